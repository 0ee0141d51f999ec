package load

import (
	"fmt"
	"image/color"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Series is one line of a plot.
type Series struct {
	Name string
	XY   plotter.XYs
}

// LinePlot draws series into a PNG at path.
func LinePlot(path, title, xLabel, yLabel string, series ...Series) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xLabel
	p.Y.Label.Text = yLabel
	p.Add(plotter.NewGrid())
	palette := []color.Color{
		color.RGBA{R: 31, G: 119, B: 180, A: 255}, color.RGBA{R: 214, G: 39, B: 40, A: 255},
		color.RGBA{R: 44, G: 160, B: 44, A: 255}, color.RGBA{R: 255, G: 127, B: 14, A: 255},
		color.RGBA{R: 148, G: 103, B: 189, A: 255}, color.RGBA{R: 127, G: 127, B: 127, A: 255},
	}
	for i, s := range series {
		l, err := plotter.NewLine(s.XY)
		if err != nil {
			return fmt.Errorf("plot %s: %w", s.Name, err)
		}
		l.Color = palette[i%len(palette)]
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(s.Name, l)
	}
	p.Legend.Top = true
	return p.Save(8*vg.Inch, 4*vg.Inch, path)
}

// Plot draws the run's time series into dir: rates.png (offered and
// admitted per second, victims' success) and latency.png (p50 and p99 of
// all decisions and of the victims').
func (r *Result) Plot(dir string) error {
	var offered, admitted, success, attacker, p99, vp99, p50 plotter.XYs
	for _, s := range r.Seconds {
		t := float64(s.T)
		offered = append(offered, plotter.XY{X: t, Y: float64(s.Offered)})
		admitted = append(admitted, plotter.XY{X: t, Y: float64(s.Admitted)})
		attacker = append(attacker, plotter.XY{X: t, Y: float64(s.AttackerAdmitted)})
		if s.VictimOffered > 0 {
			success = append(success, plotter.XY{X: t, Y: 100 * float64(s.VictimOffered-s.VictimDeniedGlobal) / float64(s.VictimOffered)})
		}
		us := func(d float64) float64 { return d / 1e3 }
		p50 = append(p50, plotter.XY{X: t, Y: us(float64(s.P50))})
		p99 = append(p99, plotter.XY{X: t, Y: us(float64(s.P99))})
		vp99 = append(vp99, plotter.XY{X: t, Y: us(float64(s.VictimP99))})
	}
	if err := LinePlot(filepath.Join(dir, "rates.png"), "offered and admitted", "second", "requests/s",
		Series{"offered", offered}, Series{"admitted", admitted}, Series{"attacker admitted", attacker}); err != nil {
		return err
	}
	if err := LinePlot(filepath.Join(dir, "victims.png"), "victims' success (not denied at the global level)", "second", "%",
		Series{"victim success", success}); err != nil {
		return err
	}
	return LinePlot(filepath.Join(dir, "latency.png"), "decision latency", "second", "µs",
		Series{"p50", p50}, Series{"p99", p99}, Series{"victims p99", vp99})
}
