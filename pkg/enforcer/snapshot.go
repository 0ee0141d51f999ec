package enforcer

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

type fairnessMode uint8

const (
	fairNone fairnessMode = iota
	fairMaxMin
	fairWFQ
	fairDRR
)

func parseFairness(s string) fairnessMode {
	switch s {
	case "maxmin":
		return fairMaxMin
	case "wfq":
		return fairWFQ
	case "drr":
		return fairDRR
	}
	return fairNone
}

// snapshot is everything a decision reads from one policy, derived once when
// the policy is installed and never modified after.
type snapshot struct {
	// seq orders the snapshots an engine installs: state only ever moves
	// to a later one.
	seq uint64
	// installedAt is when SetPolicyAt put it in force (µs; 0 for the first):
	// the old limits hold until then, the new ones from then on.
	installedAt int64

	policy    *policy.Policy
	endpoints []policy.Endpoint
	// known maps the tenants the policy names to their (shared, long-lived) state.
	known map[string]*tenantState

	fairness fairnessMode
	// shareByTenant: contended capacity is shared among tenants by their
	// weights (policy.ShareByTenant), not among tiers first.
	shareByTenant bool
	mode          policy.Mode        // the plane's backend
	failureMode   policy.FailureMode // what the distributed backends do while Redis is unavailable
	redisPrefix   keyspace.Prefix    // the prefix of the plane's Redis keys
	// shardPrefixes are the key prefixes of the plane's shards (shards.go);
	// one, redisPrefix, unless the plane is split.
	shardPrefixes []keyspace.Prefix
	denyUnknown   bool
	denyEndpoint  bool
	// bound: the plane binds api keys to tenants (policy.KeyBindingBound).
	bound   bool
	maxCost int64 // the largest endpoint cost, at least 1
	// part is the part of each tenant, endpoint and key limit a limiter
	// enforces until the reconcile loop sizes its own (1 but in mode
	// local-reconciled: an even share among the live nodes); reconciled
	// says the loop sizes them (limiter.fit).
	part       float64
	reconciled bool
	// splitOver is the live nodes that limits are split over in mode
	// local-reconciled while Redis answers (0 otherwise): a limit too
	// small to give each a request is decided in Redis (hybrid.go), for
	// a request of smallCost or more.
	splitOver int64
	smallCost int64
	minCost   int64 // the cheapest request's cost: 1 with unknown endpoints (cost 1) allowed

	global *policy.Limit
	// plane is the plane's whole policy: policy itself but in the
	// distributed modes, whose own snapshot holds the node's share of it.
	// Decisions carry it (Decision.Limits).
	plane         *policy.Policy
	globalPerSec  float64       // the global limit's refill rate in tokens per second
	pool          *policy.Limit // the burst pool as a bucket; nil without a pool
	borrowCeiling *policy.Limit // a tenant's borrow allowance: ceiling, repaid at the pool's refill rate

	tierRank    map[string]int // tier name → index in policy order (0 is the most protected)
	floors      []float64      // per tier rank: floor in tokens per second
	tierWeights []int64        // per tier rank
	// reserves (fairness none only), per tier rank: token·µs of the global
	// bucket kept for the tiers ranked above it.
	reserves []int64
	// reservePercents, per tier rank: the floors of the tiers ranked above
	// it, in percent of the global burst (reserves before scaling).
	reservePercents []int64
	// contendedReserve is the token·µs of the global bucket that tenants
	// above their fair share may not take while the plane is contended.
	contendedReserve int64

	reasons map[reasonKey]string
	// shapes are the whole shapes of every limit of the policy, shared by
	// the limiters that enforce them (limiter.sh).
	shapes map[*policy.Limit]*limitShape

	// The tenants' records (record.go): records of those the policy
	// names, tierRecords of the others by tier, defaultRecord the default
	// tier's, deniedRecord the zero tenant's.
	records                     map[string]*tenantRecord
	tierRecords                 map[string]*tenantRecord
	defaultRecord, deniedRecord *tenantRecord
}

// changeTime is when state moves to this snapshot for a decision (or a
// swap) at now: at its installation, or at now for a decision dated before
// that. The old limits hold until then.
func (s *snapshot) changeTime(now int64) int64 {
	if s.installedAt > 0 {
		return min(now, s.installedAt)
	}
	return now
}

// contendedReservePercent is the part of the global burst kept for tenants
// within their fair share while the plane is contended.
const contendedReservePercent = 10

// reasonKind is what a precomputed denial reason is about.
type reasonKind uint8

const (
	reasonGlobal reasonKind = iota
	reasonTenant
	reasonTenantPoolDry
	reasonTenantCeiling
	reasonEndpoint
	reasonAPIKey
)

type reasonKey struct {
	kind reasonKind
	lim  *policy.Limit
}

// Reasons that do not depend on a limit.
const (
	reasonShare   = "global capacity is contended and this tenant is above its weighted fair share"
	reasonReserve = "global capacity is low and what is left is reserved for higher tiers"
	// reasonShareReserve: the tenant is above its fair share and the rest of
	// the global bucket is kept for tenants within theirs.
	reasonShareReserve = "global capacity is contended and what is left is kept for tenants within their fair share"
	reasonUnknown      = "this request cannot pass"
)

func newSnapshot(p *policy.Policy) *snapshot {
	spec := p.Spec()
	s := &snapshot{
		policy:        p,
		endpoints:     p.Endpoints(),
		known:         make(map[string]*tenantState, len(spec.Tenants)),
		fairness:      parseFairness(spec.Fairness),
		shareByTenant: spec.SharesByTenant(),
		mode:          p.Mode(),
		failureMode:   p.FailureMode(),
		redisPrefix:   keyspace.PlanePrefix(p.ID()),
		shardPrefixes: shardPrefixes(p),
		denyUnknown:   spec.UnknownTenants == "deny",
		denyEndpoint:  spec.UnknownEndpoints == "deny",
		bound:         p.KeyBinding() == policy.KeyBindingBound,
		maxCost:       1,
		part:          1,
		smallCost:     math.MaxInt64,
		global:        &spec.Global,
		plane:         p,
		tierRank:      make(map[string]int, len(spec.Tiers)),
		reasons:       map[reasonKey]string{},
		shapes:        map[*policy.Limit]*limitShape{},
	}
	s.globalPerSec = perSecond(spec.Global)
	if bp := spec.BurstPool; bp != nil {
		s.pool = &policy.Limit{Rate: bp.RefillRate, Burst: bp.Size, Period: time.Second, Algorithm: policy.TokenBucket}
		s.borrowCeiling = &policy.Limit{Rate: bp.RefillRate, Burst: bp.PerTenantCeiling, Period: time.Second, Algorithm: policy.TokenBucket}
		s.addShape(s.pool)
		s.addShape(s.borrowCeiling)
	}
	s.contendedReserve = spec.Global.Burst * contendedReservePercent / 100 * spec.Global.PeriodMicros()
	var reserved int64
	for i, t := range spec.Tiers {
		s.tierRank[t.Name] = i
		s.floors = append(s.floors, s.globalPerSec*float64(t.FloorPercent)/100)
		s.tierWeights = append(s.tierWeights, t.Weight)
		s.reserves = append(s.reserves, reserveOf(reserved, &spec.Global))
		s.reservePercents = append(s.reservePercents, reserved)
		reserved += t.FloorPercent
		s.addReason(reasonTenant, t.Tenant)
		s.addReason(reasonAPIKey, t.Key)
	}
	s.addReason(reasonGlobal, s.global)
	s.minCost = math.MaxInt64
	if !s.denyEndpoint || len(s.endpoints) == 0 {
		s.minCost = 1
	}
	for i := range s.endpoints {
		e := &s.endpoints[i]
		s.maxCost = max(s.maxCost, e.Cost)
		s.minCost = min(s.minCost, max(e.Cost, 1))
		s.addReason(reasonEndpoint, e.Limit)
		for j := range e.Tiers {
			s.addReason(reasonEndpoint, &e.Tiers[j].Limit)
		}
	}
	for i := range spec.Tenants {
		t := &spec.Tenants[i]
		s.addReason(reasonTenant, t.Limit)
		for j := range t.Keys {
			s.addReason(reasonAPIKey, &t.Keys[j].Limit)
		}
		for j := range t.Endpoints {
			s.addReason(reasonEndpoint, &t.Endpoints[j].Limit)
		}
	}
	s.resolveRecords()
	return s
}

// reserveOf is percent of lim's burst, in token·µs.
func reserveOf(percent int64, lim *policy.Limit) int64 {
	return percent * lim.Burst / 100 * lim.PeriodMicros()
}

func perSecond(l policy.Limit) float64 {
	return float64(l.Rate) * float64(time.Second) / float64(l.Period)
}

var reasonFormats = [...]string{
	reasonGlobal:        "global limit of %s is used up: the whole plane is at capacity",
	reasonTenant:        "tenant limit of %s is used up",
	reasonTenantPoolDry: "tenant limit of %s is used up and the burst pool is dry",
	reasonTenantCeiling: "tenant limit of %s is used up and the tenant already owes the burst pool its ceiling",
	reasonEndpoint:      "this tenant's limit on this endpoint, %s, is used up",
	reasonAPIKey:        "api key limit of %s is used up",
}

// neverReason is the reason of a denial at level for a request of cost
// that the level's limit lim (the plane's whole limit; extra, what a soft
// tenant may borrow beyond its burst) can never hold, "" when it can some
// day. Such a request waits in vain: "used up" would send its client back
// after Retry-After for nothing.
func neverReason(level Level, lim *policy.Limit, extra, cost int64) string {
	if lim == nil {
		return ""
	}
	if c := capacityOf(lim) + extra; cost > c {
		return fmt.Sprintf("the request costs %d tokens and the %s limit holds at most %d: it can never pass; send fewer units", cost, level, c)
	}
	return ""
}

// borrowExtra is what a tenant may borrow beyond its burst (neverReason's
// extra): the pool's per-tenant ceiling when it may borrow, else 0.
func (s *snapshot) borrowExtra(mayBorrow bool) int64 {
	if mayBorrow && s.borrowCeiling != nil {
		return s.borrowCeiling.Burst
	}
	return 0
}

// addReason precomputes the denial reasons that mention lim, so that a
// denial builds no string, and lim's shape (every limit of the policy
// passes here).
func (s *snapshot) addReason(kind reasonKind, lim *policy.Limit) {
	if lim == nil {
		return
	}
	s.addShape(lim)
	kinds := []reasonKind{kind}
	if kind == reasonTenant {
		kinds = append(kinds, reasonTenantPoolDry, reasonTenantCeiling)
	}
	for _, k := range kinds {
		if _, ok := s.reasons[reasonKey{k, lim}]; !ok {
			s.reasons[reasonKey{k, lim}] = fmt.Sprintf(reasonFormats[k], lim)
		}
	}
}

// addShape derives lim's whole shape, once.
func (s *snapshot) addShape(lim *policy.Limit) {
	if _, ok := s.shapes[lim]; !ok {
		s.shapes[lim] = wholeShape(lim)
	}
}

// shapeOf is lim's whole shape, shared; nil for a limit the policy does
// not hold (or none).
func (s *snapshot) shapeOf(lim *policy.Limit) *limitShape {
	if lim == nil {
		return nil
	}
	return s.shapes[lim]
}

func (s *snapshot) reason(kind reasonKind, lim *policy.Limit) string {
	if r, ok := s.reasons[reasonKey{kind, lim}]; ok {
		return r
	}
	return reasonUnknown
}

// endpoint finds an endpoint's index (-1 for an endpoint the plane does not
// name, and for none) and cost. ok is false when the plane denies unknown
// endpoints. A name resolves canonically (policy.ResolveEndpoint): the
// endpoint of that name, else the one whose name equals it but for ASCII
// case, so that "Export" costs what "export" costs and meets its limits;
// Compile refuses two endpoints that differ only in case. name is valid
// (ValidateRequest: ASCII only), where strings.EqualFold is ASCII folding.
func (s *snapshot) endpoint(name string) (index int, cost int64, ok bool) {
	if len(s.endpoints) <= 8 { // a handful of endpoints: a scan beats hashing
		for i := range s.endpoints {
			if s.endpoints[i].Name == name {
				return i, s.endpoints[i].Cost, true
			}
		}
		for i := range s.endpoints {
			if strings.EqualFold(s.endpoints[i].Name, name) {
				return i, s.endpoints[i].Cost, true
			}
		}
	} else if i, found := s.policy.ResolveEndpoint(name); found {
		return i, s.endpoints[i].Cost, true
	}
	return -1, 1, !s.denyEndpoint
}
