package enforcer

// For the tests of package enforcer_test, which may import packages that
// import this one (pkg/load).

// WithSteppedReconcile is withSteppedReconcile (sim.go).
var WithSteppedReconcile = withSteppedReconcile

// StepReconcile is stepReconcile (sim.go).
func (e *Engine) StepReconcile() { e.stepReconcile() }

// ProcStatusMB is procStatusMB (memory_bench_test.go).
var ProcStatusMB = procStatusMB
