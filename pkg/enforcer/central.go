package enforcer

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/lua"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// central is the central backend (mode central): every decision is made by
// decide.lua in Redis, where all levels of every node's requests meet.
// Concurrent decisions are coalesced into batches, one script call per batch
// and shard (batchLoop). When Redis fails or is slow, a circuit breaker
// opens and the plane's failureMode decides meanwhile (failure.go). It also
// owns what both distributed backends share: the client, the fleet's size
// and the background loops, which run only in their mode (modeLoops).
type central struct {
	e      *Engine
	client redis.UniversalClient
	// snap is the full policy's snapshot: limits and reasons for the script.
	// nil while the policy in force is not in central mode.
	snap atomic.Pointer[snapshot]

	batches chan *centralCall
	stop    chan struct{}
	workers sync.WaitGroup

	breaker breaker
	fleet   fleet
	journal journal
	shards  shards
	fair    centralFair
	loops   modeLoops

	stats centralStats
}

// centralStats count what the backend did; read with atomic loads.
type centralStats struct {
	calls, decisions, failures, degraded atomic.Int64
	// refunds counts the refund calls of groups split over shards
	// (refundSplitGroups), refundFailures those that failed.
	refunds, refundFailures atomic.Int64
}

// centralCall is one request on its way through the script.
type centralCall struct {
	snap      *snapshot
	tenant    *policy.Tenant   // the snapshot's record's
	endpoint  *policy.Endpoint // nil for an endpoint the plane does not name
	epLim     *policy.Limit
	keyLim    *policy.Limit
	cost      int64
	tierRank  int // for the reserve the request must leave in the global bucket
	mayBorrow bool
	shard     int // the shard that decides it (shards.go)
	// ts is the tenant's state on this node (known: the policy names
	// it), which record counts in; its name, the request's tenant or
	// overflowName beyond the node's bound on tenant states, names the
	// tenant's keys in Redis, as apiKey (the request's, or overflowName)
	// names its api key's.
	ts     *tenantState
	known  bool
	apiKey string
	// keys and limits of the tenant, borrow allowance, endpoint and api key
	// levels; a nil limit means the level has no limit. They are the
	// policy's, or a split tenant's part of them.
	keys   [4]string
	limits [4]*policy.Limit
	// share is the tenant's share bucket while the plane is contended
	// (central_fair.go); aboveShare says its fleet demand is above it.
	share      shareLevel
	aboveShare bool
	// timer is submit's deadline, kept with the call (stopped between
	// uses): a timer made per decision was two of its allocations.
	timer *time.Timer
	reply [lua.DecideReplyFields]int64
	at    int64 // µs: the time the script decided at (its reply's first value)
	err   error
	// members are the calls that go to Redis as one: the call itself (one
	// holds it), or a group's calls (DecideAll), this one first, which
	// the script decides all or nothing. The first call stands for all:
	// its done and state are the group's.
	members []*centralCall
	one     [1]*centralCall
	group   int64         // the members' group in the script call: 0 alone, else unique in the batch (split)
	done    chan struct{} // capacity 1: signalled when reply or err is set
	// state is callQueued until a worker sends the call (callSent) or its
	// caller stops waiting (callAbandoned), whichever comes first: a call
	// its caller gave up on, and got an answer from the failure mode for,
	// is not sent, so it is not counted twice.
	state atomic.Uint32
	// finished counts the two ends of a call that was sent: the worker
	// when Redis answered (or failed), and its caller when the failure mode
	// decided it, the caller having stopped waiting or got an error. The
	// second settles what the failure mode admitted (local) against
	// Redis's answer (settleLate).
	finished atomic.Int32
	local    localAdmission
}

const (
	callQueued uint32 = iota
	callSent
	callAbandoned
)

// errRedisUnavailable is what a decision gets while the breaker is open.
var errRedisUnavailable = errors.New("redis unavailable")

func newCentral(e *Engine, c redis.UniversalClient) *central {
	s := e.settings
	b := &central{
		e:       e,
		client:  c,
		batches: make(chan *centralCall, s.batchQueue),
		stop:    make(chan struct{}),
	}
	b.breaker.init(s.breakerThreshold, s.breakerCooldown)
	return b
}

// start starts the batch workers and the upstream gate's loop, which run
// for the engine's life, and the loops of the mode in force (modeLoops).
func (b *central) start() {
	if b.e.settings.steppedReconcile {
		return // a simulation runs the reconciles in its own time (sim.go)
	}
	for range b.e.settings.redisConcurrency {
		b.workers.Go(b.batchLoop)
	}
	b.workers.Go(func() { b.e.gateLoop(b.stop) })
	b.e.runLoops(false)
}

// close stops the mode's loops, then the workers once the queued calls are
// decided.
func (b *central) close() {
	b.e.runLoops(true)
	close(b.stop)
	b.workers.Wait()
}

// send decides call (a group's lead, with its members) at now, alone, or,
// with now 0, queues it for a batch at Redis TIME and waits. reusable says
// that no worker will touch the call again, so it may go back to callPool.
func (b *central) send(ctx context.Context, now int64, call *centralCall) (reusable bool, err error) {
	if now != 0 {
		b.run(ctx, now, []*centralCall{call}, &batchBuffers{})
		<-call.done
		return true, nil
	}
	queued, err := b.submit(ctx, call)
	return err == nil || !queued, err
}

// decide decides r through Redis: at Redis TIME (now 0, batched with other
// decisions) or at now (µs; DecideAt, alone, for simulations and tests).
// When Redis cannot answer in time, the plane's failureMode decides.
func (b *central) decide(ctx context.Context, snap *snapshot, now int64, r *Request, d *Decision) error {
	call, err := b.prepare(snap, now, r)
	if err != nil {
		return err
	}
	reusable, err := b.send(ctx, now, call)
	if reusable {
		defer callPool.Put(call)
	}
	if err == nil {
		err = call.err
	}
	if err == nil {
		call.decision(d)
		b.record(call, r, d, true)
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	return b.fail(call, now, r, d)
}

// prepare resolves r's limits from the full policy into a script call,
// deciding at now (µs).
func (b *central) prepare(snap *snapshot, now int64, r *Request) (*centralCall, error) {
	ep, cost, err := snap.resolve(r, false)
	if err != nil {
		return nil, err
	}
	p := snap.policy
	c := callPool.Get().(*centralCall)
	c.reset()
	// Unknown tenants and api keys take a state on this node, up to its
	// bounds (WithMaxTenants, WithMaxKeys, WithMaxKeysPerTenant); beyond
	// them they share one overflow state, and its keys in Redis, as in
	// mode local: a flood of new names cannot grow Redis's keys without
	// bound either.
	c.ts, c.known = b.stateOf(r)
	name, tier := r.Tenant, r.Tier
	if c.ts.name == overflowName {
		name, tier = overflowName, "" // the default tier, as the local overflow state
	}
	rec, _ := snap.recordOf(name, tier) // resolve checked that the plane lets it through
	t := &rec.tenant
	c.snap, c.tenant, c.cost = snap, t, cost
	endpointName := r.Endpoint
	if ep >= 0 {
		endpointName = snap.endpoints[ep].Name // canonical: "Export" is export's bucket
		c.endpoint = &snap.endpoints[ep]
		c.epLim = p.EndpointLimit(t, ep)
	}
	if r.APIKey != "" {
		c.apiKey = r.APIKey
		if c.keyLim = p.KeyLimit(t, r.APIKey); c.keyLim != nil && !p.NamesKey(t, r.APIKey) {
			if c.apiKey = b.keyOf(c.ts, r.APIKey, now); c.apiKey == overflowName {
				c.keyLim = p.KeyLimit(t, "")
			}
		}
	}
	shard, parts := b.shards.shardOf(len(snap.shardPrefixes), name, t, c.apiKey)
	c.shard = shard
	prefix := snap.shardPrefixes[shard]
	c.tierRank, c.mayBorrow = rec.tierRank, rec.mayBorrow
	c.limits = [4]*policy.Limit{t.Limit, nil, c.epLim, c.keyLim}
	if c.mayBorrow {
		c.limits[1] = snap.borrowCeiling
	}
	if parts > 1 { // a split tenant: this part's share of its own limits
		for i := range 3 { // tenant, allowance, endpoint: not the key, whose state stays in one part
			if l := c.limits[i]; l != nil {
				part := l.Share(1/float64(parts), snap.maxCost)
				c.limits[i] = &part
			}
		}
	}
	v := b.fair.view.Load()
	contended := v != nil && v.snap == snap
	levels := keyspace.RequestLevels{Tenant: name, TenantWindow: isWindow(t.Limit), Allowance: c.limits[1] != nil, Share: contended}
	if c.epLim != nil {
		levels.Endpoint, levels.EndpointWindow = endpointName, isWindow(c.epLim)
	}
	if c.keyLim != nil {
		levels.APIKey, levels.KeyWindow = c.apiKey, isWindow(c.keyLim)
	}
	var share string
	c.keys[0], c.keys[1], c.keys[2], c.keys[3], share = prefix.Request(&levels)
	if contended {
		b.pace(c, v, name, share, parts)
	}
	return c, nil
}

// stateOf is the tenant's state on this node: the one the policy names, or
// one of the registry's, the overflow state beyond its bound.
func (b *central) stateOf(r *Request) (ts *tenantState, known bool) {
	e := b.e
	local := e.snap.Load()
	if ts := local.known[r.Tenant]; ts != nil {
		return ts, true
	}
	return e.tenants.getOrCreate(r.Tenant, r.Tier, e.settings.maxTenants+len(local.known)), false
}

// keyOf is the name in Redis of an api key the policy does not name: the
// key's own while the node's key budget holds it, overflowName beyond. The
// key's state in ts.keys marks it; its limiter is the local engine's (the
// failure mode's), in force once the tenant was moved to a local snapshot
// and else at the move (syncLocked), like any key state's.
func (b *central) keyOf(ts *tenantState, key string, now int64) string {
	e := b.e
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ks := ts.keys.get(key)
	if ks == nil {
		if !e.keys.admits(ts) {
			return overflowName
		}
		ks = &keyState{key: strings.Clone(key)}
		if ts.snap != nil {
			ks.limit.reset(ts.snap.policy.KeyLimit(&ts.rec.tenant, key), now)
			ks.limit.fit(ts.snap, now)
		}
		ts.keys.put(ks)
		e.keys.count.Add(1)
	}
	ks.lastSeen = now
	return ks.key
}

// record counts a decision Redis made in the tenant's state on this node
// and writes it to the tenant's trace, for the debug view: as a decision
// of the engine's own does (the failure mode's are). groupAllowed says
// whether the request's group was admitted (recordGroupLocked); a request
// alone is its own group. In mode central the state holds no limits (it
// is never moved to a snapshot), only what the node counts and traces.
func (b *central) record(c *centralCall, r *Request, d *Decision, groupAllowed bool) {
	ts := c.ts
	ts.mu.Lock()
	defer ts.mu.Unlock()
	ts.known = c.known
	ts.lastSeen = b.e.clock()
	b.countDemandLocked(ts, d)
	ts.recordGroupLocked(ts.lastSeen, d, r.APIKey, c.endpoint, groupAllowed)
}

// countDemandLocked counts a decision Redis made as the tenant's demand on
// the plane, as the engine's own decisions count theirs: a request that
// passed the levels below global (admitted, or denied at global; a global
// denial is reported before a lower one, so a request denied at both
// counts too, and the tenant's own limit caps its claim). central_fair.go
// measures it. ts.mu is held.
func (b *central) countDemandLocked(ts *tenantState, d *Decision) {
	if d.Allow || d.Level == LevelGlobal {
		ts.offered += d.Cost
		ts.arrivals++
	}
	if d.Level == LevelGlobal {
		b.fair.denials.Add(1)
	}
}

// isWindow reports whether lim is a sliding window, whose state is another
// kind of key than a bucket's (pkg/keyspace).
func isWindow(lim *policy.Limit) bool {
	return lim != nil && lim.Algorithm == policy.SlidingWindow
}

// decision turns the script's reply into d.
func (c *centralCall) decision(d *Decision) {
	r := &c.reply
	*d = Decision{Allow: r[0] == 1, Cost: c.cost, Remaining: r[4], Borrowed: r[5], Bound: Levels[min(max(r[6]-1, 0), 3)], policy: c.snap.plane}
	if d.Allow {
		return
	}
	d.Level = Levels[max(r[1]-1, 0)]
	d.RetryAfter = retryDuration(r[3])
	s := c.snap
	switch r[2] {
	case lua.ReasonGlobal:
		d.Reason = cmp.Or(neverReason(LevelGlobal, s.global, 0, c.cost), s.reason(reasonGlobal, s.global))
	case lua.ReasonReserve:
		d.Reason = reasonReserve
		if c.aboveShare {
			d.Reason = reasonShareReserve
		}
	case lua.ReasonShare:
		d.Reason = reasonShare
		// Shares are computed again every interval: no longer than that.
		if c.share.maxRetry > 0 {
			d.RetryAfter = min(d.RetryAfter, c.share.maxRetry)
		}
	case lua.ReasonTenant:
		d.Reason = cmp.Or(neverReason(LevelTenant, c.tenant.Limit, s.borrowExtra(c.mayBorrow), c.cost), s.reason(reasonTenant, c.tenant.Limit))
	case lua.ReasonTenantCeiling:
		d.Reason = cmp.Or(neverReason(LevelTenant, c.tenant.Limit, s.borrowExtra(c.mayBorrow), c.cost), s.reason(reasonTenantCeiling, c.tenant.Limit))
	case lua.ReasonPoolDry:
		d.Reason = s.reason(reasonTenantPoolDry, c.tenant.Limit)
	case lua.ReasonEndpoint:
		d.Reason = cmp.Or(neverReason(LevelEndpoint, c.epLim, 0, c.cost), s.reason(reasonEndpoint, c.epLim))
	case lua.ReasonKey:
		d.Reason = cmp.Or(neverReason(LevelKey, c.keyLim, 0, c.cost), s.reason(reasonAPIKey, c.keyLim))
	default:
		d.Reason = reasonUnknown
	}
}

// submit queues c for a batch and waits for its answer, at most the
// decision deadline. queued says whether a worker got the call (and may
// still signal it after an error).
func (b *central) submit(ctx context.Context, c *centralCall) (queued bool, err error) {
	if b.breaker.blocked(b.e.clock()) {
		return false, errRedisUnavailable // fail fast: no trip through the queue
	}
	timer := c.timer
	timer.Reset(b.e.settings.redisTimeout)
	defer timer.Stop()
	select {
	case b.batches <- c:
	case <-ctx.Done():
		return false, ctx.Err()
	case <-timer.C:
		return false, fmt.Errorf("%w: the batch queue is full", errRedisUnavailable)
	}
	select {
	case <-c.done:
		return true, nil
	case <-ctx.Done():
		c.state.CompareAndSwap(callQueued, callAbandoned)
		return true, ctx.Err()
	case <-timer.C:
		err := fmt.Errorf("%w: no answer within %s", errRedisUnavailable, b.e.settings.redisTimeout)
		if c.state.CompareAndSwap(callQueued, callAbandoned) {
			// A Redis slow enough that calls wait their deadline out in the
			// queue counts as failing, or the breaker would never open.
			b.breaker.failure(b.e.clock(), err)
		}
		return true, err
	}
}

// callPool recycles calls (and their channels: a decision through Redis
// otherwise allocates a channel, the costliest of its allocations). A call
// goes back only when no worker holds it any more.
var callPool = sync.Pool{New: func() any {
	c := &centralCall{done: make(chan struct{}, 1), timer: time.NewTimer(time.Hour)}
	c.timer.Stop()
	c.one[0] = c
	c.members = c.one[:]
	return c
}}

func (c *centralCall) reset() {
	c.snap, c.tenant, c.endpoint, c.epLim, c.keyLim = nil, nil, nil, nil, nil
	c.cost, c.tierRank, c.mayBorrow, c.shard = 0, 0, false, 0
	c.ts, c.known, c.apiKey = nil, false, ""
	c.keys, c.limits, c.reply, c.at, c.err = [4]string{}, [4]*policy.Limit{}, [lua.DecideReplyFields]int64{}, 0, nil
	c.share, c.aboveShare = shareLevel{}, false
	c.members, c.group = c.one[:], 0
	c.state.Store(callQueued)
	c.finished.Store(0)
	c.local = localAdmission{}
}

// batchLoop is one worker: it takes a call, adds whatever else is queued
// (up to the batch size, waiting at most the batch window for more) and
// decides them in one script call per shard. A batch holds calls of one
// policy snapshot; a call of another starts the next batch. A group
// (members) goes whole into one batch, which it may fill beyond the batch
// size when it comes first. After close it drains the queue.
func (b *central) batchLoop() {
	s := b.e.settings
	batch := make([]*centralCall, 0, s.batchSize)
	var buf batchBuffers
	var carry *centralCall // the first call of the next batch
	for {
		first := carry
		carry = nil
		if first == nil {
			select {
			case first = <-b.batches:
			case <-b.stop:
				select {
				case first = <-b.batches:
				default:
					return
				}
			}
		}
		batch = append(batch[:0], first)
		requests := len(first.members)
		var window <-chan time.Time
		if s.batchWindow > 0 {
			window = time.After(s.batchWindow)
		}
	fill:
		for requests < s.batchSize {
			var c *centralCall
			select {
			case c = <-b.batches:
			default:
				if window == nil {
					break fill
				}
				select {
				case c = <-b.batches:
				case <-window:
					break fill
				}
			}
			if c.snap != first.snap || requests+len(c.members) > s.batchSize {
				carry = c
				break fill
			}
			batch = append(batch, c)
			requests += len(c.members)
		}
		b.run(context.Background(), 0, batch, &buf)
		clear(batch)
	}
}

// run decides a batch at now (0: Redis TIME) and completes every call (a
// group's first call stands for all of them).
func (b *central) run(ctx context.Context, now int64, batch []*centralCall, buf *batchBuffers) {
	b.call(ctx, now, batch, buf)
	for _, c := range batch {
		late := c.finished.Add(1) == 2 // before done: a caller that waits may reuse c after it
		c.done <- struct{}{}
		if late {
			b.settleLate(c)
		}
	}
}

// call decides a batch of calls of one snapshot: one script call per shard
// the batch touches, pipelined when there are several. It sets each call's
// reply or err.
func (b *central) call(ctx context.Context, now int64, batch []*centralCall, buf *batchBuffers) {
	snap := batch[0].snap
	k := len(snap.shardPrefixes)
	if buf.split(batch, k) == 0 {
		return // every caller gave up: nothing to send, nothing to tell the breaker
	}
	// While the breaker is open, batches fail at once (no trip to Redis)
	// but for one probe per cooldown.
	if !b.breaker.allow(b.e.clock()) {
		for _, c := range batch {
			for _, m := range c.members {
				m.err = errRedisUnavailable
			}
		}
		return
	}
	ctx, cancel := context.WithTimeout(ctx, b.e.settings.redisTimeout)
	defer cancel()
	var err error
	if k == 1 {
		part := buf.parts[0]
		args := buf.args(0)
		args.build(b, snap, 0, part)
		b.stats.calls.Add(1)
		start := time.Now()
		cmd := lua.Decide.RunCall(ctx, b.client, lua.DecideCall(&args.levels, now, args.requests, false))
		b.e.observeRedis(time.Since(start))
		err = b.decided(part, cmd)
	} else {
		buf.calls = buf.calls[:0]
		for shard, part := range buf.parts {
			if len(part) == 0 {
				continue
			}
			args := buf.args(shard)
			args.build(b, snap, shard, part)
			buf.calls = append(buf.calls, lua.DecideCall(&args.levels, now, args.requests, true))
		}
		b.stats.calls.Add(int64(len(buf.calls)))
		start := time.Now()
		err = lua.Decide.RunPipelined(ctx, b.client, buf.calls)
		b.e.observeRedis(time.Since(start))
		i := 0
		for _, part := range buf.parts {
			if len(part) == 0 {
				continue
			}
			if cerr := b.decided(part, buf.calls[i].Cmd); cerr != nil && err == nil {
				err = cerr
			}
			i++
		}
		b.refundSplitGroups(ctx, now, batch, buf)
	}
	var reply redis.Error
	switch {
	case errors.As(err, &reply) && !storeFault(err):
		// Redis answered, with an error: a bug or bad data in this batch,
		// not an outage. Its calls get the failure mode; the breaker does
		// not open for the whole plane. But a probe answered so does not
		// show Redis back: the breaker probes again after its cooldown,
		// instead of staying in probing, shut, for good.
		b.stats.failures.Add(1)
		b.breaker.probeFailed(b.e.clock(), err)
	case err != nil: // decided set the err of every call it could not decide
		b.stats.failures.Add(1)
		b.breaker.failure(b.e.clock(), err)
	case b.breaker.success():
		// Off the callers' path; decisions meanwhile go to the failure mode,
		// so none is made against fleet buckets that miss the node's debit.
		b.workers.Go(func() {
			b.recovered()
			b.breaker.recoveryDone()
		})
	}
}

// storeFault says whether err is Redis answering that it cannot serve the
// engine at all: no or a wrong password, no permission, out of memory, a
// read-only replica, a Redis still loading or busy, a cluster or replica
// down. That is an outage as much as no answer is (the breaker opens, the
// node reports itself degraded). Other errors (ERR, WRONGTYPE, a script's
// runtime error) are a bad call's or bad data's: its batch gets the
// failure mode, the plane does not.
func storeFault(err error) bool {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return false
	}
	code, _, _ := strings.Cut(reply.Error(), " ")
	return slices.Contains(storeFaultCodes, code)
}

// storeFaultCodes are the error codes of a Redis that cannot serve.
var storeFaultCodes = []string{"NOAUTH", "WRONGPASS", "NOPERM", "OOM", "READONLY", "LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "MISCONF"}

// decided sets the calls' replies from one script call's, or their err.
func (b *central) decided(calls []*centralCall, cmd *redis.Cmd) error {
	reply, err := cmd.Int64Slice()
	if err == nil && len(reply) != 1+lua.DecideReplyFields*len(calls) {
		err = fmt.Errorf("decide.lua answered %d values for %d requests", len(reply), len(calls))
	}
	if err != nil {
		for _, c := range calls {
			c.err = fmt.Errorf("%w: %w", errRedisUnavailable, err)
		}
		return err
	}
	b.stats.decisions.Add(int64(len(calls)))
	for i, c := range calls {
		copy(c.reply[:], reply[1+i*lua.DecideReplyFields:])
		c.at = reply[0]
	}
	return nil
}

// batchBuffers are a worker's reusable buffers: the batch split by shard
// and each shard's script arguments.
type batchBuffers struct {
	parts   [][]*centralCall
	shards  []batchArgs
	calls   []lua.Call
	refunds []*centralCall
}

// split sorts the calls whose callers still wait by shard and marks them
// sent; it returns how many there are. A group's calls stay in a row in
// each shard, with a group number unique in the batch.
func (bb *batchBuffers) split(batch []*centralCall, k int) (sent int) {
	for len(bb.parts) < k {
		bb.parts = append(bb.parts, nil)
	}
	bb.parts = bb.parts[:k]
	for i := range bb.parts {
		clear(bb.parts[i])
		bb.parts[i] = bb.parts[i][:0]
	}
	for i, c := range batch {
		if !c.state.CompareAndSwap(callQueued, callSent) {
			continue
		}
		var group int64
		if len(c.members) > 1 {
			group = int64(i) + 1
		}
		for _, m := range c.members {
			m.group = group
			bb.parts[m.shard] = append(bb.parts[m.shard], m)
			sent++
		}
	}
	return sent
}

func (bb *batchBuffers) args(shard int) *batchArgs {
	for len(bb.shards) <= shard {
		bb.shards = append(bb.shards, batchArgs{})
	}
	return &bb.shards[shard]
}

// batchArgs is a batch in decide.lua's form: each distinct key once, with
// its limit, and the requests as indexes into the keys. A worker reuses
// one.
type batchArgs struct {
	index    map[string]int64
	levels   lua.Levels
	requests []byte
}

// build fills a with the calls of one shard: the shard's part of the
// global limit and of the pool first, then each call's levels.
func (a *batchArgs) build(b *central, snap *snapshot, shard int, batch []*centralCall) {
	prefix := snap.shardPrefixes[shard]
	global, pool := b.shardLimits(snap, shard)
	a.reset(prefix, global, pool)
	for _, c := range batch {
		a.requests = binary.LittleEndian.AppendUint64(a.requests, uint64(c.cost))
		// Without fairness the tier floors reserve their percent of this
		// shard's part; with it, floors are rate guarantees (the shares),
		// and a tenant above its share leaves the bottom of the bucket to
		// those within theirs, as in the engine (decideLocked).
		var reserve int64
		switch {
		case snap.fairness == fairNone:
			reserve = reserveOf(snap.reservePercents[c.tierRank], global)
		case c.aboveShare:
			reserve = reserveOf(contendedReservePercent, global)
		}
		a.requests = binary.LittleEndian.AppendUint64(a.requests, uint64(reserve))
		var borrow uint64
		if c.mayBorrow {
			borrow = 1
		}
		a.requests = binary.LittleEndian.AppendUint64(a.requests, borrow)
		for i, key := range c.keys {
			var idx int64
			if c.limits[i] != nil {
				idx = a.add(key, c.limits[i])
			}
			a.requests = binary.LittleEndian.AppendUint64(a.requests, uint64(idx))
		}
		a.requests = binary.LittleEndian.AppendUint64(a.requests, uint64(c.group))
		var share int64
		if c.share.key != "" {
			share = a.addLevel(c.share.key, lua.Limit{Algorithm: lua.AlgorithmShareBucket, Rate: c.share.rate, Burst: c.share.burst, PeriodMicros: c.share.period})
		}
		a.requests = binary.LittleEndian.AppendUint64(a.requests, uint64(share))
	}
}

// reset empties a for a call of the shard at prefix: its global bucket,
// burst pool (no limit: nil) and demand counter first, as decide.lua
// takes them.
func (a *batchArgs) reset(prefix keyspace.Prefix, global, pool *policy.Limit) {
	if a.index == nil {
		a.index = map[string]int64{}
	}
	clear(a.index)
	a.levels.Reset()
	a.requests = a.requests[:0]
	a.add(prefix.Global(), global)
	a.add(prefix.Pool(), pool)
	a.add(prefix.Demand(), nil)
}

// add returns key's index in KEYS (from 1), adding it with its limit the
// first time. A key's limit is the first request's: every request of a
// batch but the rare one that straddles a policy swap resolves it the same
// way.
func (a *batchArgs) add(key string, lim *policy.Limit) int64 {
	return a.addLevel(key, limitOf(lim))
}

// addLevel is add with the limit as the scripts take it.
func (a *batchArgs) addLevel(key string, lim lua.Limit) int64 {
	if idx, ok := a.index[key]; ok {
		return idx
	}
	idx := a.levels.Add(key, lim)
	a.index[key] = idx
	return idx
}

// limitOf is lim as the scripts take it; nil is no limit.
func limitOf(lim *policy.Limit) lua.Limit {
	if lim == nil {
		return lua.Limit{}
	}
	alg := int64(lua.AlgorithmTokenBucket)
	if lim.Algorithm == policy.SlidingWindow {
		alg = lua.AlgorithmSlidingWindow
	}
	return lua.Limit{Algorithm: alg, Rate: lim.Rate, Burst: lim.Burst, PeriodMicros: lim.PeriodMicros()}
}

// defaultNodeID is the host name and a random suffix: unique per process.
func defaultNodeID() string {
	host, err := os.Hostname()
	if err != nil || !policy.ValidName(host) {
		host = "node"
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	return host + "-" + hex.EncodeToString(b[:])
}
