package store_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
)

// TestCluster: publish, read and watch through a cluster client; the hash,
// the script call and the channel all route by the plane's hash tag. The
// watcher's poll never ticks, so its second delivery came by pub/sub.
func TestCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3).Client(t)
	ctx := context.Background()
	a, b := samplePolicy(t, 10000), samplePolicy(t, 20000)
	publisher := newStore(t, c)
	if v, changed := publish(t, publisher, a); v != 1 || !changed {
		t.Fatalf("Publish = (%d, %v), want (1, true)", v, changed)
	}
	if v, changed := publish(t, publisher, a); v != 1 || changed {
		t.Fatalf("Publish of the same content = (%d, %v), want (1, false)", v, changed)
	}
	cur, err := newStore(t, c).Current(ctx)
	if err != nil || cur.Version() != 1 || cur.Hash() != a.Hash() {
		t.Fatalf("Current = %v, %v", cur, err)
	}

	w := startWatch(t, newStore(t, c, store.WithPollInterval(never)))
	w.expect(t, 1, a.Hash())
	// PUBSUB NUMSUB counts one node's subscribers and is sent to any node:
	// sum over the masters.
	poll.Until(t, waitTimeout, "the watcher subscribed", func() bool {
		var subscribers atomic.Int64
		err := c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			n, err := node.PubSubNumSub(ctx, key).Result()
			subscribers.Add(n[key])
			return err
		})
		return err == nil && subscribers.Load() == 1
	})
	if v, _ := publish(t, publisher, b); v != 2 {
		t.Fatalf("Publish of new content = version %d, want 2", v)
	}
	w.expect(t, 2, b.Hash())
}
