package load

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// planeFrom compiles quota YAML documents.
func planeFrom(t testing.TB, docs ...string) *policy.Policy {
	t.Helper()
	fsys := fstest.MapFS{}
	for i, d := range docs {
		fsys[fmt.Sprintf("%02d.yaml", i)] = &fstest.MapFile{Data: []byte(d)}
	}
	p, err := policy.LoadFS(fsys)
	if err != nil {
		t.Fatalf("compile: %v\n%s", err, strings.Join(docs, "---\n"))
	}
	return p
}

func quotaPlane(global, fairness, tiers string) string {
	return fmt.Sprintf(`apiVersion: quotaplane.io/v1alpha1
kind: QuotaPlane
metadata: {name: p}
spec:
  global: %s
  mode: local
  fairness: %s
  defaultTier: free
  tiers:
%s`, global, fairness, tiers)
}

func endpointQuota(name string, cost int, extra string) string {
	return fmt.Sprintf(`apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: %s}
spec:
  endpoint: %s
  cost: %d
%s`, name, name, cost, extra)
}

// handPlane: global 100/s (burst 100, half of it kept for enterprise);
// free tenants 10/s (burst 10), keys 4/s (burst 4); writes cost 5, one per
// second per tenant (5 tokens/s, burst 5).
func handPlane(t testing.TB) *policy.Policy {
	return planeFrom(t,
		quotaPlane("{rate: 100, burst: 100}", "none", `    - {name: enterprise, weight: 8, floorPercent: 50, tenant: {rate: 1000, burst: 1000}}
    - {name: free, weight: 1, tenant: {rate: 10, burst: 10}, key: {rate: 4, burst: 4}}
`),
		endpointQuota("read", 1, ""),
		endpointQuota("write", 5, "  limit: {rate: 5, burst: 5}\n"),
	)
}

func TestBucketOracleHandCases(t *testing.T) {
	at := func(ms int) time.Time { return Epoch.Add(time.Duration(ms) * time.Millisecond) }
	type step struct {
		ms               int
		tenant, tier, ep string
		key              string
		want             enforcer.Level
		allow            bool
		times            int
	}
	ok := func(ms int, tenant, ep, key string, times int) step {
		return step{ms: ms, tenant: tenant, tier: "free", ep: ep, key: key, allow: true, times: times}
	}
	deny := func(ms int, tenant, ep, key string, l enforcer.Level) step {
		return step{ms: ms, tenant: tenant, tier: "free", ep: ep, key: key, want: l, times: 1}
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"tenant bucket empties and refills", []step{
			ok(0, "a", "read", "", 10), deny(0, "a", "read", "", enforcer.LevelTenant),
			deny(99, "a", "read", "", enforcer.LevelTenant), ok(100, "a", "read", "", 1), deny(100, "a", "read", "", enforcer.LevelTenant),
		}},
		{"a denied request consumes nothing", []step{
			// one write empties the endpoint's 5 tokens; the second is
			// denied there and takes nothing from the tenant's other 5
			ok(0, "a", "write", "", 1), deny(0, "a", "write", "", enforcer.LevelEndpoint),
			ok(0, "a", "read", "", 5), deny(0, "a", "read", "", enforcer.LevelTenant),
		}},
		{"key before tenant runs out", []step{
			ok(0, "a", "read", "k1", 4), deny(0, "a", "read", "k1", enforcer.LevelKey),
			ok(0, "a", "read", "k2", 4), ok(0, "a", "read", "", 2), deny(0, "a", "read", "", enforcer.LevelTenant),
		}},
		{"free tenants cannot take enterprise's reserve", []step{
			ok(0, "a", "read", "", 10), ok(0, "b", "read", "", 10), ok(0, "c", "read", "", 10),
			ok(0, "d", "read", "", 10), ok(0, "e", "read", "", 10),
			deny(0, "f", "read", "", enforcer.LevelGlobal),
			{ms: 0, tenant: "big", tier: "enterprise", ep: "read", allow: true, times: 50},
			{ms: 0, tenant: "big", tier: "enterprise", ep: "read", want: enforcer.LevelGlobal, times: 1},
		}},
		{"global fires before an empty tenant level", []step{
			{ms: 0, tenant: "big", tier: "enterprise", ep: "read", allow: true, times: 100},
			deny(0, "big2", "read", "", enforcer.LevelGlobal),
			// a, whose own bucket is full, is denied at global too
			deny(0, "a", "read", "", enforcer.LevelGlobal),
		}},
		{"the clock going back earns nothing", []step{
			ok(1000, "a", "read", "", 10), deny(500, "a", "read", "", enforcer.LevelTenant),
			deny(1099, "a", "read", "", enforcer.LevelTenant), ok(1100, "a", "read", "", 1),
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := handPlane(t)
			o, err := NewBucketOracle(p)
			if err != nil {
				t.Fatal(err)
			}
			e, err := enforcer.New(p)
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			for i, s := range c.steps {
				for n := range s.times {
					r := enforcer.Request{Tenant: s.tenant, Tier: s.tier, Endpoint: s.ep, APIKey: s.key}
					allow, level := o.Decide(at(s.ms), &r)
					if allow != s.allow || level != s.want {
						t.Fatalf("step %d (%d of %d): oracle says allow=%v level=%q, want allow=%v level=%q", i, n+1, s.times, allow, level, s.allow, s.want)
					}
					// The hand cases hold for the engine too.
					d, err := e.DecideAt(at(s.ms), r)
					if err != nil || d.Allow != s.allow || d.Level != s.want {
						t.Fatalf("step %d (%d of %d): engine says allow=%v level=%q err=%v, want allow=%v level=%q", i, n+1, s.times, d.Allow, d.Level, err, s.allow, s.want)
					}
				}
			}
		})
	}
}

func TestBucketOracleRefusesWhatItDoesNotModel(t *testing.T) {
	tiers := "    - {name: free, weight: 1, tenant: {rate: 10, burst: 10}}\n"
	read := endpointQuota("read", 1, "")
	cases := map[string][]string{
		"fairness maxmin": {quotaPlane("{rate: 100, burst: 100}", "maxmin", tiers), read},
		"a sliding window": {quotaPlane("{rate: 100, burst: 100}", "none", tiers),
			endpointQuota("read", 1, "  limit: {rate: 10, period: 60s, algorithm: slidingWindow}\n")},
		"a burst pool": {quotaPlane("{rate: 100, burst: 100}", "none", tiers), read, `apiVersion: quotaplane.io/v1alpha1
kind: BurstPool
metadata: {name: pool}
spec: {size: 100, refillRate: 10, perTenantCeiling: 50}
`},
		"a reserve that is not whole tokens": {quotaPlane("{rate: 100, burst: 150}", "none",
			"    - {name: enterprise, weight: 8, floorPercent: 33}\n"+tiers), read},
	}
	for name, docs := range cases {
		if _, err := NewBucketOracle(planeFrom(t, docs...)); err == nil {
			t.Errorf("%s: the oracle accepted it", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	p, err := handPlane(t).Override(policy.Overrides{Mode: "central"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewBucketOracle(p); err == nil {
		t.Errorf("mode central: the oracle accepted it")
	}
}

// randomPlane is a plane with random token-bucket limits at every level,
// tiers with floors, named tenants with their own overrides, and keys.
func randomPlane(t testing.TB, rng *rand.Rand) *policy.Policy {
	limit := func(maxRate int) string {
		periods := []string{"1s", "100ms", "10s", "1m", "7ms"}
		rate := rng.IntN(maxRate + 1)
		burst := 1 + rng.IntN(2*maxRate)
		return fmt.Sprintf("{rate: %d, burst: %d, period: %s}", rate, burst, periods[rng.IntN(len(periods))])
	}
	maybe := func(field, lim string) string {
		if rng.IntN(4) == 0 {
			return ""
		}
		return ", " + field + ": " + lim
	}
	global := fmt.Sprintf("{rate: %d, burst: %d}", 50+rng.IntN(500), 100*(1+rng.IntN(10)))
	tiers := fmt.Sprintf("    - {name: enterprise, weight: 8, floorPercent: %d%s%s}\n", rng.IntN(40), maybe("tenant", limit(200)), maybe("key", limit(100))) +
		fmt.Sprintf("    - {name: standard, weight: 4, floorPercent: %d%s%s}\n", rng.IntN(30), maybe("tenant", limit(60)), maybe("key", limit(30))) +
		fmt.Sprintf("    - {name: free, weight: 1%s%s}\n", maybe("tenant", limit(20)), maybe("key", limit(10)))
	docs := []string{quotaPlane(global, "none", tiers)}
	for i, cost := range []int{1, 5, 50} {
		name := []string{"read", "write", "export"}[i]
		extra := ""
		if rng.IntN(3) > 0 {
			extra = "  limit: " + limit(40*cost) + "\n"
		}
		if rng.IntN(2) == 0 {
			extra += "  tiers:\n    - {tier: free, limit: " + limit(10*cost) + "}\n"
		}
		docs = append(docs, endpointQuota(name, cost, extra))
	}
	for _, name := range []string{"named-a", "named-b"} {
		doc := fmt.Sprintf("apiVersion: quotaplane.io/v1alpha1\nkind: TenantQuota\nmetadata: {name: %s}\nspec:\n  tenant: %s\n  tier: %s\n",
			name, name, []string{"enterprise", "standard", "free"}[rng.IntN(3)])
		if rng.IntN(2) == 0 {
			doc += "  limit: " + limit(100) + "\n"
		}
		doc += "  keys:\n    - {key: k0, limit: " + limit(5) + "}\n"
		if rng.IntN(2) == 0 {
			doc += "  endpoints:\n    - {endpoint: write, limit: " + limit(50) + "}\n"
		}
		docs = append(docs, doc)
	}
	return planeFrom(t, docs...)
}

// TestBucketOracleAgreesWithEngine drives the engine and the oracle through
// random planes and random requests in virtual time and compares every
// decision's allow and level.
func TestBucketOracleAgreesWithEngine(t *testing.T) {
	tenants := []string{"named-a", "named-b", "t1", "t2", "t3"}
	tiers := []string{"enterprise", "standard", "free", ""}
	eps := []string{"read", "read", "read", "write", "export", "other"}
	levels := map[enforcer.Level]int{}
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 7))
		p := randomPlane(t, rng)
		o, err := NewBucketOracle(p)
		if err != nil {
			t.Fatal(err)
		}
		e, err := enforcer.New(p)
		if err != nil {
			t.Fatal(err)
		}
		tierOf := map[string]string{}
		for _, name := range tenants {
			tierOf[name] = tiers[rng.IntN(len(tiers))]
		}
		now := Epoch
		for step := range 3000 {
			switch rng.IntN(10) {
			case 0:
				now = now.Add(time.Duration(rng.IntN(2_000_000)) * time.Microsecond)
			case 1, 2, 3:
				now = now.Add(time.Duration(rng.IntN(20_000)) * time.Nanosecond) // sub-µs steps too
			}
			tn := tenants[rng.IntN(len(tenants))]
			r := enforcer.Request{Tenant: tn, Tier: tierOf[tn], Endpoint: eps[rng.IntN(len(eps))],
				APIKey: []string{"", "k0", "k1", "k2"}[rng.IntN(4)], Units: int64(rng.IntN(3))}
			d, err := e.DecideAt(now, r)
			if err != nil {
				t.Fatalf("seed %d step %d: %v", seed, step, err)
			}
			allow, level := o.Decide(now, &r)
			if allow != d.Allow || level != d.Level {
				t.Fatalf("seed %d step %d at %s: %+v: engine allow=%v level=%q (%s), oracle allow=%v level=%q\nplane: %s",
					seed, step, now.Sub(Epoch), r, d.Allow, d.Level, d.Reason, allow, level, p.EncodedSpec())
			}
			levels[level]++
		}
		e.Close()
		if o.OutOfModel != 0 {
			t.Fatalf("seed %d: %d requests out of model", seed, o.OutOfModel)
		}
	}
	t.Logf("decisions by level: %v", levels)
	for _, l := range append([]enforcer.Level{enforcer.LevelNone}, enforcer.Levels[:]...) {
		if levels[l] < 100 {
			t.Errorf("only %d decisions at level %q: the random planes do not exercise it", levels[l], l)
		}
	}
}

// TestBucketOracleCatchesADifferentEngine is the negative control: an
// oracle that forgets the global reserve of higher tiers must disagree.
func TestBucketOracleCatchesADifferentEngine(t *testing.T) {
	p := handPlane(t)
	o, err := NewBucketOracle(p)
	if err != nil {
		t.Fatal(err)
	}
	e, err := enforcer.New(p)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	delete(o.reserves, "free") // the bug: free tenants may take enterprise's reserve
	disagree := 0
	for i := range 100 {
		r := enforcer.Request{Tenant: fmt.Sprintf("t%d", i), Tier: "free", Endpoint: "read"}
		d, _ := e.DecideAt(Epoch, r)
		if allow, level := o.Decide(Epoch, &r); allow != d.Allow || level != d.Level {
			disagree++
		}
	}
	if disagree == 0 {
		t.Fatal("a wrong oracle agreed with the engine on every decision")
	}
}
