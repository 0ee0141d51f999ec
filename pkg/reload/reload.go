// Package reload keeps an engine on the newest good policy from its source:
// a directory of quota YAML files (the enforcer's file mode, or a mounted
// ConfigMap) or the policy store in Redis. Every load is validated in full
// (the same Compile or Decode as everywhere); a bad one is counted and
// logged and the last good policy stays in force; a good one is swapped in
// atomically by the engine, which carries the state of every tenant,
// endpoint and key that still exists.
package reload

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/store"
)

// Loader applies policies to an engine and counts the outcomes.
type Loader struct {
	engine *enforcer.Engine
	loads  *prometheus.CounterVec // by result: ok, error
	log    *slog.Logger
	ready  atomic.Bool
}

// New returns a loader for e; loads counts the outcomes by result ("ok",
// "error"). The engine's policy counts as loaded when ready is true (it
// came from the source itself).
func New(e *enforcer.Engine, loads *prometheus.CounterVec, log *slog.Logger, ready bool) *Loader {
	l := &Loader{engine: e, loads: loads, log: log}
	l.ready.Store(ready)
	return l
}

// Ready reports whether a good policy from the source is in force.
func (l *Loader) Ready() bool { return l.ready.Load() }

// Apply puts p in force when its content differs from the policy in force
// (versions aside) and reports whether it did.
func (l *Loader) Apply(p *policy.Policy) (bool, error) {
	current := l.engine.Policy()
	if p.Hash() == current.Hash() && l.ready.Load() {
		return false, nil
	}
	if err := l.engine.SetPolicy(p); err != nil {
		l.failed(err)
		return false, err
	}
	l.ready.Store(true)
	l.loads.WithLabelValues("ok").Inc()
	l.log.Info("policy loaded", "plane", p.ID(), "version", p.Version(), "hash", p.Hash()[:12], "mode", p.Spec().Mode)
	return true, nil
}

func (l *Loader) failed(err error) {
	l.loads.WithLabelValues("error").Inc()
	l.log.Error("policy not loaded; the last good one stays in force", "err", err)
}

// WatchDir reads dir every interval until ctx ends and applies what it
// compiles to, as the next version, when it changed. It reads the files
// afresh each time, so it follows edits and the symlink swap of a mounted
// ConfigMap alike; a read or compile error leaves the policy in force.
func (l *Loader) WatchDir(ctx context.Context, dir string, every time.Duration) {
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
		p, err := policy.LoadDir(dir)
		if err != nil {
			if err.Error() != lastErr { // count every failure, log each once
				l.log.Error("policy not loaded; the last good one stays in force", "dir", dir, "err", err)
			}
			l.loads.WithLabelValues("error").Inc()
			lastErr = err.Error()
			continue
		}
		lastErr = ""
		if p.Hash() == l.engine.Policy().Hash() {
			continue
		}
		_, _ = l.Apply(p.WithVersion(l.engine.Policy().Version() + 1))
	}
}

// WatchStore follows the policy store until ctx ends: every version it
// delivers is applied (Decode has validated it); the errors it reports (a
// corrupt version, an unreachable Redis) are counted as failed loads and
// logged.
func (l *Loader) WatchStore(ctx context.Context, s *store.Store) error {
	return s.Watch(ctx, func(p *policy.Policy) { _, _ = l.Apply(p) }, l.failed)
}
