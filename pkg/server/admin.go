package server

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/store"
)

// FleetReports reads what the plane's enforcers reported (store.Store).
type FleetReports interface {
	Enforcers(ctx context.Context) ([]store.EnforcerReport, error)
}

// AdminOption configures NewAdmin.
type AdminOption func(*adminConfig)

type adminConfig struct {
	fleet FleetReports
}

// WithFleet has /quota/debug show the fleet, in the distributed modes, from
// the enforcers' reports in Redis (reload.Loader.Report writes them).
func WithFleet(f FleetReports) AdminOption { return func(c *adminConfig) { c.fleet = f } }

// debugReadTimeout bounds the Redis reads of one /quota/debug.
const debugReadTimeout = 2 * time.Second

// NewAdmin returns the handler of the admin listener, which operators and
// probes use and which must not face clients: GET /healthz (the process
// serves), GET /readyz (ready reports a good policy loaded), GET /metrics
// (Prometheus), GET /quota/debug?tenant=X (the tenant's live state and,
// in the distributed modes, the fleet's), GET /quota/ui (the live view
// of the plane, HTML: ui.go) and /debug/pprof/ (Go's profiles: the soak
// diffs heap profiles taken an hour apart).
func NewAdmin(e *enforcer.Engine, m *Metrics, ready func() bool, opts ...AdminOption) http.Handler {
	var cfg adminConfig
	for _, o := range opts {
		o(&cfg)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, struct {
			Status string `json:"status"`
		}{"ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready() {
			writeError(w, http.StatusServiceUnavailable, "no policy loaded yet")
			return
		}
		writeJSON(w, http.StatusOK, struct {
			Status        string `json:"status"`
			PolicyVersion int64  `json:"policyVersion"`
		}{"ready", e.Policy().Version()})
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /quota/debug", func(w http.ResponseWriter, r *http.Request) { debug(w, r, e, &cfg) })
	mux.Handle("GET /quota/ui", newUI(e, &cfg))      // the live view (ui.go)
	mux.HandleFunc("GET /debug/pprof/", pprof.Index) // heap, goroutine, allocs, ... by name
	mux.HandleFunc("GET /debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("GET /debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such path %q: the admin listener serves GET /healthz, /readyz, /metrics, /quota/debug?tenant=X, /quota/ui and /debug/pprof/", r.URL.Path))
	})
	return mux
}

// DebugView is the JSON of GET /quota/debug?tenant=X (quotactl explain reads it: pkg/explain).
type DebugView struct {
	Tenant        string           `json:"tenant"`
	Known         bool             `json:"known"`
	Tier          string           `json:"tier"`
	Weight        int64            `json:"weight"`
	MayBorrow     bool             `json:"mayBorrow"`
	Limits        []DebugLimit     `json:"limits"`
	BorrowDebt    int64            `json:"borrowDebt"`
	DemandPerSec  float64          `json:"demandPerSecond"`
	FairShare     *float64         `json:"fairSharePerSecond,omitempty"` // absent when not contended or unpaced
	Admitted      int64            `json:"admitted"`
	Denied        map[string]int64 `json:"denied"`
	Borrowed      int64            `json:"borrowed"`
	PolicyVersion int64            `json:"policyVersion"`
	Backend       string           `json:"backend"`
	Degraded      bool             `json:"degraded"`
	// LimitsNote says whose state the limits' remaining tokens are.
	LimitsNote string `json:"limitsNote"`
	// LimitsReadAt is the Redis TIME the limits were read at, in mode
	// central.
	LimitsReadAt *time.Time      `json:"limitsReadAt,omitempty"`
	Recent       []DebugDecision `json:"recentDecisions"`
	// Fleet is the plane's enforcers, in the distributed modes.
	Fleet *DebugFleet `json:"fleet,omitempty"`
	// Upstreams are the tenant's priority class on each upstream of the
	// plan in force (seed 004), and why.
	Upstreams []DebugUpstream `json:"upstreams,omitempty"`
}

// DebugUpstream is a tenant's class on one upstream.
type DebugUpstream struct {
	Upstream   string  `json:"upstream"`
	Phase      string  `json:"phase"`
	Confidence float64 `json:"confidence"`
	Class      string  `json:"class"`
	Score      float64 `json:"score,omitempty"`
	// AllocationPerSec is the class's fleet-wide share of the upstream
	// while it is degraded.
	AllocationPerSec float64 `json:"allocationPerSecond,omitempty"`
	Why              string  `json:"why"`
}

// DebugFleet is the plane's enforcers as their reports in Redis say.
type DebugFleet struct {
	// LiveNodes counts the nodes whose heartbeats are live, as this node
	// last heard (it sizes each node's share of the limits).
	LiveNodes int64           `json:"liveNodes"`
	Enforcers []DebugEnforcer `json:"enforcers"`
	// Error says why the reports could not be read; the list then holds
	// this enforcer alone.
	Error string `json:"error,omitempty"`
}

// DebugEnforcer is one enforcer of DebugFleet.
type DebugEnforcer struct {
	ID string `json:"id"`
	// Self marks the enforcer that answers; its entry is its state now,
	// and Reported says whether Redis holds its report.
	Self            bool    `json:"self,omitempty"`
	Reported        bool    `json:"reported"`
	PolicyVersion   int64   `json:"policyVersion"`
	Mode            string  `json:"mode,omitempty"`     // absent: an enforcer too old to report it
	Degraded        *bool   `json:"degraded,omitempty"` // absent when not reported
	DecisionsPerSec float64 `json:"decisionsPerSecond"`
	// ReportUntil is when the report lapses unless renewed.
	ReportUntil *time.Time `json:"reportUntil,omitempty"`
}

// DebugLimit is one level's limit and what remains of it, in tokens.
type DebugLimit struct {
	Level     string `json:"level"`
	Name      string `json:"name,omitempty"`
	Limit     string `json:"limit"`
	Remaining int64  `json:"remaining"`
}

// DebugDecision is one of the tenant's recent decisions, newest first, or
// Count admitted ones alike in a row (same endpoint, key, cost and loan),
// the last at At.
type DebugDecision struct {
	At       time.Time `json:"at"`
	Count    int64     `json:"count"`
	Endpoint string    `json:"endpoint,omitempty"`
	KeyHash  string    `json:"keyHash,omitempty"` // the api key's short hash, never the key
	Cost     int64     `json:"cost"`
	Borrowed int64     `json:"borrowed,omitempty"`
	Allowed  bool      `json:"allowed"`
	Level    string    `json:"level,omitempty"`
	Reason   string    `json:"reason,omitempty"`
}

func debug(w http.ResponseWriter, r *http.Request, e *enforcer.Engine, cfg *adminConfig) {
	name := r.URL.Query().Get("tenant")
	switch {
	case name == "":
		writeError(w, http.StatusBadRequest, "missing query parameter tenant: GET /quota/debug?tenant=X")
		return
	case !policy.ValidName(name):
		writeError(w, http.StatusBadRequest, fmt.Sprintf("tenant must be 1 to %d printable ASCII characters without spaces", policy.MaxNameBytes))
		return
	}
	now := time.Now()
	b := e.BackendStatus()
	s, ok := e.TenantStatusAt(now, name)
	if !ok && b.Mode == policy.ModeCentral && !b.Degraded {
		// The fleet's state is in Redis, whichever enforcer decided.
		p := e.Policy()
		t, known := p.Tenant(name)
		if !known {
			t, ok = p.DefaultTenant(name, "")
		}
		ok = ok || known
		s = enforcer.TenantStatus{Tenant: name, Known: known, Tier: t.Tier, Weight: t.Weight, MayBorrow: p.MayBorrow(&t), PolicyVersion: p.Version()}
	}
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no state for tenant %q on this enforcer: it has not sent a request here since its state was last forgotten", name))
		return
	}
	v := DebugView{
		Tenant: s.Tenant, Known: s.Known, Tier: s.Tier, Weight: s.Weight, MayBorrow: s.MayBorrow,
		BorrowDebt: s.Debt, DemandPerSec: s.Demand, Admitted: s.Admitted, Borrowed: s.Borrowed,
		Denied: map[string]int64{}, PolicyVersion: s.PolicyVersion, Backend: b.Mode.String(), Degraded: b.Degraded,
		Limits: []DebugLimit{}, Recent: []DebugDecision{},
	}
	ctx, cancel := context.WithTimeout(r.Context(), debugReadTimeout)
	defer cancel()
	var redisErr error
	if b.Mode == policy.ModeCentral && !b.Degraded {
		// Redis holds the state; this node's own is idle until Redis fails.
		var st enforcer.RedisStatus
		if st, redisErr = e.RedisStatusOf(ctx, name); redisErr == nil {
			v.LimitsNote = "mode central: the fleet's state in Redis, read without changing it; counters and recent decisions are this enforcer's"
			v.LimitsReadAt = &st.At
			v.Limits = append(v.Limits, DebugLimit{Level: string(enforcer.LevelGlobal), Limit: st.Global.Limit.String(), Remaining: st.Global.Remaining})
			for _, l := range st.Limits {
				v.Limits = append(v.Limits, DebugLimit{Level: string(l.Level), Name: l.Name, Limit: l.Limit.String(), Remaining: l.Remaining})
			}
			if st.Pool != nil {
				v.Limits = append(v.Limits, DebugLimit{Level: "burstPool", Limit: st.Pool.Limit.String(), Remaining: st.Pool.Remaining})
			}
			if st.Allowance != nil {
				v.Limits = append(v.Limits, DebugLimit{Level: "borrowAllowance", Limit: st.Allowance.Limit.String(), Remaining: st.Allowance.Remaining})
				v.BorrowDebt = st.Allowance.Limit.Burst - st.Allowance.Remaining
			}
		}
	}
	switch {
	case b.Mode == policy.ModeCentral && !b.Degraded && redisErr == nil:
	case b.Mode == policy.ModeCentral && !b.Degraded:
		v.LimitsNote = "mode central: the fleet's state in Redis could not be read (" + redisErr.Error() + "); counters and recent decisions are this enforcer's"
	default:
		v.LimitsNote = "this enforcer's state"
		if b.Mode != policy.ModeLocal {
			v.LimitsNote = "this enforcer's share of the plane (" + b.Mode.String() + ")"
		}
		plane := e.PlaneStatusAt(now)
		v.Limits = append(v.Limits, DebugLimit{Level: string(enforcer.LevelGlobal), Limit: plane.Global.Limit.String(), Remaining: plane.Global.Remaining})
		for _, l := range s.Limits {
			v.Limits = append(v.Limits, DebugLimit{Level: string(l.Level), Name: l.Name, Limit: l.Limit.String(), Remaining: l.Remaining})
		}
	}
	if s.FairShare > 0 && !math.IsInf(s.FairShare, 0) && !math.IsNaN(s.FairShare) {
		share := s.FairShare
		v.FairShare = &share
	}
	for l, n := range s.Denied {
		v.Denied[string(l)] = n
	}
	for _, t := range s.Trace {
		v.Recent = append(v.Recent, DebugDecision{At: t.At, Count: t.Count, Endpoint: t.Endpoint, KeyHash: t.KeyHash, Cost: t.Cost, Borrowed: t.Borrowed,
			Allowed: t.Allow, Level: string(t.Level), Reason: t.Reason})
	}
	if b.Mode != policy.ModeLocal {
		v.Fleet = fleetView(ctx, e, b, cfg.fleet)
	}
	v.Upstreams = upstreamsView(e, s.Tenant, s.Tier)
	writeJSON(w, http.StatusOK, v)
}

// fleetView is the plane's enforcers from their reports, with this one's
// state now in its own entry (listed also when Redis holds no report of it:
// a degraded enforcer may not reach Redis to report).
func fleetView(ctx context.Context, e *enforcer.Engine, b enforcer.BackendStatus, reports FleetReports) *DebugFleet {
	f := &DebugFleet{LiveNodes: b.Nodes, Enforcers: []DebugEnforcer{}}
	var live []store.EnforcerReport
	var err error
	if reports == nil {
		err = fmt.Errorf("this enforcer does not read the fleet's reports: it loads its policy from files, not from the plane's Redis store")
	} else {
		live, err = reports.Enforcers(ctx)
	}
	if err != nil {
		f.Error = err.Error()
	}
	degraded := b.Degraded
	self := DebugEnforcer{ID: e.NodeID(), Self: true, PolicyVersion: e.Policy().Version(), Mode: b.Mode.String(), Degraded: &degraded}
	for _, r := range live {
		if r.ID == e.NodeID() {
			self.Reported, self.DecisionsPerSec = true, r.DecisionsPerSec
			until := r.Until
			self.ReportUntil = &until
			f.Enforcers = append(f.Enforcers, self)
			continue
		}
		entry := DebugEnforcer{ID: r.ID, Reported: true, PolicyVersion: r.PolicyVersion, Mode: r.Mode, DecisionsPerSec: r.DecisionsPerSec}
		until := r.Until
		entry.ReportUntil = &until
		if r.Mode != "" {
			d := r.Degraded
			entry.Degraded = &d
		}
		f.Enforcers = append(f.Enforcers, entry)
	}
	if !self.Reported {
		f.Enforcers = append(f.Enforcers, self)
	}
	return f
}

// upstreamsView is the tenant's class on every upstream of the plan in
// force, and why.
func upstreamsView(e *enforcer.Engine, tenant, tier string) []DebugUpstream {
	var out []DebugUpstream
	for _, tu := range e.TenantUpstreams(tenant, tier) {
		out = append(out, DebugUpstream{Upstream: tu.Upstream, Phase: tu.Phase, Confidence: tu.Confidence, Class: tu.Class,
			Score: tu.Score, AllocationPerSec: tu.Allocation, Why: tu.Why})
	}
	return out
}
