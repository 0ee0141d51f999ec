package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/policy"
	"github.com/quotaplane/quotaplane/pkg/poll"
	"github.com/quotaplane/quotaplane/pkg/redistest"
	"github.com/quotaplane/quotaplane/pkg/store"
)

// TestWatchFollowsNotices: with a poll that never ticks, the watcher
// delivers the current version at once and every later one through pub/sub.
func TestWatchFollowsNotices(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	a, b, d := samplePolicy(t, 10000), samplePolicy(t, 20000), samplePolicy(t, 30000)
	publisher := newStore(t, c)
	publish(t, publisher, a)

	w := startWatch(t, newStore(t, c, store.WithPollInterval(never)))
	w.expect(t, 1, a.Hash())
	poll.Until(t, waitTimeout, "the watcher subscribed", func() bool {
		n, err := c.PubSubNumSub(ctx, key).Result()
		return err == nil && n[key] == 1
	})
	for _, p := range []*policy.Policy{b, d} {
		start := time.Now()
		v, _ := publish(t, publisher, p)
		w.expect(t, v, p.Hash())
		t.Logf("version %d delivered %s after Publish was called", v, time.Since(start))
	}
	// The same content again announces nothing, so nothing is delivered
	// before the next real version.
	publish(t, publisher, d)
	publish(t, publisher, a)
	w.expect(t, 4, a.Hash())
}

// TestWatchPollCatchesLostNotice: the watcher's Redis user may not
// subscribe, so every notice is lost to it; the poll delivers each version,
// one stored by Publish and one stored by hand without a notice.
func TestWatchPollCatchesLostNotice(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	if err := c.Do(ctx, "ACL", "SETUSER", "deaf", "on", ">pw", "~*", "resetchannels", "+@all").Err(); err != nil {
		t.Fatal(err)
	}
	deaf := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "deaf", Password: "pw"})
	t.Cleanup(func() { _ = deaf.Close() })
	sub := deaf.Subscribe(ctx, key)
	if _, err := sub.ReceiveTimeout(ctx, waitTimeout); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("the deaf user's subscription answered %v, want NOPERM", err)
	}
	_ = sub.Close()
	a, b, d := samplePolicy(t, 10000), samplePolicy(t, 20000), samplePolicy(t, 30000)
	publisher := newStore(t, c)
	publish(t, publisher, a)

	w := startWatch(t, newStore(t, deaf, store.WithPollInterval(20*time.Millisecond)))
	w.expect(t, 1, a.Hash())
	publish(t, publisher, b)
	w.expect(t, 2, b.Hash())
	// What publish.lua does, without the PUBLISH.
	if err := c.HSet(ctx, key, "v3", d.WithVersion(3).Encode(), "hash", d.Hash(), "current", 3).Err(); err != nil {
		t.Fatal(err)
	}
	w.expect(t, 3, d.Hash())
}

// TestWatchReadsOnResubscribe: a version stored without a notice is read as
// soon as the subscription comes back after its connection was killed; the
// poll never ticks.
func TestWatchReadsOnResubscribe(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	a, b := samplePolicy(t, 10000), samplePolicy(t, 20000)
	publish(t, newStore(t, c), a)
	w := startWatch(t, newStore(t, c, store.WithPollInterval(never)))
	w.expect(t, 1, a.Hash())
	poll.Until(t, waitTimeout, "the watcher subscribed", func() bool {
		n, err := c.PubSubNumSub(ctx, key).Result()
		return err == nil && n[key] == 1
	})

	if err := c.HSet(ctx, key, "v2", b.WithVersion(2).Encode(), "hash", b.Hash(), "current", 2).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.ClientKillByFilter(ctx, "TYPE", "pubsub").Result(); err != nil || n != 1 {
		t.Fatalf("CLIENT KILL TYPE pubsub = %d, %v; want the watcher's connection killed", n, err)
	}
	w.expect(t, 2, b.Hash())
}

// TestWatchSkipsCorruptVersion: a corrupt current version is reported (once)
// and skipped; the next good version is delivered.
func TestWatchSkipsCorruptVersion(t *testing.T) {
	for _, tc := range corruptions(t) {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.Start(t)
			c := srv.Client()
			ctx := context.Background()
			a, b := samplePolicy(t, 10000), samplePolicy(t, 30000)
			publisher := newStore(t, c)
			publish(t, publisher, a)

			w := startWatch(t, newStore(t, c, store.WithPollInterval(20*time.Millisecond)))
			w.expect(t, 1, a.Hash())
			if err := c.HSet(ctx, key, tc.fields...).Err(); err != nil {
				t.Fatal(err)
			}
			err := w.nextError(t, func(err error) bool { return errors.Is(err, store.ErrCorrupt) })
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("reported %q, want it to say %q", err, tc.want)
			}
			w.nothingDelivered(t)
			if tc.name == "current not a number" {
				return // publish.lua refuses to number after it, as it should
			}
			v, _ := publish(t, publisher, b)
			if v != 3 {
				t.Fatalf("Publish after the corrupt version 2 = version %d, want 3", v)
			}
			w.expect(t, 3, b.Hash())
			select {
			case err := <-w.errs:
				if errors.Is(err, store.ErrCorrupt) {
					t.Fatalf("the corrupt version was reported twice: %v", err)
				}
			default:
			}
		})
	}
}

// TestWatchWaitsForFirstPublish: an empty store is reported as such, and the
// first version is delivered when it comes.
func TestWatchWaitsForFirstPublish(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	w := startWatch(t, newStore(t, c, store.WithPollInterval(never)))
	w.nextError(t, func(err error) bool { return errors.Is(err, store.ErrNoPolicy) })
	a := samplePolicy(t, 10000)
	publish(t, newStore(t, c), a)
	w.expect(t, 1, a.Hash())
}

// TestWatchSurvivesRedisRestart: Redis restarts empty; the watcher
// resubscribes, reads at once, reports the reset and follows the new
// numbering. The poll never ticks, so all of that is the resubscription's
// doing. No goroutine outlives the Watch.
func TestWatchSurvivesRedisRestart(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil { // the pool's goroutines, if any, start before the baseline
		t.Fatal(err)
	}
	checkNoLeak(t)
	a, b, d, e := samplePolicy(t, 10000), samplePolicy(t, 20000), samplePolicy(t, 30000), samplePolicy(t, 40000)
	publisher := newStore(t, c)
	publish(t, publisher, a)

	w := startWatch(t, newStore(t, c, store.WithPollInterval(never)))
	w.expect(t, 1, a.Hash())
	publish(t, publisher, b)
	w.expect(t, 2, b.Hash())

	srv.Restart()
	if v, _ := publish(t, publisher, d); v != 1 {
		t.Fatalf("first Publish after the restart = version %d, want 1", v)
	}
	err := w.nextError(t, func(err error) bool { return errors.Is(err, store.ErrReset) })
	if !strings.Contains(err.Error(), "delivered version 2, now the current version is 1") {
		t.Fatalf("reset reported as %q", err)
	}
	w.expect(t, 1, d.Hash())
	publish(t, publisher, e)
	w.expect(t, 2, e.Hash())
	w.stop(t)
}

// TestWatchFollowsResetToSameVersion: after the hash is lost, another content
// published under the version number the watcher holds is still delivered.
func TestWatchFollowsResetToSameVersion(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	a, b := samplePolicy(t, 10000), samplePolicy(t, 20000)
	publisher := newStore(t, c)
	publish(t, publisher, a)
	w := startWatch(t, newStore(t, c, store.WithPollInterval(never)))
	w.expect(t, 1, a.Hash())
	poll.Until(t, waitTimeout, "the watcher subscribed", func() bool {
		n, err := c.PubSubNumSub(ctx, key).Result()
		return err == nil && n[key] == 1
	})

	if err := c.Del(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	if v, _ := publish(t, publisher, b); v != 1 {
		t.Fatalf("Publish after the hash was deleted = version %d, want 1", v)
	}
	w.nextError(t, func(err error) bool { return errors.Is(err, store.ErrReset) })
	w.expect(t, 1, b.Hash())
}

func TestWatchReturnsWhenContextEnds(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	checkNoLeak(t)
	a := samplePolicy(t, 10000)
	publish(t, newStore(t, c), a)
	w := startWatch(t, newStore(t, c))
	w.expect(t, 1, a.Hash())
	if err := w.stop(t); !errors.Is(err, context.Canceled) {
		t.Fatalf("Watch returned %v, want context.Canceled", err)
	}
}

func TestWatchRejectsNilHandler(t *testing.T) {
	srv := redistest.Start(t)
	if err := newStore(t, srv.Client()).Watch(context.Background(), nil, nil); err == nil {
		t.Fatal("Watch(nil handler) succeeded")
	}
}

// TestWatchReturnsWithNoticesQueued: Watch returns, and leaves no goroutine
// behind, even when more notices are queued than its subscription buffers
// (the PubSub's receiver would otherwise wait a minute to hand one over).
func TestWatchReturnsWithNoticesQueued(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	checkNoLeak(t)
	publish(t, newStore(t, c), samplePolicy(t, 10000))

	watchCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	delivered, release, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		done <- newStore(t, c, store.WithPollInterval(never)).Watch(watchCtx, func(*policy.Policy) {
			close(delivered)
			<-release // a slow handler: Watch reads no notice meanwhile
		}, nil)
	}()
	select {
	case <-delivered:
	case <-time.After(waitTimeout):
		t.Fatal("no policy delivered")
	}
	const notices = 300 // more than the PubSub's channel holds (100)
	for i := range notices {
		if err := c.Publish(ctx, key, i).Err(); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	close(release)
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Watch returned %v, want context.Canceled", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("Watch did not return")
	}
}
