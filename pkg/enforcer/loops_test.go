package enforcer

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// runningLoops counts the goroutines running each mode loop.
func runningLoops() map[string]int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	counts := map[string]int{}
	for _, g := range strings.Split(string(buf), "\n\n") {
		for _, loop := range []string{"(*central).heartbeatLoop", "(*central).fairLoop", "(*central).rebalanceLoop", "(*reconciler).loop"} {
			if strings.Contains(g, loop) {
				counts[loop]++
			}
		}
	}
	return counts
}

// TestModeLoopsRunOnlyInTheirMode: an engine with Redis runs the loops of
// the plane's mode and no other's, switches them with the mode, leaves the
// fleet at once when it leaves a distributed mode, and stops them on
// Close for good. Before, every loop ran (idle) in every mode.
func TestModeLoopsRunOnlyInTheirMode(t *testing.T) {
	srv := redistest.Start(t)
	plane := func(mode string) string {
		return withMode(planeHeader, mode) + `  global: {rate: 1000, burst: 1000}
  tiers: [{name: std, weight: 1}]
`
	}
	before := runningLoops()
	// A loop's goroutine shows its function once it has run: poll.
	want := func(step string, heartbeat, reconcile int) {
		t.Helper()
		wanted := map[string]int{"(*central).heartbeatLoop": heartbeat, "(*central).fairLoop": heartbeat, "(*central).rebalanceLoop": heartbeat, "(*reconciler).loop": reconcile}
		poll.Until(t, 5*time.Second, step+": the mode's loops "+fmt.Sprint(wanted)+" and no others", func() bool {
			got := runningLoops()
			for loop, n := range wanted {
				if got[loop]-before[loop] != n {
					return false
				}
			}
			return true
		})
	}
	e := newEngine(t, policytest.Compile(t, plane("local")), WithRedis(srv.Client()), WithNodeID("n1"), withHeartbeatInterval(20*time.Millisecond))
	nodes := "qp:{" + e.Policy().ID() + "}:nodes"
	member := func() bool {
		_, err := srv.Client().ZScore(t.Context(), nodes, "n1").Result()
		return err == nil
	}
	want("local", 0, 0)

	if err := e.SetPolicy(policytest.Compile(t, plane("central"))); err != nil {
		t.Fatal(err)
	}
	want("central", 1, 0)
	poll.Until(t, 5*time.Second, "the node to beat in the fleet", member)

	if err := e.SetPolicy(policytest.Compile(t, plane("local-reconciled"))); err != nil {
		t.Fatal(err)
	}
	want("local-reconciled", 0, 1)
	if !member() {
		t.Error("local-reconciled: the node is not in the fleet right after the switch")
	}

	if err := e.SetPolicy(policytest.Compile(t, plane("local"))); err != nil {
		t.Fatal(err)
	}
	want("local again", 0, 0)
	if member() {
		t.Error("local again: the node is still in the fleet it left")
	}

	if err := e.SetPolicy(policytest.Compile(t, plane("central"))); err != nil {
		t.Fatal(err)
	}
	want("central again", 1, 0)
	e.Close()
	want("closed", 0, 0)
	// A policy that comes in after Close (a reload racing the shutdown)
	// starts nothing that nothing would stop.
	_ = e.SetPolicy(policytest.Compile(t, plane("local-reconciled")))
	l := &e.central.loops
	l.mu.Lock()
	running := l.running
	l.mu.Unlock()
	if running {
		t.Error("a policy set after Close started the mode's loops again")
	}
	want("a policy after Close", 0, 0)
}
