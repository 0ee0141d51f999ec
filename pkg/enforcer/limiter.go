package enforcer

import (
	"math"
	"math/bits"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

// limiter is the state of one limit at one level for one holder: an exact
// integer token bucket or a sliding window. It is not safe for concurrent use;
// its owner's lock guards it.
//
// The token bucket keeps its level scaled by the period: level is in
// token·µs, so a refill of elapsed µs adds exactly elapsed×rate and a cost c
// takes exactly c×period. No division, no rounding, no lost fraction of a
// token; policy bounds burst×period to 2^53 so nothing overflows and the Lua
// scripts, which count in float64, agree to the token.
//
// A limiter is what a million tenants each hold one or more of, so it keeps
// only what changes per holder: its limit's shape, the level and the time
// of the last refill (32 bytes). The shape — the limit's period, rate and
// burst in the engine's units — is derived once per limit and policy
// version and shared by every holder (snapshot.shapes); what only some
// limiters need — a window's entries, a part of the limit (local-reconciled)
// with its own shape, and the counters its reconcile loop reads — is in x,
// nil otherwise.
type limiter struct {
	sh    *limitShape // nil when the level has no limit
	level int64       // token·µs
	last  int64       // µs of the last refill
	x     *limiterExtra
}

// limitShape is a limit as a limiter enforces it: whole (shared by its
// holders) or a part of it (limiterExtra.scaled). Immutable once shared.
type limitShape struct {
	lim                             *policy.Limit
	window                          bool  // policy.SlidingWindow
	periodUs, rate, burst, capacity int64 // µs, tokens per period, tokens, token·µs
	perPeriodUs                     float64
}

// derive makes s lim's shape at part (in (0, 1); 0 or 1 for the whole
// limit), not below floor tokens.
func (s *limitShape) derive(lim *policy.Limit, part float64, floor int64) {
	*s = limitShape{lim: lim, window: lim.Algorithm == policy.SlidingWindow, periodUs: lim.PeriodMicros(), rate: lim.Rate, burst: lim.Burst}
	if part > 0 && part < 1 {
		share := lim.Share(part, floor)
		s.rate, s.burst = share.Rate, share.Burst
		if !s.window && lim.Rate > 0 && s.burst*s.periodUs <= policy.MaxScaledLevel/partPrecision {
			// The rate to a thousandth of a token per period rather than
			// a whole token (a tenth of 10/s would be 1/s, where it is
			// 1.000/s, and a third of it 3/s, where it is 3.333/s): the
			// same bucket over partPrecision periods.
			s.periodUs *= partPrecision
			s.rate = max(1, int64(math.Round(float64(lim.Rate)*part*partPrecision)))
		}
	}
	s.capacity = s.burst * s.periodUs
	s.perPeriodUs = 1 / float64(s.periodUs)
}

// wholeShape is lim's shape, whole.
func wholeShape(lim *policy.Limit) *limitShape {
	s := new(limitShape)
	s.derive(lim, 0, 0)
	return s
}

// limiterExtra is the part of a limiter that only windows and limiters of
// mode local-reconciled have.
type limiterExtra struct {
	window *slidingWindow // non-nil for policy.SlidingWindow

	// scaled is the shape of the part, which the limiter's shape points
	// to while part is in (0, 1).
	scaled limitShape

	// part is the part of lim this node enforces (local-reconciled: its
	// share of the fleet's limit; reconcile.go), in (0, 1]; 0 is all of
	// it. floor is the least capacity a part keeps: the plane's costliest
	// request, so that a share never denies for good what the whole
	// admits. reset and change keep both.
	part  float64
	floor int64
	// fleet says the reconcile loop sized part from the fleet's demand;
	// otherwise it is the snapshot's even share.
	fleet bool
	// counting: the limiter counts used and offered (mode
	// local-reconciled: limiter.fit). used is the cost taken since the
	// reconcile loop last read it, and offered the cost of the requests
	// that met this level (arrivals only): what a node pushes to the
	// fleet's bucket and its demand.
	counting      bool
	used, offered int64
}

func (l *limiter) active() bool { return l.sh != nil }

// limit is the limit in force, nil for none.
func (l *limiter) limit() *policy.Limit {
	if l.sh == nil {
		return nil
	}
	return l.sh.lim
}

// scaled reports whether the limiter enforces a part of its limit.
func (l *limiter) scaled() bool { return l.x != nil && l.sh == &l.x.scaled }

// shape is the bucket's period (µs), rate (tokens per period) and burst
// (tokens): the limit's, or its part's; 0s without a limit.
func (l *limiter) shape() (periodUs, rate, burst int64) {
	if s := l.sh; s != nil {
		return s.periodUs, s.rate, s.burst
	}
	return 0, 0, 0
}

func (l *limiter) periodUs() int64 { p, _, _ := l.shape(); return p }
func (l *limiter) rate() int64     { _, r, _ := l.shape(); return r }
func (l *limiter) burst() int64    { _, _, b := l.shape(); return b }

// window is the limiter's sliding window, nil for a bucket.
func (l *limiter) window() *slidingWindow {
	if l.x == nil {
		return nil
	}
	return l.x.window
}

// capacity is the bucket size in token·µs.
func (l *limiter) capacity() int64 {
	if l.sh == nil {
		return 0
	}
	return l.sh.capacity
}

// fleetPart reports whether the reconcile loop sized the limiter's part,
// and the part and floor it enforces.
func (l *limiter) fleetPart() (fleet bool, part float64, floor int64) {
	if l.x == nil {
		return false, 0, 0
	}
	return l.x.fleet, l.x.part, l.x.floor
}

// counters are the cost taken and offered since the reconcile loop last
// read them (0 unless the limiter counts: limiterExtra.counting).
func (l *limiter) counters() (used, offered int64) {
	if l.x == nil {
		return 0, 0
	}
	return l.x.used, l.x.offered
}

// clearCounters zeroes the counters.
func (l *limiter) clearCounters() {
	if l.x != nil {
		l.x.used, l.x.offered = 0, 0
	}
}

// undo takes back a debit: the bucket's level and the used counter as
// they were before it (a window's entry is removed by the caller).
func (l *limiter) undo(level, used int64) {
	l.level = level
	if l.x != nil {
		l.x.used = used
	}
}

// offer counts cost as offered at this level, when the limiter counts.
func (l *limiter) offer(cost int64) {
	if x := l.x; x != nil && x.counting {
		x.offered += cost
	}
}

// reset puts l in force for lim (its part) with a full bucket (or an empty
// window); its part and counters carry over.
func (l *limiter) reset(lim *policy.Limit, now int64) { l.resetShape(lim, nil, now) }

// resetShape is reset with whole, lim's whole shape when the caller has it
// (a snapshot's, shared), nil for one to be made.
func (l *limiter) resetShape(lim *policy.Limit, whole *limitShape, now int64) {
	x := l.x
	if x != nil {
		x.window = nil
	}
	*l = limiter{x: x}
	if lim == nil {
		return
	}
	switch {
	case x != nil && x.part > 0 && x.part < 1:
		x.scaled.derive(lim, x.part, x.floor)
		l.sh = &x.scaled
	case whole != nil && whole.lim == lim:
		l.sh = whole
	default:
		l.sh = wholeShape(lim)
	}
	if l.sh.window {
		l.extra().window = &slidingWindow{}
	}
	l.level = l.sh.capacity
	l.last = now
}

// extra is l.x, made when l has none.
func (l *limiter) extra() *limiterExtra {
	if l.x == nil {
		l.x = new(limiterExtra)
	}
	return l.x
}

// change puts lim (whose shape in snap is shared) in force keeping the
// state: tokens are first settled at the old rate up to now (as
// x/time/rate's SetLimitAt does), then carried over, capped by the new
// burst. A change of algorithm starts afresh.
func (l *limiter) change(snap *snapshot, lim *policy.Limit, now int64) {
	old := l.limit()
	whole := snap.shapeOf(lim)
	switch {
	case lim == nil || old == nil || lim.Algorithm != old.Algorithm:
		l.resetShape(lim, whole, now)
		return
	case *lim == *old:
		switch {
		case l.scaled():
			l.x.scaled.lim = lim
		case whole != nil:
			l.sh = whole
		default:
			l.sh = wholeShape(lim)
		}
		return
	}
	l.rebuild(lim, whole, now)
}

// setPart makes the limiter enforce part of its limit (in (0, 1], 0 for
// all of it), not below floor tokens, keeping its state as change does.
func (l *limiter) setPart(part float64, floor, now int64) {
	if part >= 1 {
		part = 0
	}
	if part == 0 && l.x == nil {
		return // the whole limit: the floor does not matter
	}
	x := l.extra()
	if part == x.part && floor == x.floor {
		return
	}
	x.part, x.floor = part, floor
	if l.sh != nil {
		var whole *limitShape
		if !l.scaled() {
			whole = l.sh
		}
		l.rebuild(l.sh.lim, whole, now)
	}
}

// setFleetPart makes the limiter enforce part of its limit as setPart
// does, sized by the fleet's demand (fleet) or the snapshot's even share.
func (l *limiter) setFleetPart(fleet bool, part float64, now int64) {
	x := l.extra()
	x.fleet = fleet
	l.setPart(part, x.floor, now)
}

// partPrecision is how finely a part's rate is kept: in thousandths of a
// token per period (limitShape.derive).
const partPrecision = 1000

// fit sizes a tenant's limiter for snap: the part the reconcile loop gave
// it, in mode local-reconciled, else the snapshot's; a whole limit's shape
// is then snap's, shared. In mode local-reconciled the limiter counts what
// it takes and is offered, which the reconcile loop pushes.
func (l *limiter) fit(snap *snapshot, now int64) {
	part := snap.part
	switch {
	case !snap.reconciled:
		if l.x != nil {
			l.x.fleet, l.x.counting = false, false
		}
	case l.extra().fleet:
		part = l.x.part
	}
	if snap.reconciled {
		l.x.counting = true
	}
	// A part holds at least one of the plane's costliest requests, or,
	// split over the live nodes, one of the costliest that the node
	// decides at this level (costlier ones are decided in Redis: hybrid.go).
	floor := snap.maxCost
	if lim := l.limit(); lim != nil && snap.splitOver > 1 {
		floor = min(floor, max(capacityOf(lim)/snap.splitOver, 1))
	}
	l.setPart(part, floor, now)
	if l.sh != nil && !l.scaled() {
		if whole := snap.shapeOf(l.sh.lim); whole != nil {
			l.sh = whole
		}
	}
	if x := l.x; x != nil && x.window == nil && !l.scaled() && !x.counting && x.used == 0 && x.offered == 0 {
		l.x = nil // the whole limit, as a fresh limiter enforces it
	}
}

// rebuild puts lim (whose whole shape is whole, or nil) in force at the
// limiter's part, keeping its state: a window its entries, a bucket its
// tokens settled up to now and capped by the new burst.
func (l *limiter) rebuild(lim *policy.Limit, whole *limitShape, now int64) {
	if w := l.window(); w != nil {
		l.resetShape(lim, whole, now)
		if l.window() != nil {
			l.x.window = w // entries are absolute times and costs: still valid
		}
		return
	}
	l.refill(now)
	oldPeriod, level, last := l.periodUs(), l.level, l.last
	l.resetShape(lim, whole, now)
	l.last = max(last, now) // a change never moves the clock back
	periodUs, _, burst := l.shape()
	// The tokens, level/oldPeriod, carry over capped by the new burst. Only
	// below the cap is level×newPeriod/oldPeriod computed: it is then below
	// the new capacity (≤ 2^53), so the 128-bit quotient cannot overflow.
	if hi, lo := bits.Mul64(uint64(burst), uint64(oldPeriod)); level >= 0 && hi == 0 && uint64(level) >= lo {
		return // level is at capacity after reset
	}
	// A bucket in debt (local-reconciled) keeps its debt, scaled the same
	// way and at most its capacity.
	neg := level < 0
	if neg {
		level = -level
	}
	hi, lo := bits.Mul64(uint64(level), uint64(periodUs))
	carried, _ := bits.Div64(hi, lo, uint64(oldPeriod))
	l.level = int64(carried)
	if neg {
		l.level = max(-l.level, -l.capacity())
	}
}

// refill adds the tokens earned since the last refill. A clock that goes
// backwards earns nothing and does not move last back.
func (l *limiter) refill(now int64) {
	if now <= l.last {
		return
	}
	elapsed := now - l.last
	l.last = now
	s := l.sh
	if s == nil { // no limit: a bucket of nothing
		l.level = min(l.level, 0)
		return
	}
	// elapsed×rate ≥ capacity: full whatever the level (the time to fill
	// from empty has passed). Below it the sum cannot overflow.
	hi, lo := bits.Mul64(uint64(elapsed), uint64(s.rate))
	if hi != 0 || lo >= uint64(s.capacity) {
		l.level = s.capacity
		return
	}
	l.level = min(l.level+int64(lo), s.capacity)
}

// canCover reports whether cost tokens are available (after the refill or
// expiry the caller has done).
func (l *limiter) canCover(cost int64) bool {
	periodUs, rate, burst := l.shape()
	if w := l.window(); w != nil {
		return w.sum+cost <= rate
	}
	return cost <= burst && cost*periodUs <= l.level
}

// take debits cost; the caller has checked canCover. Small enough to
// inline: a plain bucket is one subtraction.
func (l *limiter) take(cost int64, now int64) {
	if l.x != nil || l.sh == nil {
		l.takeSlow(cost, now)
		return
	}
	l.level -= cost * l.sh.periodUs
}

// takeSlow is take for a limiter with extra state (counted, or a window),
// or none.
func (l *limiter) takeSlow(cost int64, now int64) {
	x := l.x
	if x != nil && x.counting {
		x.used += cost
	}
	if x != nil && x.window != nil {
		_, rate, _ := l.shape()
		x.window.add(now, cost, rate)
		return
	}
	l.level -= cost * l.periodUs()
}

// settle brings the limiter up to now: refill a bucket, expire a window.
func (l *limiter) settle(now int64) {
	if w := l.window(); w != nil {
		w.expire(now, l.periodUs())
		return
	}
	l.refill(now)
}

// settleCovers is settle then canCover, the limit's shape read once, and
// counts offered as offered at this level: the decision's step at each
// level below global.
func (l *limiter) settleCovers(now, cost, offered int64) bool {
	if l.x != nil {
		l.settle(now)
		l.offer(offered)
		return l.canCover(cost)
	}
	l.refill(now)
	s := l.sh
	return cost <= s.burst && cost*s.periodUs <= l.level
}

// lack settles l at now and returns the whole tokens it lacks of a full
// bucket, rounded up (central.recovered). 0 for a window or no limit.
func (l *limiter) lack(now int64) int64 {
	if l.sh == nil || l.window() != nil {
		return 0
	}
	l.refill(now)
	periodUs := l.periodUs()
	return (l.capacity() - l.level + periodUs - 1) / periodUs
}

// never reports whether cost can never pass this limiter, however long one waits.
func (l *limiter) never(cost int64) bool {
	_, rate, burst := l.shape()
	if l.window() != nil {
		return cost > rate
	}
	return cost > burst
}

// retryAfterUs is the earliest wait after which cost would pass this limiter
// alone, in µs, at least 1; math.MaxInt64 when it never will.
func (l *limiter) retryAfterUs(cost int64, now int64) int64 {
	if l.never(cost) {
		return math.MaxInt64
	}
	periodUs, rate, _ := l.shape()
	if w := l.window(); w != nil {
		return max(w.waitUs(now, cost, rate, periodUs), 1)
	}
	return l.bucketWaitUs(cost*periodUs, now)
}

// remaining is the whole tokens left now, exactly (tokens, exact).
func (l *limiter) remaining() int64 { return l.tokens().exact() }

// tokenCount is what counting a limiter's whole tokens needs, read at once:
// the global level's is read under plane.mu and counted after it.
type tokenCount struct {
	est             float64 // the tokens, off by at most one; exact when periodUs is 0
	level, periodUs int64   // a bucket's level and period
}

// tokens reads l's count: for a bucket its level, for a window what its
// rate leaves.
func (l *limiter) tokens() tokenCount {
	s := l.sh
	if s == nil {
		return tokenCount{}
	}
	if w := l.window(); w != nil {
		return tokenCount{est: float64(max(s.rate-w.sum, 0))}
	}
	return tokenCount{est: float64(l.level) * s.perPeriodUs, level: l.level, periodUs: s.periodUs}
}

// exact is level / periodUs rounded down. An integer division costs tens
// of cycles and a decision needs up to four, so the float estimate is
// corrected by one integer multiplication each way (level < 2^53 makes it
// off by at most one).
func (t tokenCount) exact() int64 {
	q := int64(t.est)
	if t.periodUs == 0 {
		return q
	}
	switch {
	case q*t.periodUs > t.level:
		q--
	case (q+1)*t.periodUs <= t.level:
		q++
	}
	return q
}

// remainingAt is remaining at now without changing the limiter: what a
// status read reports, so that reading never moves state.
func (l *limiter) remainingAt(now int64) int64 {
	if w := l.window(); w != nil {
		periodUs, rate, _ := l.shape()
		now = max(now, w.latest)
		sum := w.sum
		for i := 0; i < w.n; i++ {
			e := w.entries[(w.head+i)%len(w.entries)]
			if e.at > now-periodUs {
				break
			}
			sum -= e.cost
		}
		return max(rate-sum, 0)
	}
	c := *l
	c.refill(now)
	return c.remaining()
}

// full reports whether the limiter is as a fresh one would be, so that its
// holder can be forgotten without changing any future decision.
func (l *limiter) full() bool {
	if l.sh == nil {
		return true
	}
	if w := l.window(); w != nil {
		return w.n == 0
	}
	return l.level >= l.capacity()
}

// slidingWindow is an exact sliding log: the costs admitted in the last
// period, oldest first, in a ring that grows up to the limit's rate entries
// (every entry costs at least one token).
type slidingWindow struct {
	entries []windowEntry
	head, n int
	sum     int64 // total cost of the n entries
	// latest is the latest time the window has seen. Like a bucket, whose
	// clock going back earns nothing, a window never goes back in time: an
	// earlier request is counted as at latest, so entries stay in time
	// order and expire oldest first.
	latest int64
}

// clock moves the window's time to now unless now is earlier.
func (w *slidingWindow) clock(now int64) int64 {
	w.latest = max(w.latest, now)
	return w.latest
}

type windowEntry struct{ at, cost int64 }

func (w *slidingWindow) expire(now, periodUs int64) {
	now = w.clock(now)
	for w.n > 0 {
		e := w.entries[w.head]
		if e.at > now-periodUs {
			return
		}
		w.sum -= e.cost
		w.head = (w.head + 1) % len(w.entries)
		w.n--
	}
}

func (w *slidingWindow) add(now, cost, rate int64) {
	now = w.clock(now)
	if w.n == len(w.entries) {
		grown := make([]windowEntry, max(4, min(2*len(w.entries), int(rate))))
		for i := range w.n {
			grown[i] = w.entries[(w.head+i)%len(w.entries)]
		}
		w.entries, w.head = grown, 0
	}
	w.entries[(w.head+w.n)%len(w.entries)] = windowEntry{at: now, cost: cost}
	w.n++
	w.sum += cost
}

// removeNewest takes back the newest entry (a debit undone).
func (w *slidingWindow) removeNewest() {
	w.n--
	w.sum -= w.entries[(w.head+w.n)%len(w.entries)].cost
}

// waitUs is how long until enough entries leave the window for cost to fit.
func (w *slidingWindow) waitUs(now, cost, rate, periodUs int64) int64 {
	// From an earlier request, the wait also covers the gap to latest.
	excess := w.sum + cost - rate
	for i := 0; i < w.n && excess > 0; i++ {
		e := w.entries[(w.head+i)%len(w.entries)]
		excess -= e.cost
		if excess <= 0 {
			return e.at + periodUs - now
		}
	}
	return 1
}

// canCoverAbove is canCover for a bucket that must keep reserve token·µs
// after the debit (tier reserves); reserve is 0 elsewhere.
func (l *limiter) canCoverAbove(cost, reserve int64) bool {
	if reserve == 0 {
		return l.canCover(cost)
	}
	periodUs, _, burst := l.shape()
	return cost <= burst && cost*periodUs+reserve <= l.level
}

// retryAboveUs is retryAfterUs for canCoverAbove: math.MaxInt64 also when
// the cost and the reserve together exceed the burst.
func (l *limiter) retryAboveUs(cost, reserve, now int64) int64 {
	periodUs := l.periodUs()
	if l.never(cost) || cost*periodUs+reserve > l.capacity() {
		return math.MaxInt64
	}
	return l.bucketWaitUs(cost*periodUs+reserve, now)
}

// bucketWaitUs is how long until the bucket holds need token·µs. The wait
// counts from now, and refill starts only at last: a request from before
// the bucket's clock (the clock went back) waits for the gap too.
func (l *limiter) bucketWaitUs(need, now int64) int64 {
	need -= l.level
	if need <= 0 {
		return 1
	}
	rate := l.rate()
	if rate == 0 {
		return math.MaxInt64
	}
	return max((need+rate-1)/rate+max(l.last-now, 0), 1)
}

// shortfall is how many whole tokens cost lacks.
func (l *limiter) shortfall(cost int64) int64 { return max(cost-l.remaining(), 0) }

// shareBucket paces a tenant at its fair share while the plane is contended.
// Shares change every fairness tick, so it counts in float64 tokens.
type shareBucket struct {
	level float64
	last  int64
}

// start begins the bucket of a tenant paced for the first time: one request
// of the plane's cheapest (first) and the share it saved since the
// contention began (since, µs), not since ever. A full bucket of
// shareMinRequests would let each of a tier's thousands of tenants with tiny
// shares (0.2 tokens/s) run over its share for a minute, and an empty one
// would deny the first request of every tenant paced at a share it does not
// use up.
func (s *shareBucket) start(since int64, first float64) { s.last, s.level = since, first }

// settle refills the bucket at rate up to burst.
func (s *shareBucket) settle(now int64, rate, burst float64) {
	if now > s.last {
		s.level += float64(now-s.last) * rate / 1e6
		s.last = now
	}
	s.level = min(s.level, burst) // also when the share shrank
}

// covers reports whether the bucket admits a request of cost. A full
// bucket admits any cost and goes into debt, repaid at the share rate: a
// request costlier than the bucket holds is paced, never refused for good,
// and the bucket need not hold the costliest request, which would let a
// small tenant run far over its share whenever its bucket is full.
func (s *shareBucket) covers(cost, capacity float64) bool {
	return s.level >= min(cost, capacity)
}

func (s *shareBucket) retryAfterUs(cost, capacity, rate float64) int64 {
	if rate <= 0 {
		return math.MaxInt64
	}
	return int64(math.Ceil((min(cost, capacity) - s.level) / rate * 1e6))
}
