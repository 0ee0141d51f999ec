package enforcer

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// syncBuffer is a log sink that tests read while the engine writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestReconciledFailureMode: in local-reconciled mode, a Redis that stops
// answering makes the node degraded after three failed reconciles —
// BackendStatus says so, a warning is logged — and the plane's failureMode
// decides meanwhile: deny denies at the global level, allow admits past
// every limit, degrade goes on at the node's parts. When Redis is back the
// next reconcile ends it, logged too. Before, failureMode was ignored in
// this mode and nothing told an operator.
func TestReconciledFailureMode(t *testing.T) {
	for _, mode := range []string{"deny", "allow", "degrade"} {
		t.Run(mode, func(t *testing.T) {
			srv := redistest.Start(t)
			const interval = 50 * time.Millisecond
			doc := withMode(planeHeader, "local-reconciled", "reconcileInterval: "+interval.String(), "failureMode: "+mode)
			p := policytest.Compile(t, doc+"  global: {rate: 1000, burst: 1000}\n  fairness: none\n  tiers: [{name: t, weight: 1, tenant: {rate: 5, burst: 5, period: 1h}}]\n")
			var logs syncBuffer
			e := newEngine(t, p, WithRedis(srv.Client()), WithNodeID("n0"), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			decide := func() Decision {
				d, err := e.Decide(context.Background(), Request{Tenant: "a"})
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			for range 5 {
				if d := decide(); !d.Allow {
					t.Fatalf("denied within the limit before the outage: %+v", d)
				}
			}
			if d := decide(); d.Allow {
				t.Fatal("admitted past the tenant limit of 5 before the outage")
			}

			srv.Stop()
			poll.Until(t, 5*time.Second, "the node to say it is degraded", func() bool { return e.BackendStatus().Degraded })
			poll.Until(t, 5*time.Second, "a warning naming the failureMode", func() bool {
				return strings.Contains(logs.String(), "quota store unavailable") && strings.Contains(logs.String(), "failureMode="+mode)
			})
			d := decide()
			switch mode {
			case "deny":
				if d.Allow || d.Level != LevelGlobal || d.Reason != reasonUnavailableDeny || d.RetryAfter <= 0 {
					t.Errorf("failureMode deny: %+v, want a denial at global saying the store is unavailable", d)
				}
			case "allow":
				if !d.Allow {
					t.Errorf("failureMode allow denied while degraded: %+v", d)
				}
			case "degrade":
				if d.Allow || d.Level != LevelTenant {
					t.Errorf("failureMode degrade: %+v, want the tenant's own limit still enforced", d)
				}
			}
			if fb := e.BackendStatus().Fallbacks; (mode == "degrade") != (fb == 0) {
				t.Errorf("fallbacks %d in failureMode %s", fb, mode)
			}

			srv.Restart()
			poll.Until(t, 5*time.Second, "the node to leave degraded operation", func() bool { return !e.BackendStatus().Degraded })
			poll.Until(t, 5*time.Second, "a log line saying the store is back", func() bool { return strings.Contains(logs.String(), "quota store back") })
		})
	}
}

// TestCentralDegradedIsLogged: central mode logs entering degraded
// operation (the breaker opens) and leaving it (the breaker closes after
// the recovery), as local-reconciled does.
func TestCentralDegradedIsLogged(t *testing.T) {
	srv := redistest.Start(t)
	p := policytest.Compile(t, withMode(planeHeader, "central")+"  global: {rate: 1000, burst: 1000}\n  tiers: [{name: t, weight: 1}]\n")
	var logs syncBuffer
	e := newEngine(t, p, WithRedis(srv.Client()), WithNodeID("n0"), withBreakerCooldown(50*time.Millisecond),
		WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	decide := func() {
		if _, err := e.Decide(context.Background(), Request{Tenant: "a"}); err != nil {
			t.Fatal(err)
		}
	}
	decide()
	srv.Stop()
	poll.Until(t, 5*time.Second, "the breaker to open", func() bool { decide(); return e.BackendStatus().Degraded })
	poll.Until(t, 5*time.Second, "a warning", func() bool { return strings.Contains(logs.String(), "quota store unavailable") })
	srv.Restart()
	poll.Until(t, 5*time.Second, "the breaker to close", func() bool { decide(); return !e.BackendStatus().Degraded })
	poll.Until(t, 5*time.Second, "a log line saying the store is back", func() bool { return strings.Contains(logs.String(), "quota store back") })
	if n := strings.Count(logs.String(), "quota store unavailable"); n != 1 {
		t.Errorf("%d warnings for one outage; log:\n%s", n, logs.String())
	}
}
