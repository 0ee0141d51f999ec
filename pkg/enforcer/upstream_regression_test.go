package enforcer

// Regression tests from the review of the upstream gate (seed 004, issue 14).
// Each comment describes the defect the test caught in the code under
// review; the code now does what the test asserts.

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/upstream"
)

// reviewClock is a virtual clock starting at the real time (so that the
// plans' Redis TIME stamps are not far in its future or past).
func reviewClock() (*atomic.Int64, func() time.Time) {
	var clock atomic.Int64
	clock.Store(time.Now().UnixMicro())
	return &clock, func() time.Time { return time.UnixMicro(clock.Load()) }
}

// fastFailClient is a client of srv that does not retry: with the server
// stopped an exchange fails at once instead of after the retries' backoff.
func fastFailClient(t *testing.T, srv *redistest.Server) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: srv.Password, MaxRetries: -1, ContextTimeoutEnabled: true,
		DialTimeout: 50 * time.Millisecond, DialerRetries: 1, DialerRetryTimeout: time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func classStatus(t *testing.T, e *Engine, c upstream.Class) UpstreamClassStatus {
	t.Helper()
	st := e.UpstreamStatus()
	if len(st) != 1 {
		t.Fatalf("status %+v, want one upstream", st)
	}
	return st[0].Classes[c]
}

// TestReviewGateEndpointCaseBypass: the levels resolve an endpoint name
// regardless of ASCII case (snapshot.endpoint, policy.ResolveEndpoint:
// "Export" costs what "export" costs and meets its limits), but the gate
// looks the request's endpoint up verbatim (gatePlan.byEndpoint). A tenant
// the degraded upstream suspends passes by spelling the endpoint "CHAT",
// and every class escapes its bucket the same way.
func TestReviewGateEndpointCaseBypass(t *testing.T) {
	srv := redistest.Start(t)
	p := policytest.Compile(t, withMode(upstreamPlane, "local", "reconcileInterval: 1h"))
	_, now := reviewClock()
	e := newEngine(t, p, WithRedis(srv.Client()), WithNodeID("a"), WithClock(now))
	if err := upstream.PublishPlan(context.Background(), srv.Client(), degradedPlan(p.ID())); err != nil {
		t.Fatal(err)
	}
	e.gateExchange()
	if d := mustDecide(t, e, now(), Request{Tenant: "bronze", Endpoint: "chat"}); !d.Suspended {
		t.Fatalf("bronze on chat: %+v, want suspended", d)
	}
	for _, ep := range []string{"CHAT", "Chat"} {
		d := mustDecide(t, e, now(), Request{Tenant: "bronze", Endpoint: ep})
		if d.Allow || !d.Suspended {
			t.Errorf("bronze on %q (the same endpoint for the levels: cost %d): %+v, want suspended as on \"chat\"", ep, d.Cost, d)
		}
	}
	// Group path too.
	ds := make([]Decision, 2)
	ok, err := e.DecideAllAt(now(), []Request{{Tenant: "bronze", Endpoint: "Chat"}, {Tenant: "silver", Endpoint: "search"}}, ds)
	if err != nil || ok {
		t.Errorf("a group with bronze on \"Chat\": allowed %v (%v) %+v, want refused: bronze is suspended", ok, err, ds)
	}
}

// TestReviewGateHeldPlanPartDrifts: while Redis is away the held plan keeps
// the gate on, and set's comment says each class keeps "its part as it
// was". It does not: set recomputes the part with nodes = 1, so a class this
// node had no demand in gets the whole fleet allocation at the first failed
// exchange (Part(0, 0, 1) = 1), and a busy class's part creeps up by 1% of
// what is left every exchange (0.99·part + 0.01), towards 1. Every node of
// the fleet does the same: N nodes admit up to N× the degraded capacity
// within a minute or so of a Redis outage (5 exchanges a second by default).
func TestReviewGateHeldPlanPartDrifts(t *testing.T) {
	srv := redistest.Start(t)
	p := policytest.Compile(t, withMode(upstreamPlane, "local", "reconcileInterval: 1h"))
	clock, now := reviewClock()
	client := fastFailClient(t, srv)
	a := newEngine(t, p, WithRedis(client), WithNodeID("a"), WithClock(now))
	b := newEngine(t, p, WithRedis(client), WithNodeID("b"), WithClock(now))
	ctx := context.Background()
	plan := degradedPlan(p.ID())
	plan.Upstreams[0].Confidence = 0.8
	// 10 s with Redis: silver sends 5/s to each node; an exchange a second.
	for range 10 {
		if err := upstream.PublishPlan(ctx, srv.Client(), plan); err != nil {
			t.Fatal(err)
		}
		clock.Add(time.Second.Microseconds())
		for range 5 {
			mustDecide(t, a, now(), Request{Tenant: "silver", Endpoint: "chat"})
			mustDecide(t, b, now(), Request{Tenant: "silver", Endpoint: "chat"})
		}
		a.gateExchange()
		b.gateExchange()
	}
	part := func(c upstream.Class) float64 {
		s := classStatus(t, a, c)
		if s.Allocation <= 0 {
			t.Fatalf("class %s: allocation %v", c, s.Allocation)
		}
		return s.Rate / s.Allocation
	}
	highBefore, critBefore := part(upstream.High), part(upstream.Critical)
	t.Logf("with Redis: node a enforces %.3f of high's allocation, %.3f of critical's (2 nodes)", highBefore, critBefore)
	if highBefore > 0.55 || critBefore > 0.55 {
		t.Fatalf("with Redis, node a's parts %.3f (high) %.3f (critical); want about half each", highBefore, critBefore)
	}

	srv.Stop()
	clock.Add(time.Second.Microseconds())
	a.gateExchange() // fails: the held plan stays in force
	if crit := part(upstream.Critical); crit > 0.55 {
		t.Errorf("one exchange after Redis went away: node a enforces %.3f of critical's fleet allocation (was %.3f); "+
			"both nodes together now admit %.1f× it", crit, critBefore, 2*crit)
	}
	for range 59 {
		clock.Add(time.Second.Microseconds())
		for range 5 {
			mustDecide(t, a, now(), Request{Tenant: "silver", Endpoint: "chat"})
		}
		a.gateExchange()
	}
	if high := part(upstream.High); high > 0.55 {
		t.Errorf("60 exchanges (12 s at the default 200 ms interval) after Redis went away: node a enforces %.3f of high's fleet allocation (was %.3f, its part as it was); "+
			"2 nodes admit %.2f× it, 10 would admit %.1f×", high, highBefore, 2*high, 10*high)
	}
}

// TestReviewGateDemandAfterFailedExchanges: measure divides the tokens
// offered since the last exchange by the time since the last *successful*
// one (heldAt, which a failed exchange does not move), but resets the count
// at every exchange. While Redis is away a steady demand is measured as
// demand/k after k failed exchanges, and the held allocation (sized by the
// node's demand) shrinks with it.
func TestReviewGateDemandAfterFailedExchanges(t *testing.T) {
	srv := redistest.Start(t)
	p := policytest.Compile(t, withMode(upstreamPlane, "local", "reconcileInterval: 1h"))
	clock, now := reviewClock()
	a := newEngine(t, p, WithRedis(fastFailClient(t, srv)), WithNodeID("a"), WithClock(now))
	ctx := context.Background()
	plan := degradedPlan(p.ID())
	step := func() {
		clock.Add(time.Second.Microseconds())
		for range 10 { // silver offers 10 tokens/s, within its class's 40/s
			mustDecide(t, a, now(), Request{Tenant: "silver", Endpoint: "chat"})
		}
		a.gateExchange()
	}
	for range 10 {
		if err := upstream.PublishPlan(ctx, srv.Client(), plan); err != nil {
			t.Fatal(err)
		}
		step()
	}
	before := classStatus(t, a, upstream.High).Demand
	if before < 9 || before > 11 {
		t.Fatalf("with Redis, high's demand on node a %.2f/s, want about 10", before)
	}
	srv.Stop()
	for range 10 {
		step()
	}
	if after := classStatus(t, a, upstream.High).Demand; after < 0.8*before {
		t.Errorf("after 10 failed exchanges at the same 10 tokens/s, high's demand on node a is measured %.2f/s (was %.2f/s)", after, before)
	}
}

// TestReviewGateRestoredClassRetriesAnHour: a class its phase lets through
// only in part (medium in phase 2, low in phase 3) is capped at its
// measured demand × its fraction, and gets nothing of the spare. A class
// that was suspended the interval before (phase 1 → 2: seed 004's recovery)
// has no measured demand, so its bucket's rate is 0 and classBucket.take
// answers -1: every request of the class is refused with Retry-After
// MaxRetryAfter, an hour, for a class that will have an allocation at the
// next exchange. Clients that honour Retry-After stay away an hour from the
// recovery meant for them (and their absence keeps the demand at 0).
func TestReviewGateRestoredClassRetriesAnHour(t *testing.T) {
	srv := redistest.Start(t)
	p := policytest.Compile(t, withMode(upstreamPlane, "local", "reconcileInterval: 1h"))
	clock, now := reviewClock()
	e := newEngine(t, p, WithRedis(srv.Client()), WithNodeID("a"), WithClock(now))
	ctx := context.Background()
	plan := degradedPlan(p.ID()) // Phase1: bronze (medium) suspended
	for range 5 {
		if err := upstream.PublishPlan(ctx, srv.Client(), plan); err != nil {
			t.Fatal(err)
		}
		clock.Add(time.Second.Microseconds())
		e.gateExchange()
		if d := mustDecide(t, e, now(), Request{Tenant: "bronze", Endpoint: "chat"}); !d.Suspended {
			t.Fatalf("phase 1: bronze %+v, want suspended", d)
		}
	}
	plan = degradedPlan(p.ID())
	plan.Upstreams[0].Phase = upstream.Phase2 // medium back at 50 %
	plan.Upstreams[0].Confidence = 0.75
	if err := upstream.PublishPlan(ctx, srv.Client(), plan); err != nil {
		t.Fatal(err)
	}
	clock.Add(time.Second.Microseconds())
	e.gateExchange()
	d := mustDecide(t, e, now(), Request{Tenant: "bronze", Endpoint: "chat"})
	if !d.Allow && d.RetryAfter > plan.Interval {
		t.Errorf("phase 2, bronze (medium at 50 %%) refused with Retry-After %s (%s); want at most the plan's cycle, %s: the class has an allocation at the next exchange",
			d.RetryAfter, d.Reason, plan.Interval)
	}
}

// TestReviewGateFirstPlanEveryNodeTakesAll: on the exchange that brings a
// plan there is no fleet demand for it yet; each node takes an even part
// of the live nodes the exchange counts (every node exchanges every
// interval, plan or not), not the whole allocation.
func TestReviewGateFirstPlanEveryNodeTakesAll(t *testing.T) {
	srv := redistest.Start(t)
	p := policytest.Compile(t, withMode(upstreamPlane, "local", "reconcileInterval: 1h"))
	_, now := reviewClock()
	nodes := make([]*Engine, 4)
	for i := range nodes {
		nodes[i] = newEngine(t, p, WithRedis(srv.Client()), WithNodeID(string(rune('a'+i))), WithClock(now))
	}
	for _, e := range nodes {
		e.gateExchange() // every node exchanges every interval, plan or not: the fleet is known
	}
	if err := upstream.PublishPlan(context.Background(), srv.Client(), degradedPlan(p.ID())); err != nil {
		t.Fatal(err)
	}
	var rates, alloc float64
	for _, e := range nodes {
		e.gateExchange()
		s := classStatus(t, e, upstream.High)
		rates += s.Rate
		alloc = s.Allocation
	}
	if rates > 1.05*alloc {
		t.Errorf("first exchange with the plan: 4 nodes enforce %.1f tokens/s together for class high, whose fleet allocation is %.1f/s (%.1f×)",
			rates, alloc, rates/alloc)
	}
}

// TestReviewGateUsageHashKeepsDeadNodes: a node's usage report is a key of
// its own that expires three report intervals after it was written, so a
// node that is gone leaves nothing behind for long; and a node that holds
// no plan (a plane without upstreams) writes none.
func TestReviewGateUsageHashKeepsDeadNodes(t *testing.T) {
	srv := redistest.Start(t)
	p := policytest.Compile(t, withMode(upstreamPlane, "local", "reconcileInterval: 1h"))
	clock, now := reviewClock()
	a := newEngine(t, p, WithRedis(srv.Client()), WithNodeID("a"), WithClock(now))
	ctx := context.Background()
	for range 2 {
		mustDecide(t, a, now(), Request{Tenant: "gold", Endpoint: "search"})
		a.gateExchange()
		clock.Add(upstream.UsageInterval.Microseconds() + 1)
	}
	if n, _ := srv.Client().Exists(ctx, upstream.UsageKey(p.ID(), "a")).Result(); n != 0 {
		t.Errorf("node a wrote a usage report without holding a plan")
	}
	if err := upstream.PublishPlan(ctx, srv.Client(), degradedPlan(p.ID())); err != nil {
		t.Fatal(err)
	}
	for range 3 { // the plan, then the first report only takes the totals, then one
		mustDecide(t, a, now(), Request{Tenant: "gold", Endpoint: "search"})
		a.gateExchange()
		clock.Add(upstream.UsageInterval.Microseconds() + 1)
	}
	ttl, err := srv.Client().PTTL(ctx, upstream.UsageKey(p.ID(), "a")).Result()
	if err != nil || ttl <= 0 || ttl > 3*upstream.UsageInterval {
		t.Errorf("node a's usage report expires in %s (%v), want within %s", ttl, err, 3*upstream.UsageInterval)
	}
}

// TestReviewGatePlanSeqReused: gateExchange reads the plan's body only when
// its seq differs from the one the node holds, but seq is not unique: it is
// a HINCRBY on the plan hash, which starts again at 1 when the hash is gone
// (the leader deletes it when no upstream is left, it expires after
// PlanTTL, Redis restarts empty or fails over to a replica a write behind).
// A node that holds seq n of the old hash and next meets seq n of the new
// one keeps applying the old plan: here a plan that suspends bronze stays
// in force after the leader published one in which llm is healthy.
func TestReviewGatePlanSeqReused(t *testing.T) {
	srv := redistest.Start(t)
	p := policytest.Compile(t, withMode(upstreamPlane, "local", "reconcileInterval: 1h"))
	_, now := reviewClock()
	e := newEngine(t, p, WithRedis(srv.Client()), WithNodeID("a"), WithClock(now))
	ctx := context.Background()
	old := degradedPlan(p.ID())
	if err := upstream.PublishPlan(ctx, srv.Client(), old); err != nil {
		t.Fatal(err)
	}
	e.gateExchange()
	if d := mustDecide(t, e, now(), Request{Tenant: "bronze", Endpoint: "chat"}); !d.Suspended {
		t.Fatalf("old plan: bronze %+v, want suspended", d)
	}
	// The hash is gone (expired, deleted, a Redis restart) while this node
	// did not exchange; the leader publishes afresh: llm healthy.
	srv.Client().Del(ctx, upstream.PlanKey(p.ID()))
	fresh := degradedPlan(p.ID())
	fresh.Upstreams[0].Phase, fresh.Upstreams[0].Confidence = upstream.Healthy, 1
	if err := upstream.PublishPlan(ctx, srv.Client(), fresh); err != nil {
		t.Fatal(err)
	}
	if fresh.Seq != old.Seq {
		t.Fatalf("seqs %d and %d: the test needs them equal", old.Seq, fresh.Seq)
	}
	e.gateExchange()
	if d := mustDecide(t, e, now(), Request{Tenant: "bronze", Endpoint: "chat"}); !d.Allow {
		t.Errorf("the plan in Redis says llm is healthy, yet bronze is refused: %+v (the node kept the old plan of the same seq %d)", d, fresh.Seq)
	}
}

// TestReviewGatePlanWithoutBodyPanics: "nothing read from Redis is
// trusted" (upstream.DecodePlan), but when the plan hash has a seq the node
// does not hold and no body (a foreign or partial write, an operator's
// HDEL), gateExchange reads no body, falls back to the
// plan held, and a node that holds none dereferences nil: the gate loop's
// goroutine panics and takes the enforcer process with it.
func TestReviewGatePlanWithoutBodyPanics(t *testing.T) {
	srv := redistest.Start(t)
	p := policytest.Compile(t, withMode(upstreamPlane, "local", "reconcileInterval: 1h"))
	_, now := reviewClock()
	e := newEngine(t, p, WithRedis(srv.Client()), WithNodeID("a"), WithClock(now))
	if err := srv.Client().HSet(context.Background(), upstream.PlanKey(p.ID()), "seq", 7, "at", time.Now().UnixMilli()).Err(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("gateExchange on a plan hash without a body panicked: %v", r)
		}
	}()
	e.gateExchange()
	if d := mustDecide(t, e, now(), Request{Tenant: "bronze", Endpoint: "chat"}); !d.Allow {
		t.Errorf("no readable plan: bronze %+v, want allowed", d)
	}
}

// TestReviewGateBeforeKeyBinding: the gate runs before the request is
// validated, so on a plane that binds api keys a request naming tenant a
// with b's key (or none) is answered by the gate as if it were a's: 503
// with X-Tier (a's class) and the upstream's confidence in the reason,
// instead of ErrKeyNotBound (403), which TestStolenKeyRefused promises in
// every mode; and it is counted as a's class's shed (a throttled one as
// its demand, which sizes the node's part).
func TestReviewGateBeforeKeyBinding(t *testing.T) {
	srv := redistest.Start(t)
	p := policytest.Compile(t, withMode(boundPlane("bound"), "local", "reconcileInterval: 1h"))
	_, now := reviewClock()
	e := newEngine(t, p, WithRedis(srv.Client()), WithNodeID("a"), WithClock(now))
	plan := &upstream.Plan{Plane: p.ID(), Interval: 10 * time.Second, Upstreams: []upstream.UpstreamPlan{{
		Name: "llm", Endpoints: []string{"read"}, Capacity: 100, Confidence: 0.4, Phase: upstream.Phase1,
		Tenants: map[string]upstream.TenantClass{"a": {Class: upstream.Medium, Score: 0.5}, "b": {Class: upstream.High, Score: 0.7}},
		Tiers:   map[string]upstream.Class{"t": upstream.Low},
	}}}
	if err := upstream.PublishPlan(context.Background(), srv.Client(), plan); err != nil {
		t.Fatal(err)
	}
	e.gateExchange()
	for _, r := range []Request{{Tenant: "a", Endpoint: "read", APIKey: "key-b"}, {Tenant: "a", Endpoint: "read"}} {
		d, err := e.DecideAt(now(), r)
		if !errors.Is(err, ErrKeyNotBound) {
			t.Errorf("%+v on a bound plane: %+v, err %v; want ErrKeyNotBound, as without a degraded upstream", r, d, err)
		}
	}
	if s := classStatus(t, e, upstream.Medium); s.Suspended != 0 {
		t.Errorf("requests refused for their key counted as %d of class medium's suspended", s.Suspended)
	}
}

// TestReviewGateGroupOverflowDebt: the gate takes cost × units before
// ValidateRequest has bounded units (MaxUnits), in int64. A group (the Go
// API; the HTTP and Envoy surfaces bound units first) whose units overflow
// the product to a negative cost "takes" a negative amount, twice; the
// group then fails validation and settleGroup gives both back, capping the
// bucket at its burst after the first: the bucket ends 2^63 tokens in debt,
// and the class is refused on this node (Retry-After an hour) for good.
func TestReviewGateGroupOverflowDebt(t *testing.T) {
	srv := redistest.Start(t)
	doc := strings.Replace(upstreamPlane, "spec: {endpoint: chat, cost: 1}", "spec: {endpoint: chat, cost: 2}", 1)
	p := policytest.Compile(t, withMode(doc, "local", "reconcileInterval: 1h"))
	_, now := reviewClock()
	e := newEngine(t, p, WithRedis(srv.Client()), WithNodeID("a"), WithClock(now))
	if err := upstream.PublishPlan(context.Background(), srv.Client(), degradedPlan(p.ID())); err != nil {
		t.Fatal(err)
	}
	e.gateExchange()
	bad := Request{Tenant: "silver", Endpoint: "chat", Units: 1<<62 + 1} // 2·units wraps to −2^63 + 2
	ds := make([]Decision, 2)
	if _, err := e.DecideAllAt(now(), []Request{bad, bad}, ds); err == nil {
		t.Fatalf("units %d: no error", bad.Units)
	}
	d := mustDecide(t, e, now(), Request{Tenant: "silver", Endpoint: "chat"})
	if !d.Allow {
		t.Errorf("after one invalid group, silver (class high, idle) is refused: %+v", d)
	}
}
