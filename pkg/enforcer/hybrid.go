package enforcer

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/lua"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// Limits too small to split, in local-reconciled mode.
//
// A node's part of a limit must hold at least one request of the costs it
// decides there, so a limit smaller than the live nodes times a request's
// cost — the free tier's 2 exports per 5 minutes over 8 nodes — would
// admit one per node, several times its limit. For such a request the
// limit is small (snapshot.small: capacity < nodes × cost) and is decided
// in Redis instead, by decide.lua on the fleet's bucket or window, the one
// the reconcile loop pushes the node's own admissions to: a request that
// meets small limits is decided there first, at those levels only (no
// global, whose node share stays local), then on the node's own state at
// the others, and what Redis debited is given back (refund.lua) when the
// node's own levels deny it. Between the two a concurrent request may see
// the debit and be denied for it: the small levels may admit less, never
// more. A group (DecideAll) has its small levels decided as one group in
// Redis, all or nothing, then the rest. Smallness is per request: the same
// tenant limit may be split for reads (cost 1) and decided in Redis for
// exports (cost 50), so only the costly requests pay a round trip; a
// request decided in Redis at its tenant level does not borrow from the
// burst pool there.
//
// While Redis does not answer, the plane's failureMode decides: deny
// denies; allow and degrade decide on the node's own state without the
// small levels until the reconcile loop finds the node degraded (three
// failed reconciles), after which every limit is the node's again, small
// ones at the floored share, until Redis is back.

// small reports whether lim is too small to split over the fleet for a
// request of cost: its burst (a window's capacity) holds less than one such
// request per live node. Never outside local-reconciled, nor with one
// node, nor while the node is degraded (snapshot.splitOver is 0).
// smallFrom is the least cost at which some limit of the snapshot's policy
// is small (math.MaxInt64 when none is), so that most requests skip the
// search for small limits (meetsSmall) with one comparison.
func (s *snapshot) smallFrom() int64 {
	least := int64(math.MaxInt64)
	if s.splitOver < 2 {
		return least
	}
	consider := func(lim *policy.Limit) {
		if lim == nil {
			return
		}
		if lim.Algorithm == policy.SlidingWindow {
			if s.small(lim, 1) { // a window is small for every cost or none
				least = 1
			}
			return
		}
		least = min(least, lim.Burst/s.splitOver+1) // capacity < nodes × cost
	}
	spec := s.policy.Spec()
	for _, t := range spec.Tiers {
		consider(t.Tenant)
		consider(t.Key)
	}
	for _, e := range spec.Endpoints {
		consider(e.Limit)
		for i := range e.Tiers {
			consider(&e.Tiers[i].Limit)
		}
	}
	for _, t := range spec.Tenants {
		consider(t.Limit)
		for i := range t.Keys {
			consider(&t.Keys[i].Limit)
		}
		for i := range t.Endpoints {
			consider(&t.Endpoints[i].Limit)
		}
	}
	return least
}

func (s *snapshot) small(lim *policy.Limit, cost int64) bool {
	if s.splitOver < 2 || lim == nil {
		return false
	}
	if lim.Algorithm == policy.SlidingWindow {
		// A window is Redis's for every request or none: the fleet's
		// window never sees what nodes admit on their own.
		cost = s.maxCost
	}
	return capacityOf(lim) < s.splitOver*cost
}

// capacityOf is a limit's burst, or a sliding window's capacity.
func capacityOf(lim *policy.Limit) int64 {
	if lim.Algorithm == policy.SlidingWindow {
		return lim.Rate
	}
	return lim.Burst
}

// levelName is the Redis key of a tenant's limit at level, as decide.lua
// and the reconcile loop name it: holder is keyspace.Holder(tenant).
func levelName(prefix keyspace.Prefix, level Level, holder, endpoint, apiKey string, lim *policy.Limit) string {
	switch level {
	case LevelTenant:
		return prefix.Tenant(holder, isWindow(lim))
	case LevelEndpoint:
		return prefix.Endpoint(holder, endpoint, isWindow(lim))
	}
	return prefix.Key(holder, keyspace.KeyDigest(apiKey), isWindow(lim))
}

// hybridLevel is one small limit a request meets.
type hybridLevel struct {
	level Level
	name  string
	lim   *policy.Limit
	cost  int64
}

// hybridCall is the small levels of a request or group, decided in Redis.
type hybridCall struct {
	levels   []hybridLevel
	requests int   // the requests with a small level
	decided  int64 // Redis TIME of the decision, µs
}

// smallHolder is the tenant state ts (this node's for r: stateOf) as the
// small levels name it in Redis, and its record in s. Like mode central and
// the reconcile loop, a tenant beyond -max-tenants is decided on the
// overflow state's buckets, with its limits (the default tier's), so a
// flood of new names leaves at most the caps' worth of keys in Redis.
func (s *snapshot) smallHolder(ts *tenantState, r *Request) (name string, t *policy.Tenant) {
	name, tier := r.Tenant, r.Tier
	if ts.name == overflowName {
		name, tier = overflowName, "" // the default tier, as the local overflow state
	}
	rec, _ := s.recordOf(name, tier)
	return name, &rec.tenant
}

// stateOf is r's tenant's state on this node: the one the policy names, or
// the registry's, which is the overflow state beyond -max-tenants.
func (e *Engine) stateOf(snap *snapshot, r *Request) *tenantState {
	if ts := snap.known[r.Tenant]; ts != nil {
		return ts
	}
	return e.tenants.getOrCreate(r.Tenant, r.Tier, e.settings.maxTenants+len(snap.known))
}

// meetsSmall reports whether r (resolved in s to ep, its tenant's limits
// t: smallHolder) meets a small limit, allocating nothing: most requests of
// a plane with small limits meet none.
func (s *snapshot) meetsSmall(t *policy.Tenant, r *Request, ep int, cost int64) bool {
	p := s.policy
	return s.small(t.Limit, cost) || ep >= 0 && s.small(p.EndpointLimit(t, ep), cost) ||
		r.APIKey != "" && s.small(p.KeyLimit(t, r.APIKey), cost)
}

// smallKeyName is the name in Redis of r's api key in ts, as the reconcile
// loop names the key's state: the key's own, or overflowName beyond the
// node's key budget (WithMaxKeysPerTenant, WithMaxKeys). It takes the key
// its state now (keyLocked, as the node's own levels would next), so that
// the budget counts every key name the small levels write, also those of
// requests Redis denies. A state pruned or a policy swapped in since snap
// was loaded gets overflowName: the caller gives the call back and decides
// again (decideOpts, lockGroup), and the state must not move back to snap.
func (e *Engine) smallKeyName(snap *snapshot, ts *tenantState, r *Request, now int64) string {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.removed || e.snap.Load() != snap {
		return overflowName
	}
	e.bringLocked(snap, ts, r, now)
	if ks := ts.keyLocked(r.APIKey, snap, &e.keys, now); ks != nil {
		return ks.key
	}
	return overflowName
}

// smallLevels appends to hc the small limits r meets (resolved in snap: ep
// and cost as snap.resolve gave them; ts its tenant's state on this node).
func (e *Engine) smallLevels(snap *snapshot, hc *hybridCall, ts *tenantState, r *Request, ep int, cost, now int64) (tenant, endpoint, key int) {
	p := snap.policy
	name, t := snap.smallHolder(ts, r)
	holder := ""
	add := func(level Level, lim *policy.Limit, endpointName, apiKey string) int {
		if !snap.small(lim, cost) {
			return 0
		}
		if holder == "" {
			holder = keyspace.Holder(name)
		}
		hc.levels = append(hc.levels, hybridLevel{level: level, lim: lim, cost: cost,
			name: levelName(snap.redisPrefix, level, holder, endpointName, apiKey, lim)})
		return len(hc.levels)
	}
	tenant = add(LevelTenant, t.Limit, "", "")
	if ep >= 0 {
		endpoint = add(LevelEndpoint, p.EndpointLimit(t, ep), snap.endpoints[ep].Name, "")
	}
	if r.APIKey != "" {
		if lim := p.KeyLimit(t, r.APIKey); snap.small(lim, cost) {
			apiKey := r.APIKey
			if !p.NamesKey(t, apiKey) {
				if apiKey = e.smallKeyName(snap, ts, r, now); apiKey == overflowName {
					lim = p.KeyLimit(t, "") // the overflow key's, as its state's (keyLookupLocked)
				}
			}
			key = add(LevelKey, lim, "", apiKey)
		}
	}
	return tenant, endpoint, key
}

// hybridDecide decides the small levels of rs (each resolved to eps and
// costs in snap, at now) in one decide.lua call, as one group when there are
// several. It returns nil when none meets a small limit; else the call,
// whether Redis admitted them (filling ds[i] of the first denied with its
// denial), and an error when Redis did not answer.
func (e *Engine) hybridDecide(snap *snapshot, now int64, rs []Request, eps []int, costs []int64, ds []Decision) (*hybridCall, bool, error) {
	meets := false
	for i := range rs {
		_, t := snap.smallHolder(e.stateOf(snap, &rs[i]), &rs[i])
		meets = meets || snap.meetsSmall(t, &rs[i], eps[i], costs[i])
	}
	if !meets {
		return nil, true, nil
	}
	hc := &hybridCall{}
	var args batchArgs
	args.reset(snap.redisPrefix, nil, nil) // no global, no pool: the small levels only
	var requests []byte
	group := int64(0)
	if len(rs) > 1 {
		group = 1
	}
	owner := make([]int, 0, len(rs))    // the request of each record
	spans := make([][2]int, 0, len(rs)) // its levels in hc.levels
	for i := range rs {
		first := len(hc.levels)
		ti, ei, ki := e.smallLevels(snap, hc, e.stateOf(snap, &rs[i]), &rs[i], eps[i], costs[i], now)
		if len(hc.levels) == first {
			continue
		}
		owner = append(owner, i)
		spans = append(spans, [2]int{first, len(hc.levels)})
		index := func(k int) int64 { // KEYS index: each key once (decide.lua), after global, pool and counter
			if k == 0 {
				return 0
			}
			l := hc.levels[k-1]
			return args.add(l.name, l.lim)
		}
		for _, v := range [lua.DecideRequestFields]int64{costs[i], 0, 0, index(ti), 0, index(ei), index(ki), group, 0} {
			requests = binary.LittleEndian.AppendUint64(requests, uint64(v))
		}
	}
	if len(hc.levels) == 0 {
		return nil, true, nil
	}
	hc.requests = len(owner)
	ctx, cancel := context.WithTimeout(context.Background(), e.settings.redisTimeout)
	defer cancel()
	start := time.Now()
	reply, err := lua.Decide.RunCall(ctx, e.redis, lua.DecideCall(&args.levels, 0, requests, false)).Int64Slice()
	e.observeRedis(time.Since(start))
	if err != nil {
		return hc, false, err
	}
	if len(reply) != 1+hc.requests*lua.DecideReplyFields {
		return hc, false, fmt.Errorf("decide.lua answered %d values for the small levels, want %d", len(reply), 1+hc.requests*lua.DecideReplyFields)
	}
	hc.decided = reply[0]
	admitted := true
	for j, i := range owner {
		out := reply[1+j*lua.DecideReplyFields:]
		if out[0] == 1 || !admitted {
			continue
		}
		admitted = false
		level := Levels[min(max(out[1]-1, 0), 3)]
		var lim *policy.Limit
		for _, l := range hc.levels[spans[j][0]:spans[j][1]] {
			if l.level == level {
				lim = l.lim
			}
		}
		kind := reasonAPIKey
		switch level {
		case LevelTenant:
			kind = reasonTenant
		case LevelEndpoint:
			kind = reasonEndpoint
		}
		ds[i] = Decision{Level: level, Bound: level, Cost: costs[i], Reason: snap.reason(kind, lim),
			RetryAfter: retryDuration(out[3]), Remaining: out[4], policy: snap.plane}
	}
	return hc, admitted, nil
}

// refund gives back what Redis debited for the call's small levels, when
// the node's own levels denied what Redis admitted. A refund that fails
// leaves the debit: the small levels admit less, never more.
func (e *Engine) hybridRefund(hc *hybridCall) {
	levels := &lua.Levels{}
	for _, l := range hc.levels {
		levels.Add(l.name, limitOf(l.lim), l.cost)
	}
	ctx, cancel := context.WithTimeout(context.Background(), e.settings.redisTimeout)
	defer cancel()
	_ = lua.Refund.RunCall(ctx, e.redis, lua.RefundCall(levels, 0, hc.decided)).Err()
}

// decideSmall decides the small limits r meets (resolved in snap to ep
// and cost) in Redis, before its other levels. decided says d is the
// decision: a denial at a small level (traced in the tenant's state), or
// failureMode deny while Redis does not answer. Otherwise the node's own
// levels decide next, and the call (nil when r meets no small limit, or
// Redis did not answer) is what to give back if they deny.
func (e *Engine) decideSmall(snap *snapshot, ts *tenantState, r *Request, ep int, cost, now int64, d *Decision) (*hybridCall, bool) {
	if _, t := snap.smallHolder(ts, r); !snap.meetsSmall(t, r, ep, cost) {
		return nil, false
	}
	var one [1]Decision
	hc, admitted, err := e.hybridDecide(snap, now, []Request{*r}, []int{ep}, []int64{cost}, one[:])
	switch {
	case hc == nil:
		return nil, false
	case err != nil && snap.failureMode == policy.FailureDeny:
		*d = unavailableDenial(snap, cost)
		return nil, true
	case err != nil:
		return nil, false // allow, degrade: the node's own levels decide
	case !admitted:
		*d = one[0]
		ts.mu.Lock()
		if !ts.removed {
			ts.lastSeen = now
			var endpoint *policy.Endpoint
			if ep >= 0 {
				endpoint = &snap.endpoints[ep]
			}
			ts.recordLocked(now, d, r.APIKey, endpoint)
		}
		ts.mu.Unlock()
		return nil, true
	}
	return hc, false
}

// unavailableDenial is failureMode deny's decision while Redis does not
// answer in local-reconciled mode.
func unavailableDenial(snap *snapshot, cost int64) Decision {
	return Decision{Level: LevelGlobal, Bound: LevelGlobal, Cost: cost, Reason: reasonUnavailableDeny, policy: snap.plane,
		RetryAfter: snap.policy.Spec().ReconcileInterval}
}
