package enforcer

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

// DecideAll decides rs as one group, all or nothing: Envoy's rate limit
// service asks about several descriptors in one request, and quotaplane
// admits the request only if every one of them passes, debiting none of
// them otherwise (envoyproxy/ratelimit debits those that passed).
//
// len(ds) must be len(rs), between 1 and MaxGroup, or DecideAll returns an
// error wrapping ErrInvalidRequest. Every request is first validated and
// resolved (ValidateRequest; its api key bound to its tenant when the plane
// binds keys; its tenant and endpoint known or let through by the plane);
// the first that fails makes DecideAll return a *RequestError with its
// index, wrapping ErrInvalidRequest, ErrKeyNotBound, ErrUnknownEndpoint or
// ErrUnknownTenant, before anything is decided or debited. Then each
// request is decided in order, as if the earlier ones of the group had been
// admitted: two requests of one tenant need both costs at the tenant level,
// and at the global level. ds[i] is request i's decision on those terms
// (Allow for one that passes given the earlier ones). allowed is true when
// all of them pass, and then every level is debited as if each had been
// decided alone in that order; when one is denied, allowed is false and no
// bucket, window, pool, borrow allowance or share differs from what it
// would be had the group never arrived (but for being brought up to the
// group's time, as a denied request's are). Counters and traces count an
// admitted group's requests as admitted, a denied group's denied requests
// as denied, and trace the others as undone with their group.
//
// Two requests of a group that name one tenant must name one tier
// (Request.Tier, which an unknown tenant takes): a tenant has one set of
// limits at a time, and decided alone each request would move an unknown
// tenant to its own tier. Such a group is refused (ErrInvalidRequest).
//
// A group of one is Decide. A larger group never waits in the queueing
// modes (fairness wfq and drr): it gets its answer at once.
//
// Atomicity. In the local modes (local, local-reconciled, and central while
// its failureMode degrades) the group holds every one of its tenants' locks,
// taken in a canonical order, and the plane's, from its first evaluation to
// its commit or undo: no concurrent decision sees a group's tentative
// debits, so groups and single decisions are linearisable together, as
// single decisions are. In mode central, the script decides a group in one
// atomic call (decide.lua), so the same holds, but for a plane sharded over
// a Redis Cluster whose group spans shards: each shard decides its part
// atomically, and the parts that passed while another shard's did not are
// refunded afterwards; until the refund, a concurrent decision on those
// shards can see the tentative debit (and be denied because of it), and a
// refund the shard cannot take (Redis failing) leaves the debit in place,
// on the side of admitting less, never more (see doc.go).
func (e *Engine) DecideAll(ctx context.Context, rs []Request, ds []Decision) (allowed bool, err error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	if len(rs) == 1 && len(ds) == 1 {
		ds[0], err = e.Decide(ctx, rs[0])
		return ds[0].Allow && err == nil, asRequestError(err)
	}
	return e.decideAll(ctx, 0, rs, ds)
}

// DecideAllAt is DecideAll at a given time (tests, virtual time), as
// DecideAt is to Decide: it never waits and is deterministic, and in mode
// central the script decides at now instead of Redis TIME.
func (e *Engine) DecideAllAt(now time.Time, rs []Request, ds []Decision) (allowed bool, err error) {
	if len(rs) == 1 && len(ds) == 1 {
		ds[0], err = e.DecideAt(now, rs[0])
		return ds[0].Allow && err == nil, asRequestError(err)
	}
	return e.decideAll(context.Background(), now.UnixMicro(), rs, ds)
}

// oneTierPerTenant refuses a group in which two requests name one tenant
// with two tiers: see DecideAll. Groups are small (MaxGroup), so a scan of
// the pairs costs less than a map.
func oneTierPerTenant(rs []Request) error {
	for j := 1; j < len(rs); j++ {
		for i := range j {
			if rs[i].Tenant == rs[j].Tenant && rs[i].Tier != rs[j].Tier {
				return &RequestError{Index: j, Err: fmt.Errorf("%w: request %d names its tenant with tier %q, request %d with tier %q; one tenant has one tier in a group",
					ErrInvalidRequest, i, rs[i].Tier, j, rs[j].Tier)}
			}
		}
	}
	return nil
}

// decideAll decides a group at now (µs), or at the engine's clock (and in
// central mode at Redis TIME, batched) when now is 0.
func (e *Engine) decideAll(ctx context.Context, now int64, rs []Request, ds []Decision) (bool, error) {
	if len(rs) == 0 || len(rs) > MaxGroup || len(ds) != len(rs) {
		return false, fmt.Errorf("%w: a group holds 1 to %d requests and as many decisions; got %d requests and %d decisions",
			ErrInvalidRequest, MaxGroup, len(rs), len(ds))
	}
	if e.closed.Load() {
		return false, ErrClosed
	}
	if err := oneTierPerTenant(rs); err != nil {
		return false, err
	}
	var gg gatedGroup
	gateNow := now
	if gateNow == 0 {
		gateNow = e.clock()
	}
	if !e.takeGroup(rs, ds, gateNow, &gg) {
		return false, nil
	}
	allowed, err := e.decideAllUngated(ctx, now, rs, ds)
	e.settleGroup(rs, ds, &gg, allowed, err)
	return allowed, err
}

// decideAllUngated is decideAll without the upstream gate.
func (e *Engine) decideAllUngated(ctx context.Context, now int64, rs []Request, ds []Decision) (bool, error) {
	if c := e.central; c != nil {
		if snap := c.snap.Load(); snap != nil {
			return c.decideAll(ctx, snap, now, rs, ds)
		}
	}
	if now == 0 {
		now = e.clock()
		if e.fair.claimTick(now, e.settings.tickInterval) {
			e.ticks.Go(func() { e.tick(now) }) // in real time, off the request's path
		}
	} else if e.fair.claimTick(now, e.settings.tickInterval) {
		e.tick(now) // in the caller's time, so that virtual time is exact
	}
	return e.decideAllLocal(now, rs, ds)
}

// asRequestError makes the error of a group of one's request (from Decide)
// a *RequestError; the context's errors and ErrClosed stay as they are.
func asRequestError(err error) error {
	if err != nil && (errors.Is(err, ErrInvalidRequest) || errors.Is(err, ErrKeyNotBound) ||
		errors.Is(err, ErrUnknownEndpoint) || errors.Is(err, ErrUnknownTenant)) {
		return &RequestError{Index: 0, Err: err}
	}
	return err
}

// group is a DecideAll in progress on the engine's own state. Its buffers
// are reused (groupPool): a group allocates nothing once warm.
type group struct {
	// Per request: its tenant's state, endpoint index and cost.
	states [MaxGroup]*tenantState
	ep     [MaxGroup]int
	cost   [MaxGroup]int64
	// locked are the distinct tenant states, in lock order, each with the
	// first request that names it (whose tier an unknown tenant takes).
	locked []groupTenant
	// undo notes every debit, in order, to be undone in reverse.
	undo []undoEntry
}

type groupTenant struct {
	ts    *tenantState
	first int
}

// undoEntry is one debit: of a limiter (a bucket's level before it, or a
// window's newest entry), or of a share bucket (its level before).
type undoEntry struct {
	lim   *limiter
	level int64
	used  int64
	share *shareBucket
	fill  float64
}

var groupPool = sync.Pool{New: func() any {
	return &group{locked: make([]groupTenant, 0, MaxGroup), undo: make([]undoEntry, 0, 8*MaxGroup)}
}}

// take debits cost from l, noting it when g is a group; g may be nil.
func (g *group) take(l *limiter, cost, now int64) {
	if g != nil {
		used, _ := l.counters()
		g.undo = append(g.undo, undoEntry{lim: l, level: l.level, used: used})
	}
	l.take(cost, now)
}

// takeShare debits cost from a paced tenant's share bucket.
func (g *group) takeShare(s *shareBucket, cost float64) {
	if g != nil {
		g.undo = append(g.undo, undoEntry{share: s, fill: s.level})
	}
	s.level -= cost
}

// undoLocked takes back every debit, newest first: a bucket gets its level
// back exactly, a window loses the entry the debit added (the newest, since
// every lock is held), a share bucket its level.
func (g *group) undoLocked() {
	for i := len(g.undo) - 1; i >= 0; i-- {
		u := &g.undo[i]
		switch {
		case u.share != nil:
			u.share.level = u.fill
		case u.lim.window() != nil:
			u.lim.window().removeNewest()
			u.lim.undo(u.lim.level, u.used)
		default:
			u.lim.undo(u.level, u.used)
		}
	}
}

func (g *group) release() {
	clear(g.states[:])
	clear(g.locked)
	clear(g.undo)
	g.locked, g.undo = g.locked[:0], g.undo[:0]
	groupPool.Put(g)
}

// reasonGroupUndone is the trace's reason for a request of a denied group
// that passed on its own terms: nothing was debited.
const reasonGroupUndone = "another request of its group was denied: the group was not admitted"

// decideAllLocal decides a group on the engine's own state at now: every
// request resolved first; then its tenants' locks taken in the order of
// their ids and the plane's lock, held until the group is committed or
// undone.
func (e *Engine) decideAllLocal(now int64, rs []Request, ds []Decision) (bool, error) {
	g := groupPool.Get().(*group)
	defer g.release()
	var snap *snapshot
	var groupHybrid *hybridCall
	for {
		snap = e.snap.Load()
		for i := range rs {
			ep, cost, err := snap.resolve(&rs[i], false)
			if err != nil {
				return false, &RequestError{Index: i, Err: err}
			}
			g.ep[i], g.cost[i] = ep, cost
		}
		if snap.reconciled && e.reconciler.degraded.Load() && snap.failureMode != policy.FailureDegrade {
			allowed := true // the failureMode decides the whole group
			for i := range rs {
				e.reconciler.failOver(snap, g.cost[i], &ds[i])
				allowed = allowed && ds[i].Allow
			}
			return allowed, nil
		}
		var hc *hybridCall // the group's small limits, decided in Redis first
		if slices.Max(g.cost[:len(rs)]) >= snap.smallCost {
			var admitted bool
			var err error
			hc, admitted, err = e.hybridDecide(snap, now, rs, g.ep[:len(rs)], g.cost[:len(rs)], ds)
			switch {
			case hc == nil:
			case err != nil && snap.failureMode == policy.FailureDeny:
				for i := range rs {
					ds[i] = unavailableDenial(snap, g.cost[i])
				}
				return false, nil
			case err != nil:
				hc = nil // allow, degrade: the node's own levels decide
			case !admitted:
				for i := range ds[:len(rs)] {
					if ds[i].Level == LevelNone {
						ds[i] = Decision{Allow: true, Cost: g.cost[i], policy: snap.plane} // passed its small levels; not decided further
					}
				}
				return false, nil
			}
		}
		g.locked = g.locked[:0]
		for i := range rs {
			ts := snap.known[rs[i].Tenant]
			if ts == nil {
				ts = e.tenants.getOrCreate(rs[i].Tenant, rs[i].Tier, e.settings.maxTenants+len(snap.known))
			}
			g.states[i] = ts
			if !g.holds(ts) {
				g.locked = append(g.locked, groupTenant{ts: ts, first: i})
			}
		}
		slices.SortFunc(g.locked, func(a, b groupTenant) int { return cmp.Compare(a.ts.id, b.ts.id) })
		if e.lockGroup(snap, g) {
			groupHybrid = hc
			break
		}
		if hc != nil {
			e.hybridRefund(hc)
		}
	}
	allowed := func() bool {
		defer g.unlockTenants() // also if a decision panics: no tenant stays locked
		return e.decideGroupLocked(snap, now, rs, ds, g)
	}()
	if groupHybrid != nil && !allowed {
		e.hybridRefund(groupHybrid)
	}
	return allowed, nil
}

func (g *group) holds(ts *tenantState) bool {
	for _, l := range g.locked {
		if l.ts == ts {
			return true
		}
	}
	return false
}

// lockGroup locks the group's tenants in order; it reports false, with
// none locked, when one was pruned or a policy swapped in meanwhile (the
// group starts over, as decideOpts does).
func (e *Engine) lockGroup(snap *snapshot, g *group) bool {
	for i, l := range g.locked {
		l.ts.mu.Lock()
		if l.ts.removed || e.snap.Load() != snap {
			for j := i; j >= 0; j-- {
				g.locked[j].ts.mu.Unlock()
			}
			return false
		}
	}
	return true
}

func (g *group) unlockTenants() {
	for i := len(g.locked) - 1; i >= 0; i-- {
		g.locked[i].ts.mu.Unlock()
	}
}

// decideGroupLocked decides the group with its tenants locked: under
// plane.mu, each request in order with its debits noted, then all of them
// undone unless every one passed; then each request is counted and traced.
func (e *Engine) decideGroupLocked(snap *snapshot, now int64, rs []Request, ds []Decision, g *group) bool {
	for _, l := range g.locked {
		e.bringLocked(snap, l.ts, &rs[l.first], now)
	}
	pl := &e.plane
	allowed := true
	func() {
		pl.mu.Lock()
		defer pl.mu.Unlock()
		admitted := pl.admitted
		for i := range rs {
			e.decideLocked(snap, g.states[i], g.ep[i], g.cost[i], rs[i].APIKey, now, arrival, &ds[i], g)
			allowed = allowed && ds[i].Allow
		}
		if !allowed {
			g.undoLocked()
			pl.admitted = admitted // what local-reconciled pushes: only what stays admitted
		}
	}()
	for i := range rs {
		var endpoint *policy.Endpoint
		if g.ep[i] >= 0 {
			endpoint = &snap.endpoints[g.ep[i]]
		}
		g.states[i].recordGroupLocked(now, &ds[i], rs[i].APIKey, endpoint, allowed)
	}
	return allowed
}
