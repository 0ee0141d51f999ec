package controllers

import (
	"context"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/store"
)

// objectKey names an object within its namespace.
type objectKey struct{ kind, name string }

// compiled is what the compiler concluded about one object.
type compiled struct {
	generation int64
	problems   []string // "field: message", empty when the object compiled
}

// verdict is the compiler's last conclusion about one namespace.
type verdict struct {
	namespace string
	objects   map[objectKey]compiled

	// planeName is the QuotaPlane that names the plane ("" when there is
	// none, or several).
	planeName string
	// planeProblems is set when the plane as a whole did not compile: no
	// policy, and the last good one stays published.
	planeProblems []string
	// publishErr is set when the compiled policy could not be published.
	publishErr string

	// version and hash are the published policy's (0 and "" when none is
	// known yet), publishedPlane the QuotaPlane it was compiled from (after
	// a rename that does not compile, planeName is the new one while the
	// version in force is still the old one's); fleet is its enforcer
	// scaling spec.
	version        int64
	hash           string
	publishedPlane string
	fleet          policy.Enforcer
}

// compilePlane compiles the objects of one namespace and publishes the
// result in its plane's store (publisher gives the store of a plane). The
// previous verdict of the namespace, if any, supplies the last good version
// when nothing new can be published. It never panics on any input: the
// fuzz test feeds it arbitrary objects.
func compilePlane(ctx context.Context, ns string, objs []runtime.Object, previous *verdict, publisher func(plane string) (*store.Store, error)) (v *verdict, published bool, err error) {
	v = &verdict{namespace: ns, objects: make(map[objectKey]compiled, len(objs))}
	if previous != nil {
		v.version, v.hash, v.publishedPlane, v.fleet = previous.version, previous.hash, previous.publishedPlane, previous.fleet
	}
	var planes []string
	for _, o := range objs {
		m, ok := o.(client.Object)
		if _, secret := o.(*corev1.Secret); !ok || secret { // Secrets are read, never given a status
			continue
		}
		v.objects[objectKey{kindOf(o), m.GetName()}] = compiled{generation: m.GetGeneration()}
		if qp, ok := o.(*v1alpha1.QuotaPlane); ok {
			planes = append(planes, qp.Name)
		}
	}
	if len(planes) == 1 {
		v.planeName = planes[0]
	}

	p, problems := policy.Compile(objs)
	if p == nil && v.version == 0 && v.planeName != "" {
		// The plane does not compile and this process knows no version
		// of it (its first compile, or nothing published yet): what is in
		// force is whatever an earlier manager published, so say so
		// instead of "nothing is published".
		if s, err := publisher(ns + "/" + v.planeName); err == nil {
			if current, err := s.Current(ctx); err == nil {
				v.version, v.hash, v.publishedPlane, v.fleet = current.Version(), current.Hash(), current.Plane(), current.Spec().Enforcer
			}
		}
	}
	for _, pr := range problems {
		if pr.Name == "" {
			// Not about one object (the namespace has no QuotaPlane).
			v.planeProblems = append(v.planeProblems, pr.Message)
			continue
		}
		key := objectKey{pr.Kind, pr.Name}
		c := v.objects[key]
		c.problems = append(c.problems, strings.TrimPrefix(pr.Field+": "+pr.Message, ": "))
		v.objects[key] = c
		if p == nil && pr.Kind == "QuotaPlane" {
			v.planeProblems = append(v.planeProblems, pr.String())
		}
	}
	if p == nil {
		if len(v.planeProblems) == 0 {
			v.planeProblems = []string{"the plane did not compile"}
		}
		return v, false, nil
	}

	s, err := publisher(p.ID())
	if err == nil {
		var version int64
		version, published, err = s.Publish(ctx, p)
		if err == nil {
			v.version, v.hash, v.publishedPlane, v.fleet = version, p.Hash(), p.Plane(), p.Spec().Enforcer
			return v, published, nil
		}
	}
	v.publishErr = err.Error() // go-redis errors never carry the password
	return v, false, err
}

// kindOf is the quotaplane kind of o ("TenantQuota"), as policy.Problem names it.
func kindOf(o runtime.Object) string {
	switch o.(type) {
	case *v1alpha1.QuotaPlane:
		return "QuotaPlane"
	case *v1alpha1.TenantQuota:
		return "TenantQuota"
	case *v1alpha1.EndpointQuota:
		return "EndpointQuota"
	case *v1alpha1.BurstPool:
		return "BurstPool"
	}
	return ""
}

// verdicts holds the compiler's last verdict per namespace.
type verdicts struct {
	mu   sync.Mutex
	byNS map[string]*verdict
}

func (vs *verdicts) get(ns string) *verdict {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	return vs.byNS[ns]
}

// set records v; a nil v forgets the namespace (it holds no quota objects).
func (vs *verdicts) set(ns string, v *verdict) {
	vs.mu.Lock()
	defer vs.mu.Unlock()
	if v == nil {
		delete(vs.byNS, ns)
		return
	}
	if vs.byNS == nil {
		vs.byNS = map[string]*verdict{}
	}
	vs.byNS[ns] = v
}
