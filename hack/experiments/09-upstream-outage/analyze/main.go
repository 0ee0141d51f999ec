// Command analyze reads experiment 9's two runs (RESULTS/sensing and
// RESULTS/static, as cmd/load -upstream writes them: upstream.csv,
// cycles.csv, fake.csv), prints the targets' table and draws the plots.
//
// The upstream's load in a second is the tokens the plane admitted on its
// endpoints (every one is then sent to it); its capacity in that second is
// the timeline's. "After one cycle" starts at the first whole second after
// the sensing run's first cycle that left Healthy; the static run is
// measured from the same second.
package main

import (
	"encoding/csv"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"gonum.org/v1/plot/plotter"

	"github.com/quotaplane/quotaplane/pkg/load"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/upstream"
	"github.com/quotaplane/quotaplane/pkg/upstream/upstreamtest"
)

func main() {
	results := flag.String("results", "/tmp/quotaplane-experiments/09-upstream-outage", "the runs")
	timeline := flag.String("timeline", "hack/experiments/09-upstream-outage/timeline.json", "the fake upstream's timeline")
	img := flag.String("img", "docs/experiments/img", "where the PNGs go")
	plane := flag.String("plane", "hack/experiments/09-upstream-outage/plane", "the plane (its named tenants are the critical ones)")
	outageEnd := flag.Duration("outage-end", 460*time.Second, "when the timeline is healthy for good")
	flag.Parse()
	if err := do(*results, *timeline, *img, *plane, *outageEnd); err != nil {
		fmt.Fprintln(os.Stderr, "analyze:", err)
		os.Exit(1)
	}
}

// table is a CSV file by column name.
type table struct {
	cols map[string]int
	rows [][]string
}

func readCSV(path string) (*table, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	all, err := csv.NewReader(f).ReadAll()
	if err != nil || len(all) == 0 {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	t := &table{cols: map[string]int{}, rows: all[1:]}
	for i, c := range all[0] {
		t.cols[c] = i
	}
	return t, nil
}

func (t *table) f(row int, col string) float64 {
	i, ok := t.cols[col]
	if !ok {
		return math.NaN()
	}
	v, _ := strconv.ParseFloat(t.rows[row][i], 64)
	return v
}

func (t *table) s(row int, col string) string { return t.rows[row][t.cols[col]] }

var classes = []string{"critical", "high", "medium", "low", "healthy"}

// load is the tokens admitted on the upstream's endpoints in second row.
func upstreamLoad(t *table, row int) float64 {
	var sum float64
	for _, c := range classes {
		sum += t.f(row, "class_"+c)
	}
	return sum
}

// nominal is what the plane's named tenants (experiment 9's critical ones)
// are owed on the upstream in a run, tokens/s: each its nominal allocation,
// its own limit's rate, or what it offered if less (tenants.csv).
func nominal(planeDir, tenantsCSV string) (float64, error) {
	objs, err := policy.ReadDir(planeDir)
	if err != nil {
		return 0, err
	}
	p, problems := policy.Compile(objs)
	if len(problems) > 0 {
		return 0, fmt.Errorf("%s: %v", planeDir, problems)
	}
	rows, err := load.ReadTenantsCSV(tenantsCSV)
	if err != nil {
		return 0, err
	}
	var sum float64
	for _, r := range rows {
		if t, ok := p.Tenant(r.Name); ok && t.Limit != nil {
			sum += min(float64(t.Limit.Rate)/t.Limit.Period.Seconds(), r.OfferedTokensPerSec)
		}
	}
	return sum, nil
}

func do(results, timelineFile, img, planeDir string, outageEnd time.Duration) error {
	raw, err := os.ReadFile(timelineFile)
	if err != nil {
		return err
	}
	tl, err := upstreamtest.ParseTimeline(raw)
	if err != nil {
		return err
	}
	capacityAt := func(sec int) float64 {
		c := 0.0
		for _, st := range tl {
			if st.At <= time.Duration(sec)*time.Second {
				c = st.Capacity
			}
		}
		return c
	}
	sensing, err := readCSV(filepath.Join(results, "sensing", "upstream.csv"))
	if err != nil {
		return err
	}
	static, err := readCSV(filepath.Join(results, "static", "upstream.csv"))
	if err != nil {
		return err
	}
	cycles, err := readCSV(filepath.Join(results, "sensing", "cycles.csv"))
	if err != nil {
		return err
	}
	outageStart := tl[1].At.Seconds()
	first := math.Inf(1) // the first cycle that left Healthy
	for i := range cycles.rows {
		if t := cycles.f(i, "t"); t >= outageStart && cycles.s(i, "phase") != "Healthy" {
			first = t
			break
		}
	}
	if math.IsInf(first, 1) {
		return fmt.Errorf("no cycle left Healthy after %.0f s", outageStart)
	}
	// The second in which that cycle ran holds what was admitted before its
	// plan reached the enforcers (within a reconcile interval): measure
	// from the next whole second.
	from, to := int(math.Floor(first))+1, int(outageEnd.Seconds())

	fmt.Printf("Outage from %.0f s; the leader's first cycle out of Healthy at %.1f s; measured over [%d s, %d s) (outage and flapping), from the first whole second after that cycle.\n\n", outageStart, first, from, to)
	fmt.Println("Critical: the plane's named tenants, owed their nominal allocations (their limits' rates, or what they offered if less).")
	fmt.Println()
	fmt.Println("| run | upstream load / its capacity, mean | worst second over capacity | seconds over capacity + 5 % | critical: admitted / owed | critical: refused at the upstream gate | critical: calls the upstream took (not 429) / owed | upstream 429s |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, r := range []struct {
		name, dir string
		t         *table
	}{{"sensing", "sensing", sensing}, {"static (no sensing)", "static", static}} {
		owed, err := nominal(planeDir, filepath.Join(results, r.dir, "tenants.csv"))
		if err != nil {
			return err
		}
		var ratio, worst, over, crit, through, limited float64
		var refused float64
		n := 0
		for sec := from; sec < to && sec < len(r.t.rows); sec++ {
			c := capacityAt(sec)
			l := upstreamLoad(r.t, sec)
			ratio += l / c
			worst = max(worst, l/c-1)
			if l > 1.05*c {
				over++
			}
			crit += r.t.f(sec, "watched_admitted")
			refused += r.t.f(sec, "throttled_critical")
			through += r.t.f(sec, "watched_through")
			limited += r.t.f(sec, "upstream_429")
			n++
		}
		fmt.Printf("| %s | %.2f | %+.1f %% | %.0f of %d | %.3f | %.0f | %.3f | %.0f |\n", r.name, ratio/float64(n), 100*worst, over, n, crit/(owed*float64(n)), refused, through/(owed*float64(n)), limited)
	}

	// Class changes while the upstream flaps (between the first flap and
	// the end of the outage), and the phases of the recovery.
	flapFrom := 0.0
	for i := 2; i < len(tl); i++ {
		if tl[i].Capacity > tl[1].Capacity {
			flapFrom = tl[i].At.Seconds()
			break
		}
	}
	var changes float64
	for i := range cycles.rows {
		if t := cycles.f(i, "t"); t >= flapFrom && t < outageEnd.Seconds() {
			changes += cycles.f(i, "changes")
		}
	}
	fmt.Printf("\nClass changes in the cycles while the upstream flapped (%.0f s to %.0f s): %.0f.\n\n", flapFrom, outageEnd.Seconds(), changes)
	fmt.Println("Recovery: each phase's cycles, the capacity the plan gave, and the upstream's load (sensing run):")
	fmt.Println()
	fmt.Println("| from | phase | confidence | capacity now | load, mean | load, worst second |")
	fmt.Println("|---|---|---|---|---|---|")
	for i := range cycles.rows {
		t := cycles.f(i, "t")
		if t < outageEnd.Seconds()-1 {
			continue
		}
		end := len(sensing.rows)
		if i+1 < len(cycles.rows) {
			end = int(cycles.f(i+1, "t"))
		}
		var sum, worst float64
		n := 0
		for sec := int(math.Ceil(t)); sec < end && sec < len(sensing.rows)-1; sec++ {
			l := upstreamLoad(sensing, sec)
			sum += l
			worst = max(worst, l)
			n++
		}
		if n == 0 {
			continue
		}
		fmt.Printf("| %.0f s | %s | %.2f | %.0f | %.0f | %.0f |\n", t, cycles.s(i, "phase"), cycles.f(i, "confidence"), cycles.f(i, "capacity_now"), sum/float64(n), worst)
	}

	// Plots.
	if err := os.MkdirAll(img, 0o755); err != nil {
		return err
	}
	var conf, phase plotter.XYs
	for i := range cycles.rows {
		conf = append(conf, plotter.XY{X: cycles.f(i, "t"), Y: cycles.f(i, "confidence")})
		p, _ := upstream.ParsePhase(cycles.s(i, "phase"))
		phase = append(phase, plotter.XY{X: cycles.f(i, "t"), Y: float64(p) / 4})
	}
	if err := load.LinePlot(filepath.Join(img, "09-confidence.png"), "Experiment 9: capacity confidence and phase, per cycle", "seconds", "confidence",
		load.Series{Name: "confidence", XY: conf}, load.Series{Name: "phase / 4 (0 Healthy, 0.25 Degraded, 0.5–1 phases 1–3)", XY: phase}); err != nil {
		return err
	}
	series := func(t *table, f func(int) float64) plotter.XYs {
		var xy plotter.XYs
		for i := range len(t.rows) - 1 {
			xy = append(xy, plotter.XY{X: float64(i), Y: f(i)})
		}
		return xy
	}
	capacity := series(sensing, func(i int) float64 { return capacityAt(i) })
	var byClass []load.Series
	for _, c := range classes {
		byClass = append(byClass, load.Series{Name: c, XY: series(sensing, func(i int) float64 { return sensing.f(i, "class_"+c) })})
	}
	byClass = append(byClass, load.Series{Name: "upstream capacity", XY: capacity})
	if err := load.LinePlot(filepath.Join(img, "09-classes.png"), "Experiment 9 (sensing): admitted on the upstream by class, tokens/s", "seconds", "tokens/s", byClass...); err != nil {
		return err
	}
	return load.LinePlot(filepath.Join(img, "09-load.png"), "Experiment 9: load on the upstream, tokens/s", "seconds", "tokens/s",
		load.Series{Name: "sensing", XY: series(sensing, func(i int) float64 { return upstreamLoad(sensing, i) })},
		load.Series{Name: "static tiers", XY: series(static, func(i int) float64 { return upstreamLoad(static, i) })},
		load.Series{Name: "upstream capacity", XY: capacity})
}
