package enforcer

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// TestRedisErrorsAreAnOutage: a Redis that answers every call with an
// error (a wrong password, a read-only replica, out of memory) is an
// outage, in both distributed modes: the node says it is degraded, logs
// it, and enforces its share of every limit among the fleet the plane
// asks for (minReplicas: 2), never the whole limit. Before, a central node
// took such answers for one bad batch's: it never reported itself
// degraded, and, its heartbeats failing too, counted itself alone and
// admitted the whole limit.
func TestRedisErrorsAreAnOutage(t *testing.T) {
	faults := map[string]func(t *testing.T, srv *redistest.Server) redis.UniversalClient{
		"wrong password": func(t *testing.T, srv *redistest.Server) redis.UniversalClient {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, Password: "not-the-password", ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = c.Close() })
			return c
		},
		"read-only replica": func(t *testing.T, srv *redistest.Server) redis.UniversalClient {
			if err := srv.Client().Do(context.Background(), "REPLICAOF", "127.0.0.1", "1").Err(); err != nil {
				t.Fatal(err)
			}
			return srv.Client()
		},
		"out of memory": func(t *testing.T, srv *redistest.Server) redis.UniversalClient {
			c := srv.Client()
			for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "1"}} {
				if err := c.ConfigSet(context.Background(), kv[0], kv[1]).Err(); err != nil {
					t.Fatal(err)
				}
			}
			return c
		},
	}
	for _, mode := range []string{"central", "local-reconciled"} {
		for name, fault := range faults {
			t.Run(mode+"/"+name, func(t *testing.T) {
				srv := redistest.Start(t, "--requirepass", "the-password")
				client := fault(t, srv)
				p := policytest.Compile(t, withMode(planeHeader, mode)+`  global: {rate: 0, burst: 100}
  tiers: [{name: t, weight: 1}]
  enforcer: {minReplicas: 2, maxReplicas: 4}
`)
				var logs syncBuffer
				e := newEngine(t, p, WithRedis(client), WithNodeID("n1"), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
					withBreakerCooldown(time.Hour), withHeartbeatInterval(20*time.Millisecond))
				admitted := 0
				for i := range 300 {
					d, err := e.Decide(context.Background(), Request{Tenant: "t" + string(rune('a'+i%26)), Endpoint: "x"})
					if err != nil {
						t.Fatal(err)
					}
					if d.Allow {
						admitted++
					}
				}
				poll.Until(t, 5*time.Second, "the node to report itself degraded", func() bool { return e.BackendStatus().Degraded })
				if admitted > 50 {
					t.Errorf("admitted %d of a global burst of 100 with a fleet of two; want at most its share, 50", admitted)
				}
				if !strings.Contains(logs.String(), "quota store unavailable") {
					t.Errorf("no log line says the store is unavailable:\n%s", logs.String())
				}
				t.Logf("admitted %d; nodes %d", admitted, e.BackendStatus().Nodes)
			})
		}
	}
}
