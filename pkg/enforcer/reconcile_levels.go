package enforcer

import (
	"cmp"
	"slices"

	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/lua"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// Lower levels in local-reconciled mode.
//
// A tenant's limits (its tenant, endpoint and api key limits) are enforced
// on each node at the node's part of them, which follows where the tenant's
// demand is: a tenant whose requests all reach one node (a balancer that
// hashes by tenant or key) gets its whole limit there, one spread over the
// nodes its limit in total. Each such limit is a bucket of the fleet in
// Redis, named as decide.lua names it, reconciled as the global level is:
//
//   - every reconcile, a node pushes, per bucket it used or was offered
//     requests at, the tokens it admitted there (debited from the fleet's
//     bucket, once per push) and its demand on it, the tokens offered per
//     second averaged over reconciles, which replaces its last report in
//     the bucket's demand record; the fleet's demand is the sum of the
//     live reports;
//   - it sizes its part from its own demand d against the fleet's D and
//     the limit's rate R: d/D
//     when the fleet wants the whole limit (D ≥ R), else its demand plus
//     an even split of what the fleet leaves, (d + (R-D)/N)/R, N the live
//     nodes; a part never drops below levelPartFloor/N, so a node whose
//     demand for a tenant is new is not at zero until its next reconcile;
//   - it pays its part of the bucket's debt: the local bucket comes down
//     to its part of the fleet's level when that is lower, as payDebt does
//     for the global level.
//
// A limiter the loop has not sized enforces the snapshot's even part, 1/N
// of the limit: a tenant the node has not seen starts there. A node pushes
// at most maxReconciledBuckets buckets per reconcile, those with the most
// demand; the others stay at the even part, and what they admit is not
// pushed (parts that sum to at most one keep it within the limit). A
// bucket's part goes back to the even one when its demand here and in the
// fleet is gone. Sliding windows are sized by demand the same way; the
// fleet's window is not debited (a window logs admissions, not a level).
type levelBucket struct {
	ts    *tenantState
	level Level
	ep    int    // LevelEndpoint: index in the tenant's endpoint limiters (its record's endpoints)
	key   string // LevelKey: the api key
	name  string // the fleet's bucket in Redis
	lim   *policy.Limit
	// tokens is what the node admitted at the level since its last push,
	// offered the cost of the requests that met it.
	tokens, offered int64
	demand          float64 // this node's, tokens/s
}

// maxReconciledBuckets bounds the lower-level buckets a node pushes per
// reconcile.
const maxReconciledBuckets = 4096

// levelPartFloor is the part of a lower-level limit kept for the live nodes
// evenly whatever their demand: 2%, so a tenant whose requests all reach
// one node of four gets 98.5% of its limit there.
const levelPartFloor = 0.02

// collectBuckets takes, from every tenant's limiters, what this push
// carries: the tokens each admitted and was offered since the last push,
// for those with some, and for those the loop sized (so that their part
// follows the fleet back to the even one); at most maxReconciledBuckets,
// those with the most demand.
func (r *reconciler) collectBuckets(snap *snapshot, seconds float64) []levelBucket {
	r.scratch = r.e.tenants.appendAll(r.scratch[:0])
	defer clear(r.scratch)
	prefix := snap.redisPrefix
	out := r.buckets[:0]
	for _, ts := range r.scratch {
		ts.mu.Lock()
		if ts.snap != snap || ts.removed {
			ts.mu.Unlock()
			continue
		}
		holder := ""
		add := func(l *limiter, level Level, ep int, endpoint, key string) {
			// A window stays at the even part: its entries outlive a
			// reconcile, so a part resized by demand would let the fleet
			// admit the sum of each node's largest part in a period.
			used, offered := l.counters()
			if fleet, _, _ := l.fleetPart(); !l.active() || l.window() != nil || (used == 0 && offered == 0 && !fleet) {
				return
			}
			if holder == "" {
				holder = keyspace.Holder(ts.name)
			}
			out = append(out, levelBucket{ts: ts, level: level, ep: ep, key: key, lim: l.limit(),
				name: levelName(prefix, level, holder, endpoint, key, l.limit()), tokens: used, offered: offered})
			l.clearCounters()
		}
		add(&ts.limit, LevelTenant, -1, "", "")
		eps := ts.endpointsLocked()
		for i := range eps {
			add(&eps[i], LevelEndpoint, i, snap.endpoints[ts.rec.endpoints[i].ep].Name, "")
		}
		for ks := range ts.keys.all() {
			add(&ks.limit, LevelKey, -1, "", ks.key)
		}
		ts.mu.Unlock()
	}
	if len(out) > maxReconciledBuckets {
		slices.SortFunc(out, func(a, b levelBucket) int { return cmp.Compare(b.offered, a.offered) })
		clear(out[maxReconciledBuckets:])
		out = out[:maxReconciledBuckets]
	}
	for i := range out {
		b := &out[i]
		instant := float64(b.offered) / seconds
		d, ok := r.demands[b.name]
		if ok {
			d += (instant - d) / 2
		} else {
			d = instant
		}
		r.demands[b.name], b.demand = d, d
	}
	r.buckets = out
	return out
}

// bucketLevels is the push's buckets as reconcile.lua takes its lower
// levels: KEYS[5..] and ARGV[11].
func bucketLevels(buckets []levelBucket) *lua.Levels {
	levels := &lua.Levels{}
	for _, b := range buckets {
		levels.Add(b.name, limitOf(b.lim), b.tokens, int64(b.demand*1000))
	}
	return levels
}

// applyBuckets sizes each pushed bucket's part on this node from the
// reply (pairs of fleet level and fleet demand) and pays its debt.
func (r *reconciler) applyBuckets(snap *snapshot, buckets []levelBucket, reply []any, nodes int64, now int64) {
	seen := make(map[string]struct{}, len(buckets))
	for i, b := range buckets {
		if 2*i+1 >= len(reply) {
			break
		}
		level, _ := reply[2*i].(int64)
		milli, _ := reply[2*i+1].(int64)
		fleet := float64(milli) / 1000

		seen[b.name] = struct{}{}
		rate := perSecond(*b.lim)
		idle := b.demand < 0.01*rate/float64(nodes) // nothing here worth a part of its own
		part := levelPart(b.demand, max(fleet, b.demand), rate, nodes)

		b.ts.mu.Lock()
		if l := b.limiterLocked(snap); l != nil {
			if idle {
				l.setFleetPart(false, snap.part, now)
				delete(r.demands, b.name)
			} else {
				l.setFleetPart(true, part, now)
				if l.window() == nil {
					// The fleet's level is in token·µs of the limit's
					// period, the limiter's in its own (limiter.reset).
					tokens := float64(level) / float64(b.lim.PeriodMicros())
					l.settle(now)
					l.level = max(min(l.level, int64(tokens*part*float64(l.periodUs()))), -l.capacity())
				}
			}
		}
		b.ts.mu.Unlock()
	}
	for name := range r.demands {
		if _, ok := seen[name]; !ok {
			delete(r.demands, name) // not pushed: back at the even part
		}
	}
}

// levelPart is a node's part of a limit of rate tokens/s: by its demand
// own against the fleet's, of nodes live nodes (see the comment at the top
// of this file).
func levelPart(own, fleet, rate float64, nodes int64) float64 {
	n := float64(max(nodes, 1))
	var f float64
	switch {
	case fleet <= 0 || rate <= 0:
		f = 1 / n
	case fleet >= rate:
		f = own / fleet
	default:
		f = (own + (rate-fleet)/n) / rate
	}
	return min((1-levelPartFloor)*f+levelPartFloor/n, 1)
}

// limiterLocked finds the bucket's limiter, if the tenant still has it
// with the same limit.
func (b *levelBucket) limiterLocked(snap *snapshot) *limiter {
	ts := b.ts
	if ts.removed || ts.snap != snap {
		return nil
	}
	var l *limiter
	switch b.level {
	case LevelTenant:
		l = &ts.limit
	case LevelEndpoint:
		if eps := ts.endpointsLocked(); b.ep < len(eps) {
			l = &eps[b.ep]
		}
	case LevelKey:
		if ks := ts.keys.get(b.key); ks != nil {
			l = &ks.limit
		}
	}
	if l == nil || l.limit() != b.lim {
		return nil
	}
	return l
}
