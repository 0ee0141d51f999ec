package enforcer

import (
	"fmt"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
)

func newEngine(t testing.TB, p *policy.Policy, opts ...Option) *Engine {
	t.Helper()
	e, err := New(p, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// epoch is the virtual start of every test's timeline.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return epoch.Add(d) }

func mustDecide(t testing.TB, e *Engine, now time.Time, r Request) Decision {
	t.Helper()
	d, err := e.DecideAt(now, r)
	if err != nil {
		t.Fatalf("DecideAt(%v, %+v): %v", now.Sub(epoch), r, err)
	}
	return d
}

const planeHeader = `
apiVersion: quotaplane.io/v1alpha1
kind: QuotaPlane
metadata: {name: test}
spec:
`

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }

// realTime marks a test that spends its seconds waiting on real time (a
// load offered at a rate, an outage) more than on the CPU, on a Redis of
// its own: such tests run beside each other (t.Parallel: go test runs
// -parallel, GOMAXPROCS by default, of them at once, after every serial
// test has finished). Tests that count allocations, measure speed or
// use most of a core stay serial.
func realTime(t *testing.T) {
	t.Helper()
	t.Parallel()
}

// simulation marks a test that runs the engine on one goroutine in virtual
// time, with no loop of its own: the race detector has nothing to find
// there and makes it about ten times slower, so under -race it skips, and
// make test runs it without -race (the Makefile's SIMULATIONS, which it
// passes to the -race run as QUOTAPLANE_SIMULATIONS: a simulation that
// list does not name fails there instead of skipping unrun).
func simulation(t *testing.T) {
	t.Helper()
	if !raceDetector {
		return
	}
	if list := os.Getenv("QUOTAPLANE_SIMULATIONS"); list != "" && !regexp.MustCompile(list).MatchString(t.Name()) {
		t.Fatalf("%s skips itself under -race as a simulation, but the Makefile's SIMULATIONS (%s) does not run it without -race: add it there", t.Name(), list)
	}
	t.Skip("a single-goroutine simulation in virtual time: make test runs it without -race (SIMULATIONS)")
}
