// Command plot draws the sustained run's time series from cmd/load's
// output (seconds.csv, by scheduled second; tokens.csv, by wall second):
//
//	PREFIX-rates.png    admitted requests/s and admitted tokens/s, and the limit
//	PREFIX-overage.png  each wall second's admitted tokens against the limit
//	PREFIX-latency.png  decision p50 and p99 per second
//	PREFIX-lag.png      the generator's lag p99 per second
package main

import (
	"encoding/csv"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot/plotter"

	"github.com/quotaplane/quotaplane/pkg/load"
)

func main() {
	dir := flag.String("dir", "/tmp/quotaplane-experiments/08-sustained/sustained", "the run's -out directory")
	prefix := flag.String("prefix", "docs/experiments/img/08-sustained", "path prefix of the PNGs")
	limit := flag.Float64("limit", 1_000_000, "the global limit, tokens/s")
	seconds := flag.Int("seconds", 600, "the scheduled run length in seconds (tokens.csv rows past it are left out)")
	flag.Parse()
	if err := do(*dir, *prefix, *limit, *seconds); err != nil {
		fmt.Fprintln(os.Stderr, "plot:", err)
		os.Exit(1)
	}
}

func readCSV(path string) (map[string]int, [][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil || len(rows) < 2 {
		return nil, nil, fmt.Errorf("%s: %v", path, err)
	}
	col := map[string]int{}
	for i, h := range rows[0] {
		col[h] = i
	}
	return col, rows[1:], nil
}

func do(dir, prefix string, limit float64, seconds int) error {
	col, rows, err := readCSV(filepath.Join(dir, "seconds.csv"))
	if err != nil {
		return err
	}
	num := func(row []string, name string) float64 {
		x, _ := strconv.ParseFloat(row[col[name]], 64)
		return x
	}
	var admitted, p50, p99, lag plotter.XYs
	for _, row := range rows {
		t := num(row, "t")
		admitted = append(admitted, plotter.XY{X: t, Y: num(row, "admitted") / 1e3})
		p50 = append(p50, plotter.XY{X: t, Y: num(row, "p50_us")})
		p99 = append(p99, plotter.XY{X: t, Y: num(row, "p99_us")})
		lag = append(lag, plotter.XY{X: t, Y: num(row, "lag_p99_us") / 1e6})
	}
	_, tokens, err := readCSV(filepath.Join(dir, "tokens.csv"))
	if err != nil {
		return err
	}
	var admittedTokens, limitLine, overage plotter.XYs
	for _, row := range tokens {
		t, _ := strconv.Atoi(row[0])
		if t >= seconds {
			break
		}
		a, _ := strconv.ParseFloat(row[1], 64)
		admittedTokens = append(admittedTokens, plotter.XY{X: float64(t), Y: a / 1e3})
		limitLine = append(limitLine, plotter.XY{X: float64(t), Y: limit / 1e3})
		overage = append(overage, plotter.XY{X: float64(t), Y: 100 * (a/limit - 1)})
	}
	if err := load.LinePlot(prefix+"-rates.png", "admitted per second", "second", "thousand per second",
		load.Series{Name: "admitted requests (scheduled second)", XY: admitted},
		load.Series{Name: "admitted tokens (wall second)", XY: admittedTokens},
		load.Series{Name: "global limit (tokens)", XY: limitLine}); err != nil {
		return err
	}
	if err := load.LinePlot(prefix+"-overage.png", "admitted tokens against the global limit, per wall second", "second", "overage (%)",
		load.Series{Name: "overage", XY: overage}); err != nil {
		return err
	}
	if err := load.LinePlot(prefix+"-latency.png", "decision latency per second", "second", "µs",
		load.Series{Name: "p50", XY: p50}, load.Series{Name: "p99", XY: p99}); err != nil {
		return err
	}
	return load.LinePlot(prefix+"-lag.png", "generator lag p99 per second (how late requests start against their schedule)", "second", "seconds",
		load.Series{Name: "lag p99", XY: lag})
}
