package enforcer

import (
	"context"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/lua"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// Reasons for decisions made while Redis is unavailable.
const (
	reasonUnavailableDeny = "the quota store is unavailable and this plane denies while it is (failureMode deny)"
)

// fail decides c's request while Redis cannot: by the plane's failureMode.
// degrade decides locally with this node's share of every limit (the
// engine's own state holds that share) and notes what it admits, to be
// debited from the fleet's buckets when Redis is back (journal,
// recovered); allow admits; deny denies at the global level until the
// breaker lets a call through again.
func (b *central) fail(c *centralCall, now int64, r *Request, d *Decision) error {
	b.stats.degraded.Add(1)
	if now == 0 {
		now = b.e.clock()
	}
	switch c.snap.failureMode {
	case policy.FailureAllow:
		*d = Decision{Allow: true, Cost: c.cost, Bound: LevelGlobal, policy: c.snap.plane}
		return nil
	case policy.FailureDeny:
		*d = Decision{Level: LevelGlobal, Bound: LevelGlobal, Cost: c.cost, Reason: reasonUnavailableDeny, policy: c.snap.plane,
			RetryAfter: retryDuration(b.breaker.waitUs(now))}
		return nil
	}
	if err := b.e.decideOpts(now, r, arrival, d); err != nil {
		return err
	}
	b.noteLocal(c, c, d)
	b.doneLocal(c)
	return nil
}

// noteLocal notes what the failure mode admitted (d) for the request of c, a
// member of the call lead (c itself when alone): journaled at once when no
// worker sent lead, else kept until Redis's answer says whether it is
// owed (settleLate).
func (b *central) noteLocal(lead, c *centralCall, d *Decision) {
	switch {
	case !d.Allow:
	case lead.state.Load() != callSent:
		b.journalAdmitted(c, c.ts.name, c.apiKey, d.Cost, d.Borrowed)
	default:
		c.local = localAdmission{cost: d.Cost, borrowed: d.Borrowed, tenant: c.ts.name, apiKey: strings.Clone(c.apiKey)}
	}
}

// doneLocal is the caller's end of a sent call lead once the failure mode
// decided its members (noteLocal): the second of it and the worker settles
// them (finished).
func (b *central) doneLocal(lead *centralCall) {
	if lead.state.Load() == callSent && lead.finished.Add(1) == 2 {
		b.settleLate(lead)
	}
}

// localAdmission is what the failure mode admitted for a call that a
// worker sent: the call's cost, what of it was borrowed, its tenant and
// api key.
type localAdmission struct {
	cost, borrowed int64
	tenant, apiKey string
}

// settleLate journals what the failure mode admitted for the members of a
// sent call (their local), once both Redis's answer and the local
// decisions are in, unless Redis admitted a member too: it then counted
// it already. Redis
// decides a call its caller stopped waiting for when it answers again (a
// slow or hung Redis runs what was sent meanwhile); a call it denied the
// fleet's buckets never saw. A call whose answer never came (the worker's
// own deadline passed) is journaled too, though a hung Redis may still run
// it when it wakes: then it counts twice, which errs towards denying and
// is bounded, as every debt is, by the local bucket's lack (recovered).
func (b *central) settleLate(lead *centralCall) {
	for _, c := range lead.members {
		if c.local.cost > 0 && (c.err != nil || c.reply[0] != 1) {
			b.journalAdmitted(c, c.local.tenant, c.local.apiKey, c.local.cost, c.local.borrowed)
		}
	}
}

// recovered runs when a call succeeds after failures, and at every
// heartbeat while the breaker is closed (decisions that timed out alone
// were decided locally too): what the node took on its own is debited
// from the fleet's buckets, which refilled all along in Redis (or came back
// full after a restart), so that central decisions resume without a burst
// of over-admission. One debit call per shard and 256 buckets.
//
// A bucket is owed what the node admitted for it, but never more than the
// local bucket that stood in for it lacks of full. The first is exact
// while the fleet's bucket did not fill up during the outage (a fleet at
// its limits, a blip): the debit, which debit.lua takes below empty if
// need be, then pays back the local bucket's burst rather than giving it
// away at every blip. The second holds when it did fill up (a fleet far
// under its limits, a Redis restarted empty): what the local bucket
// refilled meanwhile is then owed to nobody, and a long outage under the
// limits does not leave the fleet's buckets empty. The local buckets keep
// their levels (and refill while Redis decides), so that a blip soon after
// another starts from what the last one left, not from a full bucket.
//
// Every level is owed so: the global level, and a tenant's, endpoint's and
// api key's (token buckets; a sliding window forgets on its own). A local
// bucket's debt is split over the keys it stood in for (the global level's
// shards, a split tenant's parts) by what each admitted (a call Redis may
// have decided too is journaled once its answer says it did not admit it:
// settleLate). A debit that fails stays owed.
func (b *central) recovered() {
	entries := b.journal.take()
	if len(entries) == 0 {
		return
	}
	e, now := b.e, b.e.clock()
	type owed struct{ journaled, lack int64 }
	stands := map[standIn]*owed{}
	for _, en := range entries {
		o := stands[en.stand]
		if o == nil {
			o = &owed{}
			stands[en.stand] = o
		}
		o.journaled += en.tokens
	}
	local := e.snap.Load()
	for s, o := range stands {
		o.lack = e.lackOf(s, local, now)
	}
	byShard := map[keyspace.Prefix][]journalEntry{}
	for _, en := range entries {
		if o := stands[en.stand]; o.journaled > 0 {
			en.owed += min(en.tokens, int64(math.Ceil(float64(en.tokens)*float64(o.lack)/float64(o.journaled))))
		}
		en.tokens = 0
		if en.owed > 0 {
			byShard[en.shard] = append(byShard[en.shard], en)
		}
	}
	for _, entries := range byShard {
		for len(entries) > 0 {
			chunk := entries[:min(len(entries), 256)]
			entries = entries[len(chunk):]
			levels := &lua.Levels{}
			for _, en := range chunk {
				levels.Add(en.key, limitOf(en.limit), en.owed)
			}
			ctx, cancel := context.WithTimeout(context.Background(), b.e.settings.redisTimeout)
			err := lua.Debit.RunCall(ctx, b.client, lua.DebitCall(levels, 0)).Err()
			cancel()
			if err != nil {
				// Owed still: the next recovery (or heartbeat) debits it.
				for _, en := range chunk {
					b.journal.add(en)
				}
			}
		}
	}
}

// journal is what a node admitted while degraded, per bucket. It is bounded:
// beyond maxJournal buckets, only the global level's and failed debits'
// are noted.
type journal struct {
	mu      sync.Mutex
	entries map[string]*journalEntry
}

type journalEntry struct {
	shard  keyspace.Prefix // one debit call per shard
	key    string
	limit  *policy.Limit // the bucket's limit in its shard
	tokens int64         // admitted on the node's own
	// owed is what a debit that failed left to debit: tokens already
	// weighed against the local bucket's lack (recovered).
	owed  int64
	stand standIn // the local bucket that stood in for key's
}

// standIn names a local bucket that stands in for a fleet's while Redis is
// away: the global level's, or a level of a tenant's (with the endpoint or
// the api key, for those levels).
type standIn struct {
	level                    Level
	tenant, endpoint, apiKey string
}

// lackOf is what the local bucket s lacks of full at now (0 when it holds
// no state: one forgotten is as a full one would be).
func (e *Engine) lackOf(s standIn, local *snapshot, now int64) int64 {
	if s.level == LevelGlobal {
		pl := &e.plane
		pl.mu.Lock()
		defer pl.mu.Unlock()
		return pl.global.lack(now)
	}
	ts := local.known[s.tenant]
	if ts == nil {
		ts = e.tenants.get(s.tenant)
	}
	if ts == nil {
		return 0
	}
	ts.mu.Lock()
	defer ts.mu.Unlock()
	switch s.level {
	case LevelTenant:
		return ts.limit.lack(now)
	case LevelEndpoint:
		if ep, _, ok := local.endpoint(s.endpoint); ok && ts.rec != nil {
			if slot, eps := ts.rec.endpointSlot(ep), ts.endpointsLocked(); slot >= 0 && slot < len(eps) {
				return eps[slot].lack(now) // none made yet: full, it lacks nothing
			}
		}
	case LevelKey:
		if ks := ts.keys.get(s.apiKey); ks != nil {
			return ks.limit.lack(now)
		}
	}
	return 0
}

const maxJournal = 10_000

// add notes what add.tokens admitted for add.key (and what it owes).
func (j *journal) add(add journalEntry) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.entries == nil {
		j.entries = map[string]*journalEntry{}
	}
	en := j.entries[add.key]
	if en == nil {
		// Full: only the global level's keys, and debts a failed debit
		// left, are still noted.
		if len(j.entries) >= maxJournal && add.stand.level != LevelGlobal && add.owed == 0 {
			return
		}
		s := &add.stand // a request's names: they may be views of a larger buffer
		s.tenant, s.endpoint, s.apiKey = strings.Clone(s.tenant), strings.Clone(s.endpoint), strings.Clone(s.apiKey)
		en = &add
		j.entries[add.key] = en
		return
	}
	en.tokens += add.tokens
	en.owed += add.owed
}

func (j *journal) empty() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.entries) == 0
}

func (j *journal) take() []journalEntry {
	j.mu.Lock()
	defer j.mu.Unlock()
	out := make([]journalEntry, 0, len(j.entries))
	for _, en := range j.entries {
		out = append(out, *en)
	}
	j.entries = nil
	return out
}

// breaker is a circuit breaker on the calls to Redis. Closed, every call
// goes through. After threshold failures in a row it opens: no call goes
// through for the cooldown, then one call (the probe) does; its failure
// opens the breaker again, its success starts the recovery: no call goes
// through until what the node admitted on its own meanwhile is debited from
// the fleet's buckets (recovered), and then the breaker closes. Times are
// the engine's clock, in µs.
type breaker struct {
	mu        sync.Mutex
	state     breakerState
	failures  int
	openUntil int64
	threshold int
	cooldown  int64
	// open mirrors state != closed for lock-free reads by status.
	open atomic.Bool
	// onChange, when set, is told when open changes (under mu).
	onChange func(open bool, err error)
}

type breakerState uint8

const (
	breakerClosed breakerState = iota
	breakerOpen
	breakerProbing
	breakerRecovering
)

func (b *breaker) init(threshold int, cooldown time.Duration) {
	b.threshold, b.cooldown = threshold, cooldown.Microseconds()
}

// allow reports whether a call may go to Redis now.
func (b *breaker) allow(now int64) bool {
	if !b.open.Load() {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case breakerClosed:
		return true
	case breakerOpen:
		if now >= b.openUntil {
			b.state = breakerProbing
			return true
		}
	}
	return false
}

// blocked reports, without changing anything, whether the breaker is open
// and its cooldown still running.
func (b *breaker) blocked(now int64) bool {
	if !b.open.Load() {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state == breakerProbing || b.state == breakerRecovering || b.state == breakerOpen && now < b.openUntil
}

// success records a call that worked; it reports whether it was the probe,
// that is, whether Redis just came back: the breaker then stays shut until
// recoveryDone.
func (b *breaker) success() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures = 0
	if b.state == breakerClosed {
		return false
	}
	b.state = breakerRecovering
	return true
}

// recoveryDone closes the breaker after a recovery.
func (b *breaker) recoveryDone() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == breakerRecovering {
		b.state = breakerClosed
		b.open.Store(false)
		if b.onChange != nil {
			b.onChange(false, nil)
		}
	}
}

// failure records a call that failed at now with err.
func (b *breaker) failure(now int64, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures++
	if b.state == breakerProbing || b.failures >= b.threshold {
		b.reopenLocked(now, err)
	}
}

// reopenLocked opens the breaker for a cooldown from now, after err.
func (b *breaker) reopenLocked(now int64, err error) {
	b.state, b.openUntil = breakerOpen, now+b.cooldown
	if !b.open.Swap(true) && b.onChange != nil {
		b.onChange(true, err)
	}
}

// probeFailed reopens the breaker, for another cooldown, when its probe
// got an answer (err) that is not a decision.
func (b *breaker) probeFailed(now int64, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == breakerProbing {
		b.reopenLocked(now, err)
	}
}

// degradedChanged logs a distributed backend entering (with the failure
// that made it) or leaving degraded operation: what an operator must see
// without a dashboard.
func (e *Engine) degradedChanged(mode policy.Mode, degraded bool, err error) {
	p := e.policy.Load()
	if degraded {
		e.logger.Warn("quota store unavailable: deciding by the plane's failureMode until it is back",
			"plane", p.ID(), "mode", mode.String(), "failureMode", p.Spec().FailureMode, "node", e.nodeID, "err", err)
		return
	}
	e.logger.Info("quota store back: deciding with the fleet again", "plane", p.ID(), "mode", mode.String(), "node", e.nodeID)
}

// waitUs is how long until the breaker lets a call through.
func (b *breaker) waitUs(now int64) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == breakerOpen {
		return max(b.openUntil-now, 1)
	}
	return b.cooldown
}

// fleet is what the heartbeats say about the plane's nodes.
type fleet struct {
	nodes atomic.Int64 // live nodes, this one included; at least 1
	mu    sync.Mutex   // guards the counts' history: count and reset
	// fewerSince is when the counts started to say fewer nodes than
	// nodes, and last when the last count came (µs; 0: none).
	fewerSince, last int64
}

// count takes a count n of the live nodes at now and reports whether
// nodes changed. More nodes count at once; fewer only once the counts have
// said so for hold (two of the nodes' beats: each live node beats in
// that time), without a gap longer than hold between two counts: a Redis
// that restarted empty, or lost its liveness keys, counts each node alone
// until the others beat again, and a node that took that for the fleet's
// size would enforce, degraded or in local-reconciled, up to the whole of
// every limit. A node that leaves or dies is counted out that much later.
func (f *fleet) count(n, now, hold int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	n = max(n, 1)
	gap := f.last != 0 && now-f.last > hold // no count for a while: start the hold afresh
	f.last = now
	switch cur := f.nodes.Load(); {
	case n == cur:
		f.fewerSince = 0
		return false
	case n < cur:
		if f.fewerSince == 0 || gap {
			f.fewerSince = now
			return false
		}
		if now-f.fewerSince < hold {
			return false
		}
	}
	f.fewerSince = 0
	f.nodes.Store(n)
	return true
}

// reset forgets the counts' history: the next counts come from another
// mode's loop, at its own interval.
func (f *fleet) reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fewerSince, f.last = 0, 0
}

// heartbeatLoop beats while the plane is in central mode and resizes this
// node's local share (used while degraded) when the fleet's size changes.
// When stop closes it leaves the fleet it last beat in at once.
func (b *central) heartbeatLoop(stop <-chan struct{}) {
	s := b.e.settings
	ticker := time.NewTicker(s.heartbeatInterval)
	defer ticker.Stop()
	var fleetKey string // where the last beat went
	for {
		if snap := b.snap.Load(); snap != nil {
			fleetKey = snap.redisPrefix.Nodes()
			ctx, cancel := context.WithTimeout(context.Background(), s.redisTimeout)
			n, err := lua.Heartbeat.Run(ctx, b.client, []string{fleetKey},
				b.e.nodeID, strconv.FormatInt((3*s.heartbeatInterval).Milliseconds(), 10)).Int64()
			cancel()
			if err == nil && b.fleet.count(n, b.e.clock(), (2*s.heartbeatInterval).Microseconds()) {
				b.e.reshare()
			}
			if err == nil && !b.breaker.open.Load() && !b.journal.empty() {
				b.recovered()
			}
		}
		select {
		case <-stop:
			if fleetKey != "" {
				ctx, cancel := context.WithTimeout(context.Background(), s.redisTimeout)
				_ = b.client.ZRem(ctx, fleetKey, b.e.nodeID).Err()
				cancel()
			}
			return
		case <-ticker.C:
		}
	}
}
