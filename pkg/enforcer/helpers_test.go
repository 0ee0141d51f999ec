package enforcer

import (
	"fmt"
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
