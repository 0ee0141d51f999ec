package redisconn_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/config/samples"
	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/lua"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redisconn"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/reload"
	"github.com/quotaplane/quotaplane/pkg/store"
	"github.com/quotaplane/quotaplane/pkg/upstream"
)

const (
	enforcerUser     = "quotaplane-enforcer"
	managerUser      = "quotaplane-manager"
	enforcerPassword = "enforcer-secret-must-never-show"
	managerPassword  = "manager-secret-must-never-show"
)

// flags parses args as a binary's Redis flags.
func flags(t *testing.T, args ...string) *redisconn.Flags {
	t.Helper()
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	f := redisconn.Register(fs, "Redis")
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return f
}

// client is the client flags build; it fails t on an error.
func client(t *testing.T, args ...string) *redis.Client {
	t.Helper()
	c, _, err := flags(t, args...).Client()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// secretFile writes a password file (a mounted Secret) and returns its path.
func secretFile(t *testing.T, password string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "password")
	if err := os.WriteFile(path, []byte(password+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// aclServer is a Redis whose default user has a password only the test
// knows, with the enforcer and manager users of keyspace's rules and
// nothing else; it returns the admin client and the two users' clients,
// built from flags as the binaries build them.
func aclServer(t *testing.T) (admin, enforcerClient, managerClient *redis.Client) {
	t.Helper()
	srv := redistest.Start(t, "--requirepass", "admin-password")
	admin = srv.Client()
	ctx := context.Background()
	for _, u := range []struct {
		name, password string
		rules          []string
	}{{enforcerUser, enforcerPassword, keyspace.EnforcerACL("*")}, {managerUser, managerPassword, keyspace.ManagerACL("*")}} {
		args := append([]any{"ACL", "SETUSER", u.name, "reset", "on", ">" + u.password}, toAny(u.rules)...)
		if err := admin.Do(ctx, args...).Err(); err != nil {
			t.Fatalf("ACL SETUSER %s %v: %v", u.name, u.rules, err)
		}
	}
	enforcerClient = client(t, "-redis-addr", srv.Addr, "-redis-username", enforcerUser, "-redis-password-file", secretFile(t, enforcerPassword))
	managerClient = client(t, "-redis-addr", srv.Addr, "-redis-username", managerUser, "-redis-password-file", secretFile(t, managerPassword))
	return admin, enforcerClient, managerClient
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// aclLog is Redis's log of ACL denials, one line per entry: user, reason
// (command, key, channel, auth) and object.
func aclLog(t *testing.T, admin *redis.Client) []string {
	t.Helper()
	entries, err := admin.ACLLog(context.Background(), 100).Result()
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, e := range entries {
		lines = append(lines, fmt.Sprintf("%s denied %s %q (%s, %d times)", e.Username, e.Reason, e.Object, e.Context, e.Count))
	}
	return lines
}

func samplePlane(t *testing.T) *policy.Policy {
	t.Helper()
	p, err := policy.LoadFS(samples.FS)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestACLUsers: with exactly keyspace's users, the manager publishes and
// reads its fleet's reports, and the enforcer follows the policy store,
// reports itself, and decides in central mode (sharded too, with fairness,
// the burst pool, sliding windows and key levels) and in local-reconciled
// (its reconcile and heartbeats): Redis denies nothing (ACL LOG stays
// empty). Neither password appears in anything logged.
func TestACLUsers(t *testing.T) {
	admin, enf, mgr := aclServer(t)
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	sample := samplePlane(t)
	plane := sample.ID()
	publisher, err := store.New(mgr, plane, store.WithPollInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := publisher.Publish(ctx, sample, store.WithSources([]byte("sources"))); err != nil {
		t.Fatalf("the manager user publishes: %v", err)
	}

	// The enforcer follows the store (as cmd/enforcer: Current, then Watch
	// and Report), in central mode.
	follower, err := store.New(enf, plane, store.WithPollInterval(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	first, err := follower.Current(ctx)
	if err != nil {
		t.Fatalf("the enforcer user reads the store: %v", err)
	}
	central := policy.Overrides{Mode: "central"}
	inForce, err := first.Override(central)
	if err != nil {
		t.Fatal(err)
	}
	engine, err := enforcer.New(inForce, enforcer.WithRedis(enf), enforcer.WithNodeID("central-1"), enforcer.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	defer engine.Close()
	loads := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "loads"}, []string{"result"})
	loader := reload.New(engine, central, loads, log, first)
	// The watch and the reports log into logs: read it once they end.
	var watching sync.WaitGroup
	watching.Go(func() { _ = loader.WatchStore(ctx, follower) })
	watching.Go(func() { loader.Report(ctx, follower, func() int64 { return 0 }, 50*time.Millisecond) })

	decide := func(e *enforcer.Engine) {
		t.Helper()
		for _, r := range []enforcer.Request{
			{Tenant: "acme", Endpoint: "read", APIKey: "acme-batch", Units: 1},
			{Tenant: "acme", Endpoint: "write", APIKey: "some-key", Units: 1},
			{Tenant: "free-trial", Endpoint: "export", Units: 1}, // a sliding window
			{Tenant: "whale-2", Endpoint: "export", Units: 1},
			{Tenant: "someone-unknown", Endpoint: "read", Units: 1},
		} {
			for range 3 {
				if _, err := e.Decide(ctx, r); err != nil {
					t.Fatalf("%+v: %v", r, err)
				}
			}
		}
	}
	decide(engine)

	// A new version reaches the watching enforcer.
	smaller, err := sample.Override(policy.Overrides{GlobalPerSecond: 12345})
	if err != nil {
		t.Fatal(err)
	}
	v2, _, err := publisher.Publish(ctx, smaller)
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 15*time.Second, "the enforcer runs version 2", func() bool { return engine.Policy().Version() == v2 })
	poll.Until(t, 15*time.Second, "the manager reads the enforcer's report", func() bool {
		reports, err := publisher.Enforcers(ctx)
		return err == nil && len(reports) == 1 && reports[0].PolicyVersion == v2
	})
	if _, _, err := publisher.Sources(ctx); err != nil {
		t.Fatalf("the manager reads its sources: %v", err)
	}
	decide(engine)

	// Sharded, central.
	sharded := policytest.Compile(t, `apiVersion: quotaplane.io/v1alpha1
kind: QuotaPlane
metadata: {name: sharded, namespace: team}
spec:
  mode: central
  shards: 2
  fairness: maxmin
  global: {rate: 1000, burst: 1000}
  tiers: [{name: std, weight: 1, tenant: {rate: 100, burst: 100}}]
`)
	shardedEngine, err := enforcer.New(sharded, enforcer.WithRedis(enf), enforcer.WithNodeID("sharded-1"), enforcer.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	defer shardedEngine.Close()
	for i := range 20 {
		if _, err := shardedEngine.Decide(ctx, enforcer.Request{Tenant: fmt.Sprintf("t%d", i), Endpoint: "x", Units: 1}); err != nil {
			t.Fatal(err)
		}
	}

	// Local-reconciled: reconciles and heartbeats.
	reconciled, err := sample.WithVersion(1).Override(policy.Overrides{Mode: "local-reconciled", ReconcileInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	local, err := enforcer.New(reconciled, enforcer.WithRedis(enf), enforcer.WithNodeID("reconciled-1"), enforcer.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	decide(local)
	prefix := keyspace.PlanePrefix(plane)
	poll.Until(t, 15*time.Second, "the reconciled node pushed and the central node beat", func() bool {
		pushes, _ := admin.HLen(ctx, prefix.Reconcile()).Result()
		nodes, _ := admin.ZCard(ctx, prefix.Nodes()).Result()
		return pushes > 0 && nodes >= 2
	})
	decide(local)
	for _, e := range []*enforcer.Engine{engine, shardedEngine, local} {
		if s := e.BackendStatus(); s.Degraded {
			t.Errorf("%s: degraded (%+v): Redis refused it something", e.NodeID(), s)
		}
	}
	for _, pattern := range []string{"qp:*:g", "qp:*:t:*", "qp:*:k:*", "qp:*:e:*"} {
		if keys, _ := admin.Keys(ctx, pattern).Result(); len(keys) == 0 {
			t.Errorf("no key %s in Redis: the decisions did not reach it", pattern)
		}
	}
	engine.Close()
	shardedEngine.Close()
	local.Close()
	cancel()
	watching.Wait()

	if denied := aclLog(t, admin); len(denied) > 0 {
		t.Errorf("Redis denied the components' users:\n%s", strings.Join(denied, "\n"))
	}
	for _, secret := range []string{enforcerPassword, managerPassword} {
		if strings.Contains(logs.String(), secret) {
			t.Errorf("a password shows in the logs:\n%s", logs.String())
		}
	}
}

// TestACLNegative: the rules refuse what each component must not do. The
// enforcer user cannot publish a policy, write the policy hash or announce a
// version; the manager user cannot run the decision scripts; neither can
// list keys, flush or reconfigure Redis. Each refusal is a NOPERM error and
// an ACL LOG entry.
func TestACLNegative(t *testing.T) {
	admin, enf, mgr := aclServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sample := samplePlane(t)
	plane := sample.ID()

	asEnforcer, err := store.New(enf, plane)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := asEnforcer.Publish(ctx, sample); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("the enforcer user published a policy: %v", err)
	}
	if err := admin.HSet(ctx, upstream.PlanKey(plane), "seq", "1").Err(); err != nil { // a plan for it to overwrite
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"HSET policy":        enf.HSet(ctx, keyspace.Policy(plane), "current", "99").Err(),
		"DEL policy":         enf.Del(ctx, keyspace.Policy(plane)).Err(),
		"PUBLISH notice":     enf.Publish(ctx, keyspace.Policy(plane), "99").Err(),
		"KEYS":               enf.Keys(ctx, "*").Err(),
		"FLUSHALL":           enf.FlushAll(ctx).Err(),
		"CONFIG SET":         enf.ConfigSet(ctx, "maxmemory", "1").Err(),
		"HSET upstream plan": enf.HSet(ctx, upstream.PlanKey(plane), "seq", "99").Err(),
		"DEL upstream plan":  enf.Del(ctx, upstream.PlanKey(plane)).Err(),
		// A script the enforcer may call, naming the plan as a key it
		// writes (upstream.lua's gate nodes): refused before it runs.
		"EVALSHA writing the plan": lua.Upstream.Run(ctx, enf, []string{upstream.PlanKey(plane)}, "node-1", "3000").Err(),
		"manager KEYS":             mgr.Keys(ctx, "*").Err(),
		"manager SET decision key": mgr.Set(ctx, keyspace.PlanePrefix(plane).Global(), "1", 0).Err(),
	} {
		if err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("%s: got %v, want NOPERM", name, err)
		}
	}

	// The manager user runs a central decision: Redis refuses the script's
	// keys (EVALSHA's KEYS are checked before the script runs), so Redis
	// holds no decision state.
	central, err := sample.WithVersion(1).Override(policy.Overrides{Mode: "central"})
	if err != nil {
		t.Fatal(err)
	}
	e, err := enforcer.New(central, enforcer.WithRedis(mgr), enforcer.WithNodeID("as-manager"),
		enforcer.WithLogger(slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))))
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	_, _ = e.Decide(ctx, enforcer.Request{Tenant: "acme", Endpoint: "read", Units: 1})
	if keys, _ := admin.Keys(ctx, "qp:*:g").Result(); len(keys) > 0 {
		t.Errorf("the manager user wrote decision state: %v", keys)
	}
	var scriptDenied bool
	for _, line := range aclLog(t, admin) {
		if strings.HasPrefix(line, managerUser+" denied key") && strings.Contains(line, keyspace.PlanePrefix(plane).Global()) {
			scriptDenied = true
		}
	}
	if !scriptDenied {
		t.Errorf("no denial of the manager user's decision script in ACL LOG:\n%s", strings.Join(aclLog(t, admin), "\n"))
	}
}

// TestACLUpstream: the upstream pipeline under the same users: the
// manager's leader publishes a plan, drains reports and reads usage and
// the gate nodes; the enforcer exchanges (upstream.lua) and forwards its
// reports and usage, as pkg/enforcer does. Redis denies nothing.
func TestACLUpstream(t *testing.T) {
	admin, enf, mgr := aclServer(t)
	ctx := context.Background()
	const plane = "team/edge"

	plan := &upstream.Plan{Plane: plane, Interval: time.Second}
	if err := upstream.PublishPlan(ctx, mgr, plan); err != nil {
		t.Fatalf("the manager publishes a plan: %v", err)
	}
	if got, err := upstream.ReadPlan(ctx, enf, plane); err != nil || got == nil {
		t.Fatalf("the enforcer reads the plan: %v, %v", got, err)
	}
	keys := []string{upstream.NodesKey(plane), upstream.DemandKey(plane, "payments")}
	if err := lua.Upstream.Run(ctx, enf, keys, "node-1", "3000", "1 2 3 4 5").Err(); err != nil {
		t.Fatalf("the enforcer's exchange: %v", err)
	}
	_, err := enf.Pipelined(ctx, func(pipe redis.Pipeliner) error { // as pkg/enforcer flushReports
		pipe.Set(ctx, upstream.UsageKey(plane, "node-1"), "{}", 3*upstream.UsageInterval)
		key := upstream.ReportsKey(plane, "payments")
		pipe.RPush(ctx, key, "{}")
		pipe.LTrim(ctx, key, -upstream.MaxReports, -1)
		pipe.PExpire(ctx, key, upstream.PlanTTL)
		return nil
	})
	if err != nil {
		t.Fatalf("the enforcer's reports: %v", err)
	}
	// The leader's reads (pkg/upstream leader.go), and its removal of the plan.
	if err := mgr.LPopCount(ctx, upstream.ReportsKey(plane, "payments"), upstream.MaxReports).Err(); err != nil {
		t.Fatalf("the manager drains reports: %v", err)
	}
	if err := mgr.HKeys(ctx, upstream.NodesKey(plane)).Err(); err != nil {
		t.Fatalf("the manager reads the gate nodes: %v", err)
	}
	if err := mgr.MGet(ctx, upstream.UsageKey(plane, "node-1")).Err(); err != nil {
		t.Fatalf("the manager reads usage: %v", err)
	}
	if err := mgr.Del(ctx, upstream.PlanKey(plane)).Err(); err != nil {
		t.Fatalf("the manager removes the plan: %v", err)
	}
	if denied := aclLog(t, admin); len(denied) > 0 {
		t.Errorf("Redis denied the components' users:\n%s", strings.Join(denied, "\n"))
	}
}

// TestACLOnePlane: an enforcer user scoped to one plane reaches that
// plane's keys and its shards', and none of another plane's.
func TestACLOnePlane(t *testing.T) {
	srv := redistest.Start(t, "--requirepass", "admin-password")
	admin := srv.Client()
	ctx := context.Background()
	args := append([]any{"ACL", "SETUSER", enforcerUser, "reset", "on", ">" + enforcerPassword}, toAny(keyspace.EnforcerACL("team/a"))...)
	if err := admin.Do(ctx, args...).Err(); err != nil {
		t.Fatal(err)
	}
	enf := client(t, "-redis-addr", srv.Addr, "-redis-username", enforcerUser, "-redis-password-file", secretFile(t, enforcerPassword))
	for _, key := range []string{keyspace.PlanePrefix("team/a").Global(), keyspace.ShardPrefix("team/a", 1).Global()} {
		if err := enf.Set(ctx, key, "1", 0).Err(); err != nil {
			t.Errorf("its own plane's %s: %v", key, err)
		}
	}
	if err := enf.HGet(ctx, keyspace.Policy("team/a"), "current").Err(); err != nil && err != redis.Nil {
		t.Errorf("its own plane's policy: %v", err)
	}
	for name, err := range map[string]error{
		"another plane's bucket": enf.Set(ctx, keyspace.PlanePrefix("team/b").Global(), "1", 0).Err(),
		"another plane's shard":  enf.Set(ctx, keyspace.ShardPrefix("team/b", 1).Global(), "1", 0).Err(),
		"a plane named after it": enf.Set(ctx, keyspace.PlanePrefix("team/ab").Global(), "1", 0).Err(),
		"another plane's policy": enf.HGet(ctx, keyspace.Policy("team/b"), "current").Err(),
	} {
		if err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("%s: got %v, want NOPERM", name, err)
		}
	}
}
