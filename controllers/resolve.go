package controllers

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// No edit silently lowers a limit: which spec of each object is compiled.
//
// An object is in force when the published version was compiled from it.
// The compiler remembers, per namespace, the spec of every object in force
// (an inForce record: uid, generation, spec). When an object's current
// generation does not compile and an older generation of the same object
// (same uid) is in force, that older spec is compiled in its place: the
// object is held, and its Ready condition says so and names the fix. An
// object that was never in force (new, or recreated under the same name:
// another uid) is simply left out.
//
// A QuotaPlane edit that compiles on its own but would take objects in
// force out of the policy (a tier renamed or removed that tenants use,
// shards lowered below a tenant's) is held the same way: its last valid
// spec stays in force and its condition names the objects to change first.
// The alternative, keeping those tenants on a tier the plane no longer
// defines, would publish a policy that no object describes.
//
// resolve is pure: objects and in-force records in, a policy and an
// outcome per object out.

// inForce is one object as the published version compiled it.
type inForce struct {
	uid        types.UID
	generation int64
	obj        client.Object // metadata (name, namespace, uid, generation) and spec; no status
}

// inForceSet is the in-force record of every object of one namespace's policy.
type inForceSet map[objectKey]inForce

// outcome is what resolve concluded about one object.
type outcome struct {
	// problems are the current spec's ("field: message"); empty when it
	// compiled.
	problems []string
	// held is the generation compiled in place of the current one (0: the
	// current one is, or the object is left out).
	held int64
	// orphans, for a QuotaPlane held although its current spec compiles:
	// the objects in force that the edit would take out, each with why.
	orphans []string
	// duplicateOf, for a QuotaPlane that is not its namespace's plane: the
	// one that is.
	duplicateOf string
}

// resolution is the result of resolve.
type resolution struct {
	policy *policy.Policy // nil: the plane does not compile
	// problems are those of the final compile, for the plane-wide ones.
	problems []policy.Problem
	// plane names the namespace's QuotaPlane: the oldest ("" when none).
	plane    string
	outcomes map[objectKey]outcome
	// compiled is the in-force record of every object the policy holds
	// (meaningless when policy is nil).
	compiled inForceSet
}

// primaryPlane is the QuotaPlane that is its namespace's plane: the oldest
// by creationTimestamp, the name breaking ties (nil when there is none).
func primaryPlane(objs []runtime.Object) *v1alpha1.QuotaPlane {
	var first *v1alpha1.QuotaPlane
	for _, o := range objs {
		qp, ok := o.(*v1alpha1.QuotaPlane)
		if ok && (first == nil || olderPlane(qp, first)) {
			first = qp
		}
	}
	return first
}

func olderPlane(a, b *v1alpha1.QuotaPlane) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// resolver holds one resolve's inputs.
type resolver struct {
	rest    []runtime.Object            // what is compiled: all but the other QuotaPlanes
	current map[objectKey]client.Object // each object's current generation
	prev    inForceSet                  // what the published version was compiled from
	keys    []objectKey                 // every object's key, in input order
}

// resolve decides what to compile for the objects of one namespace (quota
// objects and the Secrets their TenantQuotas name), given the in-force
// records of the version published before, and compiles it.
func resolve(objs []runtime.Object, prev inForceSet) *resolution {
	res := &resolution{outcomes: map[objectKey]outcome{}}
	r := &resolver{current: map[objectKey]client.Object{}, prev: prev}
	primary := primaryPlane(objs)
	if primary != nil {
		res.plane = primary.Name
	}
	for _, o := range objs {
		m, ok := o.(client.Object)
		if !ok || kindOf(o) == "" {
			// Not a quota object: Secrets, read through a TenantQuota's
			// keySecretRef, and Upstreams, which Compile checks but the
			// policy does not hold (the upstream leaders compile them and
			// own their status). Neither is held nor given an outcome.
			r.rest = append(r.rest, o)
			continue
		}
		key := objectKey{kindOf(o), m.GetName()}
		if _, seen := r.current[key]; !seen {
			r.keys = append(r.keys, key)
		}
		r.current[key] = m
		if qp, ok := o.(*v1alpha1.QuotaPlane); ok && qp.Name != primary.Name {
			// Not compiled at all: the plane in force is the oldest one.
			res.outcomes[key] = outcome{duplicateOf: primary.Name}
			continue
		}
		r.rest = append(r.rest, o)
	}
	planeKey := objectKey{"QuotaPlane", res.plane}

	a := r.compileHolding(nil)
	if _, held := a.subst[planeKey]; !held && a.policy != nil && res.plane != "" {
		if old, edited := r.heldSpec(planeKey); edited {
			a = r.checkOrphans(a, planeKey, old)
		}
	}

	res.policy, res.problems = a.policy, a.problems
	res.compiled = inForceSet{}
	for _, key := range r.keys {
		if _, dup := res.outcomes[key]; dup {
			continue
		}
		final := a.byKey[key]
		o := outcome{problems: a.first[key]}
		if s, ok := a.subst[key]; ok && len(final) == 0 {
			o.held = s.GetGeneration()
			if key == planeKey {
				o.orphans = a.orphans
			}
		} else if !ok {
			o.problems = final
		}
		res.outcomes[key] = o
		if len(final) > 0 || res.policy == nil {
			continue
		}
		if o.held > 0 {
			res.compiled[key] = r.prev[key]
		} else {
			res.compiled[key] = recordOf(r.current[key])
		}
	}
	return res
}

// attempt is one way of compiling the namespace.
type attempt struct {
	policy   *policy.Policy
	problems []policy.Problem
	subst    map[objectKey]client.Object
	first    map[objectKey][]string // problems of the current specs
	byKey    map[objectKey][]string // problems of what was finally compiled
	orphans  []string
}

// heldSpec is key's in-force record when the object was edited since: same
// uid, another generation.
func (r *resolver) heldSpec(key objectKey) (inForce, bool) {
	rec, ok := r.prev[key]
	cur := r.current[key]
	if !ok || cur == nil || rec.uid != cur.GetUID() || rec.generation == cur.GetGeneration() {
		return inForce{}, false
	}
	return rec, true
}

// inputs is what Compile gets: the objects, with subst in place of the
// current generations it names.
func (r *resolver) inputs(subst map[objectKey]client.Object) []runtime.Object {
	out := make([]runtime.Object, len(r.rest))
	for i, o := range r.rest {
		out[i] = o
		if m, ok := o.(client.Object); ok {
			if s, held := subst[objectKey{kindOf(o), m.GetName()}]; held {
				out[i] = s
			}
		}
	}
	return out
}

// compileHolding compiles with base substituted, then again with the
// in-force spec of every edited object that does not compile.
func (r *resolver) compileHolding(base map[objectKey]client.Object) attempt {
	a := attempt{subst: maps.Clone(base)}
	if a.subst == nil {
		a.subst = map[objectKey]client.Object{}
	}
	a.policy, a.problems = policy.Compile(r.inputs(a.subst))
	a.first = problemsByKey(a.problems)
	a.byKey = a.first
	held := false
	for _, key := range r.keys {
		if _, done := a.subst[key]; done || len(a.first[key]) == 0 {
			continue
		}
		if rec, ok := r.heldSpec(key); ok {
			a.subst[key] = rec.obj
			held = true
		}
	}
	if held {
		a.policy, a.problems = policy.Compile(r.inputs(a.subst))
		a.byKey = problemsByKey(a.problems)
	}
	return a
}

// checkOrphans: the plane was edited and its current spec compiles. If the
// compile a leaves out objects that were in force and that the plane's
// in-force spec keeps, the plane is held instead.
func (r *resolver) checkOrphans(a attempt, planeKey objectKey, old inForce) attempt {
	var out []objectKey
	for _, key := range r.keys {
		rec, ok := r.prev[key]
		if key == planeKey || !ok || len(a.byKey[key]) == 0 || rec.uid != r.current[key].GetUID() {
			continue
		}
		out = append(out, key)
	}
	if len(out) == 0 {
		return a
	}
	b := r.compileHolding(map[objectKey]client.Object{planeKey: old.obj})
	if b.policy == nil {
		return a
	}
	for _, key := range out {
		if len(b.byKey[key]) == 0 {
			b.orphans = append(b.orphans, key.kind+" "+key.name+" ("+strings.Join(a.byKey[key], "; ")+")")
		}
	}
	if len(b.orphans) == 0 {
		return a
	}
	b.first[planeKey] = a.first[planeKey] // the plane's own spec compiled
	return b
}

// problemsByKey groups problems by the object they name, as "field:
// message"; a problem with the plane as a whole (no name) is left out.
func problemsByKey(problems []policy.Problem) map[objectKey][]string {
	m := map[objectKey][]string{}
	for _, pr := range problems {
		if pr.Name == "" {
			continue
		}
		key := objectKey{pr.Kind, pr.Name}
		m[key] = append(m[key], strings.TrimPrefix(pr.Field+": "+pr.Message, ": "))
	}
	return m
}

// recordOf is the in-force record of obj's current generation.
func recordOf(obj client.Object) inForce {
	c := newObject(kindOf(obj))
	c.SetName(obj.GetName())
	c.SetNamespace(obj.GetNamespace())
	c.SetUID(obj.GetUID())
	c.SetGeneration(obj.GetGeneration())
	setSpec(c, obj)
	return inForce{uid: obj.GetUID(), generation: obj.GetGeneration(), obj: c}
}

// newObject is an empty object of a quotaplane kind (nil for others).
func newObject(kind string) client.Object {
	switch kind {
	case "QuotaPlane":
		return &v1alpha1.QuotaPlane{}
	case "TenantQuota":
		return &v1alpha1.TenantQuota{}
	case "EndpointQuota":
		return &v1alpha1.EndpointQuota{}
	case "BurstPool":
		return &v1alpha1.BurstPool{}
	}
	return nil
}

// setSpec copies from's spec into to (both of one kind).
func setSpec(to, from client.Object) {
	switch t := to.(type) {
	case *v1alpha1.QuotaPlane:
		t.Spec = *from.(*v1alpha1.QuotaPlane).Spec.DeepCopy()
	case *v1alpha1.TenantQuota:
		t.Spec = *from.(*v1alpha1.TenantQuota).Spec.DeepCopy()
	case *v1alpha1.EndpointQuota:
		t.Spec = *from.(*v1alpha1.EndpointQuota).Spec.DeepCopy()
	case *v1alpha1.BurstPool:
		t.Spec = *from.(*v1alpha1.BurstPool).Spec.DeepCopy()
	}
}

// specOf is a pointer to obj's spec, for JSON.
func specOf(obj client.Object) any {
	switch o := obj.(type) {
	case *v1alpha1.QuotaPlane:
		return &o.Spec
	case *v1alpha1.TenantQuota:
		return &o.Spec
	case *v1alpha1.EndpointQuota:
		return &o.Spec
	case *v1alpha1.BurstPool:
		return &o.Spec
	}
	return nil
}

// The in-force records survive a manager restart: the compiler stores them
// in Redis beside the version they describe (store.WithSources, in the same
// atomic call as the publish), and a manager without a verdict for a
// namespace reads them back (store.Sources). They are written only with a
// version, so they always describe the version current in Redis.

// sourcesVersion is the format of the stored records.
const sourcesVersion = 1

type storedSources struct {
	Format  int            `json:"format"`
	Objects []storedObject `json:"objects"`
}

type storedObject struct {
	Kind       string          `json:"kind"`
	Name       string          `json:"name"`
	UID        types.UID       `json:"uid,omitempty"`
	Generation int64           `json:"generation"`
	Spec       json.RawMessage `json:"spec"`
}

// encodeSources is set's stored form, sorted by kind and name.
func encodeSources(set inForceSet) ([]byte, error) {
	doc := storedSources{Format: sourcesVersion, Objects: make([]storedObject, 0, len(set))}
	for _, key := range slices.SortedFunc(maps.Keys(set), func(a, b objectKey) int {
		return cmp.Or(cmp.Compare(a.kind, b.kind), cmp.Compare(a.name, b.name))
	}) {
		rec := set[key]
		spec, err := json.Marshal(specOf(rec.obj))
		if err != nil {
			return nil, fmt.Errorf("encode the spec in force of %s %s: %w", key.kind, key.name, err)
		}
		doc.Objects = append(doc.Objects, storedObject{Kind: key.kind, Name: key.name, UID: rec.uid, Generation: rec.generation, Spec: spec})
	}
	return json.Marshal(doc)
}

// decodeSources reads what encodeSources wrote, for namespace ns.
func decodeSources(ns string, b []byte) (inForceSet, error) {
	var doc storedSources
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("decode the specs in force: %w", err)
	}
	if doc.Format != sourcesVersion {
		return nil, fmt.Errorf("decode the specs in force: format %d, this manager reads %d", doc.Format, sourcesVersion)
	}
	set := inForceSet{}
	for _, so := range doc.Objects {
		obj := newObject(so.Kind)
		if obj == nil {
			return nil, fmt.Errorf("decode the specs in force: unknown kind %q", so.Kind)
		}
		if err := json.Unmarshal(so.Spec, specOf(obj)); err != nil {
			return nil, fmt.Errorf("decode the spec in force of %s %s: %w", so.Kind, so.Name, err)
		}
		obj.SetName(so.Name)
		obj.SetNamespace(ns)
		obj.SetUID(so.UID)
		obj.SetGeneration(so.Generation)
		set[objectKey{so.Kind, so.Name}] = inForce{uid: so.UID, generation: so.Generation, obj: obj}
	}
	return set, nil
}
