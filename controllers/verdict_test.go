package controllers

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// TestRenamedPlaneKeepsTheVersionsOwner: after a QuotaPlane is renamed into
// one that does not compile, the version in force still belongs to the old
// name, so the new one's status never claims it.
func TestRenamedPlaneKeepsTheVersionsOwner(t *testing.T) {
	r := redistest.Start(t)
	st := &stores{redis: r.Client()}
	ctx := context.Background()
	objs := samples(t, "rename")
	first, _, err := compilePlane(ctx, "rename", objs, nil, st.get)
	if err != nil || first.version == 0 || first.publishedPlane != "main" {
		t.Fatalf("the samples: version %d of plane %q, err %v; want a version of main", first.version, first.publishedPlane, err)
	}
	renamed := brokenPlane(objs, "other")
	v, published, err := compilePlane(ctx, "rename", renamed, first, st.get)
	if err != nil || published {
		t.Fatalf("an invalid plane published (%t) or failed: %v", published, err)
	}
	if v.planeName != "other" || v.publishedPlane != "main" || v.version != first.version {
		t.Fatalf("verdict names plane %q, version %d of %q; want plane other, version %d still main's", v.planeName, v.version, v.publishedPlane, first.version)
	}
}

// TestRestartedManagerNamesTheVersionInForce: a manager that starts while
// its plane does not compile has no verdict of its own yet; it reads the
// version in force from the store, so the objects do not say that nothing
// is published, and the fleet keeps being scaled for that version.
func TestRestartedManagerNamesTheVersionInForce(t *testing.T) {
	r := redistest.Start(t)
	st := &stores{redis: r.Client()}
	ctx := context.Background()
	objs := samples(t, "restart")
	first, _, err := compilePlane(ctx, "restart", objs, nil, st.get)
	if err != nil || first.version == 0 {
		t.Fatalf("the samples: version %d, err %v", first.version, err)
	}
	broken := brokenPlane(objs, "main")
	restarted := &stores{redis: r.Client()} // a new process: no verdicts, no stores
	v, published, err := compilePlane(ctx, "restart", broken, nil, restarted.get)
	if err != nil || published || len(v.planeProblems) == 0 {
		t.Fatalf("an invalid plane: published %t, problems %v, err %v", published, v.planeProblems, err)
	}
	if v.version != first.version || v.hash != first.hash || v.publishedPlane != "main" || v.fleet != first.fleet {
		t.Fatalf("verdict: version %d (hash %.12s) of %q, fleet %+v; want version %d (hash %.12s) of main, fleet %+v",
			v.version, v.hash, v.publishedPlane, v.fleet, first.version, first.hash, first.fleet)
	}
}

// brokenPlane is objs with their QuotaPlane named name and without tiers, so
// that the plane does not compile.
func brokenPlane(objs []runtime.Object, name string) []runtime.Object {
	var out []runtime.Object
	for _, o := range objs {
		if qp, ok := o.(*v1alpha1.QuotaPlane); ok {
			qp = qp.DeepCopy()
			qp.Name = name
			qp.Spec.Tiers = nil
			o = qp
		}
		out = append(out, o)
	}
	return out
}
