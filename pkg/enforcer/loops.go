package enforcer

import (
	"sync"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

// modeLoops runs the background loops of the plane's mode, and only
// those: in mode central the heartbeat, the fairness exchange and the
// shard rebalancing; in local-reconciled the reconcile loop; in local
// none. A policy that changes the mode stops the old mode's loops (each
// leaves its fleet as it stops) and starts the new one's.
//
// Two things run whatever the mode, for the engine's life: central's
// batch workers, which wait on their queue and cost nothing until a
// decision comes (a decision that loaded the central snapshot just
// before a switch still gets its answer), and the upstream gate's
// exchange (gateLoop), which every mode applies.
type modeLoops struct {
	mu      sync.Mutex // serialises switches
	closed  bool       // runLoops(true) ran: no loop starts again
	running bool
	mode    policy.Mode
	stop    chan struct{}
	wg      sync.WaitGroup
}

// runLoops makes the running loops those of the mode in force; after Close
// (closing), none. It takes the mode when it runs, not the caller's, so
// that concurrent policy swaps settle on the last one's.
func (e *Engine) runLoops(closing bool) {
	b := e.central
	if b == nil {
		return
	}
	l := &b.loops
	l.mu.Lock()
	defer l.mu.Unlock()
	mode := e.policy.Load().Mode()
	if l.closed || l.running && !closing && mode == l.mode {
		return // closed: a SetPolicy racing Close must not start loops nothing stops
	}
	if l.running {
		close(l.stop)
		l.wg.Wait()
		l.running = false
	}
	l.closed = closing
	if closing || mode == policy.ModeLocal {
		return
	}
	b.fleet.reset()
	l.running, l.mode, l.stop = true, mode, make(chan struct{})
	stop := l.stop
	switch mode {
	case policy.ModeCentral:
		l.wg.Go(func() { b.heartbeatLoop(stop) })
		l.wg.Go(func() { b.fairLoop(stop) })
		l.wg.Go(func() { b.rebalanceLoop(stop) })
	case policy.ModeLocalReconciled:
		l.wg.Go(func() { e.reconciler.loop(stop) })
	}
}
