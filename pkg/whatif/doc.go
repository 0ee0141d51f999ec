// Package whatif answers a reviewer's questions about a policy change
// before it merges, offline: what it changes (Diff, level by level and
// tenants by tier) and what it would do to a load (Simulate: a load
// profile replayed in virtual time against the baseline and the new
// policy with the real engine). cmd/quotactl prints its reports as tables,
// JSON or Markdown (pkg/report).
//
// Decisions:
//
//   - One compiler: both sides are compiled by pkg/policy (LoadPath), so a
//     change that does not compile is reported as the manager would.
//   - One load generator: Simulate runs pkg/load's virtual-time run (one
//     stream, DecideAt at each scheduled instant, the engine's clock pinned
//     to load.Epoch) on a one-node fleet in mode local, exactly as `load
//     -virtual -policy DIR` does, so its numbers are that command's to the
//     request. Fair shares are pkg/load's (FairShares, the pkg/fairref
//     reference), not a second model.
//   - Both policies see the same requests in the same order: the profile and
//     its seed fix them, so every difference is the policy's.
//   - A distributed plane (central, local-reconciled) is simulated in mode
//     local: one enforcer deciding the whole plane, which is what the fleet
//     enforces as a whole without the reconcile error; the report says so.
package whatif
