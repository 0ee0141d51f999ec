package upstream

import (
	"fmt"
	"math"
	"time"
)

// Seed 004's weights of the three failure signals in the capacity
// confidence (ProviderHealthSnapshot.compute_confidence), and its latency
// ceiling (5000 ms): a p95 at or above it costs the full LatencyWeight.
const (
	ErrorWeight           = 0.5
	LatencyWeight         = 0.2
	QuotaWeight           = 0.3
	DefaultLatencyCeiling = 5 * time.Second
)

// QuotaSignal says how a quota reading becomes the quota ratio of the
// quota penalty, QuotaWeight·(1 − ratio).
type QuotaSignal uint8

const (
	// QuotaSignalRemaining is seed 004's: ratio = remaining / limit. It
	// catches a provider that throttles by draining the window, but it
	// also charges normal use: at 60 % of the window used (ratio 0.4) the
	// penalty is 0.18.
	QuotaSignalRemaining QuotaSignal = iota
	// QuotaSignalLimit: ratio = min(limit / nominal limit, 1). It catches a
	// provider that cuts the limit it grants you in an outage, and charges
	// nothing for use.
	QuotaSignalLimit
)

var quotaSignalNames = [...]string{"Remaining", "Limit"}

func (q QuotaSignal) String() string {
	if int(q) < len(quotaSignalNames) {
		return quotaSignalNames[q]
	}
	return fmt.Sprintf("quotaSignal(%d)", uint8(q))
}

// ParseQuotaSignal maps the Upstream's spec.quotaSignal ("Remaining",
// "Limit"; empty is the default, Remaining) to a QuotaSignal.
func ParseQuotaSignal(s string) (QuotaSignal, bool) {
	switch s {
	case "", "Remaining":
		return QuotaSignalRemaining, true
	case "Limit":
		return QuotaSignalLimit, true
	}
	return 0, false
}

// ConfidenceParams are an upstream's settings of the confidence; the zero
// value is seed 004's.
type ConfidenceParams struct {
	// LatencyCeiling is the p95 that costs the full latency penalty;
	// DefaultLatencyCeiling when ≤ 0.
	LatencyCeiling time.Duration
	QuotaSignal    QuotaSignal
	// NominalLimit is the limit the provider grants when healthy, in the
	// unit and period of its limit header (QuotaSignalLimit only); without
	// one (≤ 0) the quota penalty is 0.
	NominalLimit float64
	// Fresh is how old the newest reading may be before the staleness
	// penalty starts: the cadence readings are expected at (the probe's
	// interval, a cycle). Seed 004 penalises every second of age, so a
	// provider probed every 15 s loses up to 0.125 between probes and a
	// healthy one can never reach the 0.95 full recovery asks; 0 is the
	// seed's.
	Fresh time.Duration
}

// Terms are the parts of a confidence, for status and debugging: the
// confidence is max(0, min(1, 1 − Error − Latency − Quota) − Staleness).
type Terms struct {
	Error, Latency, Quota, Staleness float64
	Confidence                       float64
}

// Confidence is seed 004's capacity confidence of an upstream whose window
// read st at now:
//
//	clamp(1 − 0.5·errorRate − 0.2·min(p95/latencyCeiling, 1) − 0.3·(1 − quotaRatio), 0, 1)
//	  − Staleness(now − st.Newest), at least 0
//
// An unknown quota reading costs nothing (the ratio counts as 1: seed 004
// defaults missing headers to 1000/1000), and neither does a window
// without latencies. An empty window is 1: seed 004's ledger assumes a
// provider it has no data on is healthy.
func Confidence(st Stats, now time.Time, p ConfidenceParams) float64 {
	return Explain(st, now, p).Confidence
}

// Explain is Confidence with its terms.
func Explain(st Stats, now time.Time, p ConfidenceParams) Terms {
	if st.Empty() {
		return Terms{Confidence: 1}
	}
	ceiling := p.LatencyCeiling
	if ceiling <= 0 {
		ceiling = DefaultLatencyCeiling
	}
	t := Terms{
		Error:     unit(st.ErrorRate()) * ErrorWeight,
		Latency:   min(max(st.P95.Seconds()/ceiling.Seconds(), 0), 1) * LatencyWeight,
		Quota:     (1 - quotaRatio(st, p)) * QuotaWeight,
		Staleness: Staleness(now.Sub(st.Newest) - p.Fresh),
	}
	base := unit(1 - t.Error - t.Latency - t.Quota)
	t.Confidence = max(0, base-t.Staleness)
	return t
}

// quotaRatio is the quota signal's ratio in [0, 1]; 1 when it is unknown.
func quotaRatio(st Stats, p ConfidenceParams) float64 {
	if !ValidReading(st.Remaining, st.Limit) {
		return 1
	}
	switch p.QuotaSignal {
	case QuotaSignalLimit:
		if !(p.NominalLimit > 0) || math.IsInf(p.NominalLimit, 0) {
			return 1
		}
		return unit(float64(st.Limit) / p.NominalLimit)
	default:
		return unit(float64(st.Remaining) / float64(st.Limit))
	}
}

// unit clamps x to [0, 1]; NaN is 0.
func unit(x float64) float64 {
	if !(x > 0) {
		return 0
	}
	return min(x, 1)
}
