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
	var renamed []runtime.Object
	for _, o := range objs {
		if qp, ok := o.(*v1alpha1.QuotaPlane); ok {
			qp = qp.DeepCopy()
			qp.Name = "other"
			qp.Spec.Tiers = nil // no tiers: the plane does not compile
			o = qp
		}
		renamed = append(renamed, o)
	}
	v, published, err := compilePlane(ctx, "rename", renamed, first, st.get)
	if err != nil || published {
		t.Fatalf("an invalid plane published (%t) or failed: %v", published, err)
	}
	if v.planeName != "other" || v.publishedPlane != "main" || v.version != first.version {
		t.Fatalf("verdict names plane %q, version %d of %q; want plane other, version %d still main's", v.planeName, v.version, v.publishedPlane, first.version)
	}
}
