// Command analyze compares runs of cmd/load with the reference fair shares
// of pkg/load (FairShares): per run, each tenant's admitted tokens per
// second (tenants.csv counts requests and their costs) against its
// weighted max-min share by the plane's shareBy (or -share-by's, the
// override the runs were made with), the worst deviation and its
// distribution over tenants whose share is at least -min-share tokens/s,
// and the long tail's admitted rate against its share. It prints Markdown
// tables and, with -plot, draws admitted/share by rank for every run.
//
//	analyze -policy DIR [-share-by tenant|tier] [-min-share 1] [-tail-rank 101] [-plot PNG] name=RUNDIR...
package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot/plotter"

	"github.com/quotaplane/quotaplane/pkg/load"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "analyze:", err)
		os.Exit(1)
	}
}

type namedReport struct {
	name string
	rep  *load.FairnessReport
}

func run() error {
	var (
		policyDir = flag.String("policy", "", "the plane's directory")
		minShare  = flag.Float64("min-share", 1, "count only tenants whose share is at least this many tokens/s")
		tailRank  = flag.Int("tail-rank", 101, "the long tail starts at this rank")
		plotPath  = flag.String("plot", "", "PNG of admitted/share by rank")
		worstN    = flag.Int("worst", 5, "list this many worst tenants per run")
		tiersOnly = flag.Bool("tiers-only", false, "print only the tiers' table")
		yMax      = flag.Float64("ymax", 0, "clip the plot's admitted/share at this value (0: no clipping)")
		shareBy   = flag.String("share-by", "", "the shareBy the runs were made with, if they overrode the plane's (tenant or tier)")
	)
	flag.Parse()
	if *policyDir == "" || flag.NArg() == 0 {
		return errors.New("usage: analyze -policy DIR name=RUNDIR …")
	}
	p, err := policy.LoadDir(*policyDir)
	if err != nil {
		return err
	}
	if p, err = p.Override(policy.Overrides{ShareBy: *shareBy}); err != nil {
		return err
	}
	var reports []namedReport
	for _, arg := range flag.Args() {
		name, dir, ok := strings.Cut(arg, "=")
		if !ok {
			return fmt.Errorf("%q: want name=RUNDIR", arg)
		}
		rows, err := load.ReadTenantsCSV(filepath.Join(dir, "tenants.csv"))
		if err != nil {
			return err
		}
		rep, err := load.CompareFairShares(p, rows, *minShare, *tailRank)
		if err != nil {
			return err
		}
		reports = append(reports, namedReport{name, rep})
	}

	pct := func(x float64) string { return fmt.Sprintf("%+.2f%%", 100*x) }
	if *tiersOnly {
		printTiers(reports)
		return nil
	}
	fmt.Printf("Tenants with a share ≥ %g tokens/s; deviation = (admitted − share) / share.\n\n", *minShare)
	fmt.Println("| run | tenants counted | within ±5% | worst | worst tenant (tier, share → admitted tokens/s) | p50 abs dev | p90 | p99 |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, r := range reports {
		w := r.rep.Worst
		fmt.Printf("| %s | %d | %d | %s | %s (%s, %.1f → %.1f) | %.2f%% | %.2f%% | %.2f%% |\n", r.name, r.rep.Considered, r.rep.Within5,
			pct(w.Deviation), w.Name, w.FairShare.Tier, w.SharePerSec, w.AdmittedTokensPerSec, 100*r.rep.P50, 100*r.rep.P90, 100*r.rep.P99)
	}
	fmt.Printf("\nThe long tail (ranks ≥ %d, every tenant, no filter), tokens/s:\n\n", *tailRank)
	fmt.Println("| run | tail tenants | offered | fair share | admitted | admitted / share | all tenants: offered | share | admitted |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for _, r := range reports {
		x := r.rep
		fmt.Printf("| %s | %d | %.0f | %.0f | %.0f | %.4f | %.0f | %.0f | %.0f |\n", r.name, x.TailTenants, x.TailOffered, x.TailSharePerSec,
			x.TailAdmitted, x.TailAdmitted/x.TailSharePerSec, x.TotalOffered, x.TotalSharePerS, x.TotalAdmitted)
	}
	printTiers(reports)
	for _, r := range reports {
		fmt.Printf("\nWorst %d of %s:\n\n| rank | tenant | tier | weight | offered | claim | share | admitted | deviation |\n|---|---|---|---|---|---|---|---|---|\n", *worstN, r.name)
		var counted []load.ShareDeviation
		for _, t := range r.rep.Tenants {
			if t.SharePerSec >= *minShare && t.SharePerSec > 0 {
				counted = append(counted, t)
			}
		}
		for range min(*worstN, len(counted)) {
			at := 0
			for i, t := range counted {
				if math.Abs(t.Deviation) > math.Abs(counted[at].Deviation) {
					at = i
				}
			}
			t := counted[at]
			fmt.Printf("| %d | %s | %s | %d | %.1f | %.1f | %.1f | %.1f | %s |\n", t.Rank, t.Name, t.FairShare.Tier, t.Weight,
				t.OfferedTokensPerSec, t.CapPerSec, t.SharePerSec, t.AdmittedTokensPerSec, pct(t.Deviation))
			counted = append(counted[:at], counted[at+1:]...)
		}
	}
	if *plotPath == "" {
		return nil
	}
	var series []load.Series
	for _, r := range reports {
		var xy plotter.XYs
		for _, t := range r.rep.Tenants {
			if t.SharePerSec >= *minShare && t.SharePerSec > 0 {
				y := t.AdmittedTokensPerSec / t.SharePerSec
				if *yMax > 0 {
					y = min(y, *yMax)
				}
				xy = append(xy, plotter.XY{X: math.Log10(float64(t.Rank)), Y: y})
			}
		}
		series = append(series, load.Series{Name: r.name, XY: xy})
	}
	title := fmt.Sprintf("admitted / fair share by rank, tenants with share ≥ %g tokens/s", *minShare)
	if *yMax > 0 {
		title += fmt.Sprintf(" (clipped at %g)", *yMax)
	}
	return load.LinePlot(*plotPath, title,
		"log10(rank)", "admitted / share", series...)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// printTiers prints each run's tiers: offered, floor, claim, fair share and
// admitted, tokens/s, and the tier's water level against what its held
// tenants got.
func printTiers(reports []namedReport) {
	fmt.Println("Tiers, tokens/s (offered and share from the reference; admitted measured):")
	fmt.Println()
	fmt.Println("| run | tier | offered | floor | claim (min(demand, limit)) | fair share | admitted | admitted / offered | admitted / share | tenants held to the level | level (share per weight) | their admitted per weight, median |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|")
	for _, r := range reports {
		admitted, offered := map[string]float64{}, map[string]float64{}
		level := map[string]float64{}
		var perWeight = map[string][]float64{}
		for _, t := range r.rep.Tenants {
			admitted[t.FairShare.Tier] += t.AdmittedTokensPerSec
			offered[t.FairShare.Tier] += t.OfferedTokensPerSec
			// A tenant whose share is below its claim is held to its
			// tier's water level: share = level × weight.
			if t.Weight > 0 && t.SharePerSec < t.CapPerSec*(1-1e-9) {
				level[t.FairShare.Tier] = t.SharePerSec / float64(t.Weight)
				perWeight[t.FairShare.Tier] = append(perWeight[t.FairShare.Tier], t.AdmittedTokensPerSec/float64(t.Weight))
			}
		}
		for _, tr := range r.rep.Tiers {
			lv, med := "none (whole claim fits)", "-"
			if x, ok := level[tr.Name]; ok {
				lv = fmt.Sprintf("%.3f", x)
				med = fmt.Sprintf("%.3f", median(perWeight[tr.Name]))
			}
			fmt.Printf("| %s | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.4f | %.4f | %d | %s | %s |\n", r.name, tr.Name, offered[tr.Name], tr.FloorPerSec,
				tr.DemandPerSec, tr.SharePerSec, admitted[tr.Name], admitted[tr.Name]/offered[tr.Name], admitted[tr.Name]/tr.SharePerSec,
				len(perWeight[tr.Name]), lv, med)
		}
	}
}
