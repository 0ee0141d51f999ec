package enforcer

import (
	"context"
	"time"

	"github.com/quotaplane/quotaplane/pkg/lua"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// decideAll decides a group through Redis: its calls go to the script
// together, as one unit of one batch, and the script decides them all or
// nothing (decide.lua's groups). A group whose tenants live in several
// shards is decided by each shard for its part, and the parts admitted
// while another was not are refunded (refundSplitGroups). When Redis cannot
// answer, the plane's failureMode decides the whole group (failAll).
func (b *central) decideAll(ctx context.Context, snap *snapshot, now int64, rs []Request, ds []Decision) (bool, error) {
	calls := make([]*centralCall, len(rs))
	for i := range rs {
		c, err := b.prepare(snap, now, &rs[i])
		if err != nil {
			for _, c := range calls[:i] {
				callPool.Put(c)
			}
			return false, &RequestError{Index: i, Err: err}
		}
		calls[i] = c
	}
	lead := calls[0]
	lead.members = calls
	reusable, err := b.send(ctx, now, lead)
	if reusable {
		defer func() {
			for _, c := range calls {
				c.members = c.one[:]
				callPool.Put(c)
			}
		}()
	}
	for _, c := range calls {
		if err == nil {
			err = c.err
		}
	}
	if err == nil {
		allowed := true
		for i, c := range calls {
			c.decision(&ds[i])
			allowed = allowed && ds[i].Allow
		}
		for i, c := range calls {
			b.record(c, &rs[i], &ds[i], allowed)
		}
		return allowed, nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		return false, ctxErr
	}
	return b.failAll(calls, now, rs, ds)
}

// failAll decides a group while Redis cannot, by the plane's failureMode,
// for the whole group: allow admits every request, deny denies every one
// at the global level, degrade decides the group on this node's share (as
// DecideAll does in mode local) and notes what it admits, to be debited
// from the fleet's buckets when Redis is back (noteLocal).
func (b *central) failAll(calls []*centralCall, now int64, rs []Request, ds []Decision) (bool, error) {
	b.stats.degraded.Add(int64(len(calls)))
	if now == 0 {
		now = b.e.clock()
	}
	snap := calls[0].snap
	switch snap.failureMode {
	case policy.FailureAllow:
		for i, c := range calls {
			ds[i] = Decision{Allow: true, Cost: c.cost, Bound: LevelGlobal, policy: snap.plane}
		}
		return true, nil
	case policy.FailureDeny:
		retry := retryDuration(b.breaker.waitUs(now))
		for i, c := range calls {
			ds[i] = Decision{Level: LevelGlobal, Bound: LevelGlobal, Cost: c.cost, Reason: reasonUnavailableDeny, RetryAfter: retry, policy: snap.plane}
		}
		return false, nil
	}
	allowed, err := b.e.decideAllLocal(now, rs, ds)
	if err != nil {
		return false, err
	}
	if allowed {
		for i, c := range calls {
			b.noteLocal(calls[0], c, &ds[i])
		}
	}
	b.doneLocal(calls[0])
	return allowed, nil
}

// journalAdmitted notes what the node admitted on its own for call c of
// tenant with apiKey (cost, of which borrowed from the pool), level by
// level, to be debited from the fleet's buckets when Redis is back
// (recovered).
func (b *central) journalAdmitted(c *centralCall, tenant, apiKey string, cost, borrowed int64) {
	prefix := c.snap.shardPrefixes[c.shard]
	global, _ := b.shardLimits(c.snap, c.shard)
	b.journal.add(journalEntry{shard: prefix, key: prefix.Global(), limit: global, tokens: cost, stand: standIn{level: LevelGlobal}})
	add := func(i int, tokens int64, s standIn) {
		if l := c.limits[i]; l != nil && l.Algorithm == policy.TokenBucket && tokens > 0 {
			b.journal.add(journalEntry{shard: prefix, key: c.keys[i], limit: l, tokens: tokens, stand: s})
		}
	}
	add(0, cost-borrowed, standIn{level: LevelTenant, tenant: tenant})
	if c.endpoint != nil {
		add(2, cost, standIn{level: LevelEndpoint, tenant: tenant, endpoint: c.endpoint.Name})
	}
	if apiKey != "" {
		add(3, cost, standIn{level: LevelKey, tenant: tenant, apiKey: apiKey})
	}
}

// refundSplitGroups gives back, after a batch over several shards, what
// a shard admitted of a group that another shard denied (or could not
// decide): each shard decides its part of a group all or nothing, but the
// parts are separate calls. Between a part's debit and its refund, a
// concurrent decision on its shard sees the debit; a refund that fails
// (Redis failing meanwhile) leaves it, so that a split group may admit
// less than it should, never more. One pipelined refund call per shard.
func (b *central) refundSplitGroups(ctx context.Context, now int64, batch []*centralCall, buf *batchBuffers) {
	refunds := buf.refunds[:0]
	for _, lead := range batch {
		if len(lead.members) < 2 || lead.state.Load() != callSent {
			continue
		}
		allowed := true
		for _, m := range lead.members {
			allowed = allowed && m.err == nil && m.reply[0] == 1
		}
		if allowed {
			continue
		}
		// A shard's part was debited when every member of it was allowed.
		var debited [MaxGroup]bool
		for i, m := range lead.members {
			debited[i] = m.err == nil
			for _, o := range lead.members {
				if o.shard == m.shard && (o.err != nil || o.reply[0] != 1) {
					debited[i] = false
				}
			}
		}
		for i, m := range lead.members {
			if debited[i] {
				refunds = append(refunds, m)
			}
		}
	}
	buf.refunds = refunds
	if len(refunds) == 0 {
		return
	}
	k := len(refunds[0].snap.shardPrefixes)
	calls := buf.calls[:0]
	for shard := range k {
		levels := &lua.Levels{}
		var at int64
		for _, m := range refunds {
			if m.shard != shard {
				continue
			}
			at = m.at
			borrowed := m.reply[5]
			global, pool := b.shardLimits(m.snap, shard)
			prefix := m.snap.shardPrefixes[shard]
			add := func(key string, lim *policy.Limit, tokens int64) {
				if lim != nil && tokens > 0 {
					levels.Add(key, limitOf(lim), tokens)
				}
			}
			add(prefix.Global(), global, m.cost)
			add(prefix.Pool(), pool, borrowed)
			add(m.keys[0], m.limits[0], m.cost-borrowed)
			add(m.keys[1], m.limits[1], borrowed)
			add(m.keys[2], m.limits[2], m.cost)
			add(m.keys[3], m.limits[3], m.cost)
		}
		if levels.Len() > 0 {
			calls = append(calls, lua.RefundCall(levels, now, at))
		}
	}
	buf.refunds = buf.refunds[:0]
	clear(refunds)
	start := time.Now()
	// Best effort: see above. A failed refund is counted.
	if err := lua.Refund.RunPipelined(ctx, b.client, calls); err != nil {
		b.stats.refundFailures.Add(int64(len(calls)))
	} else {
		for _, c := range calls {
			if c.Cmd.Err() != nil {
				b.stats.refundFailures.Add(1)
			}
		}
	}
	b.e.observeRedis(time.Since(start))
	b.stats.refunds.Add(int64(len(calls)))
}
