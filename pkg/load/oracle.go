package load

import (
	"fmt"
	"math/big"
	"time"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// BucketOracle is an independent model of the engine's decisions, for
// checking attribution (experiment 7): global → tenant → endpoint → key
// token buckets, all or nothing. A request is denied at the first level
// that cannot cover its cost, and a denied request consumes nothing.
//
// It shares no code with pkg/enforcer's limiters. It reads the limits from
// the policy (Global, Tenant or DefaultTenant, EndpointLimit, KeyLimit and
// the endpoints' costs) and counts tokens as exact rationals (math/big):
// a bucket starts full, earns elapsed×rate/period tokens (time in whole µs,
// the engine's unit) up to its burst, and earns nothing when the clock goes
// back. With fairness none, a tier's floor is a reserve of the global burst
// that the tiers ranked below it cannot take.
//
// It models only what it claims to: mode local on one node, fairness none,
// no burst pool, token buckets everywhere. NewBucketOracle refuses any
// other plane, so the oracle can never silently disagree. Beyond the
// engine's default bounds on state (tenants the plane does not name, api
// keys) the engine shares state the oracle does not model; OutOfModel says
// when that happened.
//
// It is not safe for concurrent use: Run calls it from its one virtual-time
// stream.
type BucketOracle struct {
	policy   *policy.Policy
	global   *ratBucket
	reserves map[string]*big.Rat // tier → tokens of the global bucket it may not take
	tenants  map[string]*oracleTenant
	keys     int

	// Its own tally of what it decided.
	Decisions, Admitted int64
	Denied              [len(enforcer.Levels)]int64 // by level: global, tenant, endpoint, key
	// OutOfModel counts requests the oracle cannot model exactly (see the
	// type's comment); 0 in a valid check.
	OutOfModel int64

	scratch big.Rat
}

// The engine's default bounds on state (enforcer.WithMaxTenants and
// friends): within them every tenant and key has its own state.
const (
	oracleMaxUnknownTenants = 1_000_000
	oracleMaxKeysPerTenant  = 10_000
	oracleMaxKeys           = 1_000_000
)

type oracleTenant struct {
	tenant    policy.Tenant
	limit     *ratBucket         // nil: no tenant limit
	endpoints map[int]*ratBucket // by endpoint index; nil entry: no limit
	keys      map[string]*ratBucket
}

// ratBucket is a token bucket counted in exact rational tokens.
type ratBucket struct {
	rate, burst, periodUs int64
	tokens                big.Rat
	lastUs                int64
}

func newRatBucket(l *policy.Limit, nowUs int64) *ratBucket {
	b := &ratBucket{rate: l.Rate, burst: l.Burst, periodUs: int64(l.Period / time.Microsecond), lastUs: nowUs}
	b.tokens.SetInt64(l.Burst)
	return b
}

// refill adds the tokens earned since the last refill, up to the burst.
func (b *ratBucket) refill(nowUs int64, scratch *big.Rat) {
	if nowUs <= b.lastUs {
		return
	}
	scratch.SetFrac64((nowUs-b.lastUs)*b.rate, b.periodUs)
	b.lastUs = nowUs
	b.tokens.Add(&b.tokens, scratch)
	if b.tokens.Cmp(scratch.SetInt64(b.burst)) > 0 {
		b.tokens.SetInt64(b.burst)
	}
}

// covers reports whether cost tokens can be taken leaving reserve (nil: 0).
func (b *ratBucket) covers(cost int64, reserve *big.Rat, scratch *big.Rat) bool {
	scratch.SetInt64(cost)
	if reserve != nil {
		scratch.Add(scratch, reserve)
	}
	return scratch.Cmp(&b.tokens) <= 0
}

func (b *ratBucket) take(cost int64, scratch *big.Rat) {
	b.tokens.Sub(&b.tokens, scratch.SetInt64(cost))
}

// NewBucketOracle models p, or says why it cannot.
func NewBucketOracle(p *policy.Policy) (*BucketOracle, error) {
	s := p.Spec()
	var problems []string
	if s.Mode != "local" {
		problems = append(problems, fmt.Sprintf("mode %s (the oracle models local, one node)", s.Mode))
	}
	if s.Fairness != "none" {
		problems = append(problems, fmt.Sprintf("fairness %s (the oracle models none: use -fairness none)", s.Fairness))
	}
	if s.BurstPool != nil {
		problems = append(problems, "a burst pool (the oracle does not model borrowing)")
	}
	check := func(what string, l *policy.Limit) {
		if l != nil && l.Algorithm != policy.TokenBucket {
			problems = append(problems, fmt.Sprintf("%s is a %s (the oracle models token buckets)", what, l.Algorithm))
		}
	}
	check("the global limit", &s.Global)
	o := &BucketOracle{policy: p, reserves: map[string]*big.Rat{}, tenants: map[string]*oracleTenant{}}
	var floorsAbove int64 // percent of the global burst kept for the tiers ranked above
	for _, t := range s.Tiers {
		check("tier "+t.Name+"'s tenant limit", t.Tenant)
		check("tier "+t.Name+"'s key limit", t.Key)
		if floorsAbove*s.Global.Burst%100 != 0 {
			problems = append(problems, fmt.Sprintf("tier %s: its reserve, %d%% of the global burst %d, is not a whole number of tokens", t.Name, floorsAbove, s.Global.Burst))
		}
		o.reserves[t.Name] = big.NewRat(floorsAbove*s.Global.Burst/100, 1)
		floorsAbove += t.FloorPercent
	}
	for _, e := range s.Endpoints {
		check("endpoint "+e.Name+"'s limit", e.Limit)
		for _, tl := range e.Tiers {
			check("endpoint "+e.Name+"'s limit for tier "+tl.Tier, &tl.Limit)
		}
	}
	for _, t := range s.Tenants {
		check("tenant "+t.Name+"'s limit", t.Limit)
		for _, k := range t.Keys {
			check("tenant "+t.Name+"'s limit on key "+k.Key, &k.Limit)
		}
		for _, e := range t.Endpoints {
			check("tenant "+t.Name+"'s limit on endpoint "+e.Endpoint, &e.Limit)
		}
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("load: the oracle cannot model plane %s: %v", p.Plane(), problems)
	}
	return o, nil
}

// Decide predicts the engine's decision on r at now and counts it.
func (o *BucketOracle) Decide(now time.Time, r *enforcer.Request) (bool, enforcer.Level) {
	nowUs := now.UnixMicro()
	p := o.policy
	t := o.tenant(r, nowUs)
	if t == nil {
		return false, enforcer.LevelNone // the engine refuses the request (an error, never checked)
	}
	cost, ep := int64(1), -1
	if i, ok := p.EndpointIndex(r.Endpoint); ok {
		cost, ep = p.Endpoints()[i].Cost, i
	} else if p.Spec().UnknownEndpoints == "deny" {
		return false, enforcer.LevelNone
	}
	cost *= max(r.Units, 1)

	// The buckets in the order a request passes them; nil skips a level.
	if o.global == nil {
		o.global = newRatBucket(&p.Spec().Global, nowUs)
	}
	var endpoint, key *ratBucket
	if ep >= 0 {
		endpoint = o.endpointBucket(t, ep, nowUs)
	}
	if r.APIKey != "" {
		key = o.keyBucket(t, r.APIKey, nowUs)
	}
	levels := [...]struct {
		bucket  *ratBucket
		reserve *big.Rat
	}{{o.global, o.reserves[t.tenant.Tier]}, {t.limit, nil}, {endpoint, nil}, {key, nil}}
	o.Decisions++
	for i, l := range levels {
		if l.bucket == nil {
			continue
		}
		l.bucket.refill(nowUs, &o.scratch)
		if !l.bucket.covers(cost, l.reserve, &o.scratch) {
			o.Denied[i]++
			return false, enforcer.Levels[i]
		}
	}
	for _, l := range levels {
		if l.bucket != nil {
			l.bucket.take(cost, &o.scratch)
		}
	}
	o.Admitted++
	return true, enforcer.LevelNone
}

// tenant is r's tenant state, made on first sight with full buckets; nil
// when the plane denies unknown tenants.
func (o *BucketOracle) tenant(r *enforcer.Request, nowUs int64) *oracleTenant {
	if t, ok := o.tenants[r.Tenant]; ok {
		if !t.tenant.Known && r.Tier != "" && t.tenant.Tier != o.tierOf(r) {
			o.OutOfModel++ // the engine moves an unknown tenant to the tier its requests name
		}
		return t
	}
	pt, known := o.policy.Tenant(r.Tenant)
	if !known {
		var ok bool
		if pt, ok = o.policy.DefaultTenant(r.Tenant, r.Tier); !ok {
			return nil
		}
		if len(o.tenants) >= oracleMaxUnknownTenants+len(o.policy.Spec().Tenants) {
			o.OutOfModel++ // the engine shares one state among the newcomers
		}
	}
	t := &oracleTenant{tenant: pt, endpoints: map[int]*ratBucket{}, keys: map[string]*ratBucket{}}
	t.tenant.Known = known
	if pt.Limit != nil {
		t.limit = newRatBucket(pt.Limit, nowUs)
	}
	o.tenants[r.Tenant] = t
	return t
}

func (o *BucketOracle) tierOf(r *enforcer.Request) string {
	t, _ := o.policy.DefaultTenant(r.Tenant, r.Tier)
	return t.Tier
}

func (o *BucketOracle) endpointBucket(t *oracleTenant, ep int, nowUs int64) *ratBucket {
	if b, ok := t.endpoints[ep]; ok {
		return b
	}
	var b *ratBucket
	if l := o.policy.EndpointLimit(&t.tenant, ep); l != nil {
		b = newRatBucket(l, nowUs)
	}
	t.endpoints[ep] = b
	return b
}

func (o *BucketOracle) keyBucket(t *oracleTenant, key string, nowUs int64) *ratBucket {
	if b, ok := t.keys[key]; ok {
		return b
	}
	l := o.policy.KeyLimit(&t.tenant, key)
	if l == nil {
		return nil
	}
	if !o.policy.NamesKey(&t.tenant, key) && (len(t.keys) >= oracleMaxKeysPerTenant || o.keys >= oracleMaxKeys) {
		o.OutOfModel++ // the engine shares one limiter among the tenant's newcomers
	}
	b := newRatBucket(l, nowUs)
	t.keys[key] = b
	o.keys++
	return b
}

// String is the oracle's own tally, one line.
func (o *BucketOracle) String() string {
	s := fmt.Sprintf("oracle's own tally: %d decisions, %d admitted; denied global %d, tenant %d, endpoint %d, key %d",
		o.Decisions, o.Admitted, o.Denied[0], o.Denied[1], o.Denied[2], o.Denied[3])
	if o.OutOfModel > 0 {
		s += fmt.Sprintf("; %d requests OUT OF MODEL (the check is void)", o.OutOfModel)
	}
	return s
}
