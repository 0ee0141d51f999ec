// Command plot reads experiment 2's runs (RESULTS/central/runN and
// RESULTS/reconciled-MS/runN, as written by cmd/load -out), computes each
// run's overage against the global limit, prints the results table
// (medians of the runs, and their range) and draws overage and p99 against
// the reconcile interval.
//
// Overage is measured on tokens.csv, the admitted tokens per second of wall
// time, the clock the buckets refill on:
//
//	cold   = admitted over the whole run / (rate × wall time + burst) − 1
//	steady = admitted in the seconds [warmup, duration) / (rate × (duration − warmup)) − 1
//
// and the worst second after the warmup (of all runs): its admitted tokens
// / rate − 1.
package main

import (
	"cmp"
	"encoding/csv"
	"encoding/json"
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
)

type run struct {
	cold, steady, p99us, p50us, lagP99us float64
	// worstSecond is the largest overage of one second after the warmup.
	worstSecond float64
}

func main() {
	results := flag.String("results", "/tmp/quotaplane-experiments/02-accuracy", "the runs")
	rate := flag.Float64("rate", 10000, "the global limit, tokens/s")
	burst := flag.Float64("burst", 10000, "the global burst, tokens")
	duration := flag.Duration("duration", 15*time.Second, "run length")
	warmup := flag.Duration("warmup", 5*time.Second, "warmup left out of the steady overage")
	img := flag.String("img", "docs/experiments/img", "where the PNGs go")
	flag.Parse()
	if err := do(*results, *rate, *burst, *duration, *warmup, *img); err != nil {
		fmt.Fprintln(os.Stderr, "plot:", err)
		os.Exit(1)
	}
}

func do(results string, rate, burst float64, duration, warmup time.Duration, img string) error {
	central, err := readRuns(filepath.Join(results, "central"), rate, burst, duration, warmup)
	if err != nil {
		return err
	}
	dirs, _ := filepath.Glob(filepath.Join(results, "reconciled-*"))
	type point struct {
		ms   int
		runs []run
	}
	var points []point
	for _, d := range dirs {
		ms, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(d), "reconciled-"))
		if err != nil {
			continue
		}
		runs, err := readRuns(d, rate, burst, duration, warmup)
		if err != nil {
			return err
		}
		points = append(points, point{ms, runs})
	}
	slices.SortFunc(points, func(a, b point) int { return a.ms - b.ms })

	fmt.Printf("| mode | reconcile | runs | overage, cold start (median [min, max]) | overage, after %s warmup | worst second after warmup | decision p50 | decision p99 (median [min, max]) | generator lag p99 |\n", warmup)
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	row := func(mode, interval string, runs []run) {
		f := func(get func(run) float64, pct bool) string {
			med, lo, hi := stats(runs, get)
			if pct {
				return fmt.Sprintf("%+.2f%% [%+.2f, %+.2f]", 100*med, 100*lo, 100*hi)
			}
			return fmt.Sprintf("%.0f µs [%.0f, %.0f]", med, lo, hi)
		}
		p50, _, _ := stats(runs, func(r run) float64 { return r.p50us })
		lag, _, _ := stats(runs, func(r run) float64 { return r.lagP99us })
		worst := slices.MaxFunc(runs, func(a, b run) int { return cmp.Compare(a.worstSecond, b.worstSecond) }).worstSecond
		fmt.Printf("| %s | %s | %d | %s | %s | %+.2f%% | %.1f µs | %s | %.0f µs |\n", mode, interval, len(runs),
			f(func(r run) float64 { return r.cold }, true), f(func(r run) float64 { return r.steady }, true),
			100*worst, p50, f(func(r run) float64 { return r.p99us }, false), lag)
	}
	row("central", "—", central)
	var cold, steady, worstSec, p99, centralCold, centralSteady plotter.XYs
	cc, _, _ := stats(central, func(r run) float64 { return r.cold })
	cs, _, _ := stats(central, func(r run) float64 { return r.steady })
	cp, _, _ := stats(central, func(r run) float64 { return r.p99us })
	for _, p := range points {
		row("local-reconciled", fmt.Sprintf("%d ms", p.ms), p.runs)
		x := float64(p.ms)
		c, _, _ := stats(p.runs, func(r run) float64 { return r.cold })
		s, _, _ := stats(p.runs, func(r run) float64 { return r.steady })
		q, _, _ := stats(p.runs, func(r run) float64 { return r.p99us })
		w := slices.MaxFunc(p.runs, func(a, b run) int { return cmp.Compare(a.worstSecond, b.worstSecond) }).worstSecond
		worstSec = append(worstSec, plotter.XY{X: x, Y: 100 * w})
		cold = append(cold, plotter.XY{X: x, Y: 100 * c})
		steady = append(steady, plotter.XY{X: x, Y: 100 * s})
		p99 = append(p99, plotter.XY{X: x, Y: q})
		centralCold = append(centralCold, plotter.XY{X: x, Y: 100 * cc})
		centralSteady = append(centralSteady, plotter.XY{X: x, Y: 100 * cs})
	}
	if len(points) == 0 {
		return nil
	}
	if err := load.LinePlot(filepath.Join(img, "02-overage.png"), "overage vs the global limit (8 nodes, 2× offered; medians)",
		"reconcile interval (ms)", "overage (%)",
		load.Series{Name: "local-reconciled, cold start", XY: cold}, load.Series{Name: "local-reconciled, after warmup", XY: steady},
		load.Series{Name: "local-reconciled, worst second after warmup", XY: worstSec},
		load.Series{Name: "central, cold start", XY: centralCold}, load.Series{Name: "central, after warmup", XY: centralSteady}); err != nil {
		return err
	}
	// Central's p99 is hundreds of times higher: on one linear axis the
	// local-reconciled line would be flat at zero, so it is in the title.
	return load.LinePlot(filepath.Join(img, "02-p99.png"), fmt.Sprintf("local-reconciled decision p99 (8 nodes; medians); central: %.0f µs", cp),
		"reconcile interval (ms)", "p99 (µs)",
		load.Series{Name: "local-reconciled", XY: p99})
}

// stats are the median, minimum and maximum of get over runs.
func stats(runs []run, get func(run) float64) (med, lo, hi float64) {
	if len(runs) == 0 {
		return 0, 0, 0
	}
	xs := make([]float64, len(runs))
	for i, r := range runs {
		xs[i] = get(r)
	}
	slices.Sort(xs)
	n := len(xs)
	med = xs[n/2]
	if n%2 == 0 {
		med = (xs[n/2-1] + xs[n/2]) / 2
	}
	return med, xs[0], xs[n-1]
}

func readRuns(dir string, rate, burst float64, duration, warmup time.Duration) ([]run, error) {
	paths, _ := filepath.Glob(filepath.Join(dir, "run*", "seconds.csv"))
	if len(paths) == 0 {
		return nil, fmt.Errorf("no runs in %s", dir)
	}
	var runs []run
	for _, p := range paths {
		r, err := readRun(filepath.Dir(p), rate, burst, duration, warmup)
		if err != nil {
			return nil, err
		}
		runs = append(runs, r)
	}
	return runs, nil
}

func readRun(dir string, rate, burst float64, duration, warmup time.Duration) (run, error) {
	f, err := os.Open(filepath.Join(dir, "tokens.csv"))
	if err != nil {
		return run{}, err
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil || len(rows) < 2 {
		return run{}, fmt.Errorf("%s/tokens.csv: %v", dir, err)
	}
	d, w := duration.Seconds(), warmup.Seconds()
	var all, steady float64
	worst := -1.0
	for _, row := range rows[1:] { // t, admitted_tokens, offered_tokens
		t, _ := strconv.Atoi(row[0])
		admitted, _ := strconv.ParseFloat(row[1], 64)
		all += admitted
		if float64(t) >= w && float64(t) < d {
			steady += admitted
			worst = max(worst, admitted/rate-1)
		}
	}
	raw, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		return run{}, err
	}
	var sum struct {
		Wall    float64        `json:"wallSeconds"`
		Latency load.Quantiles `json:"latency"`
		Lag     load.Quantiles `json:"generatorLag"`
	}
	if err := json.Unmarshal(raw, &sum); err != nil {
		return run{}, fmt.Errorf("%s/summary.json: %w", dir, err)
	}
	return run{
		cold:        all/(rate*sum.Wall+burst) - 1,
		steady:      steady/(rate*(d-w)) - 1,
		p50us:       sum.Latency.P50,
		p99us:       sum.Latency.P99,
		lagP99us:    sum.Lag.P99,
		worstSecond: worst,
	}, nil
}
