package load

import (
	"math"
	"math/bits"
	"time"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
)

// Histogram counts durations in log-linear buckets: 8 per power of two of
// nanoseconds, up to 2^40 ns (18 minutes), so a quantile is within 1/8
// (12.5%) above the truth. Adding is a few instructions and allocates
// nothing; it is 1.3 KB, small enough for one per second of a long run.
type Histogram struct {
	Counts [nBuckets]uint32
	N      uint64
}

const (
	subBits    = 3
	subBuckets = 1 << subBits
	nBuckets   = (40 - subBits + 1) * subBuckets
)

func bucketOf(ns int64) int {
	if ns < subBuckets {
		return int(max(ns, 0))
	}
	exp := bits.Len64(uint64(ns)) - 1 // ns in [2^exp, 2^(exp+1))
	sub := int(uint64(ns)>>(exp-subBits)) & (subBuckets - 1)
	return min((exp-subBits+1)*subBuckets+sub, nBuckets-1)
}

// bucketValue is the upper edge of bucket i, in nanoseconds.
func bucketValue(i int) float64 {
	if i < subBuckets {
		return float64(i)
	}
	exp := i/subBuckets + subBits - 1
	sub := i % subBuckets
	return float64(uint64(1)<<exp) * (1 + float64(sub+1)/subBuckets)
}

// Add counts one duration.
func (h *Histogram) Add(d time.Duration) {
	h.Counts[bucketOf(int64(d))]++
	h.N++
}

// Merge adds o's counts.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.Counts {
		h.Counts[i] += c
	}
	h.N += o.N
}

// Quantile is the duration below which a fraction q of the counts fall (0
// when empty).
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.N == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(h.N)))
	var seen uint64
	for i, c := range h.Counts {
		seen += uint64(c)
		if seen >= max(rank, 1) {
			return time.Duration(bucketValue(i))
		}
	}
	return time.Duration(bucketValue(len(h.Counts) - 1))
}

// Levels indexes denials: global, tenant, endpoint, key.
const nLevels = len(enforcer.Levels)

func levelIndex(l enforcer.Level) int {
	for i, x := range enforcer.Levels {
		if x == l {
			return i
		}
	}
	return 0
}

// TenantCount is what one tenant offered and got.
type TenantCount struct {
	Offered, Admitted int64          // requests
	Denied            [nLevels]int64 // by level: global, tenant, endpoint, key
	// DeniedUpstream counts the requests a degraded upstream's gate
	// refused (enforcer.LevelUpstream: suspended or throttled).
	DeniedUpstream int64
	Borrowed       int64 // tokens from the burst pool
	// OfferedTokens and AdmittedTokens count the requests' costs (endpoint
	// cost × units), as the limits do: in-process targets only (an HTTP
	// answer does not say what a request cost).
	OfferedTokens, AdmittedTokens int64
}

func (t *TenantCount) add(u *TenantCount) {
	t.Offered += u.Offered
	t.Admitted += u.Admitted
	t.Borrowed += u.Borrowed
	t.DeniedUpstream += u.DeniedUpstream
	t.OfferedTokens += u.OfferedTokens
	t.AdmittedTokens += u.AdmittedTokens
	for l := range t.Denied {
		t.Denied[l] += u.Denied[l]
	}
}

// Second is one second of the run.
type Second struct {
	Offered, Admitted int64
	// Victims are the tenants that do not spike: their requests, those
	// admitted, and those denied at the global level (the neighbour's doing;
	// a victim's own limits are its own business).
	VictimOffered, VictimAdmitted, VictimDeniedGlobal int64
	// Attacker: the spiking tenants.
	AttackerOffered, AttackerAdmitted int64
	Borrowed                          int64
	// OfferedTokens and AdmittedTokens count costs (in-process targets).
	OfferedTokens, AdmittedTokens int64
	// Latency of every decision, and of the victims' decisions.
	Latency, VictimLatency Histogram
	// Lag is how late decisions started against their scheduled arrival
	// (real time only): the generator's own overhead and backlog.
	Lag Histogram
	// Mismatches counts decisions whose level the oracle disagreed with
	// (virtual time with the oracle on).
	OracleChecked, OracleMismatches int64
	// Errors are decisions that failed (a target error, not a denial).
	Errors int64
}

// WallSecond is one second of wall time since the start of a real-time
// run. The limits refill on this clock, so a run that falls behind its
// schedule (its scheduled seconds then take longer) is measured against
// its limits here, not in Second.
type WallSecond struct {
	Decided                       int64 // decisions made (errors included)
	OfferedTokens, AdmittedTokens int64
}

// counts is one worker's tally, merged at the end.
type counts struct {
	tenants []TenantCount
	seconds []Second
	// wall is by second of wall time (real time only); its last slot also
	// holds any later second.
	wall []WallSecond
}

func newCounts(tenants, seconds, wallSeconds int) *counts {
	return &counts{tenants: make([]TenantCount, tenants), seconds: make([]Second, seconds), wall: make([]WallSecond, wallSeconds)}
}

func (c *counts) merge(o *counts) {
	for i := range c.tenants {
		c.tenants[i].add(&o.tenants[i])
	}
	for i := range c.wall {
		w, u := &c.wall[i], &o.wall[i]
		w.Decided += u.Decided
		w.OfferedTokens += u.OfferedTokens
		w.AdmittedTokens += u.AdmittedTokens
	}
	for i := range c.seconds {
		s, u := &c.seconds[i], &o.seconds[i]
		s.Offered += u.Offered
		s.Admitted += u.Admitted
		s.VictimOffered += u.VictimOffered
		s.VictimAdmitted += u.VictimAdmitted
		s.VictimDeniedGlobal += u.VictimDeniedGlobal
		s.AttackerOffered += u.AttackerOffered
		s.AttackerAdmitted += u.AttackerAdmitted
		s.Borrowed += u.Borrowed
		s.OfferedTokens += u.OfferedTokens
		s.AdmittedTokens += u.AdmittedTokens
		s.OracleChecked += u.OracleChecked
		s.OracleMismatches += u.OracleMismatches
		s.Errors += u.Errors
		s.Latency.Merge(&u.Latency)
		s.VictimLatency.Merge(&u.VictimLatency)
		s.Lag.Merge(&u.Lag)
	}
}
