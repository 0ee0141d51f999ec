package upstream

// Regression tests from the review of the leader (seed 004, issue 14).
// Each comment describes the defect the test caught in the code under
// review; the code now does what the test asserts.

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// flakyHMGet is a Redis client whose first HMGET fails (a blip: the
// connection dropped), every other command going through.
type flakyHMGet struct {
	redis.UniversalClient
	fail atomic.Int32
}

func (f *flakyHMGet) HMGet(ctx context.Context, key string, fields ...string) *redis.SliceCmd {
	if f.fail.Add(-1) >= 0 {
		cmd := redis.NewSliceCmd(ctx)
		cmd.SetErr(errors.New("read tcp: connection reset by peer"))
		return cmd
	}
	return f.UniversalClient.HMGet(ctx, key, fields...)
}

// TestReviewLeaderLateRestoreForgetsItsWindow: restore runs until it has
// read the plan once. When the first read fails (a Redis blip) the cycle
// goes on, senses and publishes; the next cycle's restore then reads the
// plan this very leader published and replaces its live state with it: a
// new sensed per upstream, its window empty (every probe and passive
// report so far forgotten), the phase machine's history, the class hold
// and the prober dropped. Here five failed probes are forgotten: the cycle
// that should see an error rate of 5/6 sees the leader's own previous
// plan (healthy) less its staleness.
func TestReviewLeaderLateRestoreForgetsItsWindow(t *testing.T) {
	srv := redistest.Start(t)
	var failing atomic.Bool
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer provider.Close()
	var clock atomic.Int64
	clock.Store(time.Now().UnixMilli()) // the plan's stamps are Redis TIME
	l := testLeader(t, srv, provider.URL, &clock)
	flaky := &flakyHMGet{UniversalClient: srv.Client()}
	flaky.fail.Store(1)
	l.Redis = flaky
	ctx := context.Background()
	probe := func() {
		l.probeDue(ctx, l.now())
		l.probing.Wait()
	}

	c := l.RunCycle(ctx) // restore fails; the cycle publishes all the same
	probe()
	if c.Err != nil || c.Upstreams[0].Phase != Healthy {
		t.Fatalf("first cycle: %+v, want Healthy and published", c)
	}
	failing.Store(true)
	for range 5 {
		clock.Add((15 * time.Second).Milliseconds())
		probe()
	}
	c = l.RunCycle(ctx)
	u := c.Upstreams[0]
	if u.Terms.Error < 0.4 || u.LastProbe.IsZero() || u.LastProbeError == "" {
		t.Errorf("after 5 failed probes of 6: terms %+v, last probe %v %q; want the window's error term (0.5·5/6 = 0.42) and the last probe's failure",
			u.Terms, u.LastProbe, u.LastProbeError)
	}
}

// TestReviewLeaderHealthyUpstreamDegradesOnProbeAge: the cycle's
// confidence takes seed 004's staleness penalty on the age of the newest
// sample, with no allowance for the probe interval. Run runs a due cycle
// before the due probes of the same tick, so with the defaults (a probe
// every 15 s, a cycle every 30 s) every cycle sees a newest probe 15 s old:
// a penalty of 0.125, and a perfectly healthy upstream (every probe 200,
// fast, no rate-limit headers) is at 0.875, under the 0.9 healthy line. It
// goes Degraded, then Phase3 for good (it needs 0.95 for 2 minutes to
// leave), and tenants are classed by the dynamic bands: free tenants
// (score 0.1) are suspended. The enforcers' side allows one interval of
// age before the penalty (gateUpstream.set); the leader's does not.
func TestReviewLeaderHealthyUpstreamDegradesOnProbeAge(t *testing.T) {
	srv := redistest.Start(t)
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer provider.Close()
	var unused atomic.Int64
	l := testLeader(t, srv, provider.URL, &unused) // probe every 15 s (the default), no Cycle override
	// The leader's clock runs 100× real time: 1.3 s of test is 130 s.
	start, base := time.Now(), time.Now()
	l.Clock = func() time.Time { return base.Add(100 * time.Since(start)) }
	l.Tick = 10 * time.Millisecond // 1 s of the leader's time
	var cycles []*Cycle
	l.Observe = func(c *Cycle) { cycles = append(cycles, c) }
	ctx, cancel := context.WithTimeout(context.Background(), 1300*time.Millisecond)
	defer cancel()
	if err := l.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if len(cycles) < 4 {
		t.Fatalf("%d cycles in 130 s, want 5", len(cycles))
	}
	for i, c := range cycles {
		u := c.Upstreams[0]
		if c.Err != nil || u.Phase != Healthy {
			t.Errorf("cycle %d at %s, the provider healthy throughout: phase %s, confidence %.3f (staleness %.3f, newest probe %s old); want Healthy",
				i, c.At.Sub(base).Round(time.Second), u.Phase, u.Terms.Confidence, u.Terms.Staleness, c.At.Sub(u.LastProbe).Round(time.Second))
		}
	}
	if plan, _ := ReadPlan(context.Background(), srv.Client(), l.Plane); plan != nil && plan.Upstreams[0].Tiers["free"] == Suspended {
		t.Errorf("the plan suspends the free tier on a healthy upstream (phase %s)", plan.Upstreams[0].Phase)
	}
}

// TestLeaderCycleReadsTheLowestLimit: under quotaSignal Limit, a cycle's
// passive reports that straddle a cut limit must give the cut one. The
// cycle took the reading with the smallest share left instead: a report
// sent just before the cut, its minute nearly spent (1,000 of 36,000
// left), beat one after it (10,000 of 12,000 left), so the first degraded
// cycle of experiment 9 read the old limit, set no ceiling and sent the
// provider 60 % more than it granted for a whole cycle.
func TestLeaderCycleReadsTheLowestLimit(t *testing.T) {
	srv := redistest.Start(t)
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer provider.Close()
	var clock atomic.Int64
	clock.Store(time.Now().UnixMilli())
	l := testLeader(t, srv, provider.URL, &clock)
	load := l.Load
	l.Load = func(ctx context.Context) (*policy.Policy, []policy.Upstream, error) {
		p, specs, err := load(ctx)
		specs[0].QuotaSignal, specs[0].Capacity = policy.QuotaSignalLimit, policy.Rate{Rate: 36000, Period: time.Minute}
		return p, specs, err
	}
	ctx := context.Background()
	for _, r := range []Report{
		{Node: "a", N: 100, Remaining: 1000, Limit: 36000},  // before the cut
		{Node: "b", N: 100, Remaining: 10000, Limit: 12000}, // after it
	} {
		body, _ := json.Marshal(r)
		if err := srv.Client().RPush(ctx, ReportsKey(l.Plane, "llm"), body).Err(); err != nil {
			t.Fatal(err)
		}
	}
	c := l.RunCycle(ctx)
	plan, err := ReadPlan(ctx, srv.Client(), l.Plane)
	if c.Err != nil || err != nil || plan == nil {
		t.Fatalf("cycle %v, plan %v %v", c.Err, plan, err)
	}
	if up := plan.Upstreams[0]; up.Ceiling != 200 || math.Abs(c.Upstreams[0].Terms.Quota-0.2) > 1e-9 {
		t.Errorf("ceiling %v/s, quota term %.3f; want the cut limit's 12,000/min = 200/s and 0.3·(1 − 12,000/36,000) = 0.2", up.Ceiling, c.Upstreams[0].Terms.Quota)
	}
}
