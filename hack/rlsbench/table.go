package main

import (
	"bufio"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// run is one rlsbench summary line with the arm that produced it.
type run struct {
	arm         string
	descriptors int
	values      map[string]float64
}

// parseRuns reads summary lines (name=value fields, one of them arm=…);
// other lines are skipped.
func parseRuns(r io.Reader) ([]run, error) {
	var runs []run
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		fields := strings.Fields(sc.Text())
		ru := run{values: map[string]float64{}}
		for _, f := range fields {
			name, value, ok := strings.Cut(f, "=")
			if !ok {
				continue
			}
			switch name {
			case "arm":
				ru.arm = value
			case "descriptors":
				d, err := strconv.Atoi(value)
				if err != nil {
					return nil, fmt.Errorf("line %d: descriptors=%q", n, value)
				}
				ru.descriptors = d
			default:
				if v, err := strconv.ParseFloat(value, 64); err == nil {
					ru.values[name] = v
				}
			}
		}
		if ru.arm == "" || ru.descriptors == 0 {
			continue
		}
		runs = append(runs, ru)
	}
	return runs, sc.Err()
}

// median of the values of name over runs; NaN-free: missing values are
// left out, and no value gives -1.
func median(runs []run, name string) float64 {
	var vs []float64
	for _, r := range runs {
		if v, ok := r.values[name]; ok {
			vs = append(vs, v)
		}
	}
	if len(vs) == 0 {
		return -1
	}
	slices.Sort(vs)
	if len(vs)%2 == 1 {
		return vs[len(vs)/2]
	}
	return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2
}

// printTable prints, per descriptor count and arm (in the order they first
// appear), the medians of the runs and their ratios to the arm named base:
// of decisions/s (bounded by the machine all share), and of decisions per
// CPU-second of the server and Redis together (what a core given to the
// service would sustain).
func printTable(w io.Writer, runs []run, base string) {
	type group struct {
		descriptors int
		arm         string
	}
	var order []group
	byGroup := map[group][]run{}
	for _, r := range runs {
		g := group{r.descriptors, r.arm}
		if _, ok := byGroup[g]; !ok {
			order = append(order, g)
		}
		byGroup[g] = append(byGroup[g], r)
	}
	slices.SortStableFunc(order, func(a, b group) int { return a.descriptors - b.descriptors })
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "descriptors\tarm\truns\tdecisions/s\tp50 µs\tp99 µs\tserver CPU µs/decision\tRedis CPU µs/decision\trlsbench CPU µs/decision\terrors\tdecisions/s ÷ "+base+"\tdecisions per server+Redis CPU-s ÷ "+base+"\t")
	for _, g := range order {
		rs := byGroup[g]
		rate := median(rs, "decisions_per_s")
		cpu := median(rs, "server_cpu_us_per_decision") + max(median(rs, "redis_cpu_us_per_decision"), 0)
		ratio, cpuRatio := "", ""
		if baseRuns := byGroup[group{g.descriptors, base}]; len(baseRuns) > 0 && g.arm != base {
			baseCPU := median(baseRuns, "server_cpu_us_per_decision") + max(median(baseRuns, "redis_cpu_us_per_decision"), 0)
			ratio = fmt.Sprintf("%.2f×", rate/median(baseRuns, "decisions_per_s"))
			cpuRatio = fmt.Sprintf("%.2f×", baseCPU/cpu)
		}
		fmt.Fprintf(tw, "%d\t%s\t%d\t%.0f\t%.0f\t%.0f\t%s\t%s\t%s\t%.0f\t%s\t%s\t\n", g.descriptors, g.arm, len(rs),
			rate, median(rs, "p50_us"), median(rs, "p99_us"),
			optional(median(rs, "server_cpu_us_per_decision")), optional(median(rs, "redis_cpu_us_per_decision")),
			optional(median(rs, "rlsbench_cpu_us_per_decision")), median(rs, "errors"), ratio, cpuRatio)
	}
	tw.Flush()
}

func optional(v float64) string {
	if v < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", v)
}
