package policy

import (
	"fmt"
	"regexp"
	"slices"
	"time"
)

// Algorithm names how a limit counts.
type Algorithm string

const (
	// TokenBucket refills Rate tokens per Period into a bucket of Burst tokens.
	TokenBucket Algorithm = "tokenBucket"
	// SlidingWindow admits at most Rate tokens in any window of one Period.
	SlidingWindow Algorithm = "slidingWindow"
)

// Limits of the values a limit may take, chosen so that the engine's integer
// arithmetic cannot overflow and agrees exactly with the Redis scripts.
const (
	// MaxScaledLevel bounds burst × period in microseconds: 2^53, the largest
	// integer a Lua number holds exactly.
	MaxScaledLevel = 1 << 53
	// MinPeriod and MaxPeriod bound a limit's period.
	MinPeriod = time.Millisecond
	MaxPeriod = 366 * 24 * time.Hour
	// MaxRate bounds a limit's rate and burst.
	MaxRate = 1_000_000_000
	// MaxSlidingWindowRate bounds a sliding window's rate: the window keeps one
	// entry per admitted request, so its memory grows with the rate.
	MaxSlidingWindowRate = 10_000
	// MaxCost bounds an endpoint's cost.
	MaxCost = 1_000_000
	// MaxTiers bounds the tiers of a plane.
	MaxTiers = 16
	// MaxShards bounds the Redis shards of a plane (and of a tenant).
	MaxShards = 64
)

// The values of the plane's enumerated fields; the default is the first,
// but for fairness, whose default is maxmin. Modes and FailureModes are
// indexed by Mode and FailureMode.
var (
	Modes           = []string{"local", "central", "local-reconciled"}
	FairnessModes   = []string{"none", "maxmin", "wfq", "drr"}
	ShareByModes    = []string{ShareByTenant, ShareByTier}
	FailureModes    = []string{"degrade", "allow", "deny"}
	UnknownPolicies = []string{"default", "deny"}
)

// Mode is a plane's backend: Spec.Mode, which stores its name (Modes).
type Mode uint8

const (
	// ModeLocal decides in each enforcer's memory: every enforcer
	// enforces the whole plane.
	ModeLocal Mode = iota
	// ModeCentral decides every request in Redis.
	ModeCentral
	// ModeLocalReconciled decides in memory on the node's share of each
	// limit, which a reconcile loop sizes through Redis.
	ModeLocalReconciled
)

func (m Mode) String() string { return Modes[m] }

// Mode is the plane's backend. A mode Compile would not accept reads as
// ModeLocal, which needs nothing.
func (p *Policy) Mode() Mode { return Mode(max(slices.Index(Modes, p.spec.Mode), 0)) }

// FailureMode is what the distributed backends do while Redis is
// unavailable: Spec.FailureMode, which stores its name (FailureModes).
type FailureMode uint8

const (
	// FailureDegrade decides on the node's share of every limit.
	FailureDegrade FailureMode = iota
	// FailureAllow admits every request.
	FailureAllow
	// FailureDeny denies every request at the global level.
	FailureDeny
)

func (f FailureMode) String() string { return FailureModes[f] }

// FailureMode is the plane's failure mode; one Compile would not accept
// reads as FailureDegrade.
func (p *Policy) FailureMode() FailureMode {
	return FailureMode(max(slices.Index(FailureModes, p.spec.FailureMode), 0))
}

// The plane's shareBy values (Spec.ShareBy).
const (
	// ShareByTenant: contended capacity is shared among tenants by their
	// weights (seed 002), tier floors kept.
	ShareByTenant = "tenant"
	// ShareByTier: among tiers by the tiers' weights and floors, then
	// within each tier among its tenants by theirs.
	ShareByTier = "tier"
)

// SharesByTenant says whether contended capacity is shared among tenants
// by their weights (ShareByTenant) rather than among tiers first.
func (s *Spec) SharesByTenant() bool { return s.ShareBy != ShareByTier }

// Bounds on names and weights.
const (
	MaxNameBytes = 256
	MaxWeight    = 1_000_000
)

// ValidName reports whether s can name a tenant, an api key or an endpoint:
// 1 to MaxNameBytes printable ASCII characters without spaces, what a
// gateway can send in a header and a URL path.
//
// Every decision validates its tenant and api key, 30 to 60 bytes each in
// the wild (UUIDs, "sk-live-…"), so it checks eight bytes at a time: a
// byte below 0x21 borrows into its high bit when 0x21 is subtracted from
// it, and one above 0x7e carries into it when 1 is added (or has it set
// already); each test is exact for "some byte of the word".
func ValidName(s string) bool {
	if len(s) == 0 || len(s) > MaxNameBytes {
		return false
	}
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	i := 0
	for ; i+8 <= len(s); i += 8 {
		w := uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
			uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
		if (w-0x21*ones)&^w&highs != 0 || (w+ones|w)&highs != 0 {
			return false
		}
	}
	for ; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// ValidTierName reports whether s can name a tier: a DNS label, as the
// CRD's pattern requires.
func ValidTierName(s string) bool { return tierName.MatchString(s) }

// ValidEndpointName reports whether s can name an endpoint: the {endpoint}
// of POST /api/{endpoint}, as the CRD's pattern requires.
func ValidEndpointName(s string) bool { return endpointName.MatchString(s) }

var (
	tierName     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)
	endpointName = regexp.MustCompile(`^[A-Za-z0-9._~-]{1,128}$`)
)

// Limit is a compiled limit: Rate tokens per Period, Burst tokens at once.
type Limit struct {
	Rate      int64         `json:"rate"`
	Burst     int64         `json:"burst"`
	Period    time.Duration `json:"period"`
	Algorithm Algorithm     `json:"algorithm"`
}

// PeriodMicros is the period in microseconds, the engine's time unit.
func (l Limit) PeriodMicros() int64 { return int64(l.Period / time.Microsecond) }

// String describes the limit as people read it: "100 per 1s (burst 200)".
func (l Limit) String() string {
	if l.Algorithm == SlidingWindow {
		return fmt.Sprintf("%d per %s (sliding window)", l.Rate, l.Period)
	}
	if l.Rate == 0 {
		return fmt.Sprintf("%d in total (no refill)", l.Burst)
	}
	return fmt.Sprintf("%d per %s (burst %d)", l.Rate, l.Period, l.Burst)
}

// Tier is a compiled tier.
type Tier struct {
	Name         string `json:"name"`
	Weight       int64  `json:"weight"`
	FloorPercent int64  `json:"floorPercent"`
	Tenant       *Limit `json:"tenant,omitempty"`
	Key          *Limit `json:"key,omitempty"`
	Hard         bool   `json:"hard,omitempty"`
	// PriorityBase is the tier's base score in seed 004's priority score,
	// in percent, when the QuotaPlane sets one that is not
	// DefaultPriorityBase for the tier's rank; nil means that default (the
	// canonical form, so a plane without priorityBase keeps its hash).
	// Policy.PriorityBase gives the effective value, 0 to 1.
	PriorityBase *int64 `json:"priorityBase,omitempty"`
}

// Bounds of seed 004's priority signals.
const (
	// MaxPriorityPercent bounds a tier's base score and a tenant's
	// importance, both in percent.
	MaxPriorityPercent = 100
	// MaxContractValue bounds a tenant's annual contract value in USD.
	MaxContractValue = 1_000_000_000_000
)

// DefaultPriorityBase is the base score, 0 to 1, of the tier of rank rank
// (0 first) in priority order (weight descending, then name) among tiers
// tiers: 0.7 for the first, 0.1 for the last, evenly spaced between them,
// not rounded. Four tiers get seed 004's 0.7, 0.5, 0.3 and 0.1 exactly
// (its enterprise, business, starter and free), three 0.7, 0.4, 0.1, one
// 0.7. A rank out of [0, tiers) is clamped into it. The arithmetic is
// pkg/upstream's TierBase's, so the two agree to the bit.
func DefaultPriorityBase(rank, tiers int) float64 {
	if tiers <= 1 || rank <= 0 {
		return 0.7
	}
	rank = min(rank, tiers-1)
	// (7·(n−1) − 6·rank) / (10·(n−1)): one rounding.
	n := float64(tiers - 1)
	return (7*n - 6*float64(rank)) / (10 * n)
}

// isDefaultPriorityBase reports whether a base of percent is exactly
// DefaultPriorityBase(rank, tiers), in integers.
func isDefaultPriorityBase(percent int64, rank, tiers int) bool {
	if tiers <= 1 || rank <= 0 {
		return percent == 70
	}
	rank = min(rank, tiers-1)
	n := int64(tiers - 1)
	return percent*n == 10*(7*n-6*int64(rank)) // percent/100 == (7n − 6·rank)/(10n)
}

// Priority are a named tenant's signals in seed 004's priority score
// (TenantQuota spec.priority). A tenant without any has none (nil): the
// canonical form, so a tenant without them keeps its hash.
type Priority struct {
	// ContractValue is the annual contract value in USD (the seed's
	// arr_usd), 0 to MaxContractValue: 0.15·min(ContractValue/500000, 1).
	ContractValue int64 `json:"contractValue,omitempty"`
	// Realtime is the seed's is_realtime_workload: 0.10.
	Realtime bool `json:"realtime,omitempty"`
	// Importance is the seed's importance_weight in percent, 0 to 100:
	// 0.10·Importance/100.
	Importance int64 `json:"importance,omitempty"`
}

// TierLimit is a limit that applies to the tenants of one tier.
type TierLimit struct {
	Tier  string `json:"tier"`
	Limit Limit  `json:"limit"`
}

// Endpoint is a compiled endpoint.
type Endpoint struct {
	Name  string      `json:"name"`
	Cost  int64       `json:"cost"`
	Limit *Limit      `json:"limit,omitempty"`
	Tiers []TierLimit `json:"tiers,omitempty"`
	// Match classifies forwarded requests into the endpoint, in the
	// EndpointQuota's order.
	Match []Match `json:"match,omitempty"`
}

// KeyLimit is a limit on one api key.
type KeyLimit struct {
	Key   string `json:"key"`
	Limit Limit  `json:"limit"`
}

// EndpointLimit is a tenant's own limit on one endpoint.
type EndpointLimit struct {
	Endpoint string `json:"endpoint"`
	Limit    Limit  `json:"limit"`
}

// Tenant is a compiled tenant with its tier's defaults already applied: Limit,
// Weight and Hard are the effective values.
type Tenant struct {
	Name      string          `json:"name"`
	Tier      string          `json:"tier"`
	Limit     *Limit          `json:"limit,omitempty"`
	Weight    int64           `json:"weight"`
	Hard      bool            `json:"hard,omitempty"`
	Keys      []KeyLimit      `json:"keys,omitempty"`
	Endpoints []EndpointLimit `json:"endpoints,omitempty"`
	// KeyHashes are the tenant's api keys (HashKey), sorted: the keys a
	// bound plane admits for it.
	KeyHashes []string `json:"keyHashes,omitempty"`
	// Shards splits the tenant's buckets over this many of the plane's
	// shards; 0 or 1 does not split them.
	Shards int64 `json:"shards,omitempty"`
	// Priority are the tenant's signals in seed 004's priority score; nil
	// when it has none, and for tenants the plane does not name.
	Priority *Priority `json:"priority,omitempty"`
	// Known is false for a tenant the plane does not name (see Policy.DefaultTenant).
	Known bool `json:"-"`
}

// BurstPool is the compiled shared burst pool.
type BurstPool struct {
	Size             int64    `json:"size"`
	RefillRate       int64    `json:"refillRate"`
	PerTenantCeiling int64    `json:"perTenantCeiling"`
	Tiers            []string `json:"tiers,omitempty"`
}

// Enforcer is how the manager scales the enforcer fleet.
type Enforcer struct {
	DeploymentName       string `json:"deploymentName,omitempty"`
	MinReplicas          int32  `json:"minReplicas"`
	MaxReplicas          int32  `json:"maxReplicas"`
	TargetRatePerReplica int64  `json:"targetRatePerReplica,omitempty"`
}

// Spec is the whole compiled content of a policy, in canonical order: tiers by
// priority (weight descending, then name), endpoints, tenants, keys and tier
// lists by name. Its JSON encoding is what the content hash covers.
type Spec struct {
	Namespace string `json:"namespace"`
	Plane     string `json:"plane"`
	Mode      string `json:"mode"`
	Fairness  string `json:"fairness"`
	// ShareBy is ShareByTier, or empty for the default, ShareByTenant
	// (Compile leaves the default unset, so that a plane that does not set
	// it keeps the hash and the encoding it had before the field existed).
	ShareBy           string        `json:"shareBy,omitempty"`
	FailureMode       string        `json:"failureMode"`
	ReconcileInterval time.Duration `json:"reconcileInterval"`
	Shards            int64         `json:"shards"`
	DefaultTier       string        `json:"defaultTier"`
	UnknownTenants    string        `json:"unknownTenants"`
	UnknownEndpoints  string        `json:"unknownEndpoints"`
	KeyBinding        string        `json:"keyBinding"`
	Descriptors       Descriptors   `json:"descriptors"`
	Global            Limit         `json:"global"`
	Tiers             []Tier        `json:"tiers"`
	Endpoints         []Endpoint    `json:"endpoints"`
	Tenants           []Tenant      `json:"tenants"`
	BurstPool         *BurstPool    `json:"burstPool,omitempty"`
	Enforcer          Enforcer      `json:"enforcer"`
}
