package main

import (
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

// TestHistogramQuantiles: within the buckets' 1/32 relative error of the
// exact quantiles, from nanoseconds to seconds.
func TestHistogramQuantiles(t *testing.T) {
	for _, scale := range []time.Duration{1, time.Microsecond, time.Millisecond, time.Second} {
		var h histogram
		for i := 1; i <= 1000; i++ {
			h.record(time.Duration(i) * scale)
		}
		for _, q := range []float64{0.5, 0.99} {
			exact := float64(time.Duration(math.Round(q*999)+1)*scale) / 1e3
			got := h.quantile(q)
			if math.Abs(got-exact) > exact/32+0.001 {
				t.Errorf("scale %v: quantile %v = %.4f µs; want %.4f µs within 1/32", scale, q, got, exact)
			}
		}
	}
}

func TestTableMedians(t *testing.T) {
	lines := `arm=peer decisions_per_s=100 p50_us=10 p99_us=50 errors=0 descriptors=1 server_cpu_us_per_decision=20 redis_cpu_us_per_decision=5
arm=peer decisions_per_s=300 p50_us=30 p99_us=70 errors=0 descriptors=1 server_cpu_us_per_decision=10 redis_cpu_us_per_decision=5
arm=peer decisions_per_s=200 p50_us=20 p99_us=60 errors=0 descriptors=1 server_cpu_us_per_decision=30 redis_cpu_us_per_decision=5
not a summary line
arm=local decisions_per_s=900 p50_us=2 p99_us=9 errors=0 descriptors=1 server_cpu_us_per_decision=5
`
	runs, err := parseRuns(strings.NewReader(lines))
	if err != nil || len(runs) != 4 {
		t.Fatalf("%d runs, %v; want 4", len(runs), err)
	}
	var out strings.Builder
	printTable(&out, runs, "peer")
	for _, want := range []string{"200", "4.50×", "5.00×"} { // median rate; 900/200; (20+5)/(5+0)
		if !strings.Contains(out.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, out.String())
		}
	}
}

// TestPlaneMatchesPeerConfig: the two services are configured alike: the
// domain is the plane's name, and the per-tenant and per-(tenant, key)
// limits are the same rates per second.
func TestPlaneMatchesPeerConfig(t *testing.T) {
	p, err := policy.LoadDir("plane")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile("peer/config/main.yaml")
	if err != nil {
		t.Fatal(err)
	}
	type limit struct {
		Unit            string `json:"unit"`
		RequestsPerUnit int64  `json:"requests_per_unit"`
	}
	var peer struct {
		Domain      string `json:"domain"`
		Descriptors []struct {
			Key         string `json:"key"`
			RateLimit   limit  `json:"rate_limit"`
			Descriptors []struct {
				Key       string `json:"key"`
				RateLimit limit  `json:"rate_limit"`
			} `json:"descriptors"`
		} `json:"descriptors"`
	}
	if err := yaml.UnmarshalStrict(data, &peer); err != nil {
		t.Fatal(err)
	}
	if peer.Domain != p.Plane() {
		t.Errorf("peer domain %q, plane %s: rlsbench sends one domain to both", peer.Domain, p.Plane())
	}
	if len(peer.Descriptors) != 1 || peer.Descriptors[0].Key != "tenant" || len(peer.Descriptors[0].Descriptors) != 1 ||
		peer.Descriptors[0].Descriptors[0].Key != "api_key" {
		t.Fatalf("peer descriptors %+v; want tenant → api_key", peer.Descriptors)
	}
	tier, ok := p.Tier(p.Spec().DefaultTier)
	if !ok || len(p.Spec().Tiers) != 1 || tier.Tenant == nil || tier.Key == nil {
		t.Fatalf("plane tiers %+v; want one tier with tenant and key limits", p.Spec().Tiers)
	}
	for _, c := range []struct {
		level string
		peer  limit
		rate  int64
		per   time.Duration
	}{
		{"tenant", peer.Descriptors[0].RateLimit, tier.Tenant.Rate, tier.Tenant.Period},
		{"key", peer.Descriptors[0].Descriptors[0].RateLimit, tier.Key.Rate, tier.Key.Period},
	} {
		if c.peer.Unit != "second" || c.per != time.Second || c.peer.RequestsPerUnit != c.rate {
			t.Errorf("%s: peer %+v, plane %d per %v; want the same rate per second", c.level, c.peer, c.rate, c.per)
		}
	}
}
