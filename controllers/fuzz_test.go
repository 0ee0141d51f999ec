package controllers

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/redis/go-redis/v9"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quotaplane/quotaplane/api/v1alpha1"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
	"github.com/quotaplane/quotaplane/pkg/testenv"
)

// fuzzNamespace is the one namespace every fuzzed plane lives in, so that
// each input compiles against what the previous one published.
const fuzzNamespace = "fuzz"

// FuzzCompilePublish feeds arbitrary quota objects, one namespace's worth per
// input, through compilePlane into a real Redis, each input after the last
// like successive reconciles of one namespace. It must never panic, and
// after every input:
//
//   - the verdict covers every input object at its generation, and nothing
//     else, and names the oldest QuotaPlane as the plane;
//   - a compiled plane is in Redis at the verdict's version and hash, as a new
//     version exactly when its content changed; without held objects, it is
//     Compile of the inputs (the namespace's plane only);
//   - a plane that does not compile publishes nothing, and the verdict keeps
//     naming the version still in force;
//   - what Redis holds leaves out every object the verdict rejects and holds
//     every other one, a held object as its spec in force.
func FuzzCompilePublish(f *testing.F) {
	dir := filepath.Join(testenv.Root(), "config", "samples")
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		f.Fatalf("no sample files in %s: %v", dir, err)
	}
	sample := map[string][]byte{}
	var whole []byte // the whole sample plane in one stream
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
		sample[filepath.Base(name)] = data
		whole = join(whole, data)
	}
	f.Add(whole)
	// The same plane again: nothing new to publish.
	f.Add(join(whole, []byte("# a comment")))
	mutate := func(old, new string) []byte {
		if !bytes.Contains(whole, []byte(old)) {
			f.Fatalf("the samples no longer contain %q: update the seed", old)
		}
		return bytes.Replace(whole, []byte(old), []byte(new), 1)
	}
	for _, seed := range [][2]string{
		{"tier: standard", "tier: platinum"},              // a tenant of an unknown tier
		{"rate: 3000", "rate: -3000"},                     // a negative rate
		{"name: acme\n", "name: acme\n  generation: 7\n"}, // a generation
		{"name: globex", "name: acme"},                    // two TenantQuotas of one name
		{"tenant: globex", "tenant: acme"},                // two TenantQuotas of one tenant
		{"endpoint: write", "endpoint: read"},             // two EndpointQuotas of one endpoint
		{"weight: 8", "weight: -8"},                       // a plane that does not compile
		{"name: main", "name: other"},                     // the plane renamed
		{"name: main", "name: ma{in"},                     // a plane name Redis cannot hold
	} {
		f.Add(mutate(seed[0], seed[1]))
	}
	// Every TenantQuota twice.
	f.Add(join(whole, sample["tenants.yaml"]))
	// Two QuotaPlanes.
	f.Add(join(whole, bytes.Replace(sample["quotaplane.yaml"], []byte("name: main"), []byte("name: second"), 1)))
	// Two BurstPools of one name.
	f.Add(join(sample["quotaplane.yaml"], sample["burstpool.yaml"], sample["burstpool.yaml"]))
	// No QuotaPlane.
	f.Add(sample["tenants.yaml"])
	f.Add([]byte(""))

	// One client for every input: Client registers a cleanup, which the
	// fuzz function may not.
	rc := redistest.Start(f).Client()
	st := &stores{redis: rc}
	ctx := context.Background()
	var (
		previous *verdict
		// inForce is the plane whose store holds previous's version.
		inForce string
	)
	f.Fuzz(func(t *testing.T, data []byte) {
		objs, err := policy.DecodeYAML(data)
		if err != nil {
			return
		}
		for _, o := range objs {
			o.(client.Object).SetNamespace(fuzzNamespace)
		}
		// Compile is deterministic: what compilePlane compiles when no
		// object is held (other QuotaPlanes than the oldest are not compiled).
		want, _ := policy.Compile(onlyPrimaryPlane(objs))
		var before *policy.Policy
		if want != nil && store.ValidatePlane(want.ID()) == nil {
			before = currentPolicy(t, rc, want.ID())
		}

		v, published, err := compilePlane(ctx, fuzzNamespace, objs, previous, st.get)
		if v == nil {
			t.Fatalf("compilePlane returned no verdict (published %t, err %v)", published, err)
		}
		checkVerdictObjects(t, objs, v)
		var kept verdict // what a verdict that publishes nothing keeps of the previous one
		if previous != nil {
			kept = *previous
		}
		_, held := v.counts()
		if held > 0 && len(v.planeProblems) == 0 && err == nil {
			// What is compiled differs from Compile of the inputs: check
			// Redis against the verdict, and what it holds against the
			// specs the verdict says are in force.
			got := currentPolicy(t, rc, v.publishedPlaneID())
			if got == nil || got.Version() != v.version || got.Hash() != v.hash {
				t.Fatalf("verdict names version %d (hash %s) with %d held objects; Redis holds %s", v.version, v.hash, held, describe(got))
			}
			checkPublishedObjects(t, objs, v, got)
			previous, inForce = v, v.publishedPlaneID()
			return
		}
		switch {
		case want == nil:
			if err != nil || published || len(v.planeProblems) == 0 {
				t.Fatalf("a plane that does not compile: published %t, err %v, plane problems %q; want nothing published and the plane's problems", published, err, v.planeProblems)
			}
		case err != nil:
			// Redis is up: only a plane it cannot name fails to publish.
			if store.ValidatePlane(want.ID()) == nil {
				t.Fatalf("publishing plane %s failed with Redis up: %v", want.ID(), err)
			}
			if published || v.publishErr == "" {
				t.Fatalf("a failed publish: published %t, publishErr %q; want false and the error", published, v.publishErr)
			}
		default:
			got := currentPolicy(t, rc, want.ID())
			if got == nil || v.version < 1 || got.Version() != v.version || got.Hash() != v.hash || v.hash != want.Hash() {
				t.Fatalf("verdict names version %d (hash %s); Redis holds %s of plane %s; compiled hash %s", v.version, v.hash, describe(got), want.ID(), want.Hash())
			}
			if changed := before == nil || before.Hash() != want.Hash(); published != changed {
				t.Fatalf("published %t, yet the content changed %t (Redis held %s)", published, changed, describe(before))
			}
			if wantVersion := int64(1); before != nil {
				if published {
					wantVersion = before.Version() + 1
				} else {
					wantVersion = before.Version()
				}
				if v.version != wantVersion {
					t.Fatalf("Redis held %s; the verdict names version %d, want %d", describe(before), v.version, wantVersion)
				}
			}
			if v.fleet != want.Spec().Enforcer || v.planeName != want.Plane() || v.publishErr != "" || len(v.planeProblems) > 0 {
				t.Fatalf("verdict fleet %+v, plane %q, publishErr %q, plane problems %q; want %+v, plane %q, none", v.fleet, v.planeName, v.publishErr, v.planeProblems, want.Spec().Enforcer, want.Plane())
			}
			checkPublishedObjects(t, objs, v, got)
			previous, inForce = v, want.ID()
			return
		}
		if v.version != kept.version || v.hash != kept.hash || v.fleet != kept.fleet {
			t.Fatalf("nothing was published, yet the verdict moved from version %d (hash %s) to version %d (hash %s)", kept.version, kept.hash, v.version, v.hash)
		}
		if v.version > 0 {
			if got := currentPolicy(t, rc, inForce); got == nil || got.Version() != v.version || got.Hash() != v.hash {
				t.Fatalf("the verdict keeps version %d (hash %s) in force; Redis holds %s of plane %s", v.version, v.hash, describe(got), inForce)
			}
		}
		previous = v
	})
}

// join joins YAML streams into one.
func join(streams ...[]byte) []byte { return bytes.Join(streams, []byte("\n---\n")) }

// currentPolicy is what Redis holds as plane's current policy, nil when
// nothing is published; what it holds must decode.
func currentPolicy(t *testing.T, rc redis.UniversalClient, plane string) *policy.Policy {
	t.Helper()
	s, err := store.New(rc, plane)
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Current(context.Background())
	if errors.Is(err, store.ErrNoPolicy) {
		return nil
	}
	if err != nil {
		t.Fatalf("plane %s: %v", plane, err)
	}
	return p
}

// checkVerdictObjects checks that v has one entry per input object, at its
// generation (the last one's, for objects of one kind and name), and names
// the plane when the input holds exactly one QuotaPlane.
func checkVerdictObjects(t *testing.T, objs []runtime.Object, v *verdict) {
	t.Helper()
	want := map[objectKey]int64{}
	var planes []string
	for _, o := range objs {
		m := o.(client.Object)
		want[objectKey{kindOf(o), m.GetName()}] = m.GetGeneration()
		if _, ok := o.(*v1alpha1.QuotaPlane); ok {
			planes = append(planes, m.GetName())
		}
	}
	wantPlane := ""
	if p := primaryPlane(objs); p != nil {
		wantPlane = p.Name
	}
	if v.planeName != wantPlane {
		t.Fatalf("the verdict names plane %q; the input has QuotaPlanes %q (the plane is the oldest, by name among equals)", v.planeName, planes)
	}
	for key, generation := range want {
		c, ok := v.objects[key]
		if !ok {
			t.Fatalf("the verdict has no entry for %s %s", key.kind, key.name)
		}
		if c.generation != generation {
			t.Fatalf("the verdict has %s %s at generation %d, want %d", key.kind, key.name, c.generation, generation)
		}
	}
	if len(v.objects) != len(want) {
		t.Fatalf("the verdict has %d entries for %d input objects: %v", len(v.objects), len(want), v.objects)
	}
}

// onlyPrimaryPlane is objs without the QuotaPlanes that are not the
// namespace's plane.
func onlyPrimaryPlane(objs []runtime.Object) []runtime.Object {
	primary := primaryPlane(objs)
	var out []runtime.Object
	for _, o := range objs {
		if qp, ok := o.(*v1alpha1.QuotaPlane); ok && qp.Name != primary.Name {
			continue
		}
		out = append(out, o)
	}
	return out
}

// publishedPlaneID is the store name of the plane v's version belongs to.
func (v *verdict) publishedPlaneID() string { return v.namespace + "/" + v.publishedPlane }

// checkPublishedObjects checks that the published policy p holds the
// tenants, endpoints and burst pool of the objects v accepts (a held one
// as its spec in force), and none that only rejected objects name.
func checkPublishedObjects(t *testing.T, objs []runtime.Object, v *verdict, p *policy.Policy) {
	t.Helper()
	tenants, endpoints := map[string]bool{}, map[string]bool{} // name: named by an accepted object
	pool := false
	for _, o := range objs {
		key := objectKey{kindOf(o), o.(client.Object).GetName()}
		c := v.objects[key]
		ok := len(c.problems) == 0 || c.held > 0
		if c.held > 0 {
			rec, in := v.inForce[key]
			if !in || rec.generation != c.held {
				t.Fatalf("%s %s is held at generation %d, but the specs in force have %+v", key.kind, key.name, c.held, rec)
			}
			o = rec.obj
		}
		switch o := o.(type) {
		case *v1alpha1.QuotaPlane:
			if !ok {
				t.Fatalf("QuotaPlane %s is rejected (%q), yet the plane was published", o.Name, v.objects[objectKey{"QuotaPlane", o.Name}].problems)
			}
		case *v1alpha1.TenantQuota:
			tenants[o.Spec.Tenant] = tenants[o.Spec.Tenant] || ok
		case *v1alpha1.EndpointQuota:
			endpoints[o.Spec.Endpoint] = endpoints[o.Spec.Endpoint] || ok
		case *v1alpha1.BurstPool:
			pool = pool || ok
		}
	}
	accepting := 0
	for name, ok := range tenants {
		if _, in := p.Tenant(name); in != ok {
			t.Fatalf("tenant %q: in the published policy %t, but named by an accepted TenantQuota %t", name, in, ok)
		}
		if ok {
			accepting++
		}
	}
	if n := len(p.Spec().Tenants); n != accepting {
		t.Fatalf("the published policy names %d tenants; accepted TenantQuotas name %d", n, accepting)
	}
	accepting = 0
	for name, ok := range endpoints {
		if _, in := p.EndpointIndex(name); in != ok {
			t.Fatalf("endpoint %q: in the published policy %t, but named by an accepted EndpointQuota %t", name, in, ok)
		}
		if ok {
			accepting++
		}
	}
	if n := len(p.Endpoints()); n != accepting {
		t.Fatalf("the published policy names %d endpoints; accepted EndpointQuotas name %d", n, accepting)
	}
	if in := p.Spec().BurstPool != nil; in != pool {
		t.Fatalf("burst pool in the published policy %t, but a BurstPool is accepted %t", in, pool)
	}
}
