package controllers

import (
	"context"
	"errors"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/store"
)

// objectKey names an object within its namespace.
type objectKey struct{ kind, name string }

// compiled is what the compiler concluded about one object.
type compiled struct {
	generation int64
	outcome
}

// verdict is the compiler's last conclusion about one namespace.
type verdict struct {
	namespace string
	objects   map[objectKey]compiled

	// planeName is the QuotaPlane that names the plane: the oldest of the
	// namespace ("" when there is none).
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
	// scaling spec and mode its mode.
	version        int64
	hash           string
	publishedPlane string
	fleet          policy.Enforcer
	mode           string

	// inForce records the spec of every object the published version was
	// compiled from; inForceKnown is false until this process has read
	// them from the store or published a version itself.
	inForce      inForceSet
	inForceKnown bool
}

// restore is what the store says is in force for the namespace's plane
// (named by primary): the version, its plane and fleet, and the specs it was
// compiled from. A manager calls it for a namespace it has no verdict of
// (its first compile after a start or a leader change) and until it
// succeeds. It returns what it could read; nothing when Redis is away.
func restore(ctx context.Context, ns string, primary *v1alpha1.QuotaPlane, publisher func(plane string) (*store.Store, error)) *verdict {
	v := &verdict{namespace: ns}
	if primary == nil {
		return v
	}
	s, err := publisher(ns + "/" + primary.Name)
	if err != nil {
		return v
	}
	current, err := s.Current(ctx)
	switch {
	case errors.Is(err, store.ErrNoPolicy):
		v.inForce, v.inForceKnown = inForceSet{}, true // nothing published: nothing in force
		return v
	case err != nil:
		return v
	}
	v.version, v.hash, v.publishedPlane, v.fleet, v.mode = current.Version(), current.Hash(), current.Plane(), current.Spec().Enforcer, current.Spec().Mode
	version, sources, err := s.Sources(ctx)
	if err != nil || version != current.Version() {
		return v // moved on in between: read again next time
	}
	v.inForce, v.inForceKnown = inForceSet{}, true
	if len(sources) > 0 {
		if set, err := decodeSources(ns, sources); err == nil {
			v.inForce = set
		} else {
			log.FromContext(ctx).Error(err, "the specs in force stored with the policy do not decode; invalid edits are left out until the next publish", "plane", s.Plane(), "version", version)
		}
	}
	return v
}

// compilePlane compiles the objects of one namespace and publishes the
// result in its plane's store (publisher gives the store of a plane). The
// previous verdict of the namespace, if any, supplies the last good version
// when nothing new can be published, and the specs in force that invalid
// edits leave in place (see resolve.go); without one, compilePlane reads
// them from the store. Versions are published above both the previous
// verdict's and the one the QuotaPlane's status recorded, so they keep
// growing when Redis lost its data. It never panics on any input: the fuzz
// test feeds it arbitrary objects.
func compilePlane(ctx context.Context, ns string, objs []runtime.Object, previous *verdict, publisher func(plane string) (*store.Store, error)) (v *verdict, published bool, err error) {
	primary := primaryPlane(objs)
	if previous == nil || !previous.inForceKnown {
		restored := restore(ctx, ns, primary, publisher)
		if previous == nil || restored.inForceKnown {
			previous = restored
		}
	}
	v = &verdict{namespace: ns, objects: make(map[objectKey]compiled, len(objs))}
	v.version, v.hash, v.publishedPlane, v.fleet, v.mode = previous.version, previous.hash, previous.publishedPlane, previous.fleet, previous.mode
	v.inForce, v.inForceKnown = previous.inForce, previous.inForceKnown

	res := resolve(objs, previous.inForce)
	v.planeName = res.plane
	for _, o := range objs {
		m, ok := o.(client.Object)
		if _, secret := o.(*corev1.Secret); !ok || secret { // Secrets are read, never given a status
			continue
		}
		key := objectKey{kindOf(o), m.GetName()}
		v.objects[key] = compiled{generation: m.GetGeneration(), outcome: res.outcomes[key]}
	}
	p := res.policy
	for _, pr := range res.problems {
		switch {
		case pr.Name == "":
			// Not about one object (the namespace has no QuotaPlane).
			v.planeProblems = append(v.planeProblems, pr.Message)
		case p == nil && pr.Kind == "QuotaPlane":
			v.planeProblems = append(v.planeProblems, pr.String())
		}
	}
	if p == nil {
		if len(v.planeProblems) == 0 {
			v.planeProblems = []string{"the plane did not compile"}
		}
		return v, false, nil
	}

	// The floor: the last version this process published of the plane, and
	// the one the QuotaPlane's status recorded.
	var floor int64
	if previous.publishedPlane == p.Plane() {
		floor = previous.version
	}
	if primary != nil && primary.Name == p.Plane() {
		floor = max(floor, primary.Status.PublishedVersion)
	}
	sources, err := encodeSources(res.compiled)
	if err != nil {
		v.publishErr = err.Error()
		return v, false, err
	}
	s, err := publisher(p.ID())
	if err == nil {
		var version int64
		version, published, err = s.Publish(ctx, p, store.Above(floor), store.WithSources(sources))
		if err == nil {
			v.version, v.hash, v.publishedPlane, v.fleet, v.mode = version, p.Hash(), p.Plane(), p.Spec().Enforcer, p.Spec().Mode
			v.inForce, v.inForceKnown = res.compiled, true
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
