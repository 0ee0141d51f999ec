package lua

import (
	"context"
	"encoding/binary"
	"math"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// reconcileTTL is the node ttl the reconcile tests push with, ms: an
// interval (the ttl's third) of 200.
const reconcileTTL = 600

// reconcileAt runs one reconcile.lua push of node on plane {p} at ms (push
// sequence seq, its claim, its lower-level buckets' records for buckets,
// its claim curves; the global limit 1,000/s, burst 1,000) and returns
// the reply.
func reconcileAt(t *testing.T, c redis.Scripter, node string, seq, claim, ms int64, records []byte, buckets []string, curves []byte) []any {
	t.Helper()
	keys := append([]string{"qp:{p}:g", "qp:{p}:nodes", "qp:{p}:rc", "qp:{p}:td:" + node}, buckets...)
	args := []any{node, seq, 0, 0, claim, reconcileTTL, 1000, 1000, 1_000_000, 200_000, records, ms * 1000, curves}
	reply, err := Reconcile.Run(context.Background(), c, keys, args...).Slice()
	if err != nil || len(reply) != 6 {
		t.Fatalf("%s at %d ms: reconcile.lua answered %v, %v", node, ms, reply, err)
	}
	return reply
}

// TestReconcileSumsClaimCurves: reconcile.lua returns the live nodes' claim
// curves summed point by point, tier by tier. A node that pushes none (a
// node of the version before the curves, in an upgrade's window) or
// curves of another number of tiers counts as its claim at every level of
// the last tier; a node that pushes none gets none back. The sum is taken
// once an interval (the ttl's third), by the first push after it, and the
// pushes in between get it as it was.
func TestReconcileSumsClaimCurves(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	const points, tiers = ClaimPoints, 3
	curves := func(scale float64, tiers int) []byte {
		var b []byte
		for k := range tiers {
			for g := range points {
				b = binary.LittleEndian.AppendUint64(b, math.Float64bits(scale*float64(100*k+g)))
			}
		}
		return b
	}
	reconcile := func(node string, claim int64, curves []byte, ms int64) any {
		t.Helper()
		return reconcileAt(t, c, node, 1, claim, ms, []byte{}, nil, curves)[4]
	}
	check := func(v any, scale float64) {
		t.Helper()
		s, ok := v.(string)
		if !ok || len(s) != 8*points*tiers {
			t.Fatalf("the fleet's curves are %T of %d bytes, want %d", v, len(s), 8*points*tiers)
		}
		for k := range tiers {
			for g := range points {
				want := scale * float64(100*k+g) // a's and b's
				if k == tiers-1 {
					want += 500 + 70 // the nodes without curves of this shape, flat
				}
				got := math.Float64frombits(binary.LittleEndian.Uint64([]byte(s[8*(k*points+g):])))
				if got != want {
					t.Fatalf("tier %d, level %d: the fleet claims %g, want %g", k, g, got, want)
				}
			}
		}
	}
	if got := reconcile("old", 500, nil, 1000); got != nil {
		t.Fatalf("a node that pushes no curves got %v back, want none", got)
	}
	reconcile("two-tiers", 70, curves(1, 2), 1010)
	reconcile("a", 10, curves(1, tiers), 1020)
	check(reconcile("b", 20, curves(2, tiers), 1220), 3)
	// Within the interval the sum is as it was; after it, b's new curves count.
	check(reconcile("b", 20, curves(4, tiers), 1300), 3)
	check(reconcile("a", 10, curves(1, tiers), 1420), 5)
}

// TestReconcileDemandRecord: the fleet's demand on a lower-level bucket is
// the sum of the nodes' last reports younger than the ttl. A push replaces
// its node's report in the sum without reading the others', until a
// report in it may be older than the ttl: that push sweeps the record (a
// report older than the ttl leaves it, and the sum is counted anew). A
// record without a sum (the previous script's) is swept on its first push.
func TestReconcileDemandRecord(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	bucket := "qp:{p}:t:acme"
	hgetalls := func() int64 { return srv.InfoCount("commandstats", "cmdstat_hgetall") }
	var seq int64
	// push reports node's demand on the bucket (thousandths of a token/s)
	// at ms and returns the fleet's, and the HGETALLs the call made less
	// one per live node (their tenant demands, read every call).
	push := func(node string, demand int64, ms int64) (fleet, sweeps int64) {
		t.Helper()
		seq++
		var rec []byte
		for _, v := range []int64{1, 100, 100, 1_000_000, 0, demand} {
			rec = binary.LittleEndian.AppendUint64(rec, uint64(v))
		}
		before := hgetalls()
		reply := reconcileAt(t, c, node, seq, 0, ms, rec, []string{bucket}, []byte{})
		levels, _ := reply[5].([]any)
		if len(levels) != 2 {
			t.Fatalf("%s at %d ms: bucket levels %v, want a level and a demand", node, ms, levels)
		}
		return levels[1].(int64), hgetalls() - before - reply[2].(int64)
	}
	for _, step := range []struct {
		node          string
		demand, at    int64
		fleet, sweeps int64
	}{
		{"a", 5000, 1000, 5000, 1},  // a new record is swept
		{"b", 7000, 1050, 12000, 0}, // added
		{"a", 3000, 1100, 10000, 0}, // replaced
		{"c", 1000, 1150, 11000, 0},
		{"a", 3000, 1199, 11000, 0},
		// The oldest report (1000) may be stale at 1600: b's (1050) is at
		// 1700, and the sweep drops it; c's (1150) is the oldest left.
		{"a", 3000, 1700, 4000, 1},
		{"c", 2000, 1750, 5000, 1}, // c's own report is the one that may be stale
		{"a", 3000, 1800, 5000, 0},
	} {
		fleet, sweeps := push(step.node, step.demand, step.at)
		if fleet != step.fleet || sweeps != step.sweeps {
			t.Fatalf("%s reports %d at %d ms: the fleet's demand %d in %d sweeps, want %d in %d",
				step.node, step.demand, step.at, fleet, sweeps, step.fleet, step.sweeps)
		}
	}
	// The previous script's record: no sum, and a report of a node gone.
	if err := c.Del(ctx, bucket+":n").Err(); err != nil {
		t.Fatal(err)
	}
	c.HSet(ctx, bucket+":n", "a", "2000:1790", "gone", "9000:1000")
	if fleet, sweeps := push("c", 500, 1800); fleet != 2500 || sweeps != 1 {
		t.Fatalf("a record without a sum: the fleet's demand %d in %d sweeps, want 2500 in 1", fleet, sweeps)
	}
	if n, _ := c.HExists(ctx, bucket+":n", "gone").Result(); n {
		t.Fatal("the sweep kept a report older than the ttl")
	}
}
