package enforcer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// boundPlane binds api keys to tenants: a's key is key-a, b's key-b; the
// plane lets unknown tenants through (by its unknownTenants policy: what
// binding must override).
func boundPlane(binding string) string {
	return strings.Replace(planeHeader, "spec:\n", "spec:\n  keyBinding: "+binding+"\n", 1) + `  global: {rate: 0, burst: 100000}
  tiers: [{name: t, weight: 1, tenant: {rate: 0, burst: 100}, key: {rate: 0, burst: 50}}]
---
apiVersion: quotaplane.io/v1alpha1
kind: EndpointQuota
metadata: {name: read}
spec: {endpoint: read, cost: 1}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: a}
spec: {tenant: a, keyHashes: ["` + policy.HashKey("key-a") + `"]}
---
apiVersion: quotaplane.io/v1alpha1
kind: TenantQuota
metadata: {name: b}
spec: {tenant: b, keyHashes: ["` + policy.HashKey("key-b") + `"]}
`
}

// TestStolenKeyRefused: on a plane that binds keys, tenant a's request with
// b's key is refused with ErrKeyNotBound, as are a request without a key,
// with an unknown key, and one naming a tenant the plane does not know;
// neither a's nor b's buckets move, no state is created (rotating unknown
// tenant names creates none), the error names the tenant and at most the
// key's short hash; alone and in a group; in every mode. A's own key
// passes, and on an open plane the stolen key passes too (the control).
func TestStolenKeyRefused(t *testing.T) {
	srv := redistest.Start(t)
	for _, m := range groupModes {
		t.Run(m.name, func(t *testing.T) {
			e := groupEngine(t, srv, m.mode, m.redisDown, boundPlane("bound"))
			now := at(time.Hour)
			for _, r := range []Request{{Tenant: "a", Endpoint: "read", APIKey: "key-a"}, {Tenant: "b", Endpoint: "read", APIKey: "key-b"}} {
				if d := mustDecide(t, e, now, r); !d.Allow {
					t.Fatalf("%+v with its own key: %+v", r, d)
				}
			}
			before, tenants := stateAt(t, e, upRedis(e, m.redisDown), now), e.tenants.count.Load()
			refused := []Request{
				{Tenant: "a", Endpoint: "read", APIKey: "key-b"},   // stolen
				{Tenant: "a", Endpoint: "read"},                    // none
				{Tenant: "a", Endpoint: "read", APIKey: "key-zzz"}, // unknown
				{Tenant: "b", Endpoint: "nosuch", APIKey: "key-a"}, // stolen, to an unknown endpoint
			}
			for i := range 100 {
				refused = append(refused, Request{Tenant: fmt.Sprintf("rotating-%d", i), Endpoint: "read", APIKey: "key-a"})
			}
			for _, r := range refused {
				_, err := e.DecideAt(now, r)
				if !errors.Is(err, ErrKeyNotBound) || !strings.Contains(err.Error(), fmt.Sprintf("%q", r.Tenant)) {
					t.Fatalf("%+v: %v; want ErrKeyNotBound naming the tenant", r, err)
				}
				if r.APIKey != "" && (strings.Contains(err.Error(), r.APIKey) || !strings.Contains(err.Error(), policy.ShortKeyHash(r.APIKey))) {
					t.Fatalf("%+v: %q must name the key by its short hash only", r, err)
				}
				ds := make([]Decision, 2)
				_, err = e.DecideAllAt(now, []Request{{Tenant: "a", Endpoint: "read", APIKey: "key-a"}, r}, ds)
				var re *RequestError
				if !errors.As(err, &re) || re.Index != 1 || !errors.Is(err, ErrKeyNotBound) {
					t.Fatalf("%+v in a group: %v", r, err)
				}
			}
			if after := stateAt(t, e, upRedis(e, m.redisDown), now); after != before || e.tenants.count.Load() != tenants {
				t.Fatalf("refused keys changed the state (%d tenant states, were %d):\n%s\n%s", e.tenants.count.Load(), tenants, before, after)
			}
		})
	}
	t.Run("open", func(t *testing.T) {
		e := newEngine(t, policytest.Compile(t, boundPlane("open")))
		if d, err := e.DecideAt(at(time.Hour), Request{Tenant: "a", Endpoint: "read", APIKey: "key-b"}); err != nil || !d.Allow {
			t.Fatalf("an open plane: %+v, %v", d, err)
		}
	})
}

// TestKeysNeverShown: the trace, the status and the debug output name an
// api key by its short hash only, in the engine's own state and in mode
// central's trace.
func TestKeysNeverShown(t *testing.T) {
	srv := redistest.Start(t)
	const key = "sk-live-very-secret"
	for _, m := range groupModes {
		t.Run(m.name, func(t *testing.T) {
			e := groupEngine(t, srv, m.mode, m.redisDown, boundPlane("open"))
			now := at(time.Hour)
			mustDecide(t, e, now, Request{Tenant: "a", Endpoint: "read", APIKey: key})
			ds := make([]Decision, 2)
			if _, err := e.DecideAllAt(now, []Request{{Tenant: "a", Endpoint: "read", APIKey: key}, {Tenant: "a", Endpoint: "read", Units: 1000}}, ds); err != nil {
				t.Fatal(err)
			}
			s, ok := e.TenantStatusAt(now, "a")
			if !ok || len(s.Trace) != 3 {
				t.Fatalf("status %+v", s)
			}
			if dump := fmt.Sprintf("%+v", s); strings.Contains(dump, key) || strings.Contains(dump, "sk-live") {
				t.Fatalf("the status shows the key: %s", dump)
			}
			hash := policy.ShortKeyHash(key)
			// Newest first: the group's denied request (no key), its undone one, the single.
			if s.Trace[2].KeyHash != hash || s.Trace[1].KeyHash != hash || s.Trace[0].KeyHash != "" {
				t.Fatalf("trace %+v; want the key's short hash %s, and none for the request without a key", s.Trace, hash)
			}
			if s.Trace[1].Allow || s.Trace[1].Reason != reasonGroupUndone || s.Trace[0].Level != LevelTenant || !s.Trace[2].Allow {
				t.Fatalf("the denied group's trace %+v: want the undone request and the denied one", s.Trace[:2])
			}
			if !inRedis(m.mode, m.redisDown) {
				var named bool
				for _, l := range s.Limits {
					named = named || l.Level == LevelKey && l.Name == hash
				}
				if !named {
					t.Fatalf("limits %+v: want the key's limit named by its short hash", s.Limits)
				}
			}
			if m.redisDown {
				return
			}
			// Nor does Redis: its key names carry a digest of the api key.
			names, err := srv.Client().Keys(context.Background(), "*").Result()
			if err != nil {
				t.Fatal(err)
			}
			if dump := strings.Join(names, " "); strings.Contains(dump, "sk-live") {
				t.Fatalf("Redis key names show the api key: %s", dump)
			}
		})
	}
}
