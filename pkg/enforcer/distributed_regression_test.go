package enforcer

import (
	"context"
	"encoding/binary"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// Regression tests for the distributed backends, named after what went
// wrong.

// An api key chosen by a client ("foo:w") must not name the sliding window
// of another key ("foo"): the script would fail on a list where it wants a
// string, and failures open the breaker for the whole plane.
func TestCentralKeyNamesDoNotCollide(t *testing.T) {
	srv := redistest.Start(t)
	p := policytest.Compile(t, withMode(planeHeader, "central")+`  global: {rate: 1000, burst: 1000}
  tiers: [{name: t, weight: 1, key: {rate: 10, burst: 10}}]
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: a}
spec: {tenant: a, keys: [{key: foo, limit: {rate: 5, period: 1m, algorithm: slidingWindow}}]}
`)
	e := centralEngine(t, p, srv.Client(), "n1", slowMachine)
	for _, key := range []string{"foo", "foo:w", "foo:w", "foo:w", "foo"} {
		if _, err := e.Decide(context.Background(), Request{Tenant: "a", Endpoint: "x", APIKey: key}); err != nil {
			t.Fatal(err)
		}
	}
	if s := e.BackendStatus(); s.Failures != 0 || s.Fallbacks != 0 {
		t.Fatalf("status %+v: script calls failed", s)
	}
}

// A bucket whose limit slowed down must not expire before it is full at the
// new rate: it would come back full early.
func TestCentralExpiryFollowsTheLimit(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	fast := policytest.Compile(t, withMode(planeHeader, "central")+"  global: {rate: 1000000, burst: 1000000}\n  tiers: [{name: t, weight: 1, tenant: {rate: 100, burst: 100}}]\n")
	slow := policytest.Compile(t, withMode(planeHeader, "central")+"  global: {rate: 1000000, burst: 1000000}\n  tiers: [{name: t, weight: 1, tenant: {rate: 1, burst: 100}}]\n")
	e := centralEngine(t, fast, client, "n1", slowMachine)
	now := time.Now()
	if d := mustDecide(t, e, now, Request{Tenant: "a", Endpoint: "x", Units: 100}); !d.Allow {
		t.Fatalf("draining decision denied: %+v", d)
	}
	if err := e.SetPolicy(slow); err != nil {
		t.Fatal(err)
	}
	if d := mustDecide(t, e, now.Add(time.Millisecond), Request{Tenant: "a", Endpoint: "x"}); d.Allow {
		t.Fatalf("the drained bucket admitted: %+v", d)
	}
	key := keyspace.PlanePrefix(slow.ID()).Tenant(keyspace.Holder("a"), false)
	ttl, err := client.PTTL(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl < 90*time.Second { // 100 tokens at 1/s
		t.Fatalf("the bucket expires in %s, before it is full at the new rate", ttl)
	}
	raw, err := client.Get(context.Background(), key).Bytes()
	if err != nil || len(raw) != 32 || binary.LittleEndian.Uint64(raw[24:]) != 1 {
		t.Fatalf("the bucket was not written back with the new rate: %x, %v", raw, err)
	}
}

// A limit that never refills must not leave a key forever for every holder
// requests name.
func TestCentralNoRefillKeysExpire(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	p := policytest.Compile(t, withMode(planeHeader, "central")+"  global: {rate: 1000, burst: 1000}\n  tiers: [{name: t, weight: 1, key: {rate: 0, burst: 5}}]\n")
	e := centralEngine(t, p, client, "n1", slowMachine)
	if _, err := e.Decide(context.Background(), Request{Tenant: "a", Endpoint: "x", APIKey: "random-1"}); err != nil {
		t.Fatal(err)
	}
	ttl, err := client.PTTL(context.Background(), keyspace.PlanePrefix(p.ID()).Key(keyspace.Holder("a"), keyspace.KeyDigest("random-1"), false)).Result()
	if err != nil || ttl <= 0 || ttl > 8*24*time.Hour {
		t.Fatalf("a no-refill bucket's expiry is %s (%v), want a week", ttl, err)
	}
}

// What a local-reconciled node admits while a push is unconfirmed must be
// pushed later, not dropped.
func TestReconciledPushesAfterFailure(t *testing.T) {
	srv := redistest.Start(t)
	// Reconciles only when the test says; refills 1 token a second, so that
	// the level the test reads does not move while a loaded machine runs it.
	p := policytest.Compile(t, withMode(planeHeader, "local-reconciled", "reconcileInterval: 1h")+
		"  global: {rate: 1, burst: 1000}\n  fairness: none\n  tiers: [{name: t, weight: 1}]\n")
	e := newEngine(t, p, WithRedis(srv.Client()), WithNodeID("n1"), WithRedisTimeout(200*time.Millisecond))
	admit := func(n int64) {
		if d := mustDecide(t, e, time.Now(), Request{Tenant: "a", Endpoint: "x", Units: n}); !d.Allow {
			t.Fatalf("denied: %+v", d)
		}
	}
	admit(10)
	srv.Stop()
	e.reconciler.reconcile() // fails: the push of 10 stays pending
	admit(20)
	srv.Restart() // empty: the fleet's bucket is full again
	e.reconciler.reconcile()
	e.reconciler.reconcile()
	level := e.reconciler.stats.fleetLevel.Load() / 1_000_000
	if level > 1000-30 || level < 1000-40 {
		t.Fatalf("the fleet's level is %d tokens, want 1000 less the 30 admitted", level)
	}
	// BackendStatus reports it in tokens (the reconcile overage metric's source).
	if got := e.BackendStatus().FleetLevel; got > 1000-29 || got < 1000-40 { // the level refills at 1 token/s
		t.Fatalf("BackendStatus().FleetLevel = %v tokens, want 1000 less the 30 admitted", got)
	}
}

// A node id reused by a new process (a StatefulSet's pod) must have its
// pushes counted, not taken for retries of its predecessor's.
func TestReconciledNodeIDReused(t *testing.T) {
	srv := redistest.Start(t)
	// A limit that refills 1,000 tokens an hour: the 100 the second process
	// pushes show whole however slow the machine (at 1,000 a second, 14 ms
	// between the pushes under load hid 14 of them).
	p := policytest.Compile(t, withMode(planeHeader, "local-reconciled", "reconcileInterval: 1h")+
		"  global: {rate: 1000, burst: 1000, period: 1h}\n  fairness: none\n  tiers: [{name: t, weight: 1}]\n")
	var levels []int64
	for range 2 {
		e, err := New(p, WithRedis(srv.Client()), WithNodeID("pod-0"))
		if err != nil {
			t.Fatal(err)
		}
		if d := mustDecide(t, e, time.Now(), Request{Tenant: "a", Endpoint: "x", Units: 100}); !d.Allow {
			t.Fatalf("denied: %+v", d)
		}
		e.reconciler.reconcile()
		levels = append(levels, e.reconciler.stats.fleetLevel.Load()/1_000_000)
		e.Close()
	}
	if levels[1] > levels[0]-90 {
		t.Fatalf("fleet levels %v: the second process's push was not counted", levels)
	}
}

// A node that switches to local-reconciled with SetPolicy enforces its
// share at once, and what it admitted before is not pushed as if admitted
// in the new mode.
func TestReconciledModeSwitch(t *testing.T) {
	srv := redistest.Start(t)
	reconciled := reconciledPlane(t, 1000, time.Hour)
	other := newEngine(t, reconciled, WithRedis(srv.Client()), WithNodeID("n0"))
	local := policytest.Compile(t, planeHeader+"  global: {rate: 1000, burst: 1000}\n  fairness: none\n  tiers: [{name: t, weight: 1}]\n")
	e := newEngine(t, local, WithRedis(srv.Client()), WithNodeID("n1"))
	if d := mustDecide(t, e, time.Now(), Request{Tenant: "a", Endpoint: "x", Units: 500}); !d.Allow {
		t.Fatalf("denied: %+v", d)
	}
	if err := e.SetPolicy(reconciled); err != nil {
		t.Fatal(err)
	}
	if got := e.snap.Load().global.Rate; got != 500 {
		t.Fatalf("after the switch the node enforces a global rate of %d, want its half, 500", got)
	}
	other.reconciler.reconcile()
	if level := other.reconciler.stats.fleetLevel.Load() / 1_000_000; level < 990 {
		t.Fatalf("the fleet's level is %d: the node's admissions in mode local were pushed", level)
	}
}

// A batch whose callers all gave up must not leave the breaker probing: it
// would stay open for good, every decision by the failure mode.
func TestCentralBreakerNotStuckByAbandonedBatch(t *testing.T) {
	srv := redistest.Start(t)
	var nowUs atomic.Int64
	nowUs.Store(time.Now().UnixMicro())
	clock := func() time.Time { return time.UnixMicro(nowUs.Load()) }
	p := policytest.Compile(t, withMode(planeHeader, "central")+"  global: {rate: 1000, burst: 1000}\n  tiers: [{name: t, weight: 1}]\n")
	e := centralEngine(t, p, srv.Client(), "n1", WithClock(clock), withBreakerCooldown(time.Second))
	b := e.central
	for range 3 {
		b.breaker.failure(nowUs.Load(), errRedisUnavailable)
	}
	nowUs.Add(2 * time.Second.Microseconds()) // the cooldown is over: a probe may go
	c, err := b.prepare(b.snap.Load(), nowUs.Load(), &Request{Tenant: "a", Endpoint: "x"})
	if err != nil {
		t.Fatal(err)
	}
	c.state.Store(callAbandoned)
	b.run(context.Background(), 0, []*centralCall{c}, &batchBuffers{})
	if b.breaker.blocked(nowUs.Load()) {
		t.Fatal("an abandoned batch left the breaker probing")
	}
	d, err := e.Decide(context.Background(), Request{Tenant: "a", Endpoint: "x"})
	if err != nil || !d.Allow || e.BackendStatus().ScriptCalls == 0 {
		t.Fatalf("after the cooldown the probe should reach Redis: %+v, %v, %+v", d, err, e.BackendStatus())
	}
	poll.Until(t, 5*time.Second, "the breaker to close after the recovery", func() bool { return !e.BackendStatus().Degraded })
}

// A tenant whose demand here went to zero while its fleet figure is fresh,
// in a tier with no pacing, must not get a NaN fair share.
func TestShareRateWithoutDemand(t *testing.T) {
	var f fairness
	ts := &tenantState{rec: &tenantRecord{tenant: policy.Tenant{Weight: 3}}}
	ts.setPart(0)
	f.levelBits[0].Store(math.Float64bits(math.Inf(1)))
	if r := f.shareRate(ts); !math.IsInf(r, 1) {
		t.Fatalf("share rate %v, want +Inf (no pacing)", r)
	}
}

// A probe that Redis answers with an error (a restarted Redis answers
// LOADING, say) must not leave the breaker probing: nothing moved it out of
// that state, so the node decided by its failure mode for good, its local
// admissions never debited from the fleet's buckets.
func TestCentralBreakerNotStuckByErrorProbe(t *testing.T) {
	var b breaker
	b.init(3, time.Second)
	now := time.Now().UnixMicro()
	for range 3 {
		b.failure(now, errRedisUnavailable)
	}
	now += 2 * time.Second.Microseconds()
	if !b.allow(now) {
		t.Fatal("after the cooldown the breaker lets no probe through")
	}
	b.probeFailed(now, errRedisUnavailable) // the probe got a Redis error reply
	if !b.blocked(now) {
		t.Fatal("the breaker closed on a probe that got an error")
	}
	now += 2 * time.Second.Microseconds()
	if b.blocked(now) || !b.allow(now) {
		t.Fatal("a probe answered with an error left the breaker probing: no probe goes after the next cooldown")
	}
	if !b.success() {
		t.Fatal("the second probe's success is not the recovery")
	}
	b.recoveryDone()
	if b.blocked(now) || b.open.Load() {
		t.Fatal("the breaker did not close after the recovery")
	}
}
