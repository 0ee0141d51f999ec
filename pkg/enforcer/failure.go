package enforcer

import (
	"context"
	"strconv"
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
// debited from the fleet's buckets when Redis is back (journal: unless
// Redis may have decided the call too); allow admits; deny
// denies at the global level until the breaker lets a call through again.
func (b *central) fail(c *centralCall, now int64, r *Request, d *Decision, journal bool) error {
	b.stats.degraded.Add(1)
	if now == 0 {
		now = b.e.clock()
	}
	switch c.snap.failureMode {
	case "allow":
		*d = Decision{Allow: true, Cost: c.cost, Bound: LevelGlobal}
		return nil
	case "deny":
		*d = Decision{Level: LevelGlobal, Bound: LevelGlobal, Cost: c.cost, Reason: reasonUnavailableDeny,
			RetryAfter: retryDuration(b.breaker.waitUs(now))}
		return nil
	}
	if err := b.e.decideOpts(now, r, arrival, d); err != nil {
		return err
	}
	if d.Allow && journal {
		b.journalAdmitted(c, d)
	}
	return nil
}

// recovered runs when a call succeeds after failures, and at every
// heartbeat while the breaker is closed (decisions that timed out alone
// were decided locally too): what the node admitted on its own is debited
// from the fleet's buckets, which refilled all along in Redis (or came back
// full after a restart), so that central decisions resume without a burst
// of over-admission. One debit call per shard and 256 buckets.
func (b *central) recovered() {
	byShard := map[keyspace.Prefix][]journalEntry{}
	for _, en := range b.journal.take() {
		byShard[en.shard] = append(byShard[en.shard], en)
	}
	for _, entries := range byShard {
		for len(entries) > 0 {
			n := min(len(entries), 256)
			levels := &lua.Levels{}
			for _, en := range entries[:n] {
				levels.Add(en.key, limitOf(en.limit), en.tokens)
			}
			entries = entries[n:]
			ctx, cancel := context.WithTimeout(context.Background(), b.e.settings.redisTimeout)
			// Best effort: if Redis fails again, the breaker opens on the
			// next decision and those tokens stay with the node's share.
			_ = lua.Debit.RunCall(ctx, b.client, lua.DebitCall(levels, 0)).Err()
			cancel()
		}
	}
}

// journal is what a node admitted while degraded, per bucket. It is bounded:
// beyond maxJournal buckets, only the global level is noted.
type journal struct {
	mu      sync.Mutex
	entries map[string]*journalEntry
}

type journalEntry struct {
	shard  keyspace.Prefix // one debit call per shard
	key    string
	limit  *policy.Limit // the bucket's limit in its shard
	tokens int64
}

const maxJournal = 10_000

func (j *journal) add(shard keyspace.Prefix, key string, lim *policy.Limit, tokens int64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.entries == nil {
		j.entries = map[string]*journalEntry{}
	}
	en := j.entries[key]
	if en == nil {
		if len(j.entries) >= maxJournal {
			return
		}
		en = &journalEntry{shard: shard, key: key, limit: lim}
		j.entries[key] = en
	}
	en.tokens += tokens
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

// failure records a call that failed at now.
func (b *breaker) failure(now int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.failures++
	if b.state == breakerProbing || b.failures >= b.threshold {
		b.reopenLocked(now)
	}
}

// reopenLocked opens the breaker for a cooldown from now.
func (b *breaker) reopenLocked(now int64) {
	b.state, b.openUntil = breakerOpen, now+b.cooldown
	if !b.open.Swap(true) && b.onChange != nil {
		b.onChange(true, nil)
	}
}

// probeFailed reopens the breaker, for another cooldown, when its probe
// got an answer that is not a decision.
func (b *breaker) probeFailed(now int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.state == breakerProbing {
		b.reopenLocked(now)
	}
}

// degradedChanged logs a distributed backend entering (with the failure
// that made it) or leaving degraded operation: what an operator must see
// without a dashboard.
func (e *Engine) degradedChanged(mode string, degraded bool, err error) {
	p := e.policy.Load()
	if degraded {
		e.logger.Warn("quota store unavailable: deciding by the plane's failureMode until it is back",
			"plane", p.ID(), "mode", mode, "failureMode", p.Spec().FailureMode, "node", e.nodeID, "err", err)
		return
	}
	e.logger.Info("quota store back: deciding with the fleet again", "plane", p.ID(), "mode", mode, "node", e.nodeID)
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
}

// heartbeatLoop beats while the plane is in central mode and resizes this
// node's local share (used while degraded) when the fleet's size changes.
func (b *central) heartbeatLoop() {
	s := b.e.settings
	ticker := time.NewTicker(s.heartbeatInterval)
	defer ticker.Stop()
	for {
		if snap := b.snap.Load(); snap != nil {
			ctx, cancel := context.WithTimeout(context.Background(), s.redisTimeout)
			n, err := lua.Heartbeat.Run(ctx, b.client, []string{snap.redisPrefix.Nodes()},
				b.e.nodeID, strconv.FormatInt((3*s.heartbeatInterval).Milliseconds(), 10)).Int64()
			cancel()
			if err == nil && n >= 1 && n != b.fleet.nodes.Load() {
				b.fleet.nodes.Store(n)
				b.e.reshare()
			}
			if err == nil && !b.breaker.open.Load() && !b.journal.empty() {
				b.recovered()
			}
		}
		select {
		case <-b.stop:
			if snap := b.snap.Load(); snap != nil {
				ctx, cancel := context.WithTimeout(context.Background(), s.redisTimeout)
				_ = b.client.ZRem(ctx, snap.redisPrefix.Nodes(), b.e.nodeID).Err() // leave the fleet at once
				cancel()
			}
			return
		case <-ticker.C:
		}
	}
}
