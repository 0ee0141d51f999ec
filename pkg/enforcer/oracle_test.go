package enforcer

// An independent model of the engine's decision contract (the oracle), and a
// randomized comparison of the engine against it.
//
// The model is written from the public spec only. A token bucket's level is
// kept exactly, as tokens × PeriodMicros in an integer (the policy bounds
// Burst × PeriodMicros by 2^53), and read as a big.Rat for floors, ceilings
// and failure messages; sliding windows keep every admitted (time, cost) and
// are evaluated literally (an entry admitted at a is inside at now iff
// a > now − Period); limits are resolved with the policy package's helpers
// (EndpointLimit, KeyLimit, DefaultTenant, MayBorrow). It shares no code with
// limiter.go, state.go, fairness.go or the engine's decision function.
//
// Where the spec leaves room, and only where it matters when time goes
// backwards, the model follows the engine's observed behaviour (see the
// report): a decision "touches" (creates full, settles at now) the global
// limit always; the tenant, endpoint and key limits in that order up to the
// first that cannot cover the cost; the borrow allowance when the tenant
// needs a loan; the pool when the lower levels pass with a loan.
//
// The engine disagrees with the spec once a sliding window has seen time go
// back (TestRegression_SlidingWindowTimeNeverGoesBack in properties_test.go), so the random run
// never lets a window's time go back, nor time go back past a call that
// returned an error (the spec does not say whether it touches anything).
//
// The global reserve of a tier applies in fairness mode none only.

import (
	"cmp"
	"errors"
	"fmt"
	"math/big"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
)

// ---------------------------------------------------------------------------
// The model.

type orcEntry struct{ at, cost int64 }

// orcLimiter is one limit of one holder.
type orcLimiter struct {
	lim     policy.Limit
	started bool
	// scaled is a token bucket's level in token·µs per period: the level in
	// tokens is exactly scaled / PeriodMicros (Burst × PeriodMicros ≤ 2^53).
	scaled  int64
	last    int64      // token bucket: µs of the last touch (never moves back)
	entries []orcEntry // sliding window: admitted (time, cost)
	seen    int64      // sliding window: latest now of a decision it applied to
}

func newOrcLimiter(l policy.Limit) *orcLimiter { return &orcLimiter{lim: l} }

func (b *orcLimiter) window() bool { return b.lim.Algorithm == policy.SlidingWindow }

func orcRat(n int64) *big.Rat { return new(big.Rat).SetInt64(n) }

// orcFrac is a*b/d exactly.
func orcFrac(a, b, d int64) *big.Rat {
	num := new(big.Int).Mul(big.NewInt(a), big.NewInt(b))
	return new(big.Rat).SetFrac(num, big.NewInt(d))
}

func orcFloor(r *big.Rat) int64 {
	q := new(big.Int).Div(r.Num(), r.Denom()) // Euclidean: floor for a positive denominator
	return q.Int64()
}

func orcCeil(r *big.Rat) int64 {
	n := new(big.Int).Neg(r.Num())
	q := new(big.Int).Div(n, r.Denom())
	return -q.Int64()
}

func (b *orcLimiter) full() int64 { return b.lim.Burst * b.lim.PeriodMicros() }

// tokens is a token bucket's level in tokens, exactly.
func (b *orcLimiter) tokens() *big.Rat { return big.NewRat(b.scaled, b.lim.PeriodMicros()) }

// settle creates the bucket full on first touch and refills it to now.
func (b *orcLimiter) settle(now int64) {
	if b.window() {
		// Forget entries no decision can see again (the random run never
		// lets a window's time go back).
		if now > b.last {
			b.last = now
		}
		horizon := b.last - b.lim.PeriodMicros()
		b.entries = slices.DeleteFunc(b.entries, func(e orcEntry) bool { return e.at <= horizon })
		return
	}
	if !b.started {
		b.started, b.scaled, b.last = true, b.full(), now
		return
	}
	if now <= b.last {
		return
	}
	if b.lim.Rate > 0 {
		// Each µs adds Rate token·µs/period; stop at full without overflowing.
		gap := b.full() - b.scaled
		if elapsed := now - b.last; elapsed >= (gap+b.lim.Rate-1)/b.lim.Rate {
			b.scaled = b.full()
		} else {
			b.scaled += elapsed * b.lim.Rate
		}
	}
	b.last = now
}

// windowSum is the cost inside the window at now. A window never goes back
// in time: a request before the latest time it has seen counts as at that
// time (b.last).
func (b *orcLimiter) windowSum(now int64) int64 {
	now = max(now, b.last)
	var s int64
	for _, e := range b.entries {
		if e.at > now-b.lim.PeriodMicros() {
			s += e.cost
		}
	}
	return s
}

// level is the tokens available: the bucket's level, or Rate − sum.
func (b *orcLimiter) level(now int64) *big.Rat {
	if b.window() {
		return orcRat(b.lim.Rate - b.windowSum(now))
	}
	return b.tokens()
}

func (b *orcLimiter) remaining(now int64) int64 { return orcFloor(b.level(now)) }

// covers says whether the limit covers cost c keeping extra tokens (the
// global reserve) untouched.
func (b *orcLimiter) covers(c, extra, now int64) bool {
	if b.window() {
		return b.windowSum(now)+c+extra <= b.lim.Rate
	}
	return c <= b.lim.Burst && b.scaled >= (c+extra)*b.lim.PeriodMicros()
}

// shortfall is what the limit lacks to cover c (for borrowing).
func (b *orcLimiter) shortfall(c, now int64) int64 {
	if b.window() {
		return b.windowSum(now) + c - b.lim.Rate
	}
	return c - b.scaled/b.lim.PeriodMicros()
}

func (b *orcLimiter) debit(c, now int64) {
	if b.window() {
		b.entries = append(b.entries, orcEntry{max(now, b.last), c})
		return
	}
	b.scaled -= c * b.lim.PeriodMicros()
}

func orcRetry(us int64) time.Duration {
	if us < 1 {
		us = 1
	}
	if us >= int64(MaxRetryAfter/time.Microsecond) {
		return MaxRetryAfter
	}
	return time.Duration(us) * time.Microsecond
}

// retryAfter is the earliest wait after which this limit alone covers c (+extra).
func (b *orcLimiter) retryAfter(c, extra, now int64) time.Duration {
	if b.window() {
		if c+extra > b.lim.Rate {
			return MaxRetryAfter
		}
		// The oldest entries leave first: entry a leaves at a + Period.
		var inside []orcEntry
		var sum int64
		for _, e := range b.entries {
			if e.at > max(now, b.last)-b.lim.PeriodMicros() {
				inside = append(inside, e)
				sum += e.cost
			}
		}
		excess := sum + c + extra - b.lim.Rate
		slices.SortStableFunc(inside, func(x, y orcEntry) int { return cmp.Compare(x.at, y.at) })
		var freed int64
		for _, e := range inside {
			freed += e.cost
			if freed >= excess {
				return orcRetry(e.at + b.lim.PeriodMicros() - now)
			}
		}
		return MaxRetryAfter // unreachable for a denial with c ≤ Rate
	}
	// A cost that, with the reserve, exceeds the burst never passes.
	if c+extra > b.lim.Burst || b.lim.Rate == 0 {
		return MaxRetryAfter
	}
	need := new(big.Rat).Sub(orcRat(c+extra), b.tokens())
	need.Mul(need, orcFrac(b.lim.PeriodMicros(), 1, b.lim.Rate))
	// Refill starts at the bucket's clock: a request from before it (the
	// clock went back) also waits for the gap.
	return orcRetry(orcCeil(need) + max(b.last-now, 0))
}

func (b *orcLimiter) String() string {
	if b == nil {
		return "none"
	}
	if b.window() {
		return fmt.Sprintf("%s entries=%v", b.lim, b.entries)
	}
	if !b.started {
		return fmt.Sprintf("%s (untouched)", b.lim)
	}
	return fmt.Sprintf("%s tokens=%s (≈%.4f) last=%d", b.lim, b.tokens().RatString(), orcF(b.tokens()), b.last)
}

func orcF(r *big.Rat) float64 { f, _ := r.Float64(); return f }

type orcTenant struct {
	pt        policy.Tenant
	mayBorrow bool
	limit     *orcLimiter
	allowance *orcLimiter
	endpoints map[int]*orcLimiter
	keys      map[string]*orcLimiter
}

// orcModel is the oracle for one plane.
type orcModel struct {
	p *policy.Policy
	// noFloors ignores tier floors (the reserve), as fairness modes other
	// than none do when uncontended.
	noFloors bool
	global   *orcLimiter
	pool     *orcLimiter
	tenants  map[string]*orcTenant
}

func newOrcModel(p *policy.Policy) *orcModel {
	m := &orcModel{p: p, global: newOrcLimiter(p.Global()), tenants: map[string]*orcTenant{}}
	if bp := p.Spec().BurstPool; bp != nil {
		m.pool = newOrcLimiter(policy.Limit{Rate: bp.RefillRate, Burst: bp.Size, Period: time.Second, Algorithm: policy.TokenBucket})
	}
	return m
}

// reserve is the global tokens kept for the tiers ranked above tier.
func (m *orcModel) reserve(tier string) int64 {
	if m.noFloors || m.p.Spec().Fairness != "none" {
		return 0
	}
	tiers := slices.Clone(m.p.Spec().Tiers)
	slices.SortFunc(tiers, func(a, b policy.Tier) int {
		if a.Weight != b.Weight {
			if a.Weight > b.Weight {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	var pct int64
	for _, t := range tiers {
		if t.Name == tier {
			return pct * m.p.Global().Burst / 100
		}
		pct += t.FloorPercent
	}
	return 0
}

func (m *orcModel) tenant(r Request) (*orcTenant, error) {
	if ts := m.tenants[r.Tenant]; ts != nil {
		return ts, nil
	}
	pt, ok := m.p.Tenant(r.Tenant)
	if !ok {
		if pt, ok = m.p.DefaultTenant(r.Tenant, r.Tier); !ok {
			return nil, ErrUnknownTenant
		}
	}
	ts := &orcTenant{pt: pt, mayBorrow: m.p.MayBorrow(&pt), endpoints: map[int]*orcLimiter{}, keys: map[string]*orcLimiter{}}
	if pt.Limit != nil {
		ts.limit = newOrcLimiter(*pt.Limit)
	}
	if ts.mayBorrow {
		bp := m.p.Spec().BurstPool
		ts.allowance = newOrcLimiter(policy.Limit{Rate: bp.RefillRate, Burst: bp.PerTenantCeiling, Period: time.Second, Algorithm: policy.TokenBucket})
	}
	m.tenants[r.Tenant] = ts
	return ts, nil
}

// decide is the spec. errs lists the errors the engine may return instead of
// a decision (more than one when the spec does not order them).
func (m *orcModel) decide(now int64, r Request) (d Decision, errs []error) {
	if r.Tenant == "" || r.Units < 0 || r.Units > MaxUnits {
		return Decision{}, []error{ErrInvalidRequest}
	}
	cost, ep := int64(1), -1
	if i, ok := m.p.EndpointIndex(r.Endpoint); ok {
		ep, cost = i, m.p.Endpoints()[i].Cost
	} else if m.p.Spec().UnknownEndpoints == "deny" {
		errs = append(errs, ErrUnknownEndpoint)
	}
	if _, named := m.p.Tenant(r.Tenant); !named && m.p.Spec().UnknownTenants == "deny" {
		errs = append(errs, ErrUnknownTenant)
	}
	if len(errs) > 0 {
		return Decision{}, errs
	}
	ts, err := m.tenant(r)
	if err != nil {
		return Decision{}, []error{err}
	}
	cost *= max(r.Units, 1)

	var epl, keyl *orcLimiter
	if ep >= 0 {
		if l := m.p.EndpointLimit(&ts.pt, ep); l != nil {
			if epl = ts.endpoints[ep]; epl == nil {
				epl = newOrcLimiter(*l)
				ts.endpoints[ep] = epl
			}
		}
	}
	if r.APIKey != "" {
		if l := m.p.KeyLimit(&ts.pt, r.APIKey); l != nil {
			if keyl = ts.keys[r.APIKey]; keyl == nil {
				keyl = newOrcLimiter(*l)
				ts.keys[r.APIKey] = keyl
			}
		}
	}
	levels := [4]*orcLimiter{m.global, ts.limit, epl, keyl}
	for _, l := range levels {
		if l != nil && l.window() {
			l.seen = max(l.seen, now)
		}
	}

	d.Cost = cost
	deny := func(i int, extra int64) Decision {
		l := levels[i]
		d.Level = Levels[i]
		d.Remaining = l.remaining(now)
		d.RetryAfter = l.retryAfter(cost, extra, now)
		if i == 1 && ts.mayBorrow && cost <= l.lim.Burst {
			d.RetryAfter = m.borrowRetry(ts, cost, now, d.RetryAfter)
		}
		return d
	}
	// The levels below global are consulted in order, up to the first that
	// cannot cover the cost: those are the limits the decision touches
	// (settles at now). The global level is touched by every decision.
	lowerFail := -1
	var borrow int64
	for i := 1; i < 4 && lowerFail < 0; i++ {
		l := levels[i]
		if l == nil {
			continue
		}
		l.settle(now)
		if l.covers(cost, 0, now) {
			continue
		}
		if i == 1 && ts.mayBorrow && cost <= l.lim.Burst {
			s := l.shortfall(cost, now)
			ts.allowance.settle(now)
			if ts.allowance.covers(s, 0, now) {
				borrow = s
				continue
			}
		}
		lowerFail = i
	}
	m.global.settle(now)
	reserve := m.reserve(ts.pt.Tier)
	if !m.global.covers(cost, reserve, now) {
		return deny(0, reserve), nil
	}
	// Borrowing is part of the tenant level, which comes before endpoint
	// and key: a pool that cannot cover the loan fails the tenant level.
	if borrow > 0 {
		m.pool.settle(now)
		if !m.pool.covers(borrow, 0, now) {
			return deny(1, 0), nil
		}
	}
	if lowerFail > 0 {
		return deny(lowerFail, 0), nil
	}
	// Admit: debit every level.
	d.Allow, d.Borrowed = true, borrow
	d.Remaining = 1<<63 - 1
	for i, l := range levels {
		if l == nil {
			continue
		}
		c := cost
		if i == 1 {
			c -= borrow
		}
		l.debit(c, now)
		d.Remaining = min(d.Remaining, l.remaining(now))
	}
	if borrow > 0 {
		ts.allowance.debit(borrow, now)
		m.pool.debit(borrow, now)
	}
	return d, nil
}

// windowFloor is the latest time any sliding window that r maps to has
// seen: a request at an earlier time would take the window back in time.
// borrowRetry is a borrowing tenant's wait at its own level: the earliest
// µs at which its own tokens, or its own tokens plus a loan that both its
// allowance and the pool can give, cover cost; at most own, the wait for its
// own tokens alone. It tries the times on copies of the three limiters.
func (m *orcModel) borrowRetry(ts *orcTenant, cost, now int64, own time.Duration) time.Duration {
	passes := func(wait int64) bool {
		at := now + wait
		mine := ts.limit.clone()
		mine.settle(at)
		short := cost - mine.remaining(at)
		if short <= 0 {
			return true
		}
		allow, pool := ts.allowance.clone(), m.pool.clone()
		allow.settle(at)
		pool.settle(at)
		return allow.remaining(at) >= short && pool.remaining(at) >= short
	}
	hi := int64(own / time.Microsecond)
	if !passes(hi) {
		return own
	}
	lo := int64(0)
	for hi-lo > 1 {
		if mid := lo + (hi-lo)/2; passes(mid) {
			hi = mid
		} else {
			lo = mid
		}
	}
	return orcRetry(hi)
}

func (b *orcLimiter) clone() *orcLimiter {
	c := *b
	c.entries = slices.Clone(b.entries)
	return &c
}

// dump describes the state a request touches, for failure messages.
func (m *orcModel) dump(r Request, now int64) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "  oracle state (now=%dµs):\n", now)
	fmt.Fprintf(&sb, "    global:    %v (reserve %d for its tier)\n", m.global, m.reserveFor(r))
	if m.pool != nil {
		fmt.Fprintf(&sb, "    pool:      %v\n", m.pool)
	}
	ts := m.tenants[r.Tenant]
	if ts == nil {
		sb.WriteString("    tenant: no state\n")
		return sb.String()
	}
	fmt.Fprintf(&sb, "    tenant %q tier=%s hard=%v mayBorrow=%v known=%v\n", ts.pt.Name, ts.pt.Tier, ts.pt.Hard, ts.mayBorrow, ts.pt.Known)
	fmt.Fprintf(&sb, "    tenant:    %v\n", ts.limit)
	if ts.allowance != nil {
		fmt.Fprintf(&sb, "    allowance: %v\n", ts.allowance)
	}
	if i, ok := m.p.EndpointIndex(r.Endpoint); ok {
		fmt.Fprintf(&sb, "    endpoint %s: %v\n", r.Endpoint, ts.endpoints[i])
	}
	if r.APIKey != "" {
		fmt.Fprintf(&sb, "    key %s:  %v\n", r.APIKey, ts.keys[r.APIKey])
	}
	return sb.String()
}

func (m *orcModel) reserveFor(r Request) int64 {
	if ts := m.tenants[r.Tenant]; ts != nil {
		return m.reserve(ts.pt.Tier)
	}
	return -1
}

// ---------------------------------------------------------------------------
// Random planes.

type orcPlane struct {
	yaml        string
	tenants     []string // named tenants
	unknown     []string // unknown tenants the generator uses
	unknownTier map[string]string
	endpoints   []string
	keys        []string
	tiers       []string
}

func orcPeriod(rng *rand.Rand) string {
	switch rng.IntN(4) {
	case 0:
		return fmt.Sprintf("%dms", 10+rng.IntN(1991))
	case 1:
		return fmt.Sprintf("%dus", 10_000+rng.IntN(1_990_001)) // odd microsecond periods
	case 2:
		return []string{"10ms", "100ms", "250ms"}[rng.IntN(3)]
	}
	return []string{"1s", "2s", "500ms"}[rng.IntN(3)]
}

// orcLimitYAML is a random limit; window allows a sliding window.
func orcLimitYAML(rng *rand.Rand, window bool) string {
	if window && rng.IntN(4) == 0 {
		return fmt.Sprintf("{rate: %d, period: %s, algorithm: slidingWindow}", 1+rng.IntN(50), orcPeriod(rng))
	}
	rate := rng.IntN(51)
	if rng.IntN(10) == 0 {
		rate = 0
	}
	switch rng.IntN(3) {
	case 0: // burst defaults to rate (1 when 0)
		return fmt.Sprintf("{rate: %d, period: %s}", rate, orcPeriod(rng))
	case 1:
		return fmt.Sprintf("{rate: %d, burst: %d, period: %s, algorithm: tokenBucket}", rate, 1+rng.IntN(80), orcPeriod(rng))
	}
	return fmt.Sprintf("{rate: %d, burst: %d, period: %s}", rate, max(rate, 1)+rng.IntN(40), orcPeriod(rng))
}

// orcRandomPlane generates a plane. fairness is written as given; hugeGlobal
// makes the global limit one that the load never contends.
func orcRandomPlane(rng *rand.Rand, fairness string, hugeGlobal bool) orcPlane {
	var pl orcPlane
	var sb strings.Builder
	sb.WriteString(planeHeader)
	if hugeGlobal {
		sb.WriteString("  global: {rate: 1000000000, burst: 1000000000}\n")
	} else {
		rate := 5 + rng.IntN(46)
		if rng.IntN(3) != 0 { // roomier: the lower levels get their turn
			rate *= 2 + rng.IntN(40)
		}
		fmt.Fprintf(&sb, "  global: {rate: %d, burst: %d, period: %s}\n", rate, rate+rng.IntN(3*rate), orcPeriod(rng))
	}
	fmt.Fprintf(&sb, "  fairness: %s\n", fairness)
	if rng.IntN(10) == 0 {
		sb.WriteString("  unknownTenants: deny\n")
	}
	if rng.IntN(10) == 0 {
		sb.WriteString("  unknownEndpoints: deny\n")
	}
	names := []string{"gold", "silver", "bronze"}
	nt := 1 + rng.IntN(3)
	pl.tiers = names[:nt]
	floorsLeft := 100
	if rng.IntN(3) == 0 {
		floorsLeft = 0
	}
	sb.WriteString("  tiers:\n")
	for _, n := range pl.tiers {
		floor := 0
		if floorsLeft > 0 {
			floor = rng.IntN(min(floorsLeft, 35) + 1)
			floorsLeft -= floor
		}
		fmt.Fprintf(&sb, "    - name: %s\n      weight: %d\n      floorPercent: %d\n", n, 1+rng.IntN(5), floor)
		if rng.IntN(5) == 0 {
			sb.WriteString("      hard: true\n")
		}
		if rng.IntN(5) != 0 {
			fmt.Fprintf(&sb, "      tenant: %s\n", orcLimitYAML(rng, true))
		}
		if rng.IntN(5) < 3 {
			fmt.Fprintf(&sb, "      key: %s\n", orcLimitYAML(rng, true))
		}
	}
	if rng.IntN(2) == 0 {
		fmt.Fprintf(&sb, "  defaultTier: %s\n", pl.tiers[rng.IntN(nt)])
	}

	epNames := []string{"delete", "export", "read", "write"}
	ne := 1 + rng.IntN(4)
	pl.endpoints = epNames[:ne]
	for _, n := range pl.endpoints {
		fmt.Fprintf(&sb, "---\napiVersion: quotaplane.io/v1alpha1\nkind: EndpointQuota\nmetadata: {name: %s}\nspec:\n  endpoint: %s\n  cost: %d\n", n, n, 1+rng.IntN(20))
		if rng.IntN(10) < 7 {
			fmt.Fprintf(&sb, "  limit: %s\n", orcLimitYAML(rng, true))
		}
		if rng.IntN(3) == 0 {
			sb.WriteString("  tiers:\n")
			for _, tn := range pl.tiers {
				if rng.IntN(2) == 0 {
					fmt.Fprintf(&sb, "    - tier: %s\n      limit: %s\n", tn, orcLimitYAML(rng, true))
				}
			}
		}
	}

	pl.keys = []string{"k0", "k1", "k2"}
	ntn := 3 + rng.IntN(10)
	for i := range ntn {
		name := fmt.Sprintf("t%02d", i)
		pl.tenants = append(pl.tenants, name)
		fmt.Fprintf(&sb, "---\napiVersion: quotaplane.io/v1alpha1\nkind: TenantQuota\nmetadata: {name: %s}\nspec:\n  tenant: %s\n", name, name)
		if rng.IntN(4) != 0 {
			fmt.Fprintf(&sb, "  tier: %s\n", pl.tiers[rng.IntN(nt)])
		}
		if rng.IntN(10) < 4 {
			fmt.Fprintf(&sb, "  limit: %s\n", orcLimitYAML(rng, true))
		}
		if rng.IntN(5) == 0 {
			fmt.Fprintf(&sb, "  weight: %d\n", 1+rng.IntN(9))
		}
		if rng.IntN(5) == 0 {
			fmt.Fprintf(&sb, "  hard: %v\n", rng.IntN(2) == 0)
		}
		if rng.IntN(3) == 0 {
			sb.WriteString("  keys:\n")
			for _, k := range []string{"k1", "special"} {
				if rng.IntN(2) == 0 {
					fmt.Fprintf(&sb, "    - key: %s\n      limit: %s\n", k, orcLimitYAML(rng, true))
				}
			}
		}
		if rng.IntN(3) == 0 {
			sb.WriteString("  endpoints:\n")
			for _, ep := range pl.endpoints {
				if rng.IntN(2) == 0 {
					fmt.Fprintf(&sb, "    - endpoint: %s\n      limit: %s\n", ep, orcLimitYAML(rng, true))
				}
			}
		}
	}
	pl.keys = append(pl.keys, "special")

	if rng.IntN(2) == 0 {
		size := 1 + rng.IntN(200)
		fmt.Fprintf(&sb, "---\napiVersion: quotaplane.io/v1alpha1\nkind: BurstPool\nmetadata: {name: pool}\nspec:\n  size: %d\n  refillRate: %d\n  perTenantCeiling: %d\n",
			size, rng.IntN(51), 1+rng.IntN(size))
		var tiers []string
		for _, tn := range pl.tiers {
			if rng.IntN(2) == 0 {
				tiers = append(tiers, tn)
			}
		}
		if len(tiers) > 0 {
			fmt.Fprintf(&sb, "  tiers: [%s]\n", strings.Join(tiers, ", "))
		}
	}

	pl.unknownTier = map[string]string{}
	for i := range 4 {
		name := fmt.Sprintf("u%d", i)
		pl.unknown = append(pl.unknown, name)
		// Each unknown tenant always sends the same tier (one of the plane's,
		// none, or one the plane lacks).
		switch rng.IntN(3) {
		case 0:
			pl.unknownTier[name] = pl.tiers[rng.IntN(nt)]
		case 1:
			pl.unknownTier[name] = "nosuchtier"
		}
	}
	pl.yaml = sb.String()
	return pl
}

// orcRandomRequest picks a request; named tenants send a random (ignored) tier.
func orcRandomRequest(rng *rand.Rand, pl *orcPlane) Request {
	var r Request
	if rng.IntN(5) == 0 {
		r.Tenant = pl.unknown[rng.IntN(len(pl.unknown))]
		r.Tier = pl.unknownTier[r.Tenant]
	} else {
		r.Tenant = pl.tenants[rng.IntN(len(pl.tenants))]
		if rng.IntN(3) == 0 {
			r.Tier = pl.tiers[rng.IntN(len(pl.tiers))]
		}
	}
	if rng.IntN(20) == 0 {
		r.Endpoint = "nosuchendpoint"
	} else {
		r.Endpoint = pl.endpoints[rng.IntN(len(pl.endpoints))]
	}
	if rng.IntN(10) >= 3 {
		r.APIKey = pl.keys[rng.IntN(len(pl.keys))]
	}
	switch n := rng.IntN(20); {
	case n < 10:
		r.Units = 0
	case n < 19:
		r.Units = 1 + int64(rng.IntN(3))
	default:
		r.Units = 1 + int64(rng.IntN(60))
	}
	return r
}

// orcStep advances virtual time (µs): mostly small steps, sometimes 0,
// rarely a little backwards. tempo scales the plane's pace.
func orcStep(rng *rand.Rand, tempo int64) int64 {
	switch n := rng.IntN(100); {
	case n < 15:
		return 0
	case n < 17:
		return -1 - rng.Int64N(2000) // back a little
	case n < 60:
		return 1 + rng.Int64N(tempo)
	case n < 95:
		return 1 + rng.Int64N(10*tempo)
	}
	return 1 + rng.Int64N(200*tempo)
}

// orcSame compares a decision with the oracle's on every field the spec fixes.
func orcSame(got, want Decision) bool {
	return got.Allow == want.Allow && got.Level == want.Level && got.Cost == want.Cost &&
		got.Borrowed == want.Borrowed && got.Remaining == want.Remaining && got.RetryAfter == want.RetryAfter
}

func orcFmt(d Decision) string {
	return fmt.Sprintf("{Allow:%v Level:%q Cost:%d Borrowed:%d Remaining:%d RetryAfter:%v}", d.Allow, d.Level, d.Cost, d.Borrowed, d.Remaining, d.RetryAfter)
}

// orcRun drives one engine and its oracle through steps random decisions and
// fails on the first disagreement. It returns the per-level denial counts and
// how many decisions agreed.
// orcDebug adds the oracle's state before the failing decision to failure
// messages (it costs a dump per decision): ORACLE_DEBUG=1 go test ...
var orcDebug = os.Getenv("ORACLE_DEBUG") != ""

// orcStepRecord is one past decision of a run, for failure messages.
type orcStepRecord struct {
	step  int
	now   int64
	r     Request
	want  Decision
	werrs []error
}

func orcHistory(h []orcStepRecord) string {
	var sb strings.Builder
	for _, x := range h {
		fmt.Fprintf(&sb, "    step %d at %dµs: %+v -> %s %v\n", x.step, x.now, x.r, orcFmt(x.want), x.werrs)
	}
	return sb.String()
}

// orcRetryProbe is a denied request and when it was denied.
type orcRetryProbe struct {
	r          Request
	now        int64
	RetryAfter time.Duration
}

// orcCoverage counts what a run exercised.
type orcCoverage struct {
	total, agreed, errors, admitted, borrowed, backwards, retries int
	denied                                                        map[Level]int
	reserveDenials, windowDenials, maxRetry                       int
}

func (c *orcCoverage) add(o orcCoverage) {
	c.total += o.total
	c.agreed += o.agreed
	c.errors += o.errors
	c.admitted += o.admitted
	c.borrowed += o.borrowed
	c.backwards += o.backwards
	c.retries += o.retries
	c.reserveDenials += o.reserveDenials
	c.windowDenials += o.windowDenials
	c.maxRetry += o.maxRetry
	if c.denied == nil {
		c.denied = map[Level]int{}
	}
	for l, n := range o.denied {
		c.denied[l] += n
	}
}

func orcRun(t *testing.T, seed uint64, fairness string, hugeGlobal, noFloors bool, steps int) (cov orcCoverage) {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed*0x9e3779b97f4a7c15+1))
	pl := orcRandomPlane(rng, fairness, hugeGlobal)
	p := policytest.Compile(t, pl.yaml)
	e := newEngine(t, p)
	m := newOrcModel(p)
	m.noFloors = noFloors
	tempo := []int64{100, 1000, 10_000}[rng.IntN(3)]

	cov.denied = map[Level]int{}
	base := epoch.UnixMicro()
	var now int64 = 1_000_000   // µs after epoch
	var history []orcStepRecord // the last decisions, for failure messages
	byTenant := map[string][]orcStepRecord{}
	var errAt int64         // time of the last call that returned an error
	var retry orcRetryProbe // the last denial, to retry at its RetryAfter
	for step := range steps {
		// Time never goes back past a call that returned an error: the spec
		// does not say whether such a call touches the global bucket, and
		// in the engine it may (the fairness tick runs before the tenant is
		// checked and settles it).
		prev := now
		now = max(now+orcStep(rng, tempo), min(now, errAt))
		r := orcRandomRequest(rng, &pl)
		if retry.RetryAfter > 0 && retry.RetryAfter < MaxRetryAfter && rng.IntN(3) == 0 {
			// Probe the boundary: the denied request again exactly when
			// RetryAfter says it passes its level, or a microsecond before.
			r = retry.r
			now = retry.now + int64(retry.RetryAfter/time.Microsecond) - int64(rng.IntN(2))
			cov.retries++
		}
		retry = orcRetryProbe{}
		if now < prev {
			cov.backwards++
		}
		// Sub-microsecond noise: the engine must truncate to whole µs.
		when := epoch.Add(time.Duration(now)*time.Microsecond + time.Duration(rng.IntN(1000)))
		var before string
		if orcDebug {
			before = m.dump(r, base+now)
		}
		reserve, window := orcDenialKind(m, r, base+now)
		want, werrs := m.decide(base+now, r)
		got, err := e.DecideAt(when, r)
		cov.total++
		fail := func(why string) {
			t.Fatalf("seed %d step %d at %dµs: %s\n  request: %+v\n  engine:  %s err=%v\n  oracle:  %s errs=%v\n%s  before the decision (with ORACLE_DEBUG=1):\n%s  previous decisions (oracle's):\n%s  previous decisions of this tenant:\n%s\nplane:\n%s",
				seed, step, now, why, r, orcFmt(got), err, orcFmt(want), werrs, m.dump(r, base+now), before, orcHistory(history), orcHistory(byTenant[r.Tenant]), pl.yaml)
		}
		line := orcStepRecord{step, now, r, want, werrs}
		if len(history) == 12 {
			history = history[1:]
		}
		history = append(history, line)
		if h := byTenant[r.Tenant]; len(h) == 12 {
			byTenant[r.Tenant] = h[1:]
		}
		byTenant[r.Tenant] = append(byTenant[r.Tenant], line)
		if len(werrs) > 0 || err != nil {
			ok := err != nil && slices.ContainsFunc(werrs, func(w error) bool { return errors.Is(err, w) })
			if !ok {
				fail("errors differ")
			}
			errAt = now
			cov.agreed++
			cov.errors++
			continue
		}
		if !orcSame(got, want) {
			fail("decisions differ")
		}
		if !got.Allow && got.Reason == "" {
			fail("a denial without a reason")
		}
		cov.agreed++
		switch {
		case got.Allow:
			cov.admitted++
			if got.Borrowed > 0 {
				cov.borrowed++
			}
		default:
			retry = orcRetryProbe{r, now, got.RetryAfter}
			cov.denied[got.Level]++
			if got.Level == LevelGlobal && reserve > 0 {
				cov.reserveDenials++
			}
			if window[got.Level] {
				cov.windowDenials++
			}
			if got.RetryAfter == MaxRetryAfter {
				cov.maxRetry++
			}
		}
	}
	return cov
}

// orcDenialKind tells, before a decision, the reserve that applies to the
// request's tenant and which of its levels are sliding windows (for
// coverage counts only).
func orcDenialKind(m *orcModel, r Request, now int64) (reserve int64, window map[Level]bool) {
	window = map[Level]bool{}
	pt, ok := m.p.Tenant(r.Tenant)
	if !ok {
		if pt, ok = m.p.DefaultTenant(r.Tenant, r.Tier); !ok {
			return 0, window
		}
	}
	sw := func(l *policy.Limit) bool { return l != nil && l.Algorithm == policy.SlidingWindow }
	window[LevelTenant] = sw(pt.Limit)
	if i, ok := m.p.EndpointIndex(r.Endpoint); ok {
		window[LevelEndpoint] = sw(m.p.EndpointLimit(&pt, i))
	}
	if r.APIKey != "" {
		window[LevelKey] = sw(m.p.KeyLimit(&pt, r.APIKey))
	}
	return m.reserve(pt.Tier), window
}

// TestOracleAgreesOnRandomSequences compares every field of every decision
// with the oracle over random planes and random request sequences.
func TestOracleAgreesOnRandomSequences(t *testing.T) {
	const seeds, steps = 20, 5000
	var cov orcCoverage
	for seed := range uint64(seeds) {
		cov.add(orcRun(t, seed+1, "none", false, false, steps))
	}
	t.Logf("%d decisions, %d agreed (%d errors), %d admitted (%d borrowing), %d after time went back, %d retries at RetryAfter (or 1µs before); denials per level %v, %d by a global reserve, %d at a sliding window, %d with MaxRetryAfter",
		cov.total, cov.agreed, cov.errors, cov.admitted, cov.borrowed, cov.backwards, cov.retries, cov.denied, cov.reserveDenials, cov.windowDenials, cov.maxRetry)
	if cov.agreed != cov.total {
		t.Fatalf("attribution agreement %d/%d", cov.agreed, cov.total)
	}
	for _, l := range Levels {
		if cov.denied[l] == 0 {
			t.Errorf("no denial at level %s: the generator does not exercise it", l)
		}
	}
	if cov.borrowed == 0 || cov.reserveDenials == 0 || cov.windowDenials == 0 || cov.backwards == 0 || cov.errors == 0 || cov.retries == 0 {
		t.Errorf("the generator misses a feature: %+v", cov)
	}
}

// TestOracleMaxMinUncontendedEqualsNone checks that with fairness maxmin and
// a global limit the load never contends, decisions are those of mode none
// with every tier floor 0.
func TestOracleMaxMinUncontendedEqualsNone(t *testing.T) {
	var cov orcCoverage
	for seed := range uint64(5) {
		cov.add(orcRun(t, 1000+seed, "maxmin", true, true, 3000))
	}
	t.Logf("%d decisions agreed; denials per level %v", cov.agreed, cov.denied)
}
