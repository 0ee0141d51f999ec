package server

import (
	"bytes"
	"cmp"
	"context"
	_ "embed"
	"fmt"
	"html/template"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// The live view, GET /quota/ui: one HTML page rendered on the server from
// the engine's state at each request (enforcer.PlaneLoad, PlaneStatusAt,
// BackendStatus, UpstreamStatus and, in the distributed modes, the fleet's
// reports), with inline SVG bars and inline CSS, no script and no external
// asset (its Content-Security-Policy forbids them), reloading itself every
// uiRefresh with a meta refresh. html/template escapes every name.
//
// Rates (admitted tokens/s, denials/s) are the counters' differences since
// the previous view at least uiMinInterval old: the engine keeps counters,
// not rates, and the view must add no work to decisions. The first view
// after a start has none yet; several viewers share one baseline.

//go:embed ui.html
var uiHTML string

var uiTemplate = template.Must(template.New("ui").Funcs(template.FuncMap{
	"rate":  uiRate,
	"share": uiShare,
	"deref": func(b *bool) bool { return b != nil && *b },
	"bar":   uiBar,
}).Parse(uiHTML))

const (
	// uiRefresh is how often the page reloads itself.
	uiRefresh = 2 * time.Second
	// uiMinInterval is the shortest interval rates are computed over.
	uiMinInterval = time.Second
	// uiTop is how many of the busiest tenants the page lists.
	uiTop = 20
	// uiBarWidth is the SVG bars' width in pixels.
	uiBarWidth = 260
)

// ui serves the live view; it keeps the counters of the previous view to
// turn them into rates.
type ui struct {
	e   *enforcer.Engine
	cfg *adminConfig

	mu      sync.Mutex
	prev    uiCounters // the baseline rates are computed from
	rates   uiCounters // per second, from the last two baselines
	seconds float64    // their interval; 0 before there are two
}

// uiCounters are counters (or rates) by tier, tenant and level.
type uiCounters struct {
	at      time.Time
	tiers   map[string]float64 // admitted tokens
	tenants map[string]float64 // admitted tokens, of the top tenants
	denied  map[enforcer.Level]float64
}

func newUI(e *enforcer.Engine, cfg *adminConfig) *ui { return &ui{e: e, cfg: cfg} }

// uiView is what the template renders.
type uiView struct {
	Refresh       int
	Now           string
	Plane         string
	PolicyVersion int64
	PolicyHash    string
	Node          string
	Mode          string
	Degraded      bool
	Fairness      string
	Contended     bool
	Rated         bool // rates are shown
	RateSeconds   string

	// GlobalInRedis: in mode central (not degraded) the global bucket
	// and the pool are in Redis; this enforcer's own stand by.
	GlobalInRedis    bool
	GlobalLimit      string
	GlobalRate       float64
	GlobalRemaining  int64
	GlobalBurst      int64
	GlobalBar        uiBarSpec
	PoolRemaining    int64
	PoolSize         int64
	TenantsWithState int

	Tiers   []uiTier
	Top     []uiTenant
	Denied  []uiDenied
	Fleet   *DebugFleet
	Upstrms []uiUpstream
}

type uiTier struct {
	Name                   string
	Weight, FloorPercent   int64
	Floor                  float64
	TenantLimit, KeyLimit  string
	Tenants                int
	Demand, FairShare      float64
	AdmittedRate           float64 // NaN: no rate yet
	Admitted, AdmittedCost int64
	Denied                 int64
	Bar                    uiBarSpec
}

type uiTenant struct {
	Name, Tier        string
	Known             bool
	Weight            int64
	Demand, FairShare float64
	AdmittedRate      float64
	Admitted, Denied  int64
	Bar               uiBarSpec
}

type uiDenied struct {
	Level string
	Count int64
	Rate  float64
	Bar   uiBarSpec
}

type uiUpstream struct {
	Name, Phase string
	Confidence  float64
	Capacity    float64
	PlanSeq     int64
	Classes     []enforcer.UpstreamClassStatus
	Bar         uiBarSpec
}

// uiBarSpec is one SVG bar Width pixels wide (uiBarWidth when 0): Demand
// as a pale bar, Admitted over it, and marks at Share (fair share) and
// Floor, all on a scale of Scale. NaN or 0 draws nothing.
type uiBarSpec struct {
	Width                                 int
	Scale, Demand, Admitted, Share, Floor float64
}

func (u *ui) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), debugReadTimeout)
	defer cancel()
	v := u.view(ctx, time.Now())
	var buf bytes.Buffer
	if err := uiTemplate.Execute(&buf, v); err != nil {
		writeError(w, http.StatusInternalServerError, "render the live view: "+err.Error())
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(buf.Bytes())
}

// view reads the engine at now.
func (u *ui) view(ctx context.Context, now time.Time) *uiView {
	e := u.e
	p := e.Policy()
	plane := e.PlaneStatusAt(now)
	b := e.BackendStatus()
	load := e.PlaneLoad(uiTop)
	rates, seconds := u.rate(now, load)

	v := &uiView{
		Refresh: int(uiRefresh / time.Second), Now: now.UTC().Format(time.RFC3339),
		Plane: p.ID(), PolicyVersion: p.Version(), PolicyHash: p.Hash()[:12], Node: e.NodeID(),
		Mode: b.Mode.String(), Degraded: b.Degraded, Fairness: p.Spec().Fairness, Contended: load.Contended,
		Rated: seconds > 0, RateSeconds: strconv.FormatFloat(seconds, 'f', 1, 64),
		GlobalLimit: plane.Global.Limit.String(), GlobalRate: perSecond(plane.Global.Limit),
		GlobalRemaining: plane.Global.Remaining, GlobalBurst: plane.Global.Limit.Burst,
		PoolRemaining: plane.PoolRemaining, TenantsWithState: plane.Tenants,
		GlobalInRedis: b.Mode == policy.ModeCentral && !b.Degraded,
	}
	if bp := p.Spec().BurstPool; bp != nil {
		v.PoolSize = bp.Size
	}
	v.GlobalBar = uiBarSpec{Width: 200, Scale: float64(v.GlobalBurst), Admitted: float64(v.GlobalRemaining), Share: math.NaN(), Floor: math.NaN()}
	rateOf := func(m map[string]float64, name string) float64 {
		if r, ok := m[name]; ok {
			return r
		}
		return math.NaN() // no rate yet
	}

	// The tiers' bars share one scale: the global rate, or more when the
	// demand is more.
	scale := v.GlobalRate
	for _, t := range load.Tiers {
		scale = max(scale, t.Demand)
	}
	for _, t := range load.Tiers {
		row := uiTier{Name: t.Name, Weight: t.Weight, FloorPercent: t.FloorPercent, Floor: t.Floor,
			TenantLimit: limitString(t.Tenant), KeyLimit: limitString(t.Key), Tenants: t.Tenants,
			Demand: t.Demand, FairShare: t.FairShare, Admitted: t.Admitted, AdmittedCost: t.AdmittedCost,
			AdmittedRate: rateOf(rates.tiers, t.Name)}
		for _, n := range t.Denied {
			row.Denied += n
		}
		row.Bar = uiBarSpec{Scale: scale, Demand: t.Demand, Admitted: row.AdmittedRate, Share: t.FairShare, Floor: t.Floor}
		if !load.Contended {
			row.Bar.Share = math.NaN()
		}
		v.Tiers = append(v.Tiers, row)
	}

	scale = 0
	for _, t := range load.Top {
		scale = max(scale, t.Demand, finite(t.FairShare))
	}
	for _, t := range load.Top {
		row := uiTenant{Name: t.Tenant, Tier: t.Tier, Known: t.Known, Weight: t.Weight, Demand: t.Demand, FairShare: t.FairShare,
			Admitted: t.Admitted, Denied: t.Denied, AdmittedRate: rateOf(rates.tenants, t.Tenant)}
		row.Bar = uiBarSpec{Width: 150, Scale: scale, Demand: t.Demand, Admitted: row.AdmittedRate, Share: t.FairShare, Floor: math.NaN()}
		if !load.Contended {
			row.Bar.Share = math.NaN()
		}
		v.Top = append(v.Top, row)
	}

	var most int64
	for _, n := range load.Denied {
		most = max(most, n)
	}
	for _, l := range enforcer.Levels {
		row := uiDenied{Level: string(l), Count: load.Denied[l], Rate: math.NaN()}
		if r, ok := rates.denied[l]; ok {
			row.Rate = r
		}
		row.Bar = uiBarSpec{Width: 150, Scale: float64(most), Admitted: float64(row.Count), Share: math.NaN(), Floor: math.NaN()}
		v.Denied = append(v.Denied, row)
	}

	if b.Mode != policy.ModeLocal {
		v.Fleet = fleetView(ctx, e, b, u.cfg.fleet)
	} else {
		degraded := false
		v.Fleet = &DebugFleet{LiveNodes: 1, Enforcers: []DebugEnforcer{{ID: e.NodeID(), Self: true, PolicyVersion: p.Version(), Mode: b.Mode.String(), Degraded: &degraded}}}
	}

	for _, s := range e.UpstreamStatus() {
		up := uiUpstream{Name: s.Name, Phase: s.Phase, Confidence: s.Confidence, Capacity: s.Capacity, PlanSeq: s.PlanSeq, Classes: s.Classes[:],
			Bar: uiBarSpec{Width: 120, Scale: 1, Admitted: s.Confidence, Share: math.NaN(), Floor: math.NaN()}}
		v.Upstrms = append(v.Upstrms, up)
	}
	return v
}

// rate takes this view's counters as the next baseline when the last is
// at least uiMinInterval old, and returns the rates over the last two
// baselines and their interval in seconds (none and 0 before there are
// two).
func (u *ui) rate(now time.Time, load enforcer.LoadStatus) (uiCounters, float64) {
	cur := uiCounters{at: now, tiers: map[string]float64{}, tenants: map[string]float64{}, denied: map[enforcer.Level]float64{}}
	for _, t := range load.Tiers {
		cur.tiers[t.Name] = float64(t.AdmittedCost)
	}
	for _, t := range load.Top {
		cur.tenants[t.Tenant] = float64(t.AdmittedCost)
	}
	for l, n := range load.Denied {
		cur.denied[l] = float64(n)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.prev.at.IsZero() {
		u.prev = cur
		return uiCounters{}, 0
	}
	if dt := now.Sub(u.prev.at); dt >= uiMinInterval {
		s := dt.Seconds()
		per := func(cur, prev map[string]float64) map[string]float64 {
			out := make(map[string]float64, len(cur))
			for k, n := range cur {
				if p, ok := prev[k]; ok {
					out[k] = max(n-p, 0) / s // a forgotten and recreated state restarts its counters
				}
			}
			return out
		}
		u.rates = uiCounters{at: now, tiers: per(cur.tiers, u.prev.tiers), tenants: per(cur.tenants, u.prev.tenants), denied: map[enforcer.Level]float64{}}
		for l, n := range cur.denied {
			u.rates.denied[l] = max(n-u.prev.denied[l], 0) / s
		}
		u.prev, u.seconds = cur, s
	}
	return u.rates, u.seconds
}

// perSecond is a limit's refill rate in tokens per second.
func perSecond(l policy.Limit) float64 {
	if l.Period <= 0 {
		return 0
	}
	return float64(l.Rate) / l.Period.Seconds()
}

// limitString is l, shortest for the common per-second bucket.
func limitString(l *policy.Limit) string {
	switch {
	case l == nil:
		return "none"
	case l.Algorithm != policy.SlidingWindow && l.Rate > 0 && l.Period == time.Second:
		return fmt.Sprintf("%d/s, burst %d", l.Rate, l.Burst)
	default:
		return l.String()
	}
}

// finite is f, or 0 for an infinite or NaN f.
func finite(f float64) float64 {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return 0
	}
	return f
}

// uiRate formats tokens (or requests) per second; NaN reads "–".
func uiRate(f float64) string {
	switch {
	case math.IsNaN(f):
		return "–"
	case math.IsInf(f, 1):
		return "∞"
	case f >= 100:
		return strconv.FormatFloat(f, 'f', 0, 64)
	default:
		return strconv.FormatFloat(f, 'f', 1, 64)
	}
}

// uiShare formats a fair share: "not contended" when shares are not in
// force, "fits" when the tier's whole demand fits.
func uiShare(contended bool, f float64) string {
	switch {
	case !contended:
		return "not contended"
	case math.IsInf(f, 1):
		return "fits"
	default:
		return uiRate(f)
	}
}

// uiBar draws b as an SVG b.Width × 14 pixels.
func uiBar(b uiBarSpec) template.HTML {
	width := cmp.Or(b.Width, uiBarWidth)
	x := func(f float64) float64 {
		if b.Scale <= 0 || math.IsNaN(f) || f <= 0 {
			return 0
		}
		return math.Round(min(f/b.Scale, 1)*float64(width)*10) / 10
	}
	var s bytes.Buffer
	fmt.Fprintf(&s, `<svg class="bar" width="%d" height="14" viewBox="0 0 %d 14" role="img">`, width, width)
	fmt.Fprintf(&s, `<rect width="%d" height="14" class="track"/>`, width)
	if w := x(b.Demand); w > 0 {
		fmt.Fprintf(&s, `<rect width="%g" height="14" class="demand"/>`, w)
	}
	if w := x(b.Admitted); w > 0 {
		fmt.Fprintf(&s, `<rect y="3" width="%g" height="8" class="admitted"/>`, w)
	}
	if !math.IsNaN(b.Floor) && b.Floor > 0 {
		fmt.Fprintf(&s, `<line x1="%g" x2="%g" y1="0" y2="14" class="floor"/>`, x(b.Floor), x(b.Floor))
	}
	if !math.IsNaN(b.Share) && !math.IsInf(b.Share, 0) && b.Share > 0 {
		fmt.Fprintf(&s, `<line x1="%g" x2="%g" y1="0" y2="14" class="share"/>`, x(b.Share), x(b.Share))
	}
	s.WriteString(`</svg>`)
	return template.HTML(s.String()) // numbers only: nothing to escape
}
