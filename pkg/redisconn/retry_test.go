package redisconn_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/quotaplane/quotaplane/pkg/enforcer"
	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// TestEnforcerClientReportsReadOnly: a Redis that is a replica (a primary
// demoted in a failover) answers an enforcer's writes READONLY. go-redis
// retried that answer on a new connection after a backoff until the call's
// deadline, so the failover test's log said "context deadline exceeded".
// The enforcer's client does not retry: one call is one READONLY on the
// replica and returns it at once; a central decision is the failure
// mode's well within its deadline, and the outage's log line names
// READONLY. The manager's client keeps go-redis's retries.
func TestEnforcerClientReportsReadOnly(t *testing.T) {
	primary := redistest.Start(t)
	replica := redistest.StartReplica(t, primary)
	replica.WaitSynced()
	enf, _, err := flags(t, "-redis-addr", replica.Addr).EnforcerClient()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = enf.Close() })
	ctx := context.Background()

	// One write: one READONLY, returned as Redis's error. go-redis's
	// default retries make it 4.
	for _, c := range []struct {
		name    string
		retries bool
		do      func(context.Context) error
	}{
		{"enforcer", false, func(ctx context.Context) error { return enf.Set(ctx, "x", 1, 0).Err() }},
		{"manager", true, func(ctx context.Context) error {
			return client(t, "-redis-addr", replica.Addr).Set(ctx, "x", 1, 0).Err()
		}},
	} {
		before := replica.InfoCount("errorstats", "errorstat_READONLY")
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := c.do(callCtx)
		cancel()
		answers := replica.InfoCount("errorstats", "errorstat_READONLY") - before
		t.Logf("%s's client: %v; %d READONLY answers", c.name, err, answers)
		if err == nil || !strings.HasPrefix(err.Error(), "READONLY") {
			t.Errorf("%s's client: a write to a replica returned %v; want Redis's READONLY", c.name, err)
		}
		if want := map[bool]int64{false: 1, true: 4}[c.retries]; answers != want {
			t.Errorf("%s's client: one write got %d READONLY answers; want %d", c.name, answers, want)
		}
	}

	// A central decision on the replica, with a deadline far above a
	// READONLY's round trip: each is the failure mode's (degrade) at once.
	p, err := samplePlane(t).WithVersion(1).Override(policy.Overrides{Mode: "central"})
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer // read once the engine is closed
	const deadline = 2 * time.Second
	e, err := enforcer.New(p, enforcer.WithRedis(enf), enforcer.WithNodeID("on-a-replica"), enforcer.WithRedisTimeout(deadline),
		enforcer.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	before := replica.InfoCount("errorstats", "errorstat_READONLY")
	slowest := time.Duration(0)
	for i := range 5 {
		start := time.Now()
		d, err := e.Decide(ctx, enforcer.Request{Tenant: "acme", Endpoint: "read"})
		slowest = max(slowest, time.Since(start))
		if err != nil || !d.Allow {
			t.Fatalf("decision %d on a replica: %+v %v; want the failure mode's (degrade) admission", i, d, err)
		}
	}
	e.Close()
	answers := replica.InfoCount("errorstats", "errorstat_READONLY") - before
	t.Logf("5 central decisions on a replica: slowest %s (deadline %s), %d READONLY answers", slowest, deadline, answers)
	if slowest > deadline/4 {
		t.Errorf("slowest decision on a replica took %s; want it well within the deadline (%s): READONLY is an answer", slowest, deadline)
	}
	if answers == 0 {
		t.Error("the replica answered no READONLY: the fault was not exercised")
	}
	out := logs.String()
	if !strings.Contains(out, "quota store unavailable") || !strings.Contains(out, "READONLY") || strings.Contains(out, "deadline exceeded") {
		t.Errorf("the outage's log line does not name READONLY (or names the deadline):\n%s", out)
	}
}
