package enforcer

// For the tests of package enforcer_test, which may import packages that
// import this one (pkg/load).

// WithSteppedReconcile is withSteppedReconcile (sim.go).
var WithSteppedReconcile = withSteppedReconcile

// StepReconcile is stepReconcile (sim.go).
func (e *Engine) StepReconcile() { e.stepReconcile() }

// ProcStatusMB is procStatusMB (memory_bench_test.go).
var ProcStatusMB = procStatusMB

// Reshares is how many times the engine installed a new share of the plane
// (local-reconciled; each moves every tenant's state).
func (e *Engine) Reshares() int64 { return e.reconciler.stats.reshares.Load() }
