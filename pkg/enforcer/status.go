package enforcer

import (
	"math"
	"slices"
	"strings"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

// LimitStatus is one limit in force and what is left of it.
type LimitStatus struct {
	Level Level
	// Name is the endpoint or api key the limit belongs to; empty for the
	// global and tenant levels.
	Name      string
	Limit     policy.Limit
	Remaining int64
}

// TenantStatus is what the engine knows about one tenant: its live limits
// and remaining tokens per level, its fair share and debt, its counters and
// its recent decisions. The enforcer's debug view serves it.
type TenantStatus struct {
	Tenant    string
	Known     bool // the policy names the tenant
	Tier      string
	Weight    int64
	MayBorrow bool
	// Limits lists the tenant's limits: tenant, then endpoints, then keys
	// that have state, each sorted by name.
	Limits []LimitStatus
	// Debt is what the tenant owes the burst pool, in tokens.
	Debt int64
	// Demand is the tenant's measured demand on the plane in tokens per
	// second; FairShare its share of contended global capacity (0 when the
	// plane is not contended).
	Demand    float64
	FairShare float64
	// Counters since the tenant's state was created.
	Admitted     int64
	AdmittedCost int64
	Denied       map[Level]int64
	Borrowed     int64
	// Trace holds the last TraceLength decisions, newest first.
	Trace         []TraceEntry
	PolicyVersion int64
}

// PlaneStatus is the state shared by every tenant.
type PlaneStatus struct {
	Global        LimitStatus
	PoolRemaining int64 // tokens left in the burst pool; 0 without a pool
	Contended     bool
	// WaterLevels are, per tier (in policy order), the fair share per unit
	// of tenant weight while contended; +Inf for a tier whose demand fits.
	WaterLevels     []float64
	Tenants         int // tenants with state
	PolicyVersion   int64
	PolicyHash      string
	FairnessEpoch   uint64
	FairnessEnabled bool
}

// TenantStatusAt returns the tenant's status at now (buckets are refilled to
// now, nothing is consumed); ok is false when the engine has no state for it.
func (e *Engine) TenantStatusAt(now time.Time, name string) (s TenantStatus, ok bool) {
	snap := e.snap.Load()
	ts := snap.known[name]
	if ts == nil {
		if ts = e.tenants.get(name); ts == nil {
			return TenantStatus{}, false
		}
	}
	nowUs := now.UnixMicro()
	contended := snap.fairness != fairNone && e.fair.contended.Load()

	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.snap != snap {
		ts.syncLocked(snap, nowUs)
	}
	s = TenantStatus{
		Tenant: ts.name, Known: ts.tenant.Known, Tier: ts.tenant.Tier, Weight: ts.tenant.Weight, MayBorrow: ts.mayBorrow,
		Demand:       math.Float64frombits(ts.demandBits.Load()),
		Admitted:     ts.stats.admitted,
		AdmittedCost: ts.stats.admittedCost,
		Borrowed:     ts.stats.borrowed,
		Denied:       make(map[Level]int64, len(Levels)),
		Trace:        ts.trace.newestFirst(),
	}
	s.PolicyVersion = snap.policy.Version()
	if contended {
		s.FairShare = e.fair.shareRate(ts)
	}
	for i, l := range Levels {
		s.Denied[l] = ts.stats.denied[i]
	}
	if ts.allowance.active() {
		ts.allowance.settle(nowUs)
		s.Debt = ts.allowance.lim.Burst - ts.allowance.remaining()
	}
	add := func(level Level, name string, l *limiter) {
		if l.active() {
			l.settle(nowUs)
			s.Limits = append(s.Limits, LimitStatus{Level: level, Name: name, Limit: *l.lim, Remaining: l.remaining()})
		}
	}
	add(LevelTenant, "", &ts.limit)
	for i := range ts.endpoints {
		add(LevelEndpoint, snap.endpoints[i].Name, &ts.endpoints[i])
	}
	keys := make([]string, 0, len(ts.keys))
	for k := range ts.keys {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		add(LevelKey, strings.Replace(k, overflowName, "(other keys)", 1), &ts.keys[k].limit)
	}
	return s, true
}

// PlaneStatusAt returns the plane's shared state at now.
func (e *Engine) PlaneStatusAt(now time.Time) PlaneStatus {
	snap := e.snap.Load()
	nowUs := now.UnixMicro()
	pl := &e.plane
	pl.mu.Lock()
	if pl.snap != snap {
		pl.syncLocked(snap, nowUs)
	}
	pl.global.settle(nowUs)
	s := PlaneStatus{
		Global:          LimitStatus{Level: LevelGlobal, Limit: *snap.global, Remaining: pl.global.remaining()},
		PolicyVersion:   snap.policy.Version(),
		PolicyHash:      snap.policy.Hash(),
		FairnessEnabled: snap.fairness != fairNone,
	}
	if pl.pool.active() {
		pl.pool.settle(nowUs)
		s.PoolRemaining = pl.pool.remaining()
	}
	pl.mu.Unlock()
	s.Contended = s.FairnessEnabled && e.fair.contended.Load()
	if s.Contended {
		for k := range snap.floors {
			s.WaterLevels = append(s.WaterLevels, math.Float64frombits(e.fair.levelBits[k].Load()))
		}
	}
	s.FairnessEpoch = e.fair.epoch.Load()
	s.Tenants = int(e.tenants.count.Load())
	return s
}
