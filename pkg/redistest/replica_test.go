package redistest

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestFailoverBehindForwarder fails a primary with a password over to its
// replica, with a client on a Forwarder: what the primary held before the
// promotion is on the new primary, what it took after is lost, the demoted
// one answers READONLY, and once the forwarder moved the client writes to
// the new primary.
func TestFailoverBehindForwarder(t *testing.T) {
	ctx := context.Background()
	primary := Start(t, "--requirepass", "replica-test")
	replica := StartReplica(t, primary)
	if replica.Password != primary.Password {
		t.Fatalf("the replica's password is %q; want its primary's", replica.Password)
	}
	f := Forward(t, primary.Addr)
	c := redis.NewClient(&redis.Options{Addr: f.Addr, Password: primary.Password})
	t.Cleanup(func() { _ = c.Close() })

	if err := c.Set(ctx, "before", "1", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := primary.Client().Wait(ctx, 1, 5000).Err(); err != nil {
		t.Fatal(err)
	}
	replica.Promote()
	if err := c.Set(ctx, "after", "1", 0).Err(); err != nil { // the split-brain window
		t.Fatal(err)
	}
	primary.ReplicaOf(replica)
	if err := primary.Client().Set(ctx, "demoted", "1", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "READONLY") {
		t.Fatalf("a write to the demoted primary: %v; want READONLY", err)
	}
	primary.WaitSynced()
	f.MoveTo(replica.Addr)
	c.Close() // a new connection goes where the forwarder points now
	c = redis.NewClient(&redis.Options{Addr: f.Addr, Password: primary.Password})
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Set(ctx, "moved", "1", 0).Err(); err != nil {
		t.Fatalf("a write through the moved forwarder: %v", err)
	}
	for key, want := range map[string]int64{"before": 1, "after": 0, "moved": 1} {
		if n := replica.Client().Exists(ctx, key).Val(); n != want {
			t.Errorf("the new primary holds %q %d times; want %d", key, n, want)
		}
	}
	if n := primary.InfoCount("errorstats", "errorstat_READONLY"); n < 1 {
		t.Errorf("errorstat_READONLY on the demoted primary: %d; want at least 1", n)
	}
}
