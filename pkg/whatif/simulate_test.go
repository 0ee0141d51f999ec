package whatif_test

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/load"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/whatif"
)

func tierOf(t *testing.T, r *whatif.Run, name string) whatif.Counts {
	t.Helper()
	for _, tr := range r.Tiers {
		if tr.Tier == name {
			return tr.Counts
		}
	}
	t.Fatalf("no tier %s in the run of %s", name, r.Policy.Source)
	return whatif.Counts{}
}

// The proof: halving the free tier's rate on the sample plane shows
// the free tier's admitted drop to the new limit, the difference denied at
// the tenant level, and the other tiers untouched. The profile
// (testdata/light.csv) leaves the global limit uncontended, so each free
// tenant meets its own limit: 40 of them offer about 55 tokens/s each, of
// which about 40 pass the endpoint level (the free tier's exports are held
// to 2 in 5 minutes); the old limit (50/s) admits that, the new one (25/s,
// burst 50) admits 25/s plus its burst over the run.
func TestSimulateHalvedFreeTier(t *testing.T) {
	const duration = 10 * time.Second
	b, _, err := whatif.LoadProfile("testdata/light.csv", duration, 1)
	if err != nil {
		t.Fatal(err)
	}
	base, err := policy.LoadPath("../../config/samples")
	if err != nil {
		t.Fatal(err)
	}
	halved, err := policy.LoadPath(samplesWith(t, halveFree))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	before, err := whatif.Simulate(ctx, "samples", base, b, 5)
	if err != nil {
		t.Fatal(err)
	}
	after, err := whatif.Simulate(ctx, "halved", halved, b, 5)
	if err != nil {
		t.Fatal(err)
	}
	oldFree, newFree := tierOf(t, before, "free"), tierOf(t, after, "free")
	if oldFree.Tenants != 40 || newFree.OfferedPerSec != oldFree.OfferedPerSec {
		t.Fatalf("free tier: %d tenants offering %.1f then %.1f req/s: want 40 and the same requests", oldFree.Tenants, oldFree.OfferedPerSec, newFree.OfferedPerSec)
	}
	// The new limit: 25 tokens/s and a burst of 50 over the run, per tenant.
	want := 40 * (25 + 50/duration.Seconds())
	if got := newFree.AdmittedTokensPerSec; math.Abs(got-want) > 0.05*want {
		t.Errorf("free tier admitted %.0f tokens/s under the halved limit, want %.0f ± 5%%", got, want)
	}
	if got := oldFree.AdmittedTokensPerSec; got < 1.5*newFree.AdmittedTokensPerSec || got > 40*(50+100/duration.Seconds()) {
		t.Errorf("free tier admitted %.0f tokens/s under the old limit: want at least 1.5 × the new %.0f and within the old limit", got, newFree.AdmittedTokensPerSec)
	}
	// What the change no longer admits is denied at the tenant level.
	lost := oldFree.AdmittedPerSec - newFree.AdmittedPerSec
	gained := newFree.DeniedPerSec["tenant"] - oldFree.DeniedPerSec["tenant"]
	if lost < 100 || math.Abs(gained-lost) > 0.1*lost {
		t.Errorf("free tier: admitted %.0f → %.0f req/s, denied at the tenant level %.0f → %.0f: want the drop (> 100/s) denied there", oldFree.AdmittedPerSec, newFree.AdmittedPerSec, oldFree.DeniedPerSec["tenant"], newFree.DeniedPerSec["tenant"])
	}
	if before.Total.DeniedPerSec["global"] != 0 || after.Total.DeniedPerSec["global"] != 0 {
		t.Errorf("global denials %.1f and %.1f/s: the profile must leave the global limit uncontended", before.Total.DeniedPerSec["global"], after.Total.DeniedPerSec["global"])
	}
	// The fair share follows the limit (it caps each tenant's share).
	if newFree.FairSharePerSec > 40*25*1.01 || oldFree.FairSharePerSec < 1.5*newFree.FairSharePerSec {
		t.Errorf("free tier's fair share %.0f → %.0f tokens/s: want at most 40 × 25 under the new limit", oldFree.FairSharePerSec, newFree.FairSharePerSec)
	}
	// The other tiers see the same requests and limits, and nothing contends.
	for _, tier := range []string{"enterprise", "standard"} {
		o, n := tierOf(t, before, tier), tierOf(t, after, tier)
		if o.AdmittedPerSec != n.AdmittedPerSec || o.AdmittedPerSec == 0 {
			t.Errorf("%s tier admitted %.1f then %.1f req/s: want the same, not zero", tier, o.AdmittedPerSec, n.AdmittedPerSec)
		}
	}
	if len(after.Top) != 5 || after.Top[0].Tenant != "whale-1" || after.Top[0].Tier != "enterprise" {
		t.Errorf("top tenants %+v: want 5, whale-1 (enterprise) first", after.Top)
	}
}

// Simulate counts what pkg/load's virtual-time run counts, tier by tier:
// the numbers `load -virtual -policy DIR` prints, for the sample plane and
// for it with the free tier's rate halved.
func TestSimulateAgreesWithLoadRun(t *testing.T) {
	prof := load.Seed002()
	prof.Rate, prof.Duration = 20_000, time.Second
	b, err := prof.Build()
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"../../config/samples", samplesWith(t, halveFree)} {
		p, err := policy.LoadPath(dir)
		if err != nil {
			t.Fatal(err)
		}
		run, err := whatif.Simulate(context.Background(), dir, p, b, 3)
		if err != nil {
			t.Fatal(err)
		}
		// The run as cmd/load -virtual makes it.
		fleet, err := load.NewFleet(p, 1, nil, enforcerClock())
		if err != nil {
			t.Fatal(err)
		}
		res, err := load.Run(context.Background(), b, fleet, load.Options{Virtual: true})
		fleet.Close()
		if err != nil {
			t.Fatal(err)
		}
		for _, tier := range load.Tiers {
			want, got := res.Tiers[tier], tierOf(t, run, tier)
			for i, l := range enforcer.Levels {
				if got.DeniedPerSec[string(l)] != float64(want.Denied[i])/res.Measured {
					t.Errorf("%s, %s: denied at the %s level %.1f/s, load.Run %d in %gs", dir, tier, l, got.DeniedPerSec[string(l)], want.Denied[i], res.Measured)
				}
			}
			if got.AdmittedPerSec != float64(want.Admitted)/res.Measured || got.OfferedPerSec != float64(want.Offered)/res.Measured ||
				got.AdmittedTokensPerSec != float64(want.AdmittedTokens)/res.Measured {
				t.Errorf("%s, %s: simulate %+v, load.Run %+v", dir, tier, got, want)
			}
		}
		if run.Total.DeniedPerSec["global"] == 0 {
			t.Errorf("%s: seed 002's shape at 20,000 req/s denied nothing at the global level: the comparison above compares nothing interesting", dir)
		}
	}
}
