package lua

import (
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// peekKeys are a plane's keys for the peek tests, in decide.lua's order:
// the global bucket, no pool, the demand counter, tenants a and b (10
// tokens, no refill), a's window on an endpoint (30 a minute) and a's key
// (100 tokens).
var peekKeys = []string{"qp:{p}:g", "qp:{p}:pool", "qp:{p}:d", "qp:{p}:t:a", "qp:{p}:t:b", "qp:{p}:e:a:search:w", "qp:{p}:k:a"}

var peekLimits = slices.Concat(
	le(AlgorithmTokenBucket, 0, 1000, 1e6), le(AlgorithmNone, 0, 0, 0), le(AlgorithmNone, 0, 0, 0),
	le(AlgorithmTokenBucket, 0, 10, 1e6), le(AlgorithmTokenBucket, 0, 10, 1e6),
	le(AlgorithmSlidingWindow, 30, 0, 60e6), le(AlgorithmTokenBucket, 0, 100, 1e6))

// peekRequest is a request of cost for decide.lua that meets the global
// bucket and the levels at the given indexes of keys (tenant, endpoint,
// key; 0 for none), padded to decide.lua's record.
func peekRequest(cost, tenant, endpoint, key int64) []byte {
	r := le(cost, 0, 0, tenant, 0, endpoint, key, 0)
	return append(r, make([]byte, 8*DecideRequestFields-len(r))...)
}

func decideOn(t *testing.T, c *redis.Client, keys []string, limits []byte, now int64, requests ...[]byte) []int64 {
	t.Helper()
	reply, err := Decide.Run(context.Background(), c, keys, now, limits, slices.Concat(requests...), 0).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	if len(reply) != 1+DecideReplyFields*len(requests) {
		t.Fatalf("%d values for %d requests", len(reply), len(requests))
	}
	return reply
}

func peekOn(t *testing.T, c *redis.Client, keys []string, limits []byte, now int64) (left, present []int64) {
	t.Helper()
	reply, err := Peek.Run(context.Background(), c, keys, limits, now).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	if len(reply) != 1+PeekReplyFields*len(keys) || reply[0] != now {
		t.Fatalf("peek answered %v for %d keys at %d", reply, len(keys), now)
	}
	for i := 1; i < len(reply); i += PeekReplyFields {
		left, present = append(left, reply[i]), append(present, reply[i+1])
	}
	return left, present
}

// dumpPlane is every key of the hash tag, raw, with its expiry.
func dumpPlane(t *testing.T, c *redis.Client, tag string) string {
	t.Helper()
	ctx := context.Background()
	keys, err := c.Keys(ctx, "*{"+tag+"}*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	var sb strings.Builder
	for _, k := range keys {
		switch c.Type(ctx, k).Val() {
		case "string":
			fmt.Fprintf(&sb, "%s=%s", k, hex.EncodeToString([]byte(c.Get(ctx, k).Val())))
		case "list":
			fmt.Fprintf(&sb, "%s=%v", k, c.LRange(ctx, k, 0, -1).Val())
		}
		fmt.Fprintf(&sb, " expires %v\n", c.ExpireTime(ctx, k).Val())
	}
	return sb.String()
}

// TestPeekAgreesWithDecide: after decide.lua has debited every kind of
// level (buckets, a window, a bucket that refills and was written with
// another period), peek.lua reads, at three later times, the tokens each
// level has left; decide.lua at that time then denies one more than that
// at the level, reporting the same number left, and admits that many.
// peek.lua changes no key nor expiry, and reads missing keys as full.
func TestPeekAgreesWithDecide(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	const t0 = int64(1_000_000_000)

	left, present := peekOn(t, c, peekKeys, peekLimits, t0)
	if want := []int64{1000, 0, 0, 10, 10, 30, 100}; !slices.Equal(left, want) || slices.Max(present) != 0 {
		t.Fatalf("an empty Redis peeks as %v (present %v); want every level full, %v, and nothing present", left, present, want)
	}

	// Debit every level; a's window at two times.
	decideOn(t, c, peekKeys, peekLimits, t0, peekRequest(3, 4, 6, 7), peekRequest(4, 5, 0, 0))
	decideOn(t, c, peekKeys, peekLimits, t0+20e6, peekRequest(2, 4, 6, 7))
	// Then the global limit changes to 100/s with a period of 10 s: the
	// bucket, written with a period of 1 s, is rescaled and refills.
	limits := slices.Clone(peekLimits)
	copy(limits, le(AlgorithmTokenBucket, 100, 1000, 10e6))
	before := dumpPlane(t, c, "p")

	levels := map[int]int64{0: 1, 3: 2, 4: 2, 5: 3, 6: 4} // index in keys -> decide.lua's level
	for _, now := range []int64{t0 + 20e6, t0 + 50e6, t0 + 60e6, t0 + 80e6, t0 + 90e6} {
		t.Run(fmt.Sprintf("t0+%ds", (now-t0)/1e6), func(t *testing.T) {
			left, present := peekOn(t, c, peekKeys, limits, now)
			if after := dumpPlane(t, c, "p"); after != before {
				t.Fatalf("peek changed Redis:\n%s\nwas\n%s", after, before)
			}
			for i, level := range levels {
				if present[i] != 1 {
					t.Fatalf("%s: its record is not reported present", peekKeys[i])
				}
				checkLevelAgrees(t, c, limits, now, i, level, left[i])
			}
		})
	}
}

// checkLevelAgrees copies the plane's keys and checks on the copy that
// decide.lua at now denies cost n+1 at the level of key i, reporting n
// left, and admits cost n.
func checkLevelAgrees(t *testing.T, c *redis.Client, limits []byte, now int64, i int, level, n int64) {
	t.Helper()
	ctx := context.Background()
	keys := make([]string, len(peekKeys))
	for j, k := range peekKeys {
		keys[j] = strings.Replace(k, "{p}", "{copy}", 1)
		if err := c.Copy(ctx, k, keys[j], 0, true).Err(); err != nil {
			t.Fatal(err)
		}
	}
	defer c.Del(ctx, keys...)
	request := func(cost int64) []byte {
		switch i {
		case 3, 4:
			return peekRequest(cost, int64(i+1), 0, 0)
		case 5:
			return peekRequest(cost, 0, int64(i+1), 0)
		case 6:
			return peekRequest(cost, 0, 0, int64(i+1))
		}
		return peekRequest(cost, 0, 0, 0)
	}
	if denied := decideOn(t, c, keys, limits, now, request(n+1)); denied[1] != 0 || denied[2] != level || denied[5] != n {
		t.Fatalf("%s: peek says %d left, but decide.lua answered cost %d with allowed %d at level %d, %d left; want denied at level %d, %d left",
			peekKeys[i], n, n+1, denied[1], denied[2], denied[5], level, n)
	}
	if n == 0 {
		return
	}
	if admitted := decideOn(t, c, keys, limits, now, request(n)); admitted[1] != 1 {
		t.Fatalf("%s: peek says %d left, but decide.lua denied cost %d (level %d)", peekKeys[i], n, n, admitted[2])
	}
}

// TestPeekReadsOddRecordsAsMissing: a record of another shape (an older
// format, another kind of key) reads as decide.lua reads it, as missing:
// a full bucket; a level without a limit reads as 0, not present.
func TestPeekReadsOddRecordsAsMissing(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	if err := c.Set(context.Background(), "qp:{p}:t:a", "short", 0).Err(); err != nil {
		t.Fatal(err)
	}
	left, present := peekOn(t, c, peekKeys, peekLimits, 1e9)
	if left[3] != 10 || present[3] != 0 || left[1] != 0 || present[1] != 0 {
		t.Fatalf("peek read %v (present %v); want a's odd record as a full bucket (10, absent) and the pool as 0, absent", left, present)
	}
}

// TestPeekIsReadOnly: Redis runs peek.lua as a read-only script (its
// no-writes flag): EVALSHA_RO accepts it, which it refuses for decide.lua.
func TestPeekIsReadOnly(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	for _, s := range []*Script{Peek, Decide} {
		if err := s.Load(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.EvalShaRO(ctx, Peek.SHA(), peekKeys, peekLimits, 0).Err(); err != nil {
		t.Fatalf("EVALSHA_RO peek.lua: %v", err)
	}
	if err := c.EvalShaRO(ctx, Decide.SHA(), peekKeys, 0, peekLimits, peekRequest(1, 4, 0, 0), 0).Err(); err == nil {
		t.Fatal("EVALSHA_RO accepted decide.lua: the check cannot tell a read-only script")
	}
}
