// Package poll is how quotaplane's tests wait: never a sleep, a condition
// polled at a short interval until it holds, the test failed with what it
// waited for when it does not in time.
package poll

import (
	"testing"
	"time"
)

// Interval is how often Until polls: short enough that a test waits little
// past the moment its condition holds.
const Interval = time.Millisecond

// Until polls cond every Interval until it holds; after timeout, or as soon
// as the test has failed elsewhere (a goroutine's Error), it fails t saying
// what it waited for.
func Until(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(Interval)
	defer tick.Stop()
	for !cond() {
		if t.Failed() || time.Now().After(deadline) {
			t.Fatalf("after %s: %s", timeout, what)
		}
		<-tick.C
	}
}
