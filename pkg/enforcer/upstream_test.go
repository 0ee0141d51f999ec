package enforcer

import (
	"context"
	"encoding/json"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/upstream"
)

// upstreamPlane has two endpoints, chat drawing on the upstream llm and
// search on nothing, and three named tenants.
const upstreamPlane = planeHeader + `
  global: {rate: 100000, period: 1s, burst: 100000}
  tiers:
  - {name: enterprise, weight: 8, tenant: {rate: 1000, period: 1s, burst: 100}}
  - {name: free, weight: 1, tenant: {rate: 1000, period: 1s, burst: 100}}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: chat}
spec: {endpoint: chat, cost: 1}
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: search}
spec: {endpoint: search, cost: 1}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: gold}
spec: {tenant: gold, tier: enterprise}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: silver}
spec: {tenant: silver, tier: enterprise}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: bronze}
spec: {tenant: bronze, tier: free}
`

// degradedPlan: llm at 100/s nominal, confidence 0.4 (40/s left), in
// phase 1 (critical and high only); gold critical with 30/s reserved,
// silver high, bronze medium (held back by the phase), unknown free
// tenants low.
func degradedPlan(plane string) *upstream.Plan {
	return &upstream.Plan{Plane: plane, Interval: 10 * time.Second, Upstreams: []upstream.UpstreamPlan{{
		Name: "llm", Endpoints: []string{"chat"}, Capacity: 100, Confidence: 0.4, Phase: upstream.Phase1, Reserve: 30,
		Tenants: map[string]upstream.TenantClass{
			"gold":   {Class: upstream.Critical, Score: 0.9},
			"silver": {Class: upstream.High, Score: 0.7},
			"bronze": {Class: upstream.Medium, Score: 0.5},
		},
		Tiers: map[string]upstream.Class{"enterprise": upstream.High, "free": upstream.Low},
	}}}
}

// TestUpstreamGate: two enforcers on one Redis apply a published plan: a
// suspended class is refused before any level with a 503's fields, an
// endpoint that does not draw on the upstream is not gated, critical keeps
// its reserve while high takes the rest of the degraded capacity, and the
// fleet together admits the capacity left, not each node.
func TestUpstreamGate(t *testing.T) {
	srv := redistest.Start(t)
	p := policytest.Compile(t, withMode(upstreamPlane, "local", "reconcileInterval: 1h"))
	var clock atomic.Int64
	clock.Store(epoch.UnixMicro())
	now := func() time.Time { return time.UnixMicro(clock.Load()) }
	a := newEngine(t, p, WithRedis(srv.Client()), WithNodeID("a"), WithClock(now))
	b := newEngine(t, p, WithRedis(srv.Client()), WithNodeID("b"), WithClock(now))
	plan := degradedPlan(p.ID())
	if err := upstream.PublishPlan(context.Background(), srv.Client(), plan); err != nil {
		t.Fatal(err)
	}
	a.gateExchange()
	b.gateExchange()

	d := mustDecide(t, a, now(), Request{Tenant: "bronze", Endpoint: "chat"})
	if d.Allow || !d.Suspended || d.Level != LevelUpstream || d.Class != "suspended" || d.RetryAfter != 10*time.Second || d.Reason == "" {
		t.Fatalf("bronze on chat: %+v, want suspended at level upstream, retry after the cycle (10s)", d)
	}
	if d := mustDecide(t, a, now(), Request{Tenant: "bronze", Endpoint: "search"}); !d.Allow || d.Class != "" {
		t.Fatalf("bronze on search (no upstream): %+v, want allowed, not gated", d)
	}
	if d := mustDecide(t, a, now(), Request{Tenant: "stranger", Tier: "free", Endpoint: "chat"}); !d.Suspended {
		t.Fatalf("an unknown free tenant (low, held back in phase 1): %+v, want suspended", d)
	}

	// 20 s: gold sends 30/s to a only (its reserve), silver 100/s to both
	// in turn; an exchange every 200 ms.
	admitted := map[string]int{}
	step := 10 * time.Millisecond
	for i := range 2000 {
		clock.Add(step.Microseconds())
		if i%20 == 0 {
			a.gateExchange()
			b.gateExchange()
		}
		if i%3 == 0 { // 33.3/s
			if d := mustDecide(t, a, now(), Request{Tenant: "gold", Endpoint: "chat"}); d.Allow && i >= 1000 {
				admitted["gold"]++
			}
		}
		e := a
		if i%2 == 1 {
			e = b
		}
		if d := mustDecide(t, e, now(), Request{Tenant: "silver", Endpoint: "chat"}); d.Allow && i >= 1000 {
			admitted["silver"]++
		} else if !d.Allow && (d.Level != LevelUpstream || d.Class != "high" || d.Suspended) {
			t.Fatalf("silver denied: %+v, want throttled at level upstream as class high", d)
		}
	}
	// Over the last 10 s: 40/s left; gold offered 33.3/s and keeps its
	// 30/s reserve (the rest by weight leaves it no more: 16.7·1 < 30);
	// silver the rest.
	gold, silver := float64(admitted["gold"])/10, float64(admitted["silver"])/10
	if gold < 0.99*30 || gold > 33.4 {
		t.Errorf("gold (critical) admitted %.2f/s, want ≥ 99%% of its 30/s reserve", gold)
	}
	if total := gold + silver; math.Abs(total-40) > 0.05*40 {
		t.Errorf("the fleet admitted %.1f/s on the upstream (gold %.1f, silver %.1f), want its degraded capacity 40/s ± 5%%", total, gold, silver)
	}
	t.Logf("admitted on the upstream: gold %.2f/s, silver %.2f/s", gold, silver)
	// Each node reported its named tenants' admitted rates for the
	// leader's usage ratio: gold (on a only) at about 30/s.
	raw, err := srv.Client().Get(context.Background(), upstream.UsageKey(p.ID(), "a")).Result()
	var usage upstream.Usage
	if err != nil || json.Unmarshal([]byte(raw), &usage) != nil || usage.Rates["gold"] < 25 || usage.Rates["gold"] > 35 {
		t.Errorf("node a's usage report %q (%v), want gold at about 30 tokens/s", raw, err)
	}
	st := a.UpstreamStatus()
	if len(st) != 1 || st[0].Phase != "Phase1" || st[0].Classes[upstream.Critical].Allocation < 30 {
		t.Errorf("status %+v, want llm in Phase1 with critical allocated at least its reserve", st)
	}
}

// TestUpstreamGateNoPlan: without a plan, or once the plan is gone from
// Redis, nothing is gated.
func TestUpstreamGateNoPlan(t *testing.T) {
	srv := redistest.Start(t)
	p := policytest.Compile(t, withMode(upstreamPlane, "local", "reconcileInterval: 1h"))
	e := newEngine(t, p, WithRedis(srv.Client()), WithNodeID("a"))
	e.gateExchange()
	if d, _ := e.Decide(context.Background(), Request{Tenant: "bronze", Endpoint: "chat"}); !d.Allow || d.Class != "" {
		t.Fatalf("no plan: %+v, want allowed, not gated", d)
	}
	if err := upstream.PublishPlan(context.Background(), srv.Client(), degradedPlan(p.ID())); err != nil {
		t.Fatal(err)
	}
	e.gateExchange()
	if d, _ := e.Decide(context.Background(), Request{Tenant: "bronze", Endpoint: "chat"}); !d.Suspended {
		t.Fatalf("plan published: %+v, want suspended", d)
	}
	srv.Client().Del(context.Background(), upstream.PlanKey(p.ID()))
	e.gateExchange()
	if d, _ := e.Decide(context.Background(), Request{Tenant: "bronze", Endpoint: "chat"}); !d.Allow || d.Class != "" {
		t.Fatalf("plan gone: %+v, want allowed, not gated", d)
	}
}

// TestUpstreamGateHoldsThePlanWithoutRedis: with Redis gone, an enforcer
// keeps the plan it holds, its confidence decayed by the plan's age (seed
// 004's staleness penalty), until PlanTTL after it was published; then it
// drops it and gates nothing.
func TestUpstreamGateHoldsThePlanWithoutRedis(t *testing.T) {
	realTime(t)
	srv := redistest.Start(t)
	p := policytest.Compile(t, withMode(upstreamPlane, "local", "reconcileInterval: 1h"))
	var clock atomic.Int64
	clock.Store(time.Now().UnixMicro())
	now := func() time.Time { return time.UnixMicro(clock.Load()) }
	e := newEngine(t, p, WithRedis(srv.Client()), WithNodeID("a"), WithClock(now), WithRedisTimeout(100*time.Millisecond))
	plan := degradedPlan(p.ID())
	plan.Upstreams[0].Confidence = 0.8
	if err := upstream.PublishPlan(context.Background(), srv.Client(), plan); err != nil {
		t.Fatal(err)
	}
	e.gateExchange()
	srv.Stop()
	for _, step := range []struct {
		after time.Duration
		conf  float64 // the plan's 0.8 less the penalty of its age beyond one interval (10 s)
		gated bool
	}{
		{0, 0.8, true},
		{70 * time.Second, 0.8 - 60.0/120, true},
		{4 * time.Minute, 0.8 - 0.5, true}, // the penalty is at most 0.5
		{upstream.PlanTTL, 0, false},
	} {
		clock.Store(time.UnixMilli(plan.PublishedMs).Add(step.after).UnixMicro())
		e.gateExchange()
		d, _ := e.DecideAt(now(), Request{Tenant: "bronze", Endpoint: "chat"})
		if d.Suspended != step.gated {
			t.Fatalf("%s after publishing, Redis down: %+v, want gated %v", step.after, d, step.gated)
		}
		if st := e.UpstreamStatus(); step.gated && (len(st) != 1 || math.Abs(st[0].Confidence-step.conf) > 0.02) {
			t.Errorf("%s after publishing: status %+v, want confidence %.2f", step.after, st, step.conf)
		}
	}
}
