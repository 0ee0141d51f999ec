// Command plot reads experiment 4's runs (RESULTS/sweep.txt and
// RESULTS/accuracy.txt, a line per run naming its cmd/load -out directory)
// and prints its tables (medians of the runs) and draws the sweep: decisions
// per second of wall time and decision p99 against the offered rate.
//
// Overage is computed as in experiment 2, on tokens.csv, the admitted
// tokens per second of wall time:
//
//	cold   = admitted over the whole run / (rate × wall time + burst) − 1
//	steady = admitted in the seconds [warmup, duration) / (rate × (duration − warmup)) − 1
package main

import (
	"bufio"
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

var setups = []string{"central", "sharded", "reconciled"}

var setupNames = map[string]string{
	"central":    "central, one Redis (one hot key)",
	"sharded":    "central, 3-shard Redis Cluster, whale split in 3",
	"reconciled": "local-reconciled 200 ms, one Redis",
}

func main() {
	results := flag.String("results", "/tmp/quotaplane-experiments/04-hot-tenant", "the runs")
	img := flag.String("img", "docs/experiments/img", "where the PNGs go")
	rate := flag.Float64("rate", 40000, "the accuracy runs' global limit, tokens/s")
	burst := flag.Float64("burst", 40000, "its burst")
	duration := flag.Duration("duration", 15*time.Second, "the accuracy runs' length")
	warmup := flag.Duration("warmup", 5*time.Second, "their warmup")
	flag.Parse()
	if err := do(*results, *img, *rate, *burst, *duration, *warmup); err != nil {
		fmt.Fprintln(os.Stderr, "plot:", err)
		os.Exit(1)
	}
}

// readResults parses the run lines of run.sh ("sweep setup=… offered=… run=…
// dir=…") and adds each run's numbers from its summary.json: decided/s per
// second of wall time, the decision p50 and p99 and the generator's lag p99
// (µs), and errors.
func readResults(path string) ([]map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rows []map[string]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		row := map[string]string{}
		for _, field := range strings.Fields(sc.Text())[1:] {
			k, v, _ := strings.Cut(field, "=")
			row[k] = v
		}
		raw, err := os.ReadFile(filepath.Join(row["dir"], "summary.json"))
		if err != nil {
			return nil, err
		}
		var sum load.Result
		if err := json.Unmarshal(raw, &sum); err != nil {
			return nil, fmt.Errorf("%s/summary.json: %w", row["dir"], err)
		}
		for k, v := range map[string]float64{"decided_per_wall_s": sum.DecisionsPerWallSec, "p50_us": sum.Latency.P50, "p99_us": sum.Latency.P99,
			"lag_p99_us": sum.Lag.P99, "errors": float64(sum.Errors)} {
			row[k] = strconv.FormatFloat(v, 'f', -1, 64)
		}
		rows = append(rows, row)
	}
	return rows, sc.Err()
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	n := len(xs)
	if n%2 == 0 {
		return (xs[n/2-1] + xs[n/2]) / 2
	}
	return xs[n/2]
}

func num(row map[string]string, k string) float64 {
	x, _ := strconv.ParseFloat(row[k], 64)
	return x
}

func do(results, img string, rate, burst float64, duration, warmup time.Duration) error {
	rows, err := readResults(filepath.Join(results, "sweep.txt"))
	if err != nil {
		return err
	}
	type key struct {
		setup   string
		offered float64
	}
	groups := map[key][]map[string]string{}
	var offered []float64
	for _, r := range rows {
		k := key{r["setup"], num(r, "offered")}
		groups[k] = append(groups[k], r)
		if !slices.Contains(offered, k.offered) {
			offered = append(offered, k.offered)
		}
	}
	slices.Sort(offered)
	fmt.Println("Sweep (medians of the runs; decided/s is per second of wall time, so it stops growing at the wall):")
	fmt.Println()
	fmt.Println("| set-up | offered/s | runs | decided/s | p50 | p99 | generator lag p99 | errors |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	var throughput, p99s []load.Series
	for _, s := range setups {
		var tp, lat plotter.XYs
		for _, o := range offered {
			g := groups[key{s, o}]
			if len(g) == 0 {
				continue
			}
			col := func(k string) float64 {
				var xs []float64
				for _, r := range g {
					xs = append(xs, num(r, k))
				}
				return median(xs)
			}
			d, p50, p99, lag, errs := col("decided_per_wall_s"), col("p50_us"), col("p99_us"), col("lag_p99_us"), col("errors")
			fmt.Printf("| %s | %.0f | %d | %.0f | %.0f µs | %.0f µs | %.0f µs | %.0f |\n", s, o, len(g), d, p50, p99, lag, errs)
			tp = append(tp, plotter.XY{X: o / 1e3, Y: d / 1e3})
			lat = append(lat, plotter.XY{X: o / 1e3, Y: p99 / 1e3})
		}
		throughput = append(throughput, load.Series{Name: setupNames[s], XY: tp})
		p99s = append(p99s, load.Series{Name: setupNames[s], XY: lat})
	}
	var ideal plotter.XYs
	for _, o := range offered {
		ideal = append(ideal, plotter.XY{X: o / 1e3, Y: o / 1e3})
	}
	throughput = append(throughput, load.Series{Name: "offered", XY: ideal})
	if err := load.LinePlot(filepath.Join(img, "04-throughput.png"), "one hot tenant, 8 nodes: decisions per second of wall time (medians)",
		"offered (thousand requests/s)", "decided (thousand/s)", throughput...); err != nil {
		return err
	}
	if err := load.LinePlot(filepath.Join(img, "04-p99.png"), "one hot tenant, 8 nodes: decision p99 (medians)",
		"offered (thousand requests/s)", "p99 (ms)", p99s...); err != nil {
		return err
	}

	fmt.Println()
	fmt.Printf("Accuracy at a global limit of %.0f/s (burst %.0f), offered 2×, %s runs, warmup %s (medians [min, max]):\n", rate, burst, duration, warmup)
	fmt.Println()
	fmt.Println("| set-up | runs | overage, cold start | overage, after warmup | decision p99 |")
	fmt.Println("|---|---|---|---|---|")
	acc, _ := readResults(filepath.Join(results, "accuracy.txt"))
	for _, s := range setups {
		var cold, steady, p99 []float64
		for r := 1; ; r++ {
			dir := filepath.Join(results, "accuracy", fmt.Sprintf("%s-run%d", s, r))
			c, st, err := overage(dir, rate, burst, duration, warmup)
			if err != nil {
				break
			}
			cold, steady = append(cold, c), append(steady, st)
		}
		for _, row := range acc {
			if row["setup"] == s {
				p99 = append(p99, num(row, "p99_us"))
			}
		}
		if len(cold) == 0 {
			continue
		}
		rng := func(xs []float64) string {
			return fmt.Sprintf("%+.2f%% [%+.2f, %+.2f]", 100*median(xs), 100*slices.Min(xs), 100*slices.Max(xs))
		}
		fmt.Printf("| %s | %d | %s | %s | %.0f µs |\n", s, len(cold), rng(cold), rng(steady), median(p99))
	}
	return nil
}

// overage reads a run's tokens.csv (admitted tokens per second of wall
// time) and summary.json (its wall time).
func overage(dir string, rate, burst float64, duration, warmup time.Duration) (cold, steady float64, err error) {
	f, err := os.Open(filepath.Join(dir, "tokens.csv"))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil || len(rows) < 2 {
		return 0, 0, fmt.Errorf("%s/tokens.csv: %v", dir, err)
	}
	d, w := duration.Seconds(), warmup.Seconds()
	var all, after float64
	for _, row := range rows[1:] { // t, admitted_tokens, offered_tokens
		t, _ := strconv.Atoi(row[0])
		admitted, _ := strconv.ParseFloat(row[1], 64)
		all += admitted
		if float64(t) >= w && float64(t) < d {
			after += admitted
		}
	}
	raw, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		return 0, 0, err
	}
	var sum struct {
		Wall float64 `json:"wallSeconds"`
	}
	if err := json.Unmarshal(raw, &sum); err != nil {
		return 0, 0, fmt.Errorf("%s/summary.json: %w", dir, err)
	}
	return all/(rate*sum.Wall+burst) - 1, after/(rate*(d-w)) - 1, nil
}
