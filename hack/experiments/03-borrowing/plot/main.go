// Command plot draws columns of a load run's seconds.csv against its t
// column into a PNG, with load.LinePlot.
//
//	go run ./hack/experiments/03-borrowing/plot -csv DIR/seconds.csv -out x.png -title T -ylabel L col[=legend] ...
package main

import (
	"encoding/csv"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot/plotter"

	"github.com/quotaplane/quotaplane/pkg/load"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "plot:", err)
		os.Exit(1)
	}
}

func run() error {
	in := flag.String("csv", "", "a seconds.csv")
	out := flag.String("out", "", "the PNG to write")
	title := flag.String("title", "", "the plot's title")
	yLabel := flag.String("ylabel", "per second", "the y axis' label")
	flag.Parse()
	f, err := os.Open(*in)
	if err != nil {
		return err
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return fmt.Errorf("%s: %w", *in, err)
	}
	if len(rows) < 2 {
		return fmt.Errorf("%s: no rows", *in)
	}
	header := rows[0]
	tCol := slices.Index(header, "t")
	var series []load.Series
	for _, arg := range flag.Args() {
		col, legend, ok := strings.Cut(arg, "=")
		if !ok {
			legend = col
		}
		c := slices.Index(header, col)
		if c < 0 || tCol < 0 {
			return fmt.Errorf("%s: no column %q or t (columns: %v)", *in, col, header)
		}
		var xy plotter.XYs
		for _, row := range rows[1:] {
			t, err1 := strconv.ParseFloat(row[tCol], 64)
			y, err2 := strconv.ParseFloat(row[c], 64)
			if err1 != nil || err2 != nil {
				return fmt.Errorf("%s: row %v: not numbers", *in, row)
			}
			xy = append(xy, plotter.XY{X: t, Y: y})
		}
		series = append(series, load.Series{Name: legend, XY: xy})
	}
	return load.LinePlot(*out, *title, "second of the run", *yLabel, series...)
}
