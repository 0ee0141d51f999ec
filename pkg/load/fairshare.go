package load

import (
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"

	"github.com/quotaplane/quotaplane/pkg/fairref"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// This file checks the engine's fairness in the experiments: it computes
// each tenant's weighted max-min fair share from the compiled policy and
// the tenants' measured demand with pkg/fairref, the reference written
// from the definitions without pkg/scheduler or pkg/enforcer, by the
// plane's shareBy (tenant: seed 002's, every tenant by its weight, tiers
// held to their floors; tier: the tiers by their weights and floors, then
// their tenants), each tenant capped by min(its demand, its own tenant
// limit's rate).

// DemandTenant is one tenant's measured demand, the input of FairShares.
type DemandTenant struct {
	Name string
	// Tier is the tier the generator gave the tenant; a tenant the plane
	// names keeps the plane's tier instead.
	Tier string
	// DemandPerSec is what the tenant offered, in tokens per second
	// (requests × endpoint cost).
	DemandPerSec float64
}

// FairShare is one tenant's share and what it rests on.
type FairShare struct {
	Tier         string  // the tier the plane puts the tenant in
	Weight       int64   // the tenant's effective weight
	CapPerSec    float64 // min(demand, tenant limit rate), tokens/s
	SharePerSec  float64 // the fair share, tokens/s
	LimitPerSec  float64 // the tenant limit's rate, tokens/s; +Inf without one
	TierShareSec float64 // the whole tier's share, tokens/s
}

// TierShare is one tier's part of the allocation.
type TierShare struct {
	Name         string
	Weight       int64
	FloorPerSec  float64 // floorPercent of the global rate, tokens/s
	DemandPerSec float64 // sum of its tenants' caps, tokens/s
	SharePerSec  float64
}

// FairShares returns every tenant's fair share of p's global rate by its
// shareBy (in the order of tenants) and every tier's (in p's tier order).
// A tenant the plane does not name gets its tier's defaults (weight and
// tenant limit); an unknown tenant of a plane that denies them gets
// nothing.
func FairShares(p *policy.Policy, tenants []DemandTenant) ([]FairShare, []TierShare, error) {
	global := p.Global()
	globalPerSec := limitPerSecond(&global)
	spec := p.Spec()
	tierIndex := map[string]int{}
	tiers := make([]TierShare, len(spec.Tiers))
	for k, tr := range spec.Tiers {
		tierIndex[tr.Name] = k
		tiers[k] = TierShare{Name: tr.Name, Weight: tr.Weight, FloorPerSec: globalPerSec * float64(tr.FloorPercent) / 100}
	}
	shares := make([]FairShare, len(tenants))
	byTier := make([][]int, len(tiers))
	for i, dt := range tenants {
		if dt.DemandPerSec < 0 || math.IsNaN(dt.DemandPerSec) {
			return nil, nil, fmt.Errorf("fair shares: tenant %s: demand %v", dt.Name, dt.DemandPerSec)
		}
		t, ok := p.Tenant(dt.Name)
		if !ok {
			if t, ok = p.DefaultTenant(dt.Name, dt.Tier); !ok {
				continue // denied as unknown: no share
			}
		}
		k, ok := tierIndex[t.Tier]
		if !ok {
			return nil, nil, fmt.Errorf("fair shares: tenant %s: tier %q is not in plane %s", dt.Name, t.Tier, p.Plane())
		}
		limit := math.Inf(1)
		if t.Limit != nil {
			limit = limitPerSecond(t.Limit)
		}
		shares[i] = FairShare{Tier: t.Tier, Weight: t.Weight, LimitPerSec: limit, CapPerSec: min(dt.DemandPerSec, limit)}
		byTier[k] = append(byTier[k], i)
		tiers[k].DemandPerSec += shares[i].CapPerSec
	}
	refTiers := make([]fairref.Tier, len(tiers))
	for k, tr := range tiers {
		refTiers[k] = fairref.Tier{Weight: float64(tr.Weight), FloorPerSec: tr.FloorPerSec}
	}
	var refTenants []fairref.Tenant
	var members []int // the tenants with a share, in refTenants' order
	for k, in := range byTier {
		for _, i := range in {
			refTenants = append(refTenants, fairref.Tenant{Tier: k, Weight: float64(shares[i].Weight), CapPerSec: shares[i].CapPerSec})
			members = append(members, i)
		}
	}
	tenantShares, tierShares := fairref.Shares(spec.SharesByTenant(), globalPerSec, refTiers, refTenants)
	for k := range tiers {
		tiers[k].SharePerSec = tierShares[k]
	}
	for j, i := range members {
		shares[i].SharePerSec = tenantShares[j]
		shares[i].TierShareSec = tierShares[refTenants[j].Tier]
	}
	return shares, tiers, nil
}

// limitPerSecond is a limit's sustained rate in tokens per second (0 for a limit
// that never refills).
func limitPerSecond(l *policy.Limit) float64 {
	return float64(l.Rate) / l.Period.Seconds()
}

// TenantRow is one row of a run's tenants.csv: what a tenant offered and
// got after the warmup, in requests and in tokens per second.
type TenantRow struct {
	Name                 string
	Tier                 string
	Rank                 int
	OfferedPerSec        float64
	AdmittedPerSec       float64
	OfferedTokensPerSec  float64
	AdmittedTokensPerSec float64
	DeniedGlobal         int64
	DeniedOwnLevels      int64 // tenant, endpoint and key
	BorrowedTokens       int64
	ProfileRatePerSec    float64
}

// RowsFromResult takes the rows from a Result in memory.
func RowsFromResult(r *Result) []TenantRow {
	rows := make([]TenantRow, len(r.Tenants))
	for i, t := range r.Tenants {
		rows[i] = TenantRow{Name: t.Name, Tier: t.Tier, Rank: t.Rank,
			OfferedPerSec: float64(t.Offered) / r.Measured, AdmittedPerSec: float64(t.Admitted) / r.Measured,
			OfferedTokensPerSec: float64(t.OfferedTokens) / r.Measured, AdmittedTokensPerSec: float64(t.AdmittedTokens) / r.Measured,
			DeniedGlobal: t.Denied[0], DeniedOwnLevels: t.Denied[1] + t.Denied[2] + t.Denied[3],
			BorrowedTokens: t.Borrowed, ProfileRatePerSec: t.Rate}
	}
	return rows
}

// ReadTenantsCSV reads the tenants.csv a run wrote (Result.Write).
func ReadTenantsCSV(path string) ([]TenantRow, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	rows, err := parseTenantsCSV(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return rows, nil
}

func parseTenantsCSV(r io.Reader) ([]TenantRow, error) {
	records, err := csv.NewReader(r).ReadAll()
	if err != nil {
		return nil, err
	}
	if len(records) == 0 {
		return nil, fmt.Errorf("no header")
	}
	col := map[string]int{}
	for i, name := range records[0] {
		col[name] = i
	}
	for _, need := range []string{"tenant", "tier", "rank", "profile_rate", "offered_per_s", "admitted_per_s", "denied_global", "denied_tenant", "denied_endpoint", "denied_key", "borrowed",
		"offered_tokens_per_s", "admitted_tokens_per_s"} {
		if _, ok := col[need]; !ok {
			return nil, fmt.Errorf("no column %q", need)
		}
	}
	rows := make([]TenantRow, 0, len(records)-1)
	for n, rec := range records[1:] {
		var errs []error
		num := func(name string) float64 {
			x, err := strconv.ParseFloat(rec[col[name]], 64)
			errs = append(errs, err)
			return x
		}
		row := TenantRow{Name: rec[col["tenant"]], Tier: rec[col["tier"]], Rank: int(num("rank")),
			ProfileRatePerSec: num("profile_rate"), OfferedPerSec: num("offered_per_s"), AdmittedPerSec: num("admitted_per_s"),
			OfferedTokensPerSec: num("offered_tokens_per_s"), AdmittedTokensPerSec: num("admitted_tokens_per_s"),
			DeniedGlobal:    int64(num("denied_global")),
			DeniedOwnLevels: int64(num("denied_tenant") + num("denied_endpoint") + num("denied_key")),
			BorrowedTokens:  int64(num("borrowed"))}
		for _, err := range errs {
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", n+2, err)
			}
		}
		rows = append(rows, row)
	}
	return rows, nil
}

// ShareDeviation is one tenant's admitted tokens per second against its
// fair share.
type ShareDeviation struct {
	TenantRow
	FairShare
	// Deviation is (admitted − share) / share; 0 when the share is 0.
	Deviation float64
}

// FairnessReport compares a run's admitted rates with the reference fair
// shares.
type FairnessReport struct {
	Tenants []ShareDeviation // by rank
	Tiers   []TierShare
	// MinSharePerSec is the filter: only tenants whose share is at least
	// this many tokens/s count in Considered, Worst and the quantiles.
	MinSharePerSec float64
	Considered     int
	Worst          ShareDeviation
	// P50, P90 and P99 of |deviation| over the considered tenants.
	P50, P90, P99 float64
	// Within5 counts considered tenants with |deviation| ≤ 5%.
	Within5 int
	// The long tail: tenants of rank ≥ TailFromRank, all of them (no filter).
	TailFromRank                                int
	TailTenants                                 int
	TailOffered, TailAdmitted, TailSharePerSec  float64 // tokens/s
	TotalOffered, TotalAdmitted, TotalSharePerS float64 // tokens/s
}

// CompareFairShares computes the fair shares of rows' tenants under p from
// the tokens they offered and compares them with the tokens they were
// admitted.
func CompareFairShares(p *policy.Policy, rows []TenantRow, minSharePerSec float64, tailFromRank int) (*FairnessReport, error) {
	demand := make([]DemandTenant, len(rows))
	for i, r := range rows {
		demand[i] = DemandTenant{Name: r.Name, Tier: r.Tier, DemandPerSec: r.OfferedTokensPerSec}
	}
	shares, tiers, err := FairShares(p, demand)
	if err != nil {
		return nil, err
	}
	rep := &FairnessReport{Tiers: tiers, MinSharePerSec: minSharePerSec, TailFromRank: tailFromRank}
	var abs []float64
	for i, r := range rows {
		d := ShareDeviation{TenantRow: r, FairShare: shares[i]}
		if d.SharePerSec > 0 {
			d.Deviation = (d.AdmittedTokensPerSec - d.SharePerSec) / d.SharePerSec
		}
		rep.Tenants = append(rep.Tenants, d)
		rep.TotalOffered += demand[i].DemandPerSec
		rep.TotalAdmitted += d.AdmittedTokensPerSec
		rep.TotalSharePerS += d.SharePerSec
		if r.Rank >= tailFromRank {
			rep.TailTenants++
			rep.TailOffered += demand[i].DemandPerSec
			rep.TailAdmitted += d.AdmittedTokensPerSec
			rep.TailSharePerSec += d.SharePerSec
		}
		if d.SharePerSec < minSharePerSec || d.SharePerSec <= 0 {
			continue
		}
		rep.Considered++
		a := math.Abs(d.Deviation)
		abs = append(abs, a)
		if a <= 0.05 {
			rep.Within5++
		}
		if rep.Considered == 1 || a > math.Abs(rep.Worst.Deviation) {
			rep.Worst = d
		}
	}
	slices.SortFunc(rep.Tenants, func(a, b ShareDeviation) int { return a.Rank - b.Rank })
	slices.Sort(abs)
	rep.P50, rep.P90, rep.P99 = nearestRankQuantile(abs, 0.5), nearestRankQuantile(abs, 0.9), nearestRankQuantile(abs, 0.99)
	return rep, nil
}

// nearestRankQuantile is the quantile q of sorted values by the nearest-rank method (0 when empty).
func nearestRankQuantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(q * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}
