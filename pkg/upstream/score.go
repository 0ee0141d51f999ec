package upstream

// Signals are a tenant's priority signals beside its tier: seed 004's
// TenantProfile fields (the TenantQuota's priority signals and the live
// usage ratio the leader measures).
type Signals struct {
	// ContractValue is the tenant's contract value, USD per year (the
	// seed's arr_usd).
	ContractValue float64
	// Realtime says the tenant's workload is real-time (customer-facing),
	// not batch.
	Realtime bool
	// Importance is a manual weight, 0 to 1.
	Importance float64
	// Usage is the tenant's usage ratio (use over its allocation), 0 to 1.
	Usage float64
}

// Seed 004's compute_priority_score terms: a contract value of
// ContractValueCap or more adds ContractWeight, a real-time workload
// RealtimeBonus, usage UsageWeight·usage, importance
// ImportanceWeight·importance.
const (
	ContractValueCap = 500_000.0
	ContractWeight   = 0.15
	RealtimeBonus    = 0.10
	UsageWeight      = 0.05
	ImportanceWeight = 0.10
)

// Score is seed 004's priority score (compute_priority_score):
//
//	min(1, tierBase + 0.15·min(contractValue/500000, 1) + 0.10·realtime
//	       + 0.05·usage + 0.10·importance)
//
// Signals out of range are clamped (a negative contract value counts as 0,
// importance and usage to [0, 1], NaN as 0), and so is the score, to
// [0, 1].
func Score(tierBase float64, s Signals) float64 {
	// The seed's order of terms, as its floats add up: tier, contract,
	// realtime, usage, importance.
	score := tierBase + unit(s.ContractValue/ContractValueCap)*ContractWeight
	if s.Realtime {
		score += RealtimeBonus
	}
	score += unit(s.Usage) * UsageWeight
	score += unit(s.Importance) * ImportanceWeight
	return unit(score)
}

// Seed 004's tier base scores: enterprise 0.7, business 0.5, starter 0.3,
// free 0.1.
const (
	TopTierBase    = 0.7
	BottomTierBase = 0.1
)

// TierBase is the default base score of the tier of priority rank rank (0
// the highest weight) among tiers tiers: seed 004's 0.7, 0.5, 0.3, 0.1 for
// four, and linear from 0.7 down to 0.1 for other counts (one tier is
// 0.7). A rank out of [0, tiers) is clamped into it.
func TierBase(rank, tiers int) float64 {
	if tiers <= 1 || rank <= 0 {
		return TopTierBase
	}
	rank = min(rank, tiers-1)
	// (7·(n−1) − 6·rank) / (10·(n−1)): one rounding, so four tiers give
	// exactly the seed's literals.
	n := float64(tiers - 1)
	return (7*n - 6*float64(rank)) / (10 * n)
}
