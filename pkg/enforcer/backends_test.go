package enforcer

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/policy/policytest"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// The backends the behaviour suite runs against. Each is exact on one node
// with the plane's limits, so the Go engine in mode local is its reference
// model: local-reconciled on one node enforces the whole plane (its global
// level is trued up only downward, and planes here keep the fleet's level
// far above it), and central with Redis stopped degrades to the node's
// share, the whole plane on one node. Reconciles (and so the fleet's
// level, in real time) stay out of the replay: the interval is an hour.
var backends = []struct {
	name, mode string
	hugeGlobal bool // the backend reconciles its global level in real time: keep it out of reach
	redisDown  bool
}{
	{name: "central", mode: "central"},
	{name: "central/redis-down", mode: "central", redisDown: true},
	{name: "local-reconciled", mode: "local-reconciled", hugeGlobal: true},
}

// replayOptions are the options of a node on client whose decisions a
// test compares with the Go engine's: a breaker that stays open once it
// opens and, with Redis up, slowMachine's deadline (a degraded node
// decides on its share, which is not the Go engine's decision).
func replayOptions(client redis.UniversalClient, node string, redisDown bool) []Option {
	opts := []Option{WithRedis(client), WithNodeID(node), withBreakerCooldown(time.Hour)}
	if !redisDown {
		opts = append(opts, slowMachine)
	}
	return opts
}

// TestBackendsMatchEngine replays long random sequences of decisions on
// random planes (every level, tier floors, borrowing, sliding windows,
// unknown tenants and endpoints) through each backend and through the Go
// engine in mode local: every field of every decision, its reason and its
// error must be the same. DecideAt gives every backend the time, also the
// script. Fairness is none (tier floors as reserves), what central mode
// enforces (see doc.go).
func TestBackendsMatchEngine(t *testing.T) {
	srv := redistest.Start(t)
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			if b.redisDown {
				srv.Restart()
			}
			client := srv.Client()
			const planes, steps = 10, 1200
			var total, denied, borrowed, degraded int64
			for seed := uint64(1); seed <= planes; seed++ {
				rng := rand.New(rand.NewPCG(seed, 77))
				pl := orcRandomPlane(rng, "none", b.hugeGlobal)
				local := newEngine(t, policytest.Compile(t, pl.yaml))
				if err := client.FlushDB(context.Background()).Err(); err != nil {
					t.Fatal(err)
				}
				e := newEngine(t, policytest.Compile(t, withMode(pl.yaml, b.mode, "reconcileInterval: 1h")), replayOptions(client, "n1", b.redisDown)...)
				if b.redisDown {
					srv.Stop()
				}
				tempo := []int64{100, 1000, 10_000}[rng.IntN(3)]
				now := epoch.UnixMicro() + 1_000_000
				for step := range steps {
					now += max(orcStep(rng, tempo), 0) // Redis time never goes back
					r := orcRandomRequest(rng, &pl)
					want, werr := local.DecideAt(time.UnixMicro(now), r)
					got, gerr := e.DecideAt(time.UnixMicro(now), r)
					if (werr == nil) != (gerr == nil) || werr != nil && werr.Error() != gerr.Error() {
						t.Fatalf("plane %d step %d %+v: error %v, engine says %v", seed, step, r, gerr, werr)
					}
					if !orcSame(got, want) || got.Reason != want.Reason || got.Bound != want.Bound {
						t.Fatalf("plane %d step %d at %dµs %+v:\n%s %s %q bound %s\nengine  %s %q bound %s\n%s", seed, step, now, r, b.name,
							orcFmt(got), got.Reason, got.Bound, orcFmt(want), want.Reason, want.Bound, pl.yaml)
					}
					total++
					if werr == nil && !want.Allow {
						denied++
					}
					if want.Borrowed > 0 {
						borrowed++
					}
				}
				degraded += e.BackendStatus().Fallbacks
				if b.redisDown {
					srv.Restart()
				}
			}
			t.Logf("%d decisions agree (%d denied, %d borrowed, %d by the failure mode)", total, denied, borrowed, degraded)
			if denied < total/20 || borrowed == 0 {
				t.Fatalf("the sequences exercise too little: %d denied, %d borrowed of %d", denied, borrowed, total)
			}
			if b.redisDown != (degraded > 0) {
				t.Fatalf("%d decisions by the failure mode", degraded)
			}
		})
	}
}

// TestBackendsMatchEngineGroups replays random sequences of groups (of 1 to
// 4 requests, often of one tenant) on random planes through each backend
// and through the Go engine in mode local, as TestBackendsMatchEngine
// replays single decisions: every decision of every group, the group's
// outcome and its error must be the same. The script decides a group in
// one call; the engine under every lock.
func TestBackendsMatchEngineGroups(t *testing.T) {
	srv := redistest.Start(t)
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			if b.redisDown {
				srv.Restart()
			}
			client := srv.Client()
			const planes, steps = 6, 500
			var groups, deniedGroups, undone int64
			for seed := uint64(1); seed <= planes; seed++ {
				rng := rand.New(rand.NewPCG(seed, 78))
				pl := orcRandomPlane(rng, "none", b.hugeGlobal)
				local := newEngine(t, policytest.Compile(t, pl.yaml))
				if err := client.FlushDB(context.Background()).Err(); err != nil {
					t.Fatal(err)
				}
				e := newEngine(t, policytest.Compile(t, withMode(pl.yaml, b.mode, "reconcileInterval: 1h")), replayOptions(client, "n1", b.redisDown)...)
				if b.redisDown {
					srv.Stop()
				}
				tempo := []int64{100, 1000, 10_000}[rng.IntN(3)]
				now := epoch.UnixMicro() + 1_000_000
				want, got := make([]Decision, 4), make([]Decision, 4)
				for step := range steps {
					now += max(orcStep(rng, tempo), 0)
					rs := make([]Request, 1+rng.IntN(4))
					for i := range rs {
						rs[i] = orcRandomRequest(rng, &pl)
						if i > 0 && rng.IntN(2) == 0 {
							rs[i].Tenant, rs[i].Tier = rs[0].Tenant, rs[0].Tier
						}
					}
					clear(want)
					clear(got)
					wok, werr := local.DecideAllAt(time.UnixMicro(now), rs, want[:len(rs)])
					gok, gerr := e.DecideAllAt(time.UnixMicro(now), rs, got[:len(rs)])
					if (werr == nil) != (gerr == nil) || werr != nil && werr.Error() != gerr.Error() || wok != gok {
						t.Fatalf("plane %d step %d %+v: %t, %v; engine %t, %v", seed, step, rs, gok, gerr, wok, werr)
					}
					for i := range rs {
						if !orcSame(got[i], want[i]) || got[i].Reason != want[i].Reason || got[i].Bound != want[i].Bound {
							t.Fatalf("plane %d step %d at %dµs request %d of %+v:\n%s %s %q bound %s\nengine  %s %q bound %s\n%s", seed, step, now, i, rs,
								b.name, orcFmt(got[i]), got[i].Reason, got[i].Bound, orcFmt(want[i]), want[i].Reason, want[i].Bound, pl.yaml)
						}
						if werr == nil && !wok && want[i].Allow {
							undone++
						}
					}
					if werr == nil && len(rs) > 1 {
						groups++
						if !wok {
							deniedGroups++
						}
					}
				}
				if b.redisDown {
					srv.Restart()
				}
			}
			t.Logf("%d groups agree (%d denied, %d requests undone)", groups, deniedGroups, undone)
			if deniedGroups < groups/20 || groups-deniedGroups < groups/20 || undone == 0 {
				t.Fatalf("the sequences exercise too little: %d of %d groups denied, %d requests undone", deniedGroups, groups, undone)
			}
		})
	}
}
