package enforcer

// Simulations in virtual time of a local-reconciled fleet (issue 15 §3:
// scale_sim_test.go runs 100 nodes in one process on one Redis).
//
// DecideAt takes its time as an argument; the reconcile loop does not: it
// runs every reconcileInterval of real time, at the engine's clock, and
// reconcile.lua reads Redis TIME. In virtual time both are wrong: the loop
// would reconcile at instants unrelated to the simulation's, and Redis
// would refill the fleet's buckets and expire nodes at its own pace. An
// engine made withSteppedReconcile starts none of the distributed
// backends' background loops (central.start: the reconcile loop, and the
// upstream exchange, which also runs every reconcileInterval of real time
// and which no simulated plane uses); the simulation calls
// stepReconcile at the virtual instants it chooses, with the engine's clock
// (WithClock) at that instant, and the script takes that time instead of
// TIME (its ARGV[12]), keeping its keys for at least an hour of Redis's
// time, so that liveness and expiry follow virtual time alone.

// withSteppedReconcile makes the caller run the engine's reconciles
// (stepReconcile) instead of the loop; give the engine a clock too. Only
// for mode local-reconciled: central's batches need the loops.
func withSteppedReconcile() Option { return func(e *Engine) { e.settings.steppedReconcile = true } }

// stepReconcile runs one reconcile of a local-reconciled engine at its
// clock's time.
func (e *Engine) stepReconcile() { e.reconciler.reconcile() }
