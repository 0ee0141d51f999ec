package upstream_test

import (
	"math"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/upstream"
)

func approx(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// stats is a window's reading: errors of 100 calls, a p95, a quota reading
// (-1 unknown), the newest sample age before t0.
func stats(errors int64, p95 time.Duration, remaining, limit int64, age time.Duration) upstream.Stats {
	return upstream.Stats{Calls: 100, Errors: errors, Latencies: 100, P95: p95,
		Remaining: remaining, Limit: limit, Newest: t0.Add(-age)}
}

// TestConfidenceSeed: seed 004's compute_confidence and get_confidence
// with its numbers, each signal alone and together.
func TestConfidenceSeed(t *testing.T) {
	seed := upstream.ConfidenceParams{}
	for _, tc := range []struct {
		name string
		st   upstream.Stats
		want float64
	}{
		{"healthy", stats(0, 0, 1000, 1000, 0), 1},
		{"20% errors cost 0.1", stats(20, 0, -1, -1, 0), 0.9},
		{"all errors cost 0.5", stats(100, 0, -1, -1, 0), 0.5},
		{"p95 2500ms costs 0.1", stats(0, 2500*time.Millisecond, -1, -1, 0), 0.9},
		{"p95 at the 5000ms ceiling costs 0.2", stats(0, 5*time.Second, -1, -1, 0), 0.8},
		{"p95 past the ceiling costs 0.2", stats(0, 30*time.Second, -1, -1, 0), 0.8},
		{"60% used (400/1000 left) costs 0.18", stats(0, 0, 400, 1000, 0), 0.82},
		{"nothing left costs 0.3", stats(0, 0, 0, 1000, 0), 0.7},
		{"unknown quota costs nothing", stats(0, 0, -1, -1, 0), 1},
		{"garbage quota costs nothing", stats(0, 0, 5, 0, 0), 1},
		{"remaining above limit costs nothing", stats(0, 0, 1500, 1000, 0), 1},
		{"combined: 0.1 + 0.1 + 0.18", stats(20, 2500*time.Millisecond, 400, 1000, 0), 0.62},
		{"everything at worst is 0", stats(100, time.Minute, 0, 1000, 0), 0},
		{"worse than 0 is clamped", stats(100, time.Minute, 0, 1, 0), 0},
		{"staleness 30s costs 0.25", stats(0, 0, -1, -1, 30*time.Second), 0.75},
		{"staleness 60s costs 0.5", stats(20, 0, -1, -1, 60*time.Second), 0.4},
		{"staleness after the base (0.3), then clamped", stats(40, 5*time.Second, 0, 10, 60*time.Second), 0},
		{"a sample from the future is not stale", stats(0, 0, -1, -1, -time.Minute), 1},
		{"an empty window is healthy", upstream.Stats{Remaining: -1, Limit: -1}, 1},
	} {
		if got := upstream.Confidence(tc.st, t0, seed); !approx(got, tc.want) {
			terms := upstream.Explain(tc.st, t0, seed)
			t.Errorf("%s: confidence %v, want %v (terms %+v)", tc.name, got, tc.want, terms)
		}
	}
}

// TestConfidenceStaleness: seed 004's min(age/120 s, 0.5) at 0, 60, 120
// and 300 s, from a base of 0.9.
func TestConfidenceStaleness(t *testing.T) {
	for _, tc := range []struct {
		age  time.Duration
		want float64
	}{
		{0, 0.9}, {60 * time.Second, 0.4}, {120 * time.Second, 0.4}, {300 * time.Second, 0.4}, {12 * time.Second, 0.8},
	} {
		st := stats(20, 0, -1, -1, tc.age)
		if got := upstream.Confidence(st, t0, upstream.ConfidenceParams{}); !approx(got, tc.want) {
			t.Errorf("age %s: %v, want %v", tc.age, got, tc.want)
		}
		if got, want := upstream.Explain(st, t0, upstream.ConfidenceParams{}).Staleness, upstream.Staleness(tc.age); got != want {
			t.Errorf("age %s: staleness term %v, want Staleness's %v", tc.age, got, want)
		}
	}
}

func TestConfidenceParams(t *testing.T) {
	// A 1 s ceiling: p95 500 ms costs 0.1.
	if got := upstream.Confidence(stats(0, 500*time.Millisecond, -1, -1, 0), t0, upstream.ConfidenceParams{LatencyCeiling: time.Second}); !approx(got, 0.9) {
		t.Errorf("ceiling 1s, p95 500ms: %v, want 0.9", got)
	}
	limit := upstream.ConfidenceParams{QuotaSignal: upstream.QuotaSignalLimit, NominalLimit: 1000}
	for _, tc := range []struct {
		name             string
		remaining, limit int64
		p                upstream.ConfidenceParams
		want             float64
	}{
		{"Limit: normal use costs nothing", 100, 1000, limit, 1},
		{"Limit: a limit cut to half costs 0.15", 500, 500, limit, 0.85},
		{"Limit: a limit above nominal costs nothing", 0, 5000, limit, 1},
		{"Limit: no nominal limit costs nothing", 0, 10, upstream.ConfidenceParams{QuotaSignal: upstream.QuotaSignalLimit}, 1},
		{"Limit: an unknown reading costs nothing", -1, -1, limit, 1},
		{"Remaining: the same cut half used costs 0.15", 250, 500, upstream.ConfidenceParams{}, 0.85},
	} {
		if got := upstream.Confidence(stats(0, 0, tc.remaining, tc.limit, 0), t0, tc.p); !approx(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestConfidenceFromWindow: the pipeline's sensing end to end, probes into
// a window into a confidence.
func TestConfidenceFromWindow(t *testing.T) {
	w := upstream.NewWindow(0, 0)
	for i := range 20 { // 20 probes at 15 s: 4 fail, latencies 100..2000 ms
		s := probe(t0.Add(time.Duration(i)*15*time.Second), i%5 == 0, ms(100*(i+1)))
		s.Remaining, s.Limit = int64(1000-50*i), 1000
		w.Add(s)
	}
	last := t0.Add(19 * 15 * time.Second)
	// errors 0.2 → 0.1; p95 = sorted[19] = 2000 ms → 0.08; 50/1000 left → 0.285.
	if got := upstream.Confidence(w.Stats(last), last, upstream.ConfidenceParams{}); !approx(got, 1-0.1-0.08-0.285) {
		t.Errorf("confidence %v, want %v", got, 1-0.1-0.08-0.285)
	}
	// 30 s later without a probe: the first two probes (one an error) are
	// 5 minutes old or more and left the window: 3 errors of 18, p95 still
	// 2000 ms, and 0.25 staleness.
	later := last.Add(30 * time.Second)
	want := 1 - 0.5*3/18 - 0.08 - 0.285 - 0.25
	if got := upstream.Confidence(w.Stats(later), later, upstream.ConfidenceParams{}); !approx(got, want) {
		t.Errorf("30 s stale: %v, want %v", got, want)
	}
}

func TestParseQuotaSignal(t *testing.T) {
	for in, want := range map[string]upstream.QuotaSignal{"": upstream.QuotaSignalRemaining, "Remaining": upstream.QuotaSignalRemaining, "Limit": upstream.QuotaSignalLimit} {
		if got, ok := upstream.ParseQuotaSignal(in); !ok || got != want {
			t.Errorf("ParseQuotaSignal(%q) = %v %v, want %v", in, got, ok, want)
		}
		if in != "" && want.String() != in {
			t.Errorf("%v.String() = %q, want %q", want, want.String(), in)
		}
	}
	if _, ok := upstream.ParseQuotaSignal("limit"); ok {
		t.Error(`"limit" parsed; the names are case-sensitive like the CRD's enum`)
	}
}
