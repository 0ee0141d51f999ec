package enforcer

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

// Engine decides requests against one plane's policy. It is safe for
// concurrent use. Its state lives in memory (mode local); the distributed
// backends build on it.
//
// Lock order: the reconciler's mu, then the fairness tick's mu, then swapMu
// (policy swaps, pruning), then tenants' mu (one, but a DecideAll's group
// takes each of its tenants' in the order of their ids: tenantState.id),
// then plane.mu (after the tenants' when both are held: decideLocked and
// DecideAll), then a registry shard's mu.
type Engine struct {
	// policy is the policy in force; snap is what the engine's own state
	// enforces: the policy itself in mode local, this node's share of it in
	// the distributed modes (policy.Share).
	policy atomic.Pointer[policy.Policy]
	snap   atomic.Pointer[snapshot]
	swapMu sync.Mutex // serialises SetPolicy with itself and with pruning
	// swapScratch holds tenant states while a swap or a prune (both under
	// swapMu) goes through them.
	swapScratch []*tenantState
	tenants     registry
	keys        keyBudget
	plane       planeState
	fair        fairness
	queue       queue
	clock       func() int64 // µs since the Unix epoch
	coarse      *coarseClock // the default clock; nil with WithClock
	closed      atomic.Bool
	ticks       sync.WaitGroup // ticks started by Decide, which Close waits for
	settings    settings

	logger     *slog.Logger
	redis      redis.UniversalClient // nil: mode local only
	redisCalls func(time.Duration)   // WithRedisObserver; nil: none
	nodeID     string
	central    *central    // with redis
	reconciler *reconciler // with redis
	gate       gate        // degraded upstreams (upstream.go), with redis
}

// planeState is the state shared by every tenant: the global bucket and the
// burst pool. mu guards all of it.
type planeState struct {
	mu     sync.Mutex
	snap   *snapshot
	global limiter
	pool   limiter
	// offered and admitted count the cost of arrivals that passed the
	// levels below global, and of those admitted: the node's demand and
	// consumption, which local-reconciled mode pushes to the fleet.
	offered, admitted int64
}

// settings are the engine's bounds and tunings: the Options set some, the
// rest are the defaults New gives, which tests reach through the unexported
// options.
type settings struct {
	maxTenants   int
	maxKeys      int
	maxKeysTotal int
	idleTTL      time.Duration
	tickInterval time.Duration
	// demandWindow is the shortest time constant of the moving average
	// that measures a tenant's demand: a busy tenant's. A tenant's window
	// is long enough to hold 256 of its arrivals, up to 16 s, so that a
	// trickle is not mistaken for silence (measureDemand).
	demandWindow time.Duration
	// headroom is a fraction of the global rate that fair shares leave
	// unallocated under contention, on top of what refillBias holds back.
	headroom float64
	// shareBurst is how much of its fair share a tenant may spend at once
	// under contention, as a duration of its share rate, and at least 8 of
	// the plane's cheapest requests.
	shareBurst     time.Duration
	clockPrecision time.Duration // the coarse clock's resolution
	queueWait      time.Duration
	maxQueue       int

	redisTimeout time.Duration
	batchSize    int
	// batchWindow is how long a batch waits for more decisions before its
	// script call: 0, a batch takes what queued while the previous call
	// was in flight, which adds no latency when the load is light.
	batchWindow       time.Duration
	batchQueue        int
	redisConcurrency  int
	breakerThreshold  int
	breakerCooldown   time.Duration
	heartbeatInterval time.Duration
	// steppedReconcile: the caller runs local-reconciled's reconciles at
	// the engine's clock (withSteppedReconcile, sim.go); no background
	// loop runs.
	steppedReconcile bool
}

// Option configures an Engine.
type Option func(*Engine)

// WithClock replaces the engine's coarse clock (used by Decide) with now.
func WithClock(now func() time.Time) Option {
	return func(e *Engine) { e.clock = func() int64 { return now().UnixMicro() } }
}

// WithMaxTenants bounds the tenants the engine keeps state for, beyond those
// the policy names (default 1,000,000: about 240 MB). Unknown tenants
// beyond it share one state.
func WithMaxTenants(n int) Option { return func(e *Engine) { e.settings.maxTenants = n } }

// WithMaxKeysPerTenant bounds the api keys with state per tenant (default
// 10,000). Keys beyond it share one limiter.
func WithMaxKeysPerTenant(n int) Option { return func(e *Engine) { e.settings.maxKeys = n } }

// WithMaxKeys bounds the api keys with state across all tenants (default
// 1,000,000: about 80 MB); beyond it new keys share their tenant's
// overflow limiter.
func WithMaxKeys(n int) Option { return func(e *Engine) { e.settings.maxKeysTotal = n } }

// StateBounds sizes WithMaxTenants and WithMaxKeys to a memory budget of
// memoryBytes (a container's limit): half of it for tenant states, at
// TenantStateBytes a tenant with two api keys of KeyStateBytes each, at
// least 1,000 tenants. A 256 MiB enforcer keeps 335,000 tenants and
// 671,000 keys; 1 GiB, 1,342,000 and 2,684,000.
func StateBounds(memoryBytes int64) (tenants, keys int) {
	tenants = max(int(memoryBytes/2/(TenantStateBytes+2*KeyStateBytes)), 1_000)
	return tenants, 2 * tenants
}

// TenantStateBytes and KeyStateBytes are what the engine keeps for a
// tenant and for an api key, rounded up from BenchmarkTenantMemory (a
// million tenants: 232 and 80 bytes; a tenant's includes the fairness
// tick's 40 bytes of scratch per tenant).
const (
	TenantStateBytes = 240
	KeyStateBytes    = 80
)

// WithIdleTTL sets how long an unknown tenant or an api key stays idle before
// its state may be forgotten (default 1 minute). State is forgotten only when
// it is as a fresh one would be, so forgetting never changes a decision.
func WithIdleTTL(d time.Duration) Option { return func(e *Engine) { e.settings.idleTTL = d } }

// withFairnessInterval sets how often demand is measured and contended
// capacity reallocated, in the engine's (possibly virtual) time (default 100ms).
func withFairnessInterval(d time.Duration) Option {
	return func(e *Engine) { e.settings.tickInterval = d }
}

// withQueueWait sets how long Decide may hold a request that is denied at
// the contended global level in the queueing modes (fairness wfq and drr),
// waiting for its turn (default 50ms; 0 disables waiting).
func withQueueWait(d time.Duration) Option { return func(e *Engine) { e.settings.queueWait = d } }

// withMaxQueue bounds the requests waiting in the queueing modes (default
// 10,000); beyond it a request gets its denial at once.
func withMaxQueue(n int) Option { return func(e *Engine) { e.settings.maxQueue = n } }

// WithRedis gives the engine its Redis, which the distributed modes
// (central, local-reconciled) need. The engine does not close it. Build it
// with ContextTimeoutEnabled: go-redis otherwise ignores the engine's
// deadlines on the socket, and a Redis that stops answering holds the
// engine's workers for the client's ReadTimeout (decisions still answer
// within WithRedisTimeout, by the plane's failureMode).
func WithRedis(c redis.UniversalClient) Option { return func(e *Engine) { e.redis = c } }

// WithRedisObserver has observe called with the duration of every call the
// engine makes to Redis on a decision's behalf or to reconcile (a script
// call, or a pipeline of them): for a latency histogram.
func WithRedisObserver(observe func(time.Duration)) Option {
	return func(e *Engine) { e.redisCalls = observe }
}

func (e *Engine) observeRedis(d time.Duration) {
	if e.redisCalls != nil {
		e.redisCalls(d)
	}
}

// WithNodeID names this engine in its fleet (default: host name and a random
// suffix). Engines in one process with distinct ids act as separate nodes.
func WithNodeID(id string) Option { return func(e *Engine) { e.nodeID = id } }

// WithLogger sets where the engine logs what an operator must know: the
// distributed backends entering and leaving degraded operation (default
// slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(e *Engine) { e.logger = l } }

// WithRedisTimeout sets the deadline of one decision's trip through Redis
// (default 50ms); past it, the plane's failureMode decides.
func WithRedisTimeout(d time.Duration) Option { return func(e *Engine) { e.settings.redisTimeout = d } }

// withBatchSize bounds how many decisions share one script call in central
// mode (default 128).
func withBatchSize(n int) Option { return func(e *Engine) { e.settings.batchSize = n } }

// withRedisConcurrency sets how many script calls may be in flight at once
// in central mode (default 2: one call in Redis while the next batch
// forms; more only shrink the batches).
func withRedisConcurrency(n int) Option { return func(e *Engine) { e.settings.redisConcurrency = n } }

// withBreakerCooldown sets how long the circuit breaker stays open after
// Redis fails before one call probes it again (default 1s).
func withBreakerCooldown(d time.Duration) Option {
	return func(e *Engine) { e.settings.breakerCooldown = d }
}

// withHeartbeatInterval sets how often a node reports itself alive in Redis
// (default 1s); a node that stops is counted out after three intervals.
func withHeartbeatInterval(d time.Duration) Option {
	return func(e *Engine) { e.settings.heartbeatInterval = d }
}

// New returns an engine enforcing p.
func New(p *policy.Policy, opts ...Option) (*Engine, error) {
	if p == nil {
		return nil, fmt.Errorf("enforcer: nil policy")
	}
	e := &Engine{settings: settings{
		maxTenants:     1_000_000,
		maxKeys:        10_000,
		maxKeysTotal:   1_000_000,
		idleTTL:        time.Minute,
		tickInterval:   100 * time.Millisecond,
		demandWindow:   500 * time.Millisecond,
		headroom:       0,
		shareBurst:     500 * time.Millisecond,
		clockPrecision: time.Millisecond,
		queueWait:      50 * time.Millisecond,
		maxQueue:       10_000,

		redisTimeout:      50 * time.Millisecond,
		batchSize:         128,
		batchQueue:        4096,
		redisConcurrency:  2,
		breakerThreshold:  3,
		breakerCooldown:   time.Second,
		heartbeatInterval: time.Second,
	}}
	for _, o := range opts {
		o(e)
	}
	s := e.settings
	if s.maxTenants < 1 || s.maxKeys < 1 || s.maxKeysTotal < 1 || s.idleTTL <= 0 || s.tickInterval <= 0 || s.demandWindow <= 0 ||
		s.headroom < 0 || s.headroom >= 1 || s.shareBurst <= 0 || s.clockPrecision <= 0 || s.queueWait < 0 || s.maxQueue < 0 ||
		s.redisTimeout <= 0 || s.batchSize < 1 || s.batchWindow < 0 || s.redisConcurrency < 1 || s.breakerCooldown <= 0 || s.heartbeatInterval <= 0 {
		return nil, fmt.Errorf("enforcer: invalid option: %+v", s)
	}
	if e.nodeID == "" {
		e.nodeID = defaultNodeID()
	}
	if e.logger == nil {
		e.logger = slog.Default()
	}
	if !policy.ValidName(e.nodeID) {
		return nil, fmt.Errorf("enforcer: node id %q: use printable ASCII without spaces, at most 256 characters", e.nodeID)
	}
	if err := e.checkBackend(p); err != nil {
		return nil, err
	}
	if e.clock == nil {
		e.coarse = newCoarseClock(s.clockPrecision)
		e.clock = e.coarse.now
	}
	e.tenants.init()
	e.keys.perTenant, e.keys.total = s.maxKeys, int64(s.maxKeysTotal)
	e.queue.init(s.maxQueue)
	if e.redis != nil {
		e.central = newCentral(e, e.redis)
		// Until a heartbeat counts the fleet, it is as large as the plane
		// asks for: a node that cannot reach Redis from the start must not
		// take itself for the whole fleet (fleet.count).
		e.central.fleet.nodes.Store(max(1, int64(p.Spec().Enforcer.MinReplicas)))
		e.central.breaker.onChange = func(open bool, err error) { e.degradedChanged(policy.ModeCentral, open, err) }
		e.reconciler = newReconciler(e)
	}
	if err := e.installLocked(p, 0); err != nil {
		e.Close()
		return nil, err
	}
	if e.central != nil {
		if p.Mode() == policy.ModeLocalReconciled {
			e.reconciler.reset()
			e.reconciler.reconcile()
		}
		e.central.start()
	}
	return e, nil
}

// Policy returns the policy in force.
func (e *Engine) Policy() *policy.Policy { return e.policy.Load() }

// SetPolicy puts p in force now; see SetPolicyAt.
func (e *Engine) SetPolicy(p *policy.Policy) error {
	return e.SetPolicyAt(time.UnixMicro(e.clock()), p)
}

// SetPolicyAt puts p in force at now. Bucket state is kept for every tenant,
// endpoint and key that still exists: tokens are settled at the old rate up
// to now and carried over, capped by the new burst, and refill runs at the
// new rate from now on. Every state moves to p before SetPolicyAt returns
// (O(tenants); swaps are rare); a decision dated before now moves its tenant
// at the decision's own time instead.
func (e *Engine) SetPolicyAt(now time.Time, p *policy.Policy) error {
	if p == nil {
		return fmt.Errorf("enforcer: nil policy")
	}
	if err := e.checkBackend(p); err != nil {
		return err
	}
	switching := e.reconciler != nil && e.policy.Load().Mode() != policy.ModeLocalReconciled && p.Mode() == policy.ModeLocalReconciled
	if switching {
		// Before the loop can see the new mode, and outside swapMu: the
		// reconciler's lock comes before it (reconcile reshares).
		e.reconciler.reset()
	}
	e.swapMu.Lock()
	err := e.installLocked(p, now.UnixMicro())
	e.swapMu.Unlock()
	if err == nil {
		e.runLoops(false) // outside swapMu: a stopping loop may reshare
	}
	if err == nil && switching {
		// After the old mode's loops left the fleet (the fleet's members
		// are one set in both modes); outside swapMu: it may reshare.
		e.reconciler.reconcile()
	}
	return err
}

// installLocked puts p in force: its snapshot for the central backend, and
// this node's share of it for the engine's own state. swapMu is held (or
// the engine is new).
func (e *Engine) installLocked(p *policy.Policy, now int64) error {
	local, err := e.localPolicy(p)
	if err != nil {
		return err
	}
	if e.central != nil {
		var full *snapshot
		if p.Mode() == policy.ModeCentral {
			full = newSnapshot(p)
		}
		e.central.snap.Store(full)
	}
	e.policy.Store(p)
	e.installLocalLocked(local, now)
	return nil
}

// reshare installs this node's share of the policy in force again, after the
// fleet's size changed.
func (e *Engine) reshare() {
	e.swapMu.Lock()
	defer e.swapMu.Unlock()
	if local, err := e.localPolicy(e.policy.Load()); err == nil {
		e.installLocalLocked(local, e.clock())
	}
}

// localPolicy is what this node enforces on its own of p: all of it in mode
// local; in the distributed modes, its share of every limit among the live
// nodes (policy.Share), which central mode enforces while Redis is
// unavailable; local-reconciled mode always, at the share its reconcile
// loop sizes by demand.
func (e *Engine) localPolicy(p *policy.Policy) (*policy.Policy, error) {
	switch mode := p.Mode(); {
	case e.central == nil || mode == policy.ModeLocal:
		return p, nil
	case mode == policy.ModeLocalReconciled:
		return p.SharePlane(e.reconciler.fraction())
	}
	return p.Share(1 / float64(e.central.fleet.nodes.Load()))
}

// checkBackend rejects a policy whose mode the engine cannot run.
func (e *Engine) checkBackend(p *policy.Policy) error {
	switch mode := p.Mode(); {
	case mode == policy.ModeLocal:
	case e.redis == nil:
		return fmt.Errorf("enforcer: plane %s has mode %s, which needs Redis: give the engine one with WithRedis", p.Plane(), mode)
	}
	return nil
}

// installLocalLocked makes p the snapshot the engine's own state enforces.
func (e *Engine) installLocalLocked(p *policy.Policy, now int64) {
	s := newSnapshot(p)
	if whole := e.policy.Load(); whole != nil {
		s.plane = whole // p may hold this node's share of it
	}
	if e.reconciler != nil && p.Mode() == policy.ModeLocalReconciled {
		nodes := max(e.central.fleet.nodes.Load(), 1)
		s.reconciled, s.part = true, 1/float64(nodes)
		if !e.reconciler.degraded.Load() {
			s.splitOver = nodes
			s.smallCost = s.smallFrom()
		}
	}
	old := e.snap.Load()
	if old != nil {
		s.seq, s.installedAt = old.seq+1, now
	}
	// The map's keys share one string: a lookup compares the key's bytes,
	// and 10,000 names in a few pages stay in cache where 10,000 small
	// allocations spread over the heap do not.
	tenants := p.Spec().Tenants
	var all strings.Builder
	for _, t := range tenants {
		all.WriteString(t.Name)
	}
	names := all.String()
	for _, t := range tenants {
		var name string
		name, names = names[:len(t.Name)], names[len(t.Name):]
		s.known[name] = e.tenants.getOrCreate(name, "", 0)
	}
	e.snap.Store(s)
	if old == nil {
		return
	}
	// Move every state to s now, at its time: each swap's limits then hold
	// exactly from its time to the next swap's, however long a tenant stays
	// idle. A decision that loaded the old snapshot starts over (decideOpts).
	// Fair shares, computed for the old tiers, lapse (fairness.levelsSeq).
	pl := &e.plane
	pl.mu.Lock()
	if pl.snap != nil {
		pl.syncLocked(s, now)
	}
	pl.mu.Unlock()
	e.swapScratch = e.tenants.appendAll(e.swapScratch[:0])
	for _, ts := range e.swapScratch {
		ts.mu.Lock()
		if ts.snap != nil && ts.snap != s && !ts.removed {
			ts.syncLocked(s, now, &e.keys)
		}
		ts.mu.Unlock()
	}
	clear(e.swapScratch)
}

// Close stops the engine's background goroutines. Decide fails after Close.
func (e *Engine) Close() error {
	if e.closed.Swap(true) {
		return nil
	}
	q := &e.queue
	q.mu.Lock()
	started := q.started
	q.started = true // no dispatcher starts after Close
	q.mu.Unlock()
	close(q.stop)
	if started {
		<-q.done
	}
	e.ticks.Wait() // a tick Decide started
	if e.central != nil {
		e.central.close()
	}
	if e.coarse != nil {
		e.coarse.close()
	}
	return nil
}

// Decide decides r now. In the queueing modes (fairness wfq and drr) a
// request denied at the contended global level may wait up to the queue wait
// for its turn (see queue.go); otherwise it never waits. It honours ctx.
func (e *Engine) Decide(ctx context.Context, r Request) (d Decision, err error) {
	err = e.decideGated(ctx, &r, &d) // small enough to inline: the caller's Decision is filled in place
	return d, err
}

// decideGated is Decide into d.
func (e *Engine) decideGated(ctx context.Context, r *Request, d *Decision) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if e.closed.Load() {
		return ErrClosed
	}
	gp, gu, class, cost := e.route(r)
	if gp == nil {
		return e.decideNow(ctx, r, d)
	}
	if !gp.take(gu, class, cost, e.clock(), d) {
		return nil
	}
	err := e.decideNow(ctx, r, d)
	gu.settle(class, cost, d, err)
	return err
}

// decideNow is Decide without the upstream gate.
func (e *Engine) decideNow(ctx context.Context, r *Request, d *Decision) error {
	if c := e.central; c != nil {
		if snap := c.snap.Load(); snap != nil {
			return c.decide(ctx, snap, 0, r, d)
		}
	}
	now := e.clock()
	if e.fair.claimTick(now, e.settings.tickInterval) {
		e.ticks.Go(func() { e.tick(now) }) // in real time, off the request's path
	}
	err := e.decideOpts(now, r, arrival, d)
	if err != nil || d.Allow || d.Level != LevelGlobal || e.settings.queueWait == 0 {
		return err
	}
	snap := e.snap.Load()
	if (snap.fairness != fairWFQ && snap.fairness != fairDRR) || !e.fair.contended.Load() {
		return nil
	}
	*d, err = e.wait(ctx, snap, *r, *d)
	return err
}

// DecideAt decides r at the given time. It never blocks on anything but
// short critical sections and is deterministic: the same requests at the same
// times give the same decisions, so simulations in virtual time are exact.
//
// In central mode the script decides at the given time instead of Redis
// TIME, alone rather than batched: for simulations and for tests that replay
// the Go engine. A fleet must not mix it with Decide, whose time is Redis's.
func (e *Engine) DecideAt(now time.Time, r Request) (d Decision, err error) {
	err = e.decideAtGated(now, &r, &d) // small enough to inline: filled in place
	return d, err
}

// decideAtGated is DecideAt into d.
func (e *Engine) decideAtGated(now time.Time, r *Request, d *Decision) error {
	nowUs := now.UnixMicro()
	gp, gu, class, cost := e.route(r)
	if gp == nil {
		return e.decideAt(nowUs, r, d)
	}
	if !gp.take(gu, class, cost, nowUs, d) {
		return nil
	}
	err := e.decideAt(nowUs, r, d)
	gu.settle(class, cost, d, err)
	return err
}

// decideAt is DecideAt without the upstream gate.
func (e *Engine) decideAt(nowUs int64, r *Request, d *Decision) error {
	if c := e.central; c != nil {
		if snap := c.snap.Load(); snap != nil {
			return c.decide(context.Background(), snap, nowUs, r, d)
		}
	}
	if e.fair.claimTick(nowUs, e.settings.tickInterval) {
		e.tick(nowUs) // in the caller's time, so that virtual time is exact
	}
	return e.decideOpts(nowUs, r, arrival, d)
}

// decideMode says how a decision comes about.
type decideMode uint8

const (
	// arrival is a request as it comes in.
	arrival decideMode = iota
	// fromQueue is the dispatcher trying a waiter again (queue.go): it skips
	// the fair-share pacing, which the queue's discipline replaces, is not
	// counted as demand again, and records nothing when denied at global
	// again, since the waiter goes on waiting.
	fromQueue
)

// decideOpts decides r into d (filled in place: a Decision is too big to
// copy through every call).
func (e *Engine) decideOpts(now int64, r *Request, mode decideMode, d *Decision) error {
	for {
		snap := e.snap.Load()
		ts := snap.known[r.Tenant]
		ep, cost, err := snap.resolve(r, ts != nil)
		if err != nil {
			return err
		}
		if ts == nil {
			ts = e.tenants.getOrCreate(r.Tenant, r.Tier, e.settings.maxTenants+len(snap.known))
		}
		if snap.reconciled && mode == arrival && e.reconciler.failOver(snap, cost, d) {
			return nil
		}
		var hc *hybridCall          // the small limits decided in Redis first
		if cost >= snap.smallCost { // perhaps too costly to split a limit over the nodes (hybrid.go), queued ones too
			var decided bool
			if hc, decided = e.decideSmall(snap, ts, r, ep, cost, now, d); decided {
				return nil
			}
		}
		ts.mu.Lock()
		// Pruned between lookup and lock (its replacement is in the
		// registry), or a policy swapped in since snap was loaded: a
		// tenant's state must never move back to an older policy.
		if ts.removed || e.snap.Load() != snap {
			ts.mu.Unlock()
			if hc != nil {
				e.hybridRefund(hc)
			}
			continue
		}
		e.decideAndUnlock(snap, ts, r, ep, cost, now, mode, d)
		if hc != nil && !d.Allow {
			e.hybridRefund(hc)
		}
		return nil
	}
}

// decideAndUnlock brings the tenant's state to snap, decides and releases
// ts.mu, also if something panics: one bad decision must not wedge a tenant.
func (e *Engine) decideAndUnlock(snap *snapshot, ts *tenantState, r *Request, ep int, cost, now int64, mode decideMode, d *Decision) {
	defer ts.mu.Unlock()
	e.bringLocked(snap, ts, r, now)
	e.decideLocked(snap, ts, ep, cost, r.APIKey, now, mode, d, nil)
}

// bringLocked brings the tenant's state to snap and, for a tenant the
// policy does not name, to the tier r asks for.
func (e *Engine) bringLocked(snap *snapshot, ts *tenantState, r *Request, now int64) {
	if ts.snap != snap {
		ts.syncLocked(snap, now, &e.keys)
	} else if !ts.known && r.Tier != ts.requestedTier() && ts.name != overflowName {
		// An unknown tenant's tier follows its requests (Request.Tier).
		ts.moreLocked().requestedTier = strings.Clone(r.Tier)
		ts.syncLocked(snap, now, &e.keys)
	}
}

// decideLocked decides with ts.mu held: it evaluates the levels below global
// on the tenant's own state, then the global level under plane.mu, and
// debits every level only when all of them pass, so a denied request consumes
// nothing anywhere.
//
// With a group (DecideAll), plane.mu is held by the caller for the whole
// group, every debit is noted in the group's undo log, and the decision is
// neither counted nor traced: the group's outcome decides how (see
// decideGroupLocked).
func (e *Engine) decideLocked(snap *snapshot, ts *tenantState, ep int, cost int64, apiKey string, now int64, mode decideMode, d *Decision, g *group) {
	ts.lastSeen = now
	counted := int64(0) // the cost a level's demand counts: arrivals only
	if mode == arrival {
		counted = cost
	}

	// Levels below global, in order; the first that cannot cover the cost is
	// where the request fails unless global fails first. A level too small
	// to split for this cost was decided in Redis (hybrid.go): it is not the
	// node's.
	var v verdict
	if l := &ts.limit; l.active() && !snap.small(l.limit(), cost) {
		v.tenant = l
		if !l.settleCovers(now, cost, counted) {
			v.lower, v.lowerLim, v.lowerReason = LevelTenant, l, snap.reason(reasonTenant, l.limit())
			v.borrowLocked(snap, ts, cost, now)
		}
	}
	if slot := ts.rec.endpointSlot(ep); v.lower == LevelNone && slot >= 0 {
		if l := ts.endpointLocked(slot, snap, now); l.active() && !snap.small(l.limit(), cost) {
			v.endpoint = l
			if !l.settleCovers(now, cost, counted) {
				v.lower, v.lowerLim, v.lowerReason = LevelEndpoint, l, snap.reason(reasonEndpoint, l.limit())
			}
		}
	}
	if v.lower == LevelNone && apiKey != "" {
		if key := ts.keyLocked(apiKey, snap, &e.keys, now); key != nil && key.limit.active() {
			key.lastSeen = now
			if l := &key.limit; !snap.small(l.limit(), cost) {
				v.key = l
				if !l.settleCovers(now, cost, counted) {
					v.lower, v.lowerLim, v.lowerReason = LevelKey, l, snap.reason(reasonAPIKey, l.limit())
				}
			}
		}
	}
	if v.lower == LevelNone && mode == arrival {
		ts.offered += cost
		ts.arrivals++
	}

	// The tenant's fair share, when the plane is contended; the queue's
	// discipline replaces it.
	v.contended = snap.fairness != fairNone && e.fair.contended.Load() && e.fair.levelsSeq.Load() == snap.seq
	if v.contended && mode == arrival {
		e.fairShareLocked(&v, snap, ts, cost, now)
	}
	e.globalLevel(&v, snap, ts, cost, now, mode, g)

	*d = Decision{Allow: v.allow, Cost: cost, policy: snap.plane}
	if mode == fromQueue && v.planeOK() {
		// The waiter's final outcome: its arrival was counted as a global
		// denial, which this outcome replaces.
		ts.moreLocked().denied[globalLevel]--
	}
	switch {
	case v.allow:
		v.debitLocked(ts, cost, now, g, d)
	case !v.planeOK() && mode == fromQueue:
		// The waiter goes on waiting: nothing to record.
		d.Level, d.Bound, d.RetryAfter = LevelGlobal, LevelGlobal, retryDuration(v.globalRetryUs)
		return
	case !v.planeOK():
		e.explainPlaneDenial(&v, snap, ts, cost, d)
	default:
		v.explainLowerDenial(snap, ts, cost, now, d)
	}
	if g != nil {
		return // counted and traced with the group's outcome
	}
	var endpoint *policy.Endpoint
	if ep >= 0 {
		endpoint = &snap.endpoints[ep]
	}
	ts.recordLocked(now, d, apiKey, endpoint)
}

// verdict is what the levels say of one request, filled by decideLocked in
// order: the levels below global, the fair share, the global level.
type verdict struct {
	// The levels below global: the first that cannot cover the cost
	// (LevelNone when all can), its limiter and the reason; the tenant's,
	// endpoint's and key's limiters to debit, nil where the level has no
	// limit or it is not the node's; and the loan the tenant takes from its
	// allowance and the burst pool.
	lower                 Level
	lowerLim              *limiter
	lowerReason           string
	tenant, endpoint, key *limiter
	borrow                int64

	// The tenant's fair share: contended, the plane is; paced, the share
	// bucket is in force for this request; overShare, it cannot cover the
	// cost.
	contended, paced, overShare bool
	shareRate, shareCap         float64

	// The global level, read under plane.mu: reserveDenied, its bucket
	// covers the cost but not above the reserve. pool is a copy of the
	// burst pool, for the wait of a tenant that may borrow.
	globalOK, reserveDenied bool
	globalRetryUs           int64
	globalTokens            tokenCount
	pool                    limiter

	allow bool
}

// planeOK reports whether the levels the tenant shares with the plane, the
// global level and its fair share of it, passed.
func (v *verdict) planeOK() bool { return v.globalOK && !v.overShare }

// borrowLocked lends a tenant whose own tokens cannot cover the cost the
// shortfall from its allowance, when it may borrow; the burst pool is asked
// with the global level (globalLevel).
func (v *verdict) borrowLocked(snap *snapshot, ts *tenantState, cost, now int64) {
	if !ts.rec.mayBorrow || v.tenant.never(cost) {
		return
	}
	short := v.tenant.shortfall(cost)
	allowance := ts.allowanceLocked()
	allowance.settle(now)
	if allowance.canCover(short) {
		v.lower, v.borrow = LevelNone, short
	} else {
		v.lowerReason = snap.reason(reasonTenantCeiling, ts.rec.tenant.Limit)
	}
}

// fairShareLocked settles the tenant's share bucket and asks it for the
// cost.
func (e *Engine) fairShareLocked(v *verdict, snap *snapshot, ts *tenantState, cost, now int64) {
	// A tier whose whole demand fits has an infinite level: no pacing.
	if v.shareRate = e.fair.shareRate(ts); math.IsInf(v.shareRate, 1) {
		return
	}
	v.paced = true
	v.shareCap = e.shareBurstTokens(v.shareRate, snap)
	share := &ts.moreLocked().share
	if share.last == 0 {
		share.start(e.fair.contendedSince.Load(), float64(snap.minCost))
	}
	share.settle(now, v.shareRate, v.shareCap)
	v.overShare = !share.covers(float64(cost), v.shareCap)
}

// globalLevel asks the global level and, for a loan, the burst pool under
// plane.mu (which it takes unless the caller holds it for a group), and
// debits both when every level passes: other tenants debit them too.
func (e *Engine) globalLevel(v *verdict, snap *snapshot, ts *tenantState, cost, now int64, mode decideMode, g *group) {
	pl := &e.plane
	if g == nil {
		pl.mu.Lock()
	}
	if pl.snap == nil || pl.snap.seq < snap.seq { // forward only: see decideOpts
		pl.syncLocked(snap, now)
	}
	glob := &pl.global
	glob.settle(now)
	if v.lower == LevelNone && mode == arrival {
		pl.offered += cost
	}
	var reserve int64
	switch {
	case snap.fairness == fairNone:
		reserve = snap.reserves[ts.rec.tierRank]
	case v.contended && (mode == fromQueue || math.Float64frombits(ts.demandBits.Load()) > v.shareRate):
		// A tenant that wants more than its share leaves the bottom of the
		// global bucket to those within theirs: the noise of a plane run at
		// exactly its limit then falls on the tenants that caused it.
		reserve = snap.contendedReserve
	}
	v.globalOK = glob.canCoverAbove(cost, reserve)
	if v.planeOK() && v.borrow > 0 {
		// The tenant level comes before endpoint and key: a dry pool fails
		// it whatever they say.
		pl.pool.settle(now)
		if !pl.pool.canCover(v.borrow) {
			v.lower, v.lowerLim, v.lowerReason = LevelTenant, &ts.limit, snap.reason(reasonTenantPoolDry, ts.rec.tenant.Limit)
		}
	}
	v.allow = v.planeOK() && v.lower == LevelNone
	switch {
	case v.allow:
		g.take(glob, cost, now)
		pl.admitted += cost
		if v.borrow > 0 {
			g.take(&pl.pool, v.borrow, now)
		}
	case !v.globalOK:
		v.globalRetryUs = glob.retryAboveUs(cost, reserve, now)
		v.reserveDenied = reserve > 0 && glob.canCover(cost)
	case !v.overShare && v.lower == LevelTenant && ts.rec.mayBorrow && pl.pool.active():
		pl.pool.settle(now)
		v.pool = pl.pool
	}
	v.globalTokens = glob.tokens() // other tenants debit it: read now, counted after
	if g == nil {
		pl.mu.Unlock()
	}
}

// debitLocked debits the tenant's own levels of an admitted request (global
// and the pool are debited under plane.mu) and tells what remains.
func (v *verdict) debitLocked(ts *tenantState, cost, now int64, g *group, d *Decision) {
	if v.tenant != nil && cost > v.borrow {
		g.take(v.tenant, cost-v.borrow, now)
	}
	if v.borrow > 0 {
		g.take(ts.more.allowance, v.borrow, now)
		d.Borrowed = v.borrow
	}
	if v.endpoint != nil {
		g.take(v.endpoint, cost, now)
	}
	if v.key != nil {
		g.take(v.key, cost, now)
	}
	if v.paced {
		g.takeShare(&ts.more.share, float64(cost))
	}
	// What remains at the tightest level: the levels are compared by their
	// float estimates against global's exact count, and only the tightest
	// is counted exactly too.
	global := v.globalTokens.exact()
	tightest, level := tokenCount{est: float64(global)}, LevelGlobal
	if v.tenant != nil {
		if t := v.tenant.tokens(); t.est < tightest.est {
			tightest, level = t, LevelTenant
		}
	}
	if v.endpoint != nil {
		if t := v.endpoint.tokens(); t.est < tightest.est {
			tightest, level = t, LevelEndpoint
		}
	}
	if v.key != nil {
		if t := v.key.tokens(); t.est < tightest.est {
			tightest, level = t, LevelKey
		}
	}
	d.Remaining, d.Bound = global, LevelGlobal
	if level != LevelGlobal {
		if r := tightest.exact(); r <= global {
			d.Remaining, d.Bound = r, level
		}
	}
}

// explainPlaneDenial fills a denial at the global level or at the tenant's
// fair share: why, and when to retry.
func (e *Engine) explainPlaneDenial(v *verdict, snap *snapshot, ts *tenantState, cost int64, d *Decision) {
	d.Level, d.Bound = LevelGlobal, LevelGlobal
	switch {
	case v.reserveDenied && snap.fairness == fairNone:
		d.Reason = reasonReserve
	case v.reserveDenied:
		d.Reason = reasonShareReserve
	case !v.globalOK:
		d.Reason = cmp.Or(neverReason(LevelGlobal, &snap.plane.Spec().Global, 0, cost), snap.reason(reasonGlobal, snap.global))
	default:
		d.Reason = reasonShare
	}
	wait := v.globalRetryUs
	if v.overShare {
		// Shares are computed again every tick: no longer than that.
		shareWait := min(ts.more.share.retryAfterUs(float64(cost), v.shareCap, v.shareRate), e.settings.tickInterval.Microseconds())
		wait = max(wait, shareWait)
	}
	d.RetryAfter = retryDuration(wait)
	d.Remaining = v.globalTokens.exact()
	e.fair.globalDenials.Add(1)
}

// explainLowerDenial fills a denial at a level below global: why, when to
// retry, and what remains there.
func (v *verdict) explainLowerDenial(snap *snapshot, ts *tenantState, cost, now int64, d *Decision) {
	d.Level, d.Bound, d.Reason = v.lower, v.lower, v.lowerReason
	if v.lowerLim.limit() != nil {
		// The limit this decision applies: the plane's, but while mode
		// central degrades the node's share of it, which is what holds
		// while it does.
		var extra int64
		if v.lower == LevelTenant {
			extra = snap.borrowExtra(ts.rec.mayBorrow)
		}
		d.Reason = cmp.Or(neverReason(v.lower, v.lowerLim.limit(), extra, cost), d.Reason)
	}
	wait := v.lowerLim.retryAfterUs(cost, now)
	if v.pool.active() {
		wait = borrowWaitUs(&ts.limit, ts.more.allowance, &v.pool, cost, now, wait)
	}
	d.RetryAfter = retryDuration(wait)
	d.Remaining = v.lowerLim.remaining()
}

// borrowWaitUs is the earliest wait after which a tenant that may borrow
// passes its level: its own tokens cover the cost, or cover it together with
// a loan that both its allowance and the pool can give. ownWaitUs, the wait
// for its own tokens alone, bounds it. Every term only grows with time, so
// the earliest µs is found by bisection on copies (denials only).
func borrowWaitUs(own, allowance, pool *limiter, cost, now, ownWaitUs int64) int64 {
	if own.never(cost) {
		return ownWaitUs
	}
	passes := func(wait int64) bool {
		at := now + wait
		mine := own.remainingAt(at)
		short := cost - mine
		return short <= 0 || allowance.remainingAt(at) >= short && pool.remainingAt(at) >= short
	}
	hi := min(ownWaitUs, int64(MaxRetryAfter/time.Microsecond))
	if !passes(hi) {
		return ownWaitUs
	}
	lo := int64(0) // passes(0) is false: the request was just denied
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		if passes(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi
}

func retryDuration(us int64) time.Duration {
	if us >= int64(MaxRetryAfter/time.Microsecond) {
		return MaxRetryAfter
	}
	return time.Duration(max(us, 1)) * time.Microsecond
}

func (pl *planeState) syncLocked(snap *snapshot, now int64) {
	now = snap.changeTime(now)
	pl.global.change(snap, snap.global, now)
	pl.pool.change(snap, snap.pool, now)
	pl.snap = snap
}

// shareBurstTokens is the size of a paced tenant's share bucket: shareBurst
// of its share, and at least shareMinRequests of the plane's cheapest
// request. The floor is for small shares: a bucket that holds one request
// of a tenant paced at a fraction of a token per second is full, and its
// refill wasted, whenever two of its arrivals come close together (its
// Poisson arrivals then get some 80% of its share). A floor counted in the
// costliest request instead would let such a tenant run far over its share
// for minutes whenever its bucket is full; requests costlier than the
// bucket holds are paced by debt (shareBucket.covers).
func (e *Engine) shareBurstTokens(rate float64, snap *snapshot) float64 {
	return max(rate*e.settings.shareBurst.Seconds(), shareMinRequests*float64(snap.minCost))
}

const shareMinRequests = 8
