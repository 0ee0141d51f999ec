package server

import (
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
)

// NewAdmin returns the handler of the admin listener, which operators and
// probes use and which must not face clients: GET /healthz (the process
// serves), GET /readyz (ready reports a good policy loaded), GET /metrics
// (Prometheus) and GET /quota/debug?tenant=X (the tenant's live state).
func NewAdmin(e *enforcer.Engine, m *Metrics, ready func() bool) http.Handler {
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
	mux.HandleFunc("GET /quota/debug", func(w http.ResponseWriter, r *http.Request) { debug(w, r, e) })
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no such path %q: the admin listener serves GET /healthz, /readyz, /metrics and /quota/debug?tenant=X", r.URL.Path))
	})
	return mux
}

// debugView is the JSON of GET /quota/debug.
type debugView struct {
	Tenant        string           `json:"tenant"`
	Known         bool             `json:"known"`
	Tier          string           `json:"tier"`
	Weight        int64            `json:"weight"`
	MayBorrow     bool             `json:"mayBorrow"`
	Limits        []debugLimit     `json:"limits"`
	BorrowDebt    int64            `json:"borrowDebt"`
	DemandPerSec  float64          `json:"demandPerSecond"`
	FairShare     *float64         `json:"fairSharePerSecond,omitempty"` // absent when not contended or unpaced
	Admitted      int64            `json:"admitted"`
	Denied        map[string]int64 `json:"denied"`
	Borrowed      int64            `json:"borrowed"`
	PolicyVersion int64            `json:"policyVersion"`
	Backend       string           `json:"backend"`
	Degraded      bool             `json:"degraded"`
	// LimitsNote says whose state the limits\' remaining tokens are.
	LimitsNote string       `json:"limitsNote"`
	Recent     []debugEntry `json:"recentDecisions"`
}

type debugLimit struct {
	Level     string `json:"level"`
	Name      string `json:"name,omitempty"`
	Limit     string `json:"limit"`
	Remaining int64  `json:"remaining"`
}

type debugEntry struct {
	At       time.Time `json:"at"`
	Endpoint string    `json:"endpoint,omitempty"`
	KeyHash  string    `json:"keyHash,omitempty"` // the api key's short hash, never the key
	Cost     int64     `json:"cost"`
	Borrowed int64     `json:"borrowed,omitempty"`
	Allowed  bool      `json:"allowed"`
	Level    string    `json:"level,omitempty"`
	Reason   string    `json:"reason,omitempty"`
}

func debug(w http.ResponseWriter, r *http.Request, e *enforcer.Engine) {
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
	s, ok := e.TenantStatusAt(now, name)
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no state for tenant %q on this enforcer: it has not sent a request here since its state was last forgotten", name))
		return
	}
	b := e.BackendStatus()
	v := debugView{
		Tenant: s.Tenant, Known: s.Known, Tier: s.Tier, Weight: s.Weight, MayBorrow: s.MayBorrow,
		BorrowDebt: s.Debt, DemandPerSec: s.Demand, Admitted: s.Admitted, Borrowed: s.Borrowed,
		Denied: map[string]int64{}, PolicyVersion: s.PolicyVersion, Backend: b.Mode, Degraded: b.Degraded,
		Limits: []debugLimit{}, Recent: []debugEntry{},
	}
	switch {
	case b.Mode == "central" && !b.Degraded:
		// Redis holds the state; this node's own is idle until Redis fails.
		v.LimitsNote = "mode central: the limits' state is in Redis and not shown here; counters and recent decisions are this enforcer's"
	default:
		v.LimitsNote = "this enforcer's state"
		if b.Mode != "local" {
			v.LimitsNote = "this enforcer's share of the plane (" + b.Mode + ")"
		}
		plane := e.PlaneStatusAt(now)
		v.Limits = append(v.Limits, debugLimit{Level: string(enforcer.LevelGlobal), Limit: plane.Global.Limit.String(), Remaining: plane.Global.Remaining})
		for _, l := range s.Limits {
			v.Limits = append(v.Limits, debugLimit{Level: string(l.Level), Name: l.Name, Limit: l.Limit.String(), Remaining: l.Remaining})
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
		v.Recent = append(v.Recent, debugEntry{At: t.At, Endpoint: t.Endpoint, KeyHash: t.KeyHash, Cost: t.Cost, Borrowed: t.Borrowed,
			Allowed: t.Allow, Level: string(t.Level), Reason: t.Reason})
	}
	writeJSON(w, http.StatusOK, v)
}
