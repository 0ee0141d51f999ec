package lua

import (
	"context"
	"encoding/binary"
	"math"
	"testing"

	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// TestReconcileSumsClaimCurves: reconcile.lua returns the live nodes' claim
// curves summed point by point, tier by tier. A node that pushes none (a
// node of the version before the curves, in an upgrade's window) or
// curves of another number of tiers counts as its claim at every level of
// the last tier; a node that pushes none gets none back.
func TestReconcileSumsClaimCurves(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
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
	reconcile := func(node string, claim int64, curves []byte) any {
		t.Helper()
		keys := []string{"qp:{p}:g", "qp:{p}:nodes", "qp:{p}:rc", "qp:{p}:td:" + node}
		args := []any{node, 1, 0, 0, claim, 600, 1000, 1000, 1_000_000, 200_000, []byte{}, 0, curves}
		reply, err := Reconcile.Run(ctx, c, keys, args...).Slice()
		if err != nil || len(reply) != 6 {
			t.Fatalf("%s: reconcile.lua answered %v, %v", node, reply, err)
		}
		return reply[4]
	}
	read := func(v any) []float64 {
		t.Helper()
		s, ok := v.(string)
		if !ok || len(s) != 8*points*tiers {
			t.Fatalf("the fleet's curves are %T of %d bytes, want %d", v, len(s), 8*points*tiers)
		}
		out := make([]float64, points*tiers)
		for i := range out {
			out[i] = math.Float64frombits(binary.LittleEndian.Uint64([]byte(s[8*i:])))
		}
		return out
	}
	if got := reconcile("old", 500, nil); got != nil {
		t.Fatalf("a node that pushes no curves got %v back, want none", got)
	}
	reconcile("two-tiers", 70, curves(1, 2))
	reconcile("a", 10, curves(1, tiers))
	got := read(reconcile("b", 20, curves(2, tiers)))
	for k := range tiers {
		for g := range points {
			want := 3 * float64(100*k+g) // a's and b's
			if k == tiers-1 {
				want += 500 + 70 // the nodes without curves of this shape, flat
			}
			if v := got[k*points+g]; v != want {
				t.Fatalf("tier %d, level %d: the fleet claims %g, want %g", k, g, v, want)
			}
		}
	}
}
