package upstream

import "time"

// The phase machine's thresholds: seed 004's recovery ramp (phase 1 below
// 0.7, phase 2 to 0.85, phase 3 to 0.95, full once confidence has stayed
// above 0.95 for 2 minutes) and its healthy line, 0.9, where the
// reclassification defers to the static tiers.
const (
	HealthyConfidence   = 0.9
	Phase2Confidence    = 0.7
	Phase3Confidence    = 0.85
	RecoveredConfidence = 0.95
	RecoverySustain     = 2 * time.Minute
)

// PhaseFor is the recovery phase of a degraded upstream at confidence:
// Phase1 below 0.7, Phase2 below 0.85, else Phase3 (seed 004's phase 1
// starts at 0.5; below that it also lets critical and high only, which is
// phase 1's rule).
func PhaseFor(confidence float64) Phase {
	switch c := unit(confidence); {
	case c < Phase2Confidence:
		return Phase1
	case c < Phase3Confidence:
		return Phase2
	}
	return Phase3
}

// recovery orders the phases from the most restricted: Phase1 < Phase2 <
// Phase3 < Healthy (Degraded is apart: it only follows Healthy).
func recovery(p Phase) int {
	switch p {
	case Phase1:
		return 1
	case Phase2:
		return 2
	case Phase3:
		return 3
	case Healthy:
		return 4
	}
	return 0
}

// Phases is one upstream's phase machine, stepped once per cycle with the
// cycle's confidence:
//
//   - Healthy goes to Degraded on the first cycle below 0.9.
//   - Degraded lasts one cycle: still below 0.9, the upstream goes to its
//     phase (PhaseFor); at 0.9 or more it was a blip and goes back to
//     Healthy — once: a second blip less than RecoverySustain after the
//     first goes to Phase3 instead, from where it needs the full recovery,
//     so a confidence flapping across 0.9 settles in Phase3 rather than
//     flapping between Healthy and Degraded (a decision of ours: the seed
//     says phase 4 needs 2 minutes above 0.95 "to prevent flapping").
//   - From Phase1 to Phase3 a higher phase is climbed one step per cycle;
//     a lower one is fallen to after two consecutive cycles below the
//     current phase, to the second cycle's phase.
//   - Phase3 goes to Healthy once confidence has been at least 0.95 at
//     every cycle for RecoverySustain (counted from the first such cycle,
//     in whatever phase; one cycle below restarts it).
//
// Phases is owned by one goroutine (the leader's cycle); the zero value is
// Healthy.
type Phases struct {
	phase Phase
	since time.Time
	// below counts consecutive cycles whose phase was below phase.
	below int
	// highSince is the first of the consecutive cycles at ≥ 0.95 up to
	// now; high says there is one.
	high      bool
	highSince time.Time
	// lastBlip is when Degraded last went back to Healthy; blipped says
	// it has.
	blipped  bool
	lastBlip time.Time
}

// Step advances the machine to the cycle at now whose confidence is
// confidence (not a number counts as 0) and returns the phase and whether
// it changed.
func (p *Phases) Step(now time.Time, confidence float64) (Phase, bool) {
	c := unit(confidence)
	if c >= RecoveredConfidence {
		if !p.high || now.Before(p.highSince) {
			p.high, p.highSince = true, now
		}
	} else {
		p.high = false
	}

	switch p.phase {
	case Healthy:
		if c < HealthyConfidence {
			return p.set(now, Degraded)
		}
	case Degraded:
		switch {
		case c < HealthyConfidence:
			return p.set(now, PhaseFor(c))
		case p.blipped && now.Sub(p.lastBlip) < RecoverySustain:
			return p.set(now, Phase3)
		default:
			p.blipped, p.lastBlip = true, now
			return p.set(now, Healthy)
		}
	default:
		if p.phase == Phase3 && p.high && now.Sub(p.highSince) >= RecoverySustain {
			return p.set(now, Healthy)
		}
		target := PhaseFor(c)
		switch {
		case recovery(target) > recovery(p.phase):
			return p.set(now, p.phase+1) // Phase1 → Phase2 → Phase3
		case recovery(target) < recovery(p.phase):
			p.below++
			if p.below >= 2 {
				return p.set(now, target)
			}
		default:
			p.below = 0
		}
	}
	return p.phase, false
}

func (p *Phases) set(now time.Time, phase Phase) (Phase, bool) {
	p.below = 0
	if phase == p.phase {
		return phase, false
	}
	p.phase, p.since = phase, now
	return phase, true
}

// Phase is the current phase.
func (p *Phases) Phase() Phase { return p.phase }

// Since is when the phase last changed (zero if it never has).
func (p *Phases) Since() time.Time { return p.since }

// Restore puts the machine in phase since since, with no history: a leader
// taking over restores the phase of the last published plan, so that an
// upstream in recovery does not jump back to Healthy.
func (p *Phases) Restore(phase Phase, since time.Time) {
	if phase >= NumPhases {
		phase = Healthy
	}
	*p = Phases{phase: phase, since: since}
}
