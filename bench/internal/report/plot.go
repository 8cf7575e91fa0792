package report

import (
	"fmt"
	"image/color"
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/outboxkit/dispatcher/bench/internal/suite"
)

// Plot draws the burn-down rates of every system as horizontal bars, one
// colour per system, and saves them as a PNG at path.
func Plot(r *suite.Results, path string) error {
	type group struct {
		color  color.Color
		labels []string
		values []float64
	}
	var groups []group
	if len(r.Floor) > 0 {
		g := group{color: color.RGBA{R: 150, G: 150, B: 150, A: 255}}
		for _, f := range r.Floor {
			g.labels = append(g.labels, fmt.Sprintf("SQL floor, %d client(s)", f.Clients))
			g.values = append(g.values, f.Rate())
		}
		groups = append(groups, g)
	}
	if len(r.Grid) > 0 {
		g := group{color: color.RGBA{R: 31, G: 119, B: 180, A: 255}}
		for _, e := range r.Grid {
			g.labels = append(g.labels, fmt.Sprintf("outbox engine, batch %d × %d", e.Options.BatchSize, e.Options.Dispatchers))
			g.values = append(g.values, e.Rate())
		}
		if d := r.DefaultPool; d.Messages > 0 {
			g.labels = append(g.labels, fmt.Sprintf("outbox engine, batch %d × 1, pool of %d", d.Options.BatchSize, d.Options.Conns))
			g.values = append(g.values, d.Rate())
		}
		if d := r.RiverPools; d.Messages > 0 {
			g.labels = append(g.labels, fmt.Sprintf("outbox engine, batch %d × %d, pools of %d", d.Options.BatchSize, d.Options.Dispatchers, d.Options.Conns))
			g.values = append(g.values, d.Rate())
		}
		groups = append(groups, g)
	}
	if k, u := r.ManyKeys, r.ManyKeysUnordered; k.Messages > 0 && u.Messages > 0 {
		groups = append(groups, group{color: color.RGBA{R: 148, G: 103, B: 189, A: 255},
			labels: []string{
				fmt.Sprintf("outbox engine, batch %d × 1, %s messages unordered", u.Options.BatchSize, thousands(float64(u.Messages))),
				fmt.Sprintf("outbox engine, batch %d × 1, the same on %s keys", k.Options.BatchSize, thousands(float64(r.Config.ManyKeys))),
			},
			values: []float64{u.Rate(), k.Rate()}})
	}
	if r.River.Jobs > 0 {
		groups = append(groups, group{color: color.RGBA{R: 255, G: 127, B: 14, A: 255},
			labels: []string{"River, 2,000 workers"}, values: []float64{r.River.WorkRate()}})
	}
	if w := r.Watermill; w.Messages > 0 {
		g := group{color: color.RGBA{R: 44, G: 160, B: 44, A: 255}}
		g.labels = append(g.labels, fmt.Sprintf("watermill-sql, batches of %d", w.SubscribeBatchSize))
		g.values = append(g.values, w.ConsumeRate())
		if w.Stalls > 0 {
			g.labels = append(g.labels, "watermill-sql, stalls left out")
			g.values = append(g.values, w.ActiveRate())
		}
		groups = append(groups, g)
	}
	if len(groups) == 0 {
		return fmt.Errorf("report: nothing to plot")
	}

	p := plot.New()
	p.Title.Text = fmt.Sprintf("Burn-down of %s messages of %d bytes on one PostgreSQL (higher is better)",
		thousands(float64(r.Config.Spec.Messages)), r.Config.Spec.PayloadBytes)
	p.X.Label.Text = "messages per second"
	p.X.Min = 0
	p.X.Tick.Marker = thousandsTicks{}
	var (
		labels []string
		xys    plotter.XYs
		texts  []string
		top    float64
	)
	pos := 0
	for _, g := range groups {
		bars, err := plotter.NewBarChart(plotter.Values(g.values), vg.Points(14))
		if err != nil {
			return err
		}
		bars.Horizontal = true
		bars.XMin = float64(pos)
		bars.Color = g.color
		bars.LineStyle.Width = 0
		p.Add(bars)
		for i, v := range g.values {
			labels = append(labels, g.labels[i])
			xys = append(xys, plotter.XY{X: v, Y: float64(pos + i)})
			texts = append(texts, " "+thousands(v))
			top = max(top, v)
		}
		pos += len(g.values)
	}
	values, err := plotter.NewLabels(plotter.XYLabels{XYs: xys, Labels: texts})
	if err != nil {
		return err
	}
	for i := range values.TextStyle {
		values.TextStyle[i].YAlign = -0.5
		values.TextStyle[i].Font.Size = vg.Points(9)
	}
	p.Add(values)
	p.X.Max = top * 1.18
	p.NominalY(labels...)
	p.Add(plotter.NewGrid())
	// plot.Save sizes the tick labels' column a little narrower than the
	// longest label renders, cutting its first letters off at the left
	// edge; drawing into a canvas inset by a margin keeps them whole.
	img := vgimg.New(10*vg.Inch, vg.Length(1.2+0.33*float64(len(labels)))*vg.Inch)
	p.Draw(draw.Crop(draw.New(img), leftMargin, 0, 0, 0))
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// leftMargin is the room left of the tick labels.
const leftMargin = vg.Length(0.15) * vg.Inch

// thousandsTicks are the default ticks labelled 10,000 rather than 10000.00.
type thousandsTicks struct{}

func (thousandsTicks) Ticks(min, max float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(min, max)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = thousands(ticks[i].Value)
		}
	}
	return ticks
}
