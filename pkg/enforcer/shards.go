package enforcer

import (
	"context"
	"hash/crc32"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// Sharding spreads a central plane over K Redis Cluster slots (the plane's
// spec.shards). Shard s has its own hash tag, its own global bucket and
// burst pool, each holding a part w_s of the plane's, and the state of the
// tenants that live there: a tenant lives in the shard its name hashes to,
// so every decision is still one atomic call in one slot.
//
// The parts follow demand: every call adds what it was offered to its
// shard's counter, and every node reads the counters each rebalance
// interval and sets w_s = (1-shareFloor) × s's part of the demand +
// shareFloor / K. A whale tenant may be split itself (its TenantQuota's
// spec.shards = n): its requests go to n consecutive shards by api key (an
// api key's state stays in one), and each part holds 1/n of its tenant and
// endpoint limits and of its borrow ceiling.
//
// The accuracy cost, against one slot's exactness: a request is denied in
// its shard while another shard still has tokens, when demand moves
// between shards faster than the parts follow (they follow within a
// rebalance interval) or when a split tenant's api keys are uneven; nodes
// that read the counters at different times disagree on the parts for up
// to an interval, so the parts' sum can be off the global limit by the
// demand that moved meanwhile; and each part's burst rounds up (at most the
// costliest request per shard). With one shard (the default) none of this
// applies: the plane is one slot and exact.
type shards struct {
	// weights are the shards' parts of the global limit (and of the pool),
	// adding up to one; rebalanceLoop replaces them.
	weights atomic.Pointer[[]float64]
	// counters are the demand counters at the last read (rebalanceLoop).
	counters []int64
	// next spreads a split tenant's requests without an api key.
	next atomic.Uint64
}

// rebalanceInterval is how often a node recomputes the shards' parts.
const rebalanceInterval = time.Second

// shardPrefixes are the key prefixes of a plane's shards: with one shard
// the plane's own, else one hash tag per shard.
func shardPrefixes(p *policy.Policy) []keyspace.Prefix {
	k := p.Spec().Shards
	if k <= 1 {
		return []keyspace.Prefix{keyspace.PlanePrefix(p.ID())}
	}
	prefixes := make([]keyspace.Prefix, k)
	for s := range prefixes {
		prefixes[s] = keyspace.ShardPrefix(p.ID(), s)
	}
	return prefixes
}

// shardOf is the shard that decides a request of the tenant named name,
// whose limits are t, with apiKey, and how many parts t's limits are split
// into.
func (sh *shards) shardOf(k int, name string, t *policy.Tenant, apiKey string) (shard int, parts int64) {
	if k <= 1 {
		return 0, 1
	}
	home := homeShard(k, name)
	if t.Shards <= 1 {
		return home, 1
	}
	var part uint64
	if apiKey != "" {
		part = uint64(crc32.ChecksumIEEE([]byte(apiKey)))
	} else {
		part = sh.next.Add(1)
	}
	return (home + int(part%uint64(t.Shards))) % k, t.Shards
}

// homeShard is the shard the tenant named name lives in, or its first
// part's, of k > 1.
func homeShard(k int, name string) int {
	return int(crc32.ChecksumIEEE([]byte(name)) % uint32(k))
}

// weight is shard s's part of the global limit.
func (sh *shards) weight(s, k int) float64 {
	if w := sh.weights.Load(); w != nil && len(*w) == k {
		return (*w)[s]
	}
	return 1 / float64(k)
}

// shardLimits are shard's parts of the global limit and of the burst pool
// (the limits themselves with one shard).
func (b *central) shardLimits(snap *snapshot, shard int) (global, pool *policy.Limit) {
	global, pool = snap.global, snap.pool
	if k := len(snap.shardPrefixes); k > 1 {
		w := b.shards.weight(shard, k)
		g := global.Share(w, snap.maxCost)
		global = &g
		if pool != nil {
			p := pool.Share(w, snap.maxCost)
			pool = &p
		}
	}
	return global, pool
}

// rebalanceLoop recomputes the shards' parts from the fleet's demand
// counters while the plane is in central mode with more than one shard.
func (b *central) rebalanceLoop(stop <-chan struct{}) {
	ticker := time.NewTicker(rebalanceInterval)
	defer ticker.Stop()
	for {
		select {
		case <-stop:
			return
		case <-ticker.C:
		}
		if snap := b.snap.Load(); snap != nil && len(snap.shardPrefixes) > 1 {
			b.rebalance(snap)
		}
	}
}

func (b *central) rebalance(snap *snapshot) {
	k := len(snap.shardPrefixes)
	ctx, cancel := context.WithTimeout(context.Background(), b.e.settings.redisTimeout)
	defer cancel()
	cmds := make([]*redis.StringCmd, k)
	_, _ = b.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for s, prefix := range snap.shardPrefixes {
			cmds[s] = p.Get(ctx, prefix.Demand())
		}
		return nil
	})
	sh := &b.shards
	counters := make([]int64, k)
	for s, cmd := range cmds {
		v, err := cmd.Int64()
		if err != nil && err != redis.Nil {
			return // try again next interval
		}
		counters[s] = v
	}
	last := sh.counters
	sh.counters = counters
	if len(last) != k {
		return // the first read: nothing to compare with
	}
	var total float64
	demand := make([]float64, k)
	for s := range k {
		demand[s] = float64(max(counters[s]-last[s], 0)) // a counter that expired starts again
		total += demand[s]
	}
	if total == 0 {
		return // no demand: keep the parts
	}
	weights := make([]float64, k)
	for s := range k {
		weights[s] = (1-shareFloor)*demand[s]/total + shareFloor/float64(k)
	}
	sh.weights.Store(&weights)
}
