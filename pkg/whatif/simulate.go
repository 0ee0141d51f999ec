package whatif

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"time"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/load"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/report"
)

// Counts is what a group of tenants (a tier, one tenant, all) offered and
// got over the measured time, per second, and its fair share.
type Counts struct {
	Tenants              int     `json:"tenants"`
	OfferedPerSec        float64 `json:"offeredPerSecond"`
	AdmittedPerSec       float64 `json:"admittedPerSecond"`
	OfferedTokensPerSec  float64 `json:"offeredTokensPerSecond"`
	AdmittedTokensPerSec float64 `json:"admittedTokensPerSecond"`
	// DeniedPerSec are the denials per second by level: global, tenant,
	// endpoint, key (enforcer.Levels).
	DeniedPerSec map[string]float64 `json:"deniedPerSecond"`
	// FairSharePerSec is the group's weighted max-min fair share of the
	// global rate, tokens/s (load.FairShares, from the offered tokens).
	FairSharePerSec float64 `json:"fairShareTokensPerSecond"`
	// FairShareError is (admitted tokens − fair share) / fair share; 0
	// when the share is 0.
	FairShareError float64 `json:"fairShareError"`

	raw  load.TenantCount // the counts behind the rates
	secs float64          // over this many measured seconds
}

// TierRun is one tier's counts.
type TierRun struct {
	Tier string `json:"tier"`
	Counts
}

// TenantRun is one tenant's counts.
type TenantRun struct {
	Tenant string `json:"tenant"`
	Tier   string `json:"tier"`
	Rank   int    `json:"rank"`
	Counts
}

// Run is one policy's simulated run.
type Run struct {
	Policy PolicyRef `json:"policy"`
	// Mode is the plane's mode; the run decides in mode local (see the
	// package doc).
	Mode  string    `json:"mode"`
	Total Counts    `json:"total"`
	Tiers []TierRun `json:"tiers"`
	// Top are the heaviest tenants of the profile, by rank.
	Top []TenantRun `json:"top"`
	// Decisions and WallSeconds say how long the replay took.
	Decisions   int64   `json:"decisions"`
	WallSeconds float64 `json:"wallSeconds"`
}

// Simulation is a profile replayed against a baseline (optional) and a new
// policy.
type Simulation struct {
	Profile         string  `json:"profile"`
	Seed            uint64  `json:"seed"`
	MeasuredSeconds float64 `json:"measuredSeconds"`
	Baseline        *Run    `json:"baseline,omitempty"`
	New             *Run    `json:"new"`
}

// Simulate replays b against the policy p in virtual time, as `load
// -virtual -policy DIR` does (see the package doc), and counts the result
// by tier and for the top heaviest tenants.
func Simulate(ctx context.Context, source string, p *policy.Policy, b *load.Built, top int) (*Run, error) {
	mode := p.Spec().Mode
	local := p
	if p.Mode() != policy.ModeLocal {
		var err error
		if local, err = p.Override(policy.Overrides{Mode: policy.ModeLocal.String()}); err != nil {
			return nil, err
		}
	}
	fleet, err := load.NewFleet(local, 1, nil, enforcer.WithClock(func() time.Time { return load.Epoch }))
	if err != nil {
		return nil, err
	}
	defer fleet.Close()
	res, err := load.Run(ctx, b, fleet, load.Options{Virtual: true})
	if err != nil {
		return nil, err
	}
	if res.Errors > 0 {
		return nil, fmt.Errorf("simulate %s: %d decisions failed", source, res.Errors)
	}
	rep, err := load.CompareFairShares(local, load.RowsFromResult(res), 0, math.MaxInt)
	if err != nil {
		return nil, err
	}
	secs := res.Measured
	run := &Run{Policy: PolicyRef{Source: source, Plane: p.ID(), Hash: p.Hash()}, Mode: mode,
		Total: newCounts(), WallSeconds: res.Wall}
	tierShare := map[string]float64{}
	tiers := map[string]*TierRun{}
	for _, t := range rep.Tiers {
		tierShare[t.Name] = t.SharePerSec
		tiers[t.Name] = &TierRun{Tier: t.Name, Counts: newCounts()}
	}
	for i, t := range res.Tenants {
		dev := rep.Tenants[i]
		if dev.Name != t.Name {
			return nil, fmt.Errorf("simulate: the fair shares' tenants are out of the run's order at %d (%s, %s)", i, dev.Name, t.Name)
		}
		tier := cmp.Or(dev.FairShare.Tier, "(unknown, denied)")
		c := newCounts()
		c.add(&t.TenantCount, secs)
		c.FairSharePerSec = dev.SharePerSec
		run.Decisions += t.Offered
		run.Total.add(&t.TenantCount, secs)
		run.Total.FairSharePerSec += dev.SharePerSec
		tr := tiers[tier]
		if tr == nil {
			tr = &TierRun{Tier: tier, Counts: newCounts()}
			tiers[tier] = tr
		}
		tr.add(&t.TenantCount, secs)
		if i < top {
			c.settle()
			run.Top = append(run.Top, TenantRun{Tenant: t.Name, Tier: tier, Rank: t.Rank, Counts: c})
		}
	}
	for _, t := range p.Spec().Tiers {
		tr := tiers[t.Name]
		tr.FairSharePerSec = tierShare[t.Name]
		tr.settle()
		run.Tiers = append(run.Tiers, *tr)
		delete(tiers, t.Name)
	}
	for _, name := range slices.Sorted(maps.Keys(tiers)) { // tenants of no tier
		tiers[name].settle()
		run.Tiers = append(run.Tiers, *tiers[name])
	}
	run.Total.settle()
	return run, nil
}

func newCounts() Counts {
	c := Counts{DeniedPerSec: map[string]float64{}}
	for _, l := range enforcer.Levels {
		c.DeniedPerSec[string(l)] = 0
	}
	return c
}

func (c *Counts) add(t *load.TenantCount, secs float64) {
	c.Tenants++
	c.raw.Offered += t.Offered
	c.raw.Admitted += t.Admitted
	c.raw.OfferedTokens += t.OfferedTokens
	c.raw.AdmittedTokens += t.AdmittedTokens
	c.raw.DeniedUpstream += t.DeniedUpstream
	for i := range t.Denied {
		c.raw.Denied[i] += t.Denied[i]
	}
	c.secs = secs
}

// settle turns the counts into rates (counts summed first, divided once)
// and computes the fair-share error.
func (c *Counts) settle() {
	if c.secs > 0 {
		c.OfferedPerSec = float64(c.raw.Offered) / c.secs
		c.AdmittedPerSec = float64(c.raw.Admitted) / c.secs
		c.OfferedTokensPerSec = float64(c.raw.OfferedTokens) / c.secs
		c.AdmittedTokensPerSec = float64(c.raw.AdmittedTokens) / c.secs
		for i, l := range enforcer.Levels {
			c.DeniedPerSec[string(l)] = float64(c.raw.Denied[i]) / c.secs
		}
		if c.raw.DeniedUpstream > 0 {
			c.DeniedPerSec[string(enforcer.LevelUpstream)] = float64(c.raw.DeniedUpstream) / c.secs
		}
	}
	c.FairShareError = 0
	if c.FairSharePerSec > 0 {
		c.FairShareError = (c.AdmittedTokensPerSec - c.FairSharePerSec) / c.FairSharePerSec
	}
}

// Tables are the tiers, the total and the top tenants, baseline beside new.
func (s *Simulation) Tables() []report.Table {
	title := fmt.Sprintf("simulated %s of %s (seed %d) in virtual time, mode local", time.Duration(s.MeasuredSeconds*float64(time.Second)), s.Profile, s.Seed)
	var notes []string
	if s.Baseline != nil {
		notes = append(notes, fmt.Sprintf("baseline: %s (%s, hash %s); new: %s (%s, hash %s)", s.Baseline.Policy.Plane, s.Baseline.Policy.Source, short(s.Baseline.Policy.Hash),
			s.New.Policy.Plane, s.New.Policy.Source, short(s.New.Policy.Hash)))
	} else {
		notes = append(notes, fmt.Sprintf("policy: %s (%s, hash %s)", s.New.Policy.Plane, s.New.Policy.Source, short(s.New.Policy.Hash)))
	}
	if s.New.Mode != policy.ModeLocal.String() {
		notes = append(notes, "the plane's mode is "+s.New.Mode+": simulated as one enforcer deciding the whole plane (mode local)")
	}
	notes = append(notes, "rates per second; fair share and its error in tokens (requests × endpoint cost); OLD → NEW where they differ")
	tiers := report.Table{Title: title, Header: s.header("TIER"), Notes: notes}
	var baseTiers map[string]*TierRun
	if s.Baseline != nil {
		baseTiers = map[string]*TierRun{}
		for i := range s.Baseline.Tiers {
			baseTiers[s.Baseline.Tiers[i].Tier] = &s.Baseline.Tiers[i]
		}
	}
	for _, t := range s.New.Tiers {
		var base *Counts
		if bt := baseTiers[t.Tier]; bt != nil {
			base = &bt.Counts
		} else if s.Baseline != nil {
			empty := newCounts()
			base = &empty
		}
		tiers.Rows = append(tiers.Rows, s.row(t.Tier, base, &t.Counts))
	}
	if s.Baseline != nil {
		for _, t := range s.Baseline.Tiers {
			if !slices.ContainsFunc(s.New.Tiers, func(n TierRun) bool { return n.Tier == t.Tier }) {
				empty := newCounts()
				tiers.Rows = append(tiers.Rows, s.row(t.Tier, &t.Counts, &empty))
			}
		}
	}
	var baseTotal *Counts
	if s.Baseline != nil {
		baseTotal = &s.Baseline.Total
	}
	tiers.Rows = append(tiers.Rows, s.row("all", baseTotal, &s.New.Total))

	top := report.Table{Title: fmt.Sprintf("top %d tenants by offered load", len(s.New.Top)), Header: s.header("TENANT (TIER)")}
	for i, t := range s.New.Top {
		var base *Counts
		label := t.Tenant + " (" + t.Tier + ")"
		if s.Baseline != nil && i < len(s.Baseline.Top) {
			bt := s.Baseline.Top[i]
			base = &bt.Counts
			if bt.Tier != t.Tier {
				label = t.Tenant + " (" + bt.Tier + " → " + t.Tier + ")"
			}
		}
		top.Rows = append(top.Rows, s.row(label, base, &t.Counts))
	}
	return []report.Table{tiers, top}
}

func (s *Simulation) header(first string) []string {
	h := []string{first, "OFFERED/s", "ADMITTED/s"}
	if s.Baseline != nil {
		h = append(h, "Δ ADMITTED")
	}
	for _, l := range enforcer.Levels {
		h = append(h, "DENIED "+string(l)+"/s")
	}
	return append(h, "FAIR SHARE tok/s", "ADMITTED tok/s", "FAIR-SHARE ERROR")
}

// row is one line: new's numbers, with base's beside them where they differ.
func (s *Simulation) row(label string, base, c *Counts) []string {
	pair := func(a, b float64, format func(float64) string) string {
		if base == nil || format(a) == format(b) {
			return format(b)
		}
		return format(a) + " → " + format(b)
	}
	num := func(x float64) string { return strconv.FormatFloat(x, 'f', 0, 64) }
	pct := func(x float64) string { return fmt.Sprintf("%+.1f%%", 100*x) }
	var b Counts
	if base != nil {
		b = *base
	}
	r := []string{label, pair(b.OfferedPerSec, c.OfferedPerSec, num), pair(b.AdmittedPerSec, c.AdmittedPerSec, num)}
	if base != nil {
		switch {
		case b.AdmittedPerSec > 0:
			r = append(r, pct(c.AdmittedPerSec/b.AdmittedPerSec-1))
		case c.AdmittedPerSec > 0:
			r = append(r, "new")
		default:
			r = append(r, "-")
		}
	}
	for _, l := range enforcer.Levels {
		r = append(r, pair(b.DeniedPerSec[string(l)], c.DeniedPerSec[string(l)], num))
	}
	return append(r, pair(b.FairSharePerSec, c.FairSharePerSec, num), pair(b.AdmittedTokensPerSec, c.AdmittedTokensPerSec, num),
		pair(b.FairShareError, c.FairShareError, pct))
}
