package load

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// smallProfile is seed 002's shape at a size a test runs in milliseconds.
func smallProfile(seed uint64) Profile {
	p := Seed002()
	p.Seed, p.Tenants, p.Enterprise, p.Standard, p.Whales = seed, 300, 10, 60, 5
	p.Rate, p.Duration = 3000, 3*time.Second
	return p
}

func build(t testing.TB, p Profile) *Built {
	t.Helper()
	b, err := p.Build()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// runVirtual runs b against a fresh one-engine fleet on the hand plane in
// virtual time and returns its tenants.csv.
func runVirtual(t *testing.T, b *Built) []byte {
	t.Helper()
	fleet, err := NewFleet(handPlane(t), 1, nil, enforcer.WithClock(func() time.Time { return Epoch }))
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	res, err := Run(context.Background(), b, fleet, Options{Virtual: true})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := res.Write(dir); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "tenants.csv"))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

func TestVirtualRunIsDeterministic(t *testing.T) {
	p := smallProfile(7)
	p.Spikes = []Spike{{Tenant: "whale-2", Rate: 2000, From: time.Second, To: 2 * time.Second}}
	first, again := runVirtual(t, build(t, p)), runVirtual(t, build(t, p))
	if !bytes.Equal(first, again) {
		t.Fatal("the same seed and profile gave different tenants.csv")
	}
	p.Seed = 8
	if other := runVirtual(t, build(t, p)); bytes.Equal(first, other) {
		t.Fatal("seeds 7 and 8 gave the same tenants.csv")
	}
}

func TestProfileTierCounts(t *testing.T) {
	b := build(t, Seed002())
	counts := map[string]int{}
	for _, tn := range b.Tenants {
		counts[tn.Tier]++
	}
	if counts["enterprise"] != 50 || counts["standard"] != 950 || counts["free"] != 4000 || len(b.Tenants) != 5000 {
		t.Fatalf("tiers %v of %d tenants, want 50 enterprise, 950 standard, 4000 free", counts, len(b.Tenants))
	}
	for _, tn := range b.Tenants[:b.Whales] {
		if tn.Tier != "enterprise" {
			t.Errorf("whale %s is %s, want enterprise", tn.Name, tn.Tier)
		}
	}
	var sum float64
	for _, tn := range b.Tenants {
		sum += tn.Rate
	}
	if math.Abs(sum-b.Rate) > 1e-6*b.Rate {
		t.Errorf("the tenants' rates add up to %g, want %g", sum, b.Rate)
	}
}

// TestAliasMatchesZipfWeights draws from the alias table and compares the
// frequencies with the weights by Pearson's chi-square.
func TestAliasMatchesZipfWeights(t *testing.T) {
	const n, draws = 40, 400_000
	weights := make([]float64, n)
	var sum float64
	for k := range weights {
		weights[k] = math.Pow(float64(k+1), -1.2)
		sum += weights[k]
	}
	a := newAlias(weights)
	rng := rand.New(rand.NewPCG(1, 2))
	counts := make([]int, n)
	for range draws {
		counts[a.draw(rng)]++
	}
	var chi2 float64
	for k, c := range counts {
		want := draws * weights[k] / sum
		chi2 += (float64(c) - want) * (float64(c) - want) / want
	}
	// 39 degrees of freedom: P(chi2 > 72.1) = 0.001.
	if chi2 > 72.1 {
		t.Fatalf("chi-square %.1f over %d categories: the draws do not follow the weights (counts %v)", chi2, n, counts)
	}
	// Negative control: uniform draws must fail the same test.
	uniform := make([]int, n)
	for range draws {
		uniform[rng.IntN(n)]++
	}
	var bad float64
	for k, c := range uniform {
		want := draws * weights[k] / sum
		bad += (float64(c) - want) * (float64(c) - want) / want
	}
	if bad <= 72.1 {
		t.Fatalf("uniform draws passed the test (chi-square %.1f)", bad)
	}
}

// denyAll denies every request: a target whose answers differ from Null's.
type denyAll struct{}

func (denyAll) Nodes() int { return 1 }
func (denyAll) Decide(context.Context, int, time.Time, *enforcer.Request) (enforcer.Decision, error) {
	return enforcer.Decision{Level: enforcer.LevelTenant}, nil
}
func (denyAll) Close() error { return nil }

// TestOpenModelAndSpikes: the offered load depends on the profile alone,
// not on the answers, and a spike adds its rate × window of arrivals, all
// inside its window.
func TestOpenModelAndSpikes(t *testing.T) {
	p := smallProfile(3)
	p.Duration = 4 * time.Second
	p.Spikes = []Spike{{Tenant: "t-00100", Rate: 5000, From: time.Second, To: 3 * time.Second}}
	b := build(t, p)
	admitAll, err := Run(context.Background(), b, Null{}, Options{Virtual: true})
	if err != nil {
		t.Fatal(err)
	}
	denied, err := Run(context.Background(), b, denyAll{}, Options{Virtual: true})
	if err != nil {
		t.Fatal(err)
	}
	if denied.Totals.Admitted != 0 || denied.Totals.Denied[1] != denied.Totals.Offered {
		t.Fatalf("denyAll: %+v", denied.Totals)
	}
	for i := range admitAll.Tenants {
		if a, d := admitAll.Tenants[i].Offered, denied.Tenants[i].Offered; a != d {
			t.Fatalf("tenant %s offered %d against Null, %d against a denying target", admitAll.Tenants[i].Name, a, d)
		}
	}
	for i := range admitAll.Seconds {
		if a, d := admitAll.Seconds[i].Offered, denied.Seconds[i].Offered; a != d {
			t.Fatalf("second %d: offered %d against Null, %d against a denying target", i, a, d)
		}
	}

	// The spike: 5,000/s for 2 s is 10,000 arrivals, a Poisson count (sd
	// 100); the tenant's own share of the base rate adds about 3/s.
	var inWindow, outside int64
	for i, s := range admitAll.Seconds {
		if i >= 1 && i < 3 {
			inWindow += s.AttackerOffered
		} else {
			outside += s.AttackerOffered
		}
	}
	idx, _ := b.Index("t-00100")
	base := b.Tenants[idx].Rate
	if want := 10_000 + 2*base; math.Abs(float64(inWindow)-want) > 5*math.Sqrt(want) {
		t.Errorf("the spike window offered %d, want %.0f ± 5 sd", inWindow, want)
	}
	if want := 2 * base; math.Abs(float64(outside)-want) > 5*math.Sqrt(want)+1 {
		t.Errorf("outside the window the tenant offered %d, want its base %.1f ± 5 sd", outside, want)
	}
	// Without the spike, the rest of the load is unchanged: the spike has
	// its own stream of the same seeded generator, so only compare totals.
	p.Spikes = nil
	quiet, err := Run(context.Background(), build(t, p), Null{}, Options{Virtual: true})
	if err != nil {
		t.Fatal(err)
	}
	extra := admitAll.Totals.Offered - quiet.Totals.Offered
	if math.Abs(float64(extra)-10_000) > 5*math.Sqrt(10_000)+5*math.Sqrt(float64(quiet.Totals.Offered)) {
		t.Errorf("the spike added %d arrivals in all, want about 10,000", extra)
	}
}

// TestHistogramQuantiles checks quantiles of known distributions: never
// below the truth, at most 12.5% above.
func TestHistogramQuantiles(t *testing.T) {
	check := func(name string, values []int64) {
		var h Histogram
		for _, v := range values {
			h.Add(time.Duration(v))
		}
		slices.Sort(values)
		for _, q := range []float64{0.01, 0.1, 0.5, 0.9, 0.99, 0.999, 1} {
			truth := values[max(int(math.Ceil(q*float64(len(values))))-1, 0)]
			got := int64(h.Quantile(q))
			if got < truth || float64(got) > 1.125*float64(truth) {
				t.Errorf("%s: q%.3f = %d, truth %d (want within [truth, 1.125×truth])", name, q, got, truth)
			}
		}
	}
	uniform := make([]int64, 100_000)
	for i := range uniform {
		uniform[i] = int64(i + 1)
	}
	check("1..100,000 ns", uniform)
	rng := rand.New(rand.NewPCG(5, 5))
	exp := make([]int64, 100_000)
	for i := range exp {
		exp[i] = 1 + int64(rng.ExpFloat64()*50_000) // mean 50 µs
	}
	check("exponential, mean 50µs", exp)
	logNormal := make([]int64, 100_000)
	for i := range logNormal {
		logNormal[i] = 1 + int64(math.Exp(10+2*rng.NormFloat64()))
	}
	check("log-normal", logNormal)
	check("small values", []int64{1, 2, 3, 4, 5, 6, 7})
	var empty Histogram
	if empty.Quantile(0.99) != 0 {
		t.Errorf("empty histogram: %s", empty.Quantile(0.99))
	}
}

// TestResultWriteIsParseable writes a run and reads every file back.
func TestResultWriteIsParseable(t *testing.T) {
	p := smallProfile(11)
	p.Spikes = []Spike{{Tenant: "whale-1", Rate: 1000, From: 0, To: time.Second}}
	b := build(t, p)
	res, err := Run(context.Background(), b, Null{}, Options{Virtual: true, Warmup: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := res.Write(dir); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	var summary Result
	if err := json.Unmarshal(data, &summary); err != nil {
		t.Fatalf("summary.json: %v", err)
	}
	if summary.Totals.Offered != res.Totals.Offered || summary.Totals.Offered == 0 || summary.Measured != 2 {
		t.Errorf("summary.json: totals %+v, measured %g s; the run had %+v over 2 s", summary.Totals, summary.Measured, res.Totals)
	}
	readCSV := func(name string, rows, cols int) [][]string {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		records, err := csv.NewReader(f).ReadAll()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(records) != rows+1 || len(records[0]) != cols {
			t.Fatalf("%s: %d records of %d fields, want a header and %d rows of %d", name, len(records), len(records[0]), rows, cols)
		}
		for _, r := range records[1:] {
			for i, field := range r {
				if _, err := strconv.ParseFloat(field, 64); err != nil && i > 1 { // tenant and tier are names
					t.Fatalf("%s: field %s = %q is not a number", name, records[0][i], field)
				}
			}
		}
		return records
	}
	tenants := readCSV("tenants.csv", len(b.Tenants), 13)
	var offered float64
	for _, r := range tenants[1:] {
		x, _ := strconv.ParseFloat(r[4], 64)
		offered += x * summary.Measured
	}
	if math.Abs(offered-float64(res.Totals.Offered)) > 0.5 {
		t.Errorf("tenants.csv: offered_per_s × measured adds up to %g, want %d", offered, res.Totals.Offered)
	}
	seconds := readCSV("seconds.csv", 3, 19)
	var all int64
	for _, r := range seconds[1:] {
		x, _ := strconv.ParseInt(r[1], 10, 64)
		all += x
	}
	if want := res.Seconds[0].Offered + res.Seconds[1].Offered + res.Seconds[2].Offered; all != want {
		t.Errorf("seconds.csv: offered adds up to %d, want %d", all, want)
	}
}

// TestTokensCounted: a run counts the requests' costs (read 1, write 5) per
// tenant, per scheduled second and, in real time, per second of wall time
// (tokens.csv), and the three agree with each other and with the mix.
func TestTokensCounted(t *testing.T) {
	p := smallProfile(3)
	p.Endpoints = []Endpoint{{"read", 0.5}, {"write", 0.5}}
	p.Rate, p.Duration = 4000, 1500*time.Millisecond
	b := build(t, p)
	fleet, err := NewFleet(handPlane(t), 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	res, err := Run(context.Background(), b, fleet, Options{Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	var secOffered, secAdmitted, wallOffered, wallAdmitted, wallDecided int64
	for _, s := range res.Seconds {
		secOffered, secAdmitted = secOffered+s.OfferedTokens, secAdmitted+s.AdmittedTokens
	}
	for _, w := range res.WallSeconds {
		wallOffered, wallAdmitted, wallDecided = wallOffered+w.OfferedTokens, wallAdmitted+w.AdmittedTokens, wallDecided+w.Decided
	}
	tot := res.Totals
	t.Logf("%d requests, %d tokens offered; %d admitted, %d tokens; %d wall seconds", tot.Offered, tot.OfferedTokens, tot.Admitted, tot.AdmittedTokens, len(res.WallSeconds))
	if tot.OfferedTokens != secOffered || secOffered != wallOffered || tot.AdmittedTokens != secAdmitted || secAdmitted != wallAdmitted {
		t.Errorf("offered tokens: tenants %d, seconds %d, wall %d; admitted: tenants %d, seconds %d, wall %d",
			tot.OfferedTokens, secOffered, wallOffered, tot.AdmittedTokens, secAdmitted, wallAdmitted)
	}
	if wallDecided != tot.Offered+res.Errors {
		t.Errorf("tokens.csv decided %d, want the run's %d decisions", wallDecided, tot.Offered+res.Errors)
	}
	if mean := float64(tot.OfferedTokens) / float64(tot.Offered); math.Abs(mean-3) > 0.15 {
		t.Errorf("%.2f tokens per request; want 3 (half reads of 1, half writes of 5)", mean)
	}
	if got := res.AdmittedTokensPerWallSec * res.Wall; math.Abs(got-float64(wallAdmitted)) > 0.5 {
		t.Errorf("admitted tokens per wall second × wall = %.1f, want %d", got, wallAdmitted)
	}
	// Two engines in mode local each enforce the hand plane's global limit
	// (100 tokens/s, burst 100) on their own: together at most twice it.
	res.AgainstLimit(&policy.Limit{Rate: 200, Burst: 200, Period: time.Second})
	if want := float64(wallAdmitted)/(200*res.Wall+200) - 1; math.Abs(res.GlobalOverage-want) > 1e-9 || res.GlobalOverage > 0.01 {
		t.Errorf("against twice the global limit: %+.2f%% (want %+.2f%%, and not over)", 100*res.GlobalOverage, 100*want)
	}
	dir := t.TempDir()
	if err := res.Write(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "tokens.csv")); err != nil {
		t.Errorf("a real-time run wrote no tokens.csv: %v", err)
	}
}

// BuildTenants ranks a recorded load's tenants by rate and offers each its
// share of the requests.
func TestBuildTenants(t *testing.T) {
	p := Seed002()
	p.Duration = 20 * time.Second
	b, err := p.BuildTenants([]TenantRate{{Name: "small", Tier: "free", Rate: 10}, {Name: "big", Tier: "enterprise", Rate: 90}})
	if err != nil {
		t.Fatal(err)
	}
	if b.Rate != 100 || b.Tenants[0].Name != "big" || b.Tenants[0].Rank != 1 || b.Tenants[1].Tier != "free" || len(b.Tenants[1].Keys()) != 4 {
		t.Fatalf("built %+v at %g/s", b.Tenants, b.Rate)
	}
	res, err := Run(context.Background(), b, Null{}, Options{Virtual: true})
	if err != nil {
		t.Fatal(err)
	}
	big, small := float64(res.Tenants[0].Offered)/res.Measured, float64(res.Tenants[1].Offered)/res.Measured
	if math.Abs(big-90) > 9 || math.Abs(small-10) > 3 {
		t.Errorf("offered %.1f and %.1f req/s, want about 90 and 10", big, small)
	}
	for _, bad := range [][]TenantRate{nil, {{Name: "a", Rate: 1}, {Name: "a", Rate: 2}}, {{Name: "", Rate: 1}}, {{Name: "a", Rate: -1}}, {{Name: "a"}}} {
		if _, err := p.BuildTenants(bad); err == nil {
			t.Errorf("%+v built", bad)
		}
	}
}
