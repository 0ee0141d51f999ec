package enforcer

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/poll"
)

// fakeClock is a clock the test moves by hand.
type fakeClock struct{ now atomic.Int64 }

func (c *fakeClock) Now() time.Time      { return time.Unix(0, c.now.Load()) }
func (c *fakeClock) Set(t time.Time)     { c.now.Store(t.UnixNano()) }
func (c *fakeClock) Add(d time.Duration) { c.now.Add(int64(d)) }
func (e *Engine) queuedLen(mode fairnessMode) int {
	e.queue.mu.Lock()
	defer e.queue.mu.Unlock()
	n := e.queue.discipline(mode).Len()
	if e.queue.pending != nil {
		n++
	}
	return n
}

const queuePlane = planeHeader + `
  global: {rate: 100, burst: 100}
  fairness: %s
  tiers:
    - {name: standard, weight: 1}
`

// contend drives the plane into contention in virtual time up to 2s: two
// tenants each offer twice the global rate.
func contend(t *testing.T, e *Engine) {
	for i := range 800 {
		tenant := []string{"a", "b"}[i%2]
		mustDecide(t, e, at(time.Duration(i)*2500*time.Microsecond), Request{Tenant: tenant, Endpoint: "read"})
	}
	if !e.PlaneStatusAt(at(2 * time.Second)).Contended {
		t.Fatal("the plane is not contended after offering 4x its global rate")
	}
	// Newcomers, each within its share, take what is left of the global bucket.
	for i := 0; e.PlaneStatusAt(at(2*time.Second)).Global.Remaining > 0; i++ {
		mustDecide(t, e, at(2*time.Second), Request{Tenant: sprintf("newcomer-%d", i), Endpoint: "read"})
		if i > 1000 {
			t.Fatal("the global bucket does not empty")
		}
	}
}

func TestQueueingModesHoldThenAdmit(t *testing.T) {
	for _, mode := range []string{"wfq", "drr"} {
		t.Run(mode, func(t *testing.T) {
			clock := &fakeClock{}
			clock.Set(at(2 * time.Second))
			e := newEngine(t, policytest.Compile(t, sprintf(queuePlane, mode)), WithClock(clock.Now), withQueueWait(time.Minute))
			contend(t, e)

			got := make(chan Decision, 1)
			go func() {
				d, err := e.Decide(context.Background(), Request{Tenant: "a", Endpoint: "read"})
				if err != nil {
					t.Error(err)
				}
				got <- d
			}()
			poll.Until(t, 5*time.Second, "the request to queue", func() bool { return e.queuedLen(parseFairness(mode)) == 1 })
			clock.Add(time.Second) // the global bucket refills
			d := <-got
			if !d.Allow {
				t.Fatalf("queued request got %+v after capacity returned; want it admitted", d)
			}
		})
	}
}

func TestQueueingModesTimeOutWithTheDenial(t *testing.T) {
	clock := &fakeClock{}
	clock.Set(at(2 * time.Second))
	e := newEngine(t, policytest.Compile(t, sprintf(queuePlane, "wfq")), WithClock(clock.Now), withQueueWait(20*time.Millisecond))
	contend(t, e)
	d, err := e.Decide(context.Background(), Request{Tenant: "a", Endpoint: "read"})
	if err != nil || d.Allow || d.Level != LevelGlobal || d.RetryAfter <= 0 {
		t.Fatalf("Decide after the queue wait = %+v, %v; want the global denial with a RetryAfter", d, err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		poll.Until(t, 5*time.Second, "the request to queue", func() bool { return e.queuedLen(fairWFQ) == 1 })
		cancel()
	}()
	e.settings.queueWait = time.Minute // this wait outlives the context
	if _, err := e.Decide(ctx, Request{Tenant: "b", Endpoint: "read"}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Decide with a cancelled context = %v; want context.Canceled", err)
	}
}

func TestCloseAnswersWaiters(t *testing.T) {
	clock := &fakeClock{}
	clock.Set(at(2 * time.Second))
	e, err := New(policytest.Compile(t, sprintf(queuePlane, "drr")), WithClock(clock.Now), withQueueWait(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	contend(t, e)
	got := make(chan Decision, 1)
	go func() {
		d, _ := e.Decide(context.Background(), Request{Tenant: "a", Endpoint: "read"})
		got <- d
	}()
	poll.Until(t, 5*time.Second, "the request to queue", func() bool { return e.queuedLen(fairDRR) == 1 })
	e.Close()
	if d := <-got; d.Allow || d.Level != LevelGlobal {
		t.Fatalf("a waiter at Close got %+v; want its global denial", d)
	}
	if _, err := e.Decide(context.Background(), Request{Tenant: "a", Endpoint: "read"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Decide after Close = %v; want ErrClosed", err)
	}
}

// TestQueueWeightIsTheAllocations: under shareBy tenant (the default) the
// allocation weighs each tenant by its own weight, but the wfq and drr
// queue multiplied it by its tier's, so Decide, queueing, served a gold
// tenant 4:1 against a free one while DecideAt paced them 1:1. (Review
// of the shareBy change.)
func TestQueueWeightIsTheAllocations(t *testing.T) {
	p := policytest.Compile(t, planeHeader+`  global: {rate: 100, burst: 100}
  fairness: wfq
  tiers:
    - {name: gold, weight: 4}
    - {name: free, weight: 1}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: g}
spec: {tenant: g, tier: gold, weight: 1}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: f}
spec: {tenant: f, tier: free, weight: 1}
`)
	snap := newSnapshot(p)
	if !snap.shareByTenant {
		t.Fatal("default shareBy is not tenant")
	}
	// The fluid allocation: both want 100 of 100.
	var f fairness
	rg, _ := snap.recordOf("g", "")
	rf, _ := snap.recordOf("f", "")
	f.demands = []float64{100, 100}
	f.weights = []float64{float64(rg.tenant.Weight), float64(rf.tenant.Weight)}
	f.ranks = []int{rg.tierRank, rf.tierRank}
	f.caps = []float64{math.Inf(1), math.Inf(1)}
	f.allocate(snap, 100, 1, nil)
	lg := math.Float64frombits(f.levelBits[rg.tierRank].Load()) * f.weights[0]
	lf := math.Float64frombits(f.levelBits[rf.tierRank].Load()) * f.weights[1]
	t.Logf("fluid shares: g %.1f, f %.1f (ratio %.2f)", lg, lf, lg/lf)
	wg, wf := flowWeight(snap, Request{Tenant: "g"}), flowWeight(snap, Request{Tenant: "f"})
	t.Logf("queue flow weights: g %.0f, f %.0f (ratio %.2f)", wg, wf, wg/wf)
	if math.Abs(wg/wf-lg/lf) > 1e-9 {
		t.Errorf("queue serves g:f at %.2f, the allocation at %.2f", wg/wf, lg/lf)
	}
}
