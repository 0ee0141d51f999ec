// Command analyze reads the noisy-neighbour runs of cmd/load (seconds.csv
// and tenants.csv of each) and prints, per run and as the median over a
// mode's repeats: the victims' success (not denied at the global level)
// before, during and after the spike, their decision p99 before and during
// it, what the generator offered and how late it ran, and whale-1's
// admitted rate against its reference fair share (pkg/load FairShares on
// the profile's rates plus the spike) and the burst pool's ceiling. With
// -img it draws the victims' success and p99 over time, and the whale's
// admitted rate, for the first repeat of each mode.
//
//	analyze -policy DIR -from 10s -to 20s -spike whale-1:300000 [-img PREFIX] mode=RUNDIR[,RUNDIR...]...
package main

import (
	"encoding/csv"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

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

// second is one row of seconds.csv.
type second map[string]float64

func readSeconds(path string) ([]second, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil || len(recs) < 2 {
		return nil, fmt.Errorf("%s: %v (%d lines)", path, err, len(recs))
	}
	var out []second
	for _, rec := range recs[1:] {
		s := second{}
		for i, name := range recs[0] {
			x, err := strconv.ParseFloat(rec[i], 64)
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", path, name, err)
			}
			s[name] = x
		}
		out = append(out, s)
	}
	return out, nil
}

// stats are one run's numbers.
type stats struct {
	successBefore, successDuring, successAfter, minSuccessDuring float64
	p99Before, p99During                                         float64 // µs, median of the per-second p99s
	attackerOffered, attackerAdmitted                            float64 // per second, steady part of the spike
	firstSecondAdmitted                                          float64 // the whale in the spike's first second
	lagP99Max                                                    float64 // µs, the worst second of the spike
}

func window(secs []second, from, to int, f func(second) float64) []float64 {
	var xs []float64
	for t := max(from, 0); t < min(to, len(secs)); t++ {
		xs = append(xs, f(secs[t]))
	}
	return xs
}

func sum(xs []float64) (s float64) {
	for _, x := range xs {
		s += x
	}
	return s
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 0 {
		return (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return s[len(s)/2]
}

func success(secs []second, from, to int) float64 {
	off := sum(window(secs, from, to, func(s second) float64 { return s["victim_offered"] }))
	denied := sum(window(secs, from, to, func(s second) float64 { return s["victim_denied_global"] }))
	return 1 - denied/off
}

func analyze(secs []second, from, to, skip int) stats {
	var st stats
	st.successBefore = success(secs, skip, from)
	st.successDuring = success(secs, from, to)
	st.successAfter = success(secs, to, len(secs))
	st.minSuccessDuring = 1
	for t := from; t < to; t++ {
		st.minSuccessDuring = min(st.minSuccessDuring, success(secs, t, t+1))
	}
	p99 := func(s second) float64 { return s["victim_p99_us"] }
	st.p99Before = median(window(secs, skip, from, p99))
	st.p99During = median(window(secs, from, to, p99))
	n := float64(to - from - 1)
	st.attackerOffered = sum(window(secs, from+1, to, func(s second) float64 { return s["attacker_offered"] })) / n
	st.attackerAdmitted = sum(window(secs, from+1, to, func(s second) float64 { return s["attacker_admitted"] })) / n
	st.firstSecondAdmitted = secs[from]["attacker_admitted"]
	st.lagP99Max = slices.Max(window(secs, from, to, func(s second) float64 { return s["lag_p99_us"] }))
	return st
}

func run() error {
	var (
		policyDir = flag.String("policy", "", "the plane's directory")
		fromFlag  = flag.Duration("from", 10*time.Second, "the spike's start")
		toFlag    = flag.Duration("to", 20*time.Second, "the spike's end")
		skipFlag  = flag.Duration("skip", 2*time.Second, "left out at the start of the 'before' window")
		spike     = flag.String("spike", "whale-1:300000", "the spiking tenant and its extra rate, req/s")
		img       = flag.String("img", "", "prefix of the PNG plots (e.g. docs/experiments/img/01-)")
		shareBy   = flag.String("share-by", "", "the shareBy the runs were made with, if they overrode the plane's (tenant or tier)")
	)
	flag.Parse()
	p, err := policy.LoadDir(*policyDir)
	if err != nil {
		return err
	}
	if p, err = p.Override(policy.Overrides{ShareBy: *shareBy}); err != nil {
		return err
	}
	whale, rateText, _ := strings.Cut(*spike, ":")
	spikeRate, err := strconv.ParseFloat(rateText, 64)
	if err != nil {
		return fmt.Errorf("-spike %q: %w", *spike, err)
	}
	from, to, skip := int(fromFlag.Seconds()), int(toFlag.Seconds()), int(skipFlag.Seconds())

	type mode struct {
		name   string
		runs   []stats
		first  []second
		tenant []load.TenantRow // the first repeat's tenants.csv
	}
	var modes []mode
	var rows []load.TenantRow
	for _, arg := range flag.Args() {
		name, dirs, ok := strings.Cut(arg, "=")
		if !ok {
			return fmt.Errorf("%q: want mode=RUNDIR[,RUNDIR...]", arg)
		}
		m := mode{name: name}
		for _, dir := range strings.Split(dirs, ",") {
			secs, err := readSeconds(filepath.Join(dir, "seconds.csv"))
			if err != nil {
				return err
			}
			if len(secs) < to {
				return fmt.Errorf("%s: %d seconds, the spike ends at %d", dir, len(secs), to)
			}
			if m.first == nil {
				m.first = secs
				if m.tenant, err = load.ReadTenantsCSV(filepath.Join(dir, "tenants.csv")); err != nil {
					return err
				}
			}
			m.runs = append(m.runs, analyze(secs, from, to, skip))
			if rows == nil {
				if rows, err = load.ReadTenantsCSV(filepath.Join(dir, "tenants.csv")); err != nil {
					return err
				}
			}
		}
		modes = append(modes, m)
	}

	// The whale's fair share during the spike: every tenant at its
	// profile rate, the whale at its profile rate plus the spike (reads
	// cost 1 token).
	demand := make([]load.DemandTenant, len(rows))
	at := -1
	for i, r := range rows {
		demand[i] = load.DemandTenant{Name: r.Name, Tier: r.Tier, DemandPerSec: r.ProfileRatePerSec}
		if r.Name == whale {
			at = i
			demand[i].DemandPerSec += spikeRate
		}
	}
	if at < 0 {
		return fmt.Errorf("no tenant %s", whale)
	}
	shares, tiers, err := load.FairShares(p, demand)
	if err != nil {
		return err
	}
	fmt.Println("Reference allocation during the spike (profile rates, the whale's plus the spike), tokens/s:")
	fmt.Println()
	fmt.Println("| tier | victims' demand | victims' claim (own limits) | victims' fair share | tier claim | tier floor | tier share |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, tr := range tiers {
		var vd, vc, vs float64
		for i, sh := range shares {
			if sh.Tier == tr.Name && rows[i].Name != whale {
				vd, vc, vs = vd+demand[i].DemandPerSec, vc+sh.CapPerSec, vs+sh.SharePerSec
			}
		}
		fmt.Printf("| %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.0f |\n", tr.Name, vd, vc, vs, tr.DemandPerSec, tr.FloorPerSec, tr.SharePerSec)
	}
	fmt.Println()
	share := shares[at]
	var ceiling float64
	if bp := p.Spec().BurstPool; bp != nil {
		ceiling = float64(bp.PerTenantCeiling)
	}
	spikeSeconds := float64(to - from)
	bound := share.SharePerSec + ceiling/spikeSeconds
	fmt.Printf("%s during the spike: offers %.0f req/s (profile %.0f + spike %.0f), claim min(demand, own limit %.0f) = %.0f tokens/s,\n",
		whale, demand[at].DemandPerSec, rows[at].ProfileRatePerSec, spikeRate, share.LimitPerSec, share.CapPerSec)
	fmt.Printf("fair share %.0f tokens/s; burst pool ceiling %.0f tokens (%.0f/s over the %.0f s spike): bound %.0f tokens/s.\n\n",
		share.SharePerSec, ceiling, ceiling/spikeSeconds, spikeSeconds, bound)

	pct := func(x float64) string { return fmt.Sprintf("%.2f%%", 100*x) }
	fmt.Printf("Windows: before = seconds %d–%d, spike = %d–%d, after = %d–end. Success = 1 − victims denied at the global level / victims offered.\n", skip, from-1, from, to-1, to)
	fmt.Printf("p99 = median over the window's seconds of the victims' per-second p99. Whale and generator: seconds %d–%d (the first spike second apart).\n\n", from+1, to-1)
	fmt.Println("| fairness | run | victim success before | during | worst spike second | after | victim p99 before (µs) | during (µs) | p99 rise | whale offered/s | whale admitted/s | whale admitted, first spike second | whale / fair share | generator lag p99, worst second (µs) |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
	line := func(name, run string, s stats) {
		fmt.Printf("| %s | %s | %s | %s | %s | %s | %.1f | %.1f | %+.1f%% | %.0f | %.0f | %.0f | %.3f | %.0f |\n", name, run,
			pct(s.successBefore), pct(s.successDuring), pct(s.minSuccessDuring), pct(s.successAfter), s.p99Before, s.p99During,
			100*(s.p99During/s.p99Before-1), s.attackerOffered, s.attackerAdmitted, s.firstSecondAdmitted, s.attackerAdmitted/share.SharePerSec, s.lagP99Max)
	}
	for _, m := range modes {
		for i, s := range m.runs {
			line(m.name, strconv.Itoa(i+1), s)
		}
		med := func(f func(stats) float64) float64 {
			var xs []float64
			for _, s := range m.runs {
				xs = append(xs, f(s))
			}
			return median(xs)
		}
		line(m.name, "**median**", stats{
			successBefore:       med(func(s stats) float64 { return s.successBefore }),
			successDuring:       med(func(s stats) float64 { return s.successDuring }),
			minSuccessDuring:    med(func(s stats) float64 { return s.minSuccessDuring }),
			successAfter:        med(func(s stats) float64 { return s.successAfter }),
			p99Before:           med(func(s stats) float64 { return s.p99Before }),
			p99During:           med(func(s stats) float64 { return s.p99During }),
			attackerOffered:     med(func(s stats) float64 { return s.attackerOffered }),
			attackerAdmitted:    med(func(s stats) float64 { return s.attackerAdmitted }),
			firstSecondAdmitted: med(func(s stats) float64 { return s.firstSecondAdmitted }),
			lagP99Max:           med(func(s stats) float64 { return s.lagP99Max }),
		})
	}
	fmt.Println()
	fmt.Println("Victims by tier over the whole run after the warmup (first repeat, tenants.csv): requests denied at the global level / offered.")
	fmt.Println()
	fmt.Println("| fairness | tier | victims offered | denied at global | share denied |")
	fmt.Println("|---|---|---|---|---|")
	for _, m := range modes {
		for _, tier := range load.Tiers {
			var offered, denied float64
			for _, t := range m.tenant {
				if t.Tier == tier && t.Name != whale {
					offered += t.OfferedPerSec
					denied += float64(t.DeniedGlobal)
				}
			}
			if offered == 0 {
				continue // no victims in this tier (the HTTP runs: every tenant is free)
			}
			secs := float64(len(m.first) - skip)
			fmt.Printf("| %s | %s | %.0f | %.0f | %.2f%% |\n", m.name, tier, offered*secs, denied, 100*denied/(offered*secs))
		}
	}
	if *img == "" {
		return nil
	}
	var succ, p99s, whaleSeries []load.Series
	for _, m := range modes {
		var a, b, c plotter.XYs
		for t, s := range m.first {
			x := float64(t)
			if s["victim_offered"] > 0 {
				a = append(a, plotter.XY{X: x, Y: 100 * (1 - s["victim_denied_global"]/s["victim_offered"])})
			}
			b = append(b, plotter.XY{X: x, Y: s["victim_p99_us"]})
			c = append(c, plotter.XY{X: x, Y: s["attacker_admitted"]})
		}
		succ = append(succ, load.Series{Name: "fairness " + m.name, XY: a})
		p99s = append(p99s, load.Series{Name: "fairness " + m.name, XY: b})
		whaleSeries = append(whaleSeries, load.Series{Name: "fairness " + m.name, XY: c})
	}
	flat := func(y float64) plotter.XYs {
		return plotter.XYs{{X: float64(from), Y: y}, {X: float64(to), Y: y}}
	}
	whaleSeries = append(whaleSeries, load.Series{Name: "fair share", XY: flat(share.SharePerSec)},
		load.Series{Name: "fair share + ceiling/spike", XY: flat(bound)})
	title := fmt.Sprintf("%s +%.0fk req/s from %ds to %ds", whale, spikeRate/1000, from, to)
	if err := load.LinePlot(*img+"victim-success.png", "victims' success (not denied at the global level), "+title, "second", "%", succ...); err != nil {
		return err
	}
	if err := load.LinePlot(*img+"victim-p99.png", "victims' decision p99, "+title, "second", "µs", p99s...); err != nil {
		return err
	}
	return load.LinePlot(*img+"whale-admitted.png", whale+" admitted per second, "+title, "second", "requests/s", whaleSeries...)
}
