package upstream

import "time"

// Seed 004's reclassify table (TenantPriorityEngine.reclassify). At a
// confidence of StaticConfidence or more every tenant keeps its static
// tier's class (StaticClass). Below it the confidence band says which
// classes are open, and the score which class a tenant earns:
//
//	confidence      open classes                  score ≥ 0.85 0.65 0.45 0.25  else
//	[0.65, 0.9)     critical high medium low              C    H    M    L     S
//	[0.40, 0.65)    critical high medium                  C    H    M    S     S
//	[0.15, 0.40)    critical high                         C    H    S    S     S
//	[0, 0.15)       critical                              C    S    S    S     S
const (
	StaticConfidence = 0.9
	// The bands' lower edges.
	ModerateBand = 0.65
	MajorBand    = 0.40
	SevereBand   = 0.15
	// The scores a class needs.
	CriticalScore = 0.85
	HighScore     = 0.65
	MediumScore   = 0.45
	LowScore      = 0.25
	// StaticHighBase and StaticMediumBase map a static tier to its class
	// by its base score (the seed's _static_to_tier: enterprise, 0.7, is
	// high; business, 0.5, medium; starter and free low).
	StaticHighBase   = 0.7
	StaticMediumBase = 0.5
)

// scoreEpsilon forgives a score the binary rounding of its sum: scores
// add decimal constants, and a sum that is a threshold in decimals may
// land a few ulps under it in binary (the seed's Python would put it in
// the class below; it means the class it reaches in decimals).
const scoreEpsilon = 1e-9

// Band is seed 004's class for a tenant of priority score score at
// capacity confidence confidence, whose static tier has base score
// staticBase (TierBase). A confidence that is not a number counts as 0.
func Band(score, confidence, staticBase float64) Class {
	confidence = unit(confidence)
	if confidence >= StaticConfidence {
		return StaticClass(staticBase)
	}
	var class Class
	switch s := score + scoreEpsilon; {
	case s >= CriticalScore:
		class = Critical
	case s >= HighScore:
		class = High
	case s >= MediumScore:
		class = Medium
	case s >= LowScore:
		class = Low
	default:
		return Suspended
	}
	var lowestOpen Class
	switch {
	case confidence < SevereBand:
		lowestOpen = Critical
	case confidence < MajorBand:
		lowestOpen = High
	case confidence < ModerateBand:
		lowestOpen = Medium
	default:
		lowestOpen = Low
	}
	if class < lowestOpen {
		return Suspended
	}
	return class
}

// StaticClass is the class of a static tier of base score base while the
// upstream is healthy: high from StaticHighBase, medium from
// StaticMediumBase, else low (never critical nor suspended).
func StaticClass(base float64) Class {
	switch b := base + scoreEpsilon; {
	case b >= StaticHighBase:
		return High
	case b >= StaticMediumBase:
		return Medium
	}
	return Low
}

// The reclassification cycle: seed 004 reclassifies every 30 s and every
// 10 s while confidence is below 0.5.
const (
	NormalCycle    = 30 * time.Second
	FastCycle      = 10 * time.Second
	FastCycleBelow = 0.5
)

// CycleInterval is the time to the next reclassification at confidence.
func CycleInterval(confidence float64) time.Duration {
	if unit(confidence) < FastCycleBelow {
		return FastCycle
	}
	return NormalCycle
}

// Classifier holds the tenants' classes on one upstream across cycles and
// adds seed 004's hysteresis to Band's targets: an upgrade is immediate; a
// downgrade needs two consecutive cycles whose target is below the current
// class, and then goes to the higher of those two targets. That is the
// seed's rule read literally (a tier is downgraded only if the score "has
// been below the threshold for at least two consecutive cycles"): after
// targets medium then suspended, a high tenant has been below high twice
// but below medium once, so it drops to medium, and to suspended only if
// the next target is still suspended. It costs a tenant falling fast one
// more cycle than going to the latest target would, and it never drops a
// tenant on a single cycle's evidence.
//
// Step each tenant once per cycle, then EndCycle: tenants that were not
// stepped since the last EndCycle are forgotten, so the memory is bounded
// by one cycle's tenants. A Classifier is owned by one goroutine (the
// leader's cycle); the zero value is ready.
type Classifier struct {
	tenants map[string]classState
	cycle   uint64 // counts EndCycle calls
}

type classState struct {
	class Class
	// below says the previous cycle's target, target, was below class.
	below  bool
	target Class
	seen   uint64 // the cycle of the last Step
}

// Step gives tenant's target class this cycle (Band's) and returns its
// class and whether that changed. A tenant stepped for the first time (or
// again after it was forgotten) takes its target at once and is not a
// change.
func (c *Classifier) Step(tenant string, target Class) (class Class, changed bool) {
	if c.tenants == nil {
		c.tenants = make(map[string]classState)
	}
	st, ok := c.tenants[tenant]
	switch {
	case !ok:
		st = classState{class: target}
	case target >= st.class:
		changed = target > st.class
		st.class, st.below = target, false
	case !st.below:
		st.below, st.target = true, target // first cycle below: hold
	default:
		// Second consecutive cycle below: down to the higher target. If
		// that is the earlier one, this cycle's target is already a first
		// cycle below the new class.
		prev := st.target
		st.class, changed = max(prev, target), true
		st.below, st.target = target < st.class, target
	}
	st.seen = c.cycle
	c.tenants[tenant] = st
	return st.class, changed
}

// EndCycle closes a cycle: it forgets the tenants not stepped in it and
// returns how many.
func (c *Classifier) EndCycle() (forgotten int) {
	for tenant, st := range c.tenants {
		if st.seen != c.cycle {
			delete(c.tenants, tenant)
			forgotten++
		}
	}
	c.cycle++
	return forgotten
}

// Restore sets tenant's class as if it had held it for a while, with no
// downgrade pending: a leader taking over restores the classes of the
// last published plan, so that its first cycle keeps their hysteresis.
// The tenant counts as stepped in the current cycle.
func (c *Classifier) Restore(tenant string, class Class) {
	if c.tenants == nil {
		c.tenants = make(map[string]classState)
	}
	c.tenants[tenant] = classState{class: class, seen: c.cycle}
}

// Class is tenant's current class; ok false when it is not known.
func (c *Classifier) Class(tenant string) (class Class, ok bool) {
	st, ok := c.tenants[tenant]
	return st.class, ok
}

// Len is how many tenants the classifier holds.
func (c *Classifier) Len() int { return len(c.tenants) }
