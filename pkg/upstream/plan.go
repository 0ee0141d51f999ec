package upstream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// Class is a tenant's priority class on one upstream, seed 004's
// PriorityTier, with the seed's numbers.
type Class uint8

// The classes, lowest first.
const (
	Suspended Class = iota // no capacity while the upstream is degraded
	Low
	Medium
	High
	Critical
	NumClasses = 5
)

var classNames = [NumClasses]string{"suspended", "low", "medium", "high", "critical"}

// String is the class's name as X-Tier carries it: "critical", "high",
// "medium", "low" or "suspended".
func (c Class) String() string {
	if c < NumClasses {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", uint8(c))
}

// ParseClass is String's inverse.
func ParseClass(s string) (Class, bool) {
	i := slices.Index(classNames[:], s)
	return Class(i), i >= 0
}

// MarshalText and UnmarshalText encode a class by name.
func (c Class) MarshalText() ([]byte, error) {
	if c >= NumClasses {
		return nil, fmt.Errorf("class %d out of range", uint8(c))
	}
	return []byte(c.String()), nil
}

func (c *Class) UnmarshalText(b []byte) error {
	v, ok := ParseClass(string(b))
	if !ok {
		return fmt.Errorf("class %q is not one of %v", b, classNames)
	}
	*c = v
	return nil
}

// ClassWeights are seed 004's TIER_WEIGHTS: a class's share of the capacity
// above critical's reserve is proportional to its weight.
var ClassWeights = [NumClasses]float64{Suspended: 0, Low: 0.1, Medium: 0.3, High: 0.6, Critical: 1.0}

// Phase is where an upstream stands between healthy and recovered.
type Phase uint8

// The phases. Healthy turns the gate off. Degraded is the first cycle below
// healthy: the capacity is cut at once, the classes still need their second
// cycle. Phase1 to Phase3 are seed 004's recovery phases 1 to 3, applied
// whenever the upstream is not healthy (the seed's phase 4 is Healthy).
const (
	Healthy Phase = iota
	Degraded
	Phase1 // critical and high only
	Phase2 // medium at 50 %, low at 0 %
	Phase3 // medium at 100 %, low at 25 %
	NumPhases
)

var phaseNames = [NumPhases]string{"Healthy", "Degraded", "Phase1", "Phase2", "Phase3"}

func (p Phase) String() string {
	if p < NumPhases {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", uint8(p))
}

// ParsePhase is String's inverse.
func ParsePhase(s string) (Phase, bool) {
	i := slices.Index(phaseNames[:], s)
	return Phase(i), i >= 0
}

func (p Phase) MarshalText() ([]byte, error) {
	if p >= NumPhases {
		return nil, fmt.Errorf("phase %d out of range", uint8(p))
	}
	return []byte(p.String()), nil
}

func (p *Phase) UnmarshalText(b []byte) error {
	v, ok := ParsePhase(string(b))
	if !ok {
		return fmt.Errorf("phase %q is not one of %v", b, phaseNames)
	}
	*p = v
	return nil
}

// Fractions is the part of each class's demand a phase lets through (seed
// 004's recovery ramp); 0 suspends the class. Healthy lets everything
// through, as the gate is off.
func (p Phase) Fractions() [NumClasses]float64 {
	switch p {
	case Phase1:
		return [NumClasses]float64{Critical: 1, High: 1}
	case Phase2:
		return [NumClasses]float64{Critical: 1, High: 1, Medium: 0.5}
	case Phase3:
		return [NumClasses]float64{Critical: 1, High: 1, Medium: 1, Low: 0.25}
	}
	return [NumClasses]float64{Critical: 1, High: 1, Medium: 1, Low: 1}
}

// Plan is what the leader publishes each cycle and every enforcer applies:
// per upstream, the confidence, the phase and every tenant's class. It is
// stored as JSON under PlanKey with a TTL.
type Plan struct {
	// Plane is the plane's id, namespace/name.
	Plane string `json:"plane"`
	// Seq grows with every publish; enforcers reread the plan when it
	// changes. PublishedMs is when it was published, Unix ms of Redis
	// TIME; it applies until PlanTTL later (an enforcer that cannot reread
	// it keeps it until then, its confidence decayed: Staleness). Both are
	// the plan hash's fields (PublishPlan), not the body's.
	Seq         int64 `json:"-"`
	PublishedMs int64 `json:"-"`
	// Interval is the cycle in force when it was published: a plan older
	// than one interval is stale.
	Interval  time.Duration  `json:"interval"`
	Upstreams []UpstreamPlan `json:"upstreams"`
}

// Now is the upstream's capacity at confidence: Capacity × confidence, at
// most Ceiling when there is one (tokens per second).
func (u *UpstreamPlan) Now(confidence float64) float64 {
	c := u.Capacity * confidence
	if u.Ceiling > 0 {
		c = min(c, u.Ceiling)
	}
	return c
}

// UpstreamPlan is one upstream's part of a plan.
type UpstreamPlan struct {
	Name string `json:"name"`
	// Endpoints draw on the upstream, by name, sorted.
	Endpoints []string `json:"endpoints"`
	// Capacity is the nominal capacity in the plane's tokens per second.
	Capacity float64 `json:"capacity"`
	// Confidence is the capacity confidence, 0 to 1: capacity now is
	// Capacity × Confidence, at most Ceiling.
	Confidence float64 `json:"confidence"`
	// Ceiling is the rate the provider itself now grants, tokens per
	// second, from its limit header (quotaSignal Limit, the header read in
	// the capacity's unit and period); 0 when it says none. Seed 004 has
	// no such cap: its confidence is not a capacity (50 % errors, a 5 s
	// p95 and a limit cut to 40 % give 0.37), so a provider that states
	// its limit is not sent more than it.
	Ceiling float64 `json:"ceiling,omitempty"`
	Phase   Phase   `json:"phase"`
	// Reserve is what critical tenants are reserved first: the sum of
	// their nominal allocations (tokens per second), at most Capacity.
	Reserve float64 `json:"reserve"`
	// Tiers are each tier's class: the class of its tenants, but for those
	// in Tenants, the named tenants whose own class differs (and their
	// scores).
	Tiers   map[string]Class       `json:"tiers,omitempty"`
	Tenants map[string]TenantClass `json:"tenants,omitempty"`
}

// TenantClass is a tenant's class and the score it came from.
type TenantClass struct {
	Class Class   `json:"class"`
	Score float64 `json:"score"`
}

// Bounds on a plan.
const (
	// MaxUpstreams bounds the upstreams of a plane.
	MaxUpstreams = 16
	// PlanTTL is how long a plan applies after it was published, if no
	// newer one comes: long enough to ride out a manager's restart and
	// leader election, short enough that a plane whose leader is gone does
	// not keep tenants suspended for long.
	PlanTTL = 5 * time.Minute
	// MaxStalenessPenalty and StalenessHorizon are seed 004's staleness
	// penalty: a reading loses 1/120 of confidence per second of age, at
	// most 0.5.
	MaxStalenessPenalty = 0.5
	StalenessHorizon    = 120 * time.Second
)

// Staleness is seed 004's staleness penalty for a reading age old.
func Staleness(age time.Duration) float64 {
	if age <= 0 {
		return 0
	}
	return min(age.Seconds()/StalenessHorizon.Seconds(), MaxStalenessPenalty)
}

// PlanKey is the Redis key of a plane's plan, beside its policy (the same
// hash tag: store.PolicyKey): a hash of seq, at (PublishedMs) and body (the
// plan's JSON), expiring PlanTTL after the last publish.
func PlanKey(plane string) string { return keyspace.UpstreamPlan(plane) }

// DemandKey is the hash where enforcers report their demand per class on
// one upstream (field: node id).
func DemandKey(plane, upstream string) string { return keyspace.UpstreamDemand(plane, upstream) }

// ReportsKey is the list where enforcers forward passive reports of one
// upstream for the leader.
func ReportsKey(plane, upstream string) string { return keyspace.UpstreamReports(plane, upstream) }

// NodesKey is the hash of the enforcers that exchange with the plan (field:
// node id, value: the ms of Redis TIME of its last exchange), pruned of
// the silent ones at every exchange: the fleet the leader reads usage of,
// and an enforcer's count of live nodes.
func NodesKey(plane string) string { return keyspace.UpstreamNodes(plane) }

// UsageKey is where enforcer node reports its busiest tenants' admitted
// rates (Usage), expiring three UsageIntervals after its last report.
func UsageKey(plane, node string) string { return keyspace.UpstreamUsage(plane, node) }

// Encode returns the plan's JSON.
func (p *Plan) Encode() ([]byte, error) { return json.Marshal(p) }

// DecodePlan parses and checks a plan: nothing read from Redis is trusted.
// Endpoints and tiers the policy in force does not know are the caller's to
// ignore (a plan may be a cycle behind the policy).
func DecodePlan(data []byte) (*Plan, error) {
	var p Plan
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return nil, fmt.Errorf("decode upstream plan: %w", err)
	}
	if err := p.check(); err != nil {
		return nil, fmt.Errorf("decode upstream plan: %w", err)
	}
	return &p, nil
}

func (p *Plan) check() error {
	if len(p.Upstreams) > MaxUpstreams {
		return fmt.Errorf("%d upstreams, more than %d", len(p.Upstreams), MaxUpstreams)
	}
	if p.Interval < 0 {
		return fmt.Errorf("negative interval %s", p.Interval)
	}
	for _, u := range p.Upstreams {
		switch {
		case !policy.ValidTierName(u.Name):
			return fmt.Errorf("upstream name %q is not valid", u.Name)
		case !finite(u.Capacity) || u.Capacity < 0 || !finite(u.Reserve) || u.Reserve < 0 || !finite(u.Ceiling) || u.Ceiling < 0:
			return fmt.Errorf("upstream %s: capacity %v or reserve %v out of range", u.Name, u.Capacity, u.Reserve)
		case !finite(u.Confidence) || u.Confidence < 0 || u.Confidence > 1:
			return fmt.Errorf("upstream %s: confidence %v out of [0, 1]", u.Name, u.Confidence)
		case u.Phase >= NumPhases:
			return fmt.Errorf("upstream %s: phase %d out of range", u.Name, u.Phase)
		}
		for name, tc := range u.Tenants {
			if tc.Class >= NumClasses || !finite(tc.Score) {
				return fmt.Errorf("upstream %s: tenant %s: class %d or score %v out of range", u.Name, name, tc.Class, tc.Score)
			}
		}
	}
	return nil
}

func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// Report is what one enforcer forwards of the passive reports its data path
// sent about one upstream over one interval (POST /quota/upstream/report):
// JSON in the list ReportsKey, which the leader drains each cycle.
type Report struct {
	Node string `json:"node"`
	// AtMs is when the interval ended, Unix ms of the enforcer's clock.
	AtMs int64 `json:"atMs"`
	// N calls, Errors of them failed (no answer, 429 or 5xx: IsError).
	N      int `json:"n"`
	Errors int `json:"errors"`
	// LatenciesMs is a sample of the calls' latencies (at most
	// MaxReportLatencies, every call's while they fit).
	LatenciesMs []float64 `json:"latenciesMs,omitempty"`
	// Remaining and Limit are the last rate-limit reading reported; -1
	// when none was.
	Remaining int64 `json:"remaining"`
	Limit     int64 `json:"limit"`
}

// MaxReportLatencies bounds a Report's latency sample.
const MaxReportLatencies = 256

// MaxReports bounds the reports a list keeps: the leader drains it every
// cycle; one that does not (gone) leaves at most this many behind.
const MaxReports = 1024

// IsError says whether a call that got status counts as an error: no
// answer (0), 429, or 5xx, as seed 004's probe counts 429, 500, 502 and
// 503.
func IsError(status int) bool { return status == 0 || status == 429 || status >= 500 }

// Usage is one enforcer's report of the rates its busiest named tenants
// were admitted at (tokens/s, over its last report interval), JSON under
// UsageKey: the leader's usage ratio is the live nodes' (NodesKey) sum
// over the tenant's limit. An enforcer holding a plan reports every
// UsageInterval.
type Usage struct {
	Node  string             `json:"node"`
	AtMs  int64              `json:"atMs"`
	Rates map[string]float64 `json:"rates"`
}

// UsageInterval is how often an enforcer reports Usage.
const UsageInterval = 5 * time.Second
