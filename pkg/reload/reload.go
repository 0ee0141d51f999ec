// Package reload keeps an engine on the newest good policy from its source:
// a directory of quota YAML files (the enforcer's file mode, or a mounted
// ConfigMap) or the policy store in Redis. Every load is validated in full
// (the same Compile or Decode as everywhere; from a store with a verifier,
// its signature first); a bad one is counted (result "error", or
// "unverified" for a signature that does not verify or a signed version
// older than the one in force, a replay) and logged and the
// last good policy stays in force; a good one is swapped in
// atomically by the engine, which carries the state of every tenant,
// endpoint and key that still exists.
package reload

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/store"
)

// Loader applies policies to an engine and counts the outcomes.
type Loader struct {
	engine    *enforcer.Engine
	overrides policy.Overrides
	loads     *prometheus.CounterVec // by result: ok, error
	log       *slog.Logger
	ready     atomic.Bool
	applied   chan struct{} // nudges Report when a new version is in force

	mu         sync.Mutex
	lastSource string // hash of the last source policy applied
	version    int64  // the last version applied
}

// New returns a loader for e, which applies overrides to every policy it
// loads (the enforcer's flags); loads counts the outcomes by result ("ok",
// "error", "unverified"). loaded is the source policy the engine started with, or nil when
// it started on a stand-in (not ready until the source's first policy).
func New(e *enforcer.Engine, o policy.Overrides, loads *prometheus.CounterVec, log *slog.Logger, loaded *policy.Policy) *Loader {
	l := &Loader{engine: e, overrides: o, loads: loads, log: log, applied: make(chan struct{}, 1)}
	if loaded != nil {
		l.lastSource, l.version = loaded.Hash(), loaded.Version()
		l.ready.Store(true)
	}
	return l
}

// Ready reports whether a good policy from the source is in force.
func (l *Loader) Ready() bool { return l.ready.Load() }

// Apply puts source policy p in force, with the overrides, unless it is
// the version last applied (its content and its number), and reports
// whether it did. The same content as a new version is put in force too:
// the manager republishes what Redis lost (a restart without persistence)
// as a version above the last, and the enforcer must report that version,
// or the plane shows it lagging until the next edit. A swap to the same
// content keeps every bucket.
func (l *Loader) Apply(p *policy.Policy) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.Hash() == l.lastSource && p.Version() == l.version && l.ready.Load() {
		return false, nil
	}
	q, err := p.Override(l.overrides)
	if err == nil {
		err = l.engine.SetPolicy(q)
	}
	if err != nil {
		l.failed(err)
		return false, err
	}
	l.lastSource, l.version = p.Hash(), p.Version()
	l.ready.Store(true)
	l.loads.WithLabelValues("ok").Inc()
	select {
	case l.applied <- struct{}{}:
	default:
	}
	// The mode in force, the overrides applied: what the enforcer does.
	l.log.Info("policy loaded", "plane", p.ID(), "version", p.Version(), "hash", p.Hash()[:12], "mode", q.Spec().Mode)
	return true, nil
}

func (l *Loader) failed(err error) {
	switch {
	case errors.Is(err, store.ErrUnverified):
		l.loads.WithLabelValues("unverified").Inc()
		l.log.Error("policy refused: its signature does not verify; the last good one stays in force", "err", err)
		return
	case errors.Is(err, store.ErrReplayed):
		// Counted with the forgeries: a version the manager signed but
		// does not publish now is not the manager's policy either.
		l.loads.WithLabelValues("unverified").Inc()
		l.log.Error("policy refused: older than the version in force (a replay?); the last good one stays in force", "err", err)
		return
	}
	l.loads.WithLabelValues("error").Inc()
	l.log.Error("policy not loaded; the last good one stays in force", "err", err)
}

// WatchDir reads dir when the file system says something in it changed
// (a watch) and every interval besides (a poll: watches miss events on some
// file systems, and a mounted ConfigMap changes by a symlink swap), until
// ctx ends, and applies what it compiles to, as the next version, when it
// changed. It reads the files afresh each time; a read or compile error
// leaves the policy in force.
func (l *Loader) WatchDir(ctx context.Context, dir string, every time.Duration) {
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	var changed <-chan fsnotify.Event
	if w, err := fsnotify.NewWatcher(); err != nil {
		l.log.Warn("no file watch; polling only", "dir", dir, "err", err)
	} else {
		defer w.Close()
		if err := w.Add(dir); err != nil {
			l.log.Warn("no file watch; polling only", "dir", dir, "err", err)
		} else {
			changed = w.Events
		}
	}
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		case <-changed:
			// An edit is often several events (write, chmod, the links of
			// a swap): read once they settle.
			settle := time.After(50 * time.Millisecond)
		drain:
			for {
				select {
				case <-changed:
				case <-settle:
					break drain
				case <-ctx.Done():
					return
				}
			}
		}
		p, err := policy.LoadDir(dir)
		if err != nil {
			if err.Error() != lastErr { // count every failure, log each once
				l.log.Error("policy not loaded; the last good one stays in force", "dir", dir, "err", err)
				l.loads.WithLabelValues("error").Inc()
			}
			lastErr = err.Error()
			continue
		}
		lastErr = ""
		l.mu.Lock()
		same, next := p.Hash() == l.lastSource, l.version+1
		l.mu.Unlock()
		if !same {
			_, _ = l.Apply(p.WithVersion(next))
		}
	}
}

// WatchStore follows the policy store until ctx ends: every version it
// delivers is applied (Decode has validated it, and the store's verifier, if
// any, its signature); the errors it reports are counted and logged: a
// version whose signature does not verify, or (with a verifier) one older
// than the version in force, as "unverified", the rest (a corrupt version,
// an unreachable Redis) as "error". The watch starts from the policy the
// loader started with, so an older version is refused from its first read.
func (l *Loader) WatchStore(ctx context.Context, s *store.Store) error {
	l.mu.Lock()
	inForce := store.InForce(l.version, l.lastSource) // none yet: version 0, nothing refused
	l.mu.Unlock()
	return s.Watch(ctx, func(p *policy.Policy) { _, _ = l.Apply(p) }, l.failed, inForce)
}

// Report tells the policy store, every interval and at once after each new
// version is applied, until ctx ends, which policy version this enforcer runs,
// its decisions per second (decisions counts them), its backend and whether
// it is degraded (enforcer.BackendStatus), so that the manager can show how
// many enforcers loaded a version and every enforcer's debug view the fleet.
// A report lapses after three intervals without renewal.
func (l *Loader) Report(ctx context.Context, s *store.Store, decisions func() int64, every time.Duration) {
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	last, lastAt := decisions(), time.Now()
	var rate float64 // over the last whole interval
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
			n, now := decisions(), time.Now()
			rate = float64(n-last) / now.Sub(lastAt).Seconds()
			last, lastAt = n, now
		case <-l.applied:
		}
		backend := l.engine.BackendStatus()
		r := store.EnforcerReport{ID: l.engine.NodeID(), PolicyVersion: l.engine.Policy().Version(), DecisionsPerSec: rate,
			Mode: backend.Mode.String(), Degraded: backend.Degraded}
		if err := s.ReportState(ctx, r, 3*every); err != nil && ctx.Err() == nil {
			l.log.Warn("enforcer report not sent", "err", err)
		}
	}
}
