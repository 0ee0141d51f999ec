package server

import (
	"net/http"
	"sync/atomic"
)

// Deferred serves what it is given with Set; until then it answers like an
// enforcer that has no policy yet: /healthz is 200 (the process is alive),
// everything else 503 (not ready; retry on another instance). An enforcer
// that loads its policy from Redis listens at once with it, so that its
// probes and clients get answers while it waits for the first version.
type Deferred struct {
	h atomic.Pointer[http.Handler]
}

// Set makes h serve every request from now on.
func (d *Deferred) Set(h http.Handler) { d.h.Store(&h) }

func (d *Deferred) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if h := d.h.Load(); h != nil {
		(*h).ServeHTTP(w, r)
		return
	}
	if r.URL.Path == "/healthz" {
		writeJSON(w, http.StatusOK, struct {
			Status string `json:"status"`
		}{"ok"})
		return
	}
	writeError(w, http.StatusServiceUnavailable, "no policy loaded yet: the enforcer is waiting for its plane's first policy")
}
