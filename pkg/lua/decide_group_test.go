package lua

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/redistest"
)

func le(vs ...int64) []byte {
	var b []byte
	for _, v := range vs {
		b = binary.LittleEndian.AppendUint64(b, uint64(v))
	}
	return b
}

// groupKeys are a plane's keys for the script tests: the global bucket, no
// pool, the demand counter, tenants a and b (10 tokens, no refill), a's
// window on an endpoint (30 a minute) and a's key (100 tokens).
var groupKeys = []string{"qp:{g}:g", "qp:{g}:pool", "qp:{g}:d", "qp:{g}:t:a", "qp:{g}:t:b", "qp:{g}:e:a:search:w", "qp:{g}:k:a"}

var groupLimits = slices.Concat(
	le(AlgorithmTokenBucket, 0, 1000, 1e6), le(AlgorithmNone, 0, 0, 0), le(AlgorithmNone, 0, 0, 0),
	le(AlgorithmTokenBucket, 0, 10, 1e6), le(AlgorithmTokenBucket, 0, 10, 1e6),
	le(AlgorithmSlidingWindow, 30, 0, 60e6), le(AlgorithmTokenBucket, 0, 100, 1e6))

// requestOf is a request of tenant a (every level) or b (global and
// tenant) of cost in group.
func requestOf(tenant string, cost, group int64) []byte {
	if tenant == "a" {
		return le(cost, 0, 0, 4, 0, 6, 7, group, 0)
	}
	return le(cost, 0, 0, 5, 0, 0, 0, group, 0)
}

// dumpKeys is every key of the test plane but the demand counter, raw.
func dumpKeys(t *testing.T, c *redis.Client) string {
	t.Helper()
	ctx := context.Background()
	keys, err := c.Keys(ctx, "qp:{g}:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	var sb strings.Builder
	for _, k := range keys {
		switch c.Type(ctx, k).Val() {
		case "string":
			fmt.Fprintf(&sb, "%s=%s\n", k, hex.EncodeToString([]byte(c.Get(ctx, k).Val())))
		case "list":
			fmt.Fprintf(&sb, "%s=%v\n", k, c.LRange(ctx, k, 0, -1).Val())
		}
	}
	return sb.String()
}

func decideAt(t *testing.T, c *redis.Client, now int64, requests ...[]byte) []int64 {
	t.Helper()
	reply, err := Decide.Run(context.Background(), c, groupKeys, now, groupLimits, slices.Concat(requests...), 0).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	if len(reply) != 1+DecideReplyFields*len(requests) {
		t.Fatalf("%d values for %d requests", len(reply), len(requests))
	}
	return reply
}

func allowedOf(reply []int64) []int64 {
	var out []int64
	for i := 1; i < len(reply); i += DecideReplyFields {
		out = append(out, reply[i])
	}
	return out
}

// TestDecideGroups: a group whose request is denied leaves every key as it
// was (bucket, window, key; written back or not), though its other
// requests passed; requests of one group need their costs together; a
// request after a denied group in the same call sees the state before the
// group, and admitted groups and single requests debit.
func TestDecideGroups(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	const now = 1_000_000_000
	decideAt(t, c, now, requestOf("a", 1, 0), requestOf("b", 1, 0)) // state in Redis for every key
	before := dumpKeys(t, c)
	if strings.Count(before, "\n") != 5 {
		t.Fatalf("the first call left\n%s\nwant every key but the pool and the counter", before)
	}

	reply := decideAt(t, c, now, requestOf("a", 3, 1), requestOf("b", 11, 1))
	if got := allowedOf(reply); !slices.Equal(got, []int64{1, 0}) {
		t.Fatalf("allowed %v; want the first only", got)
	}
	if after := dumpKeys(t, c); after != before {
		t.Fatalf("a denied group changed Redis:\n%s\n%s", before, after)
	}

	reply = decideAt(t, c, now,
		requestOf("a", 3, 1), requestOf("b", 11, 1), // denied at b's tenant level
		requestOf("a", 5, 2), requestOf("a", 5, 2), // 10 of a's 9 left: denied
		requestOf("a", 9, 0),                       // alone, after both: a's 9
		requestOf("b", 4, 3), requestOf("b", 5, 3), // admitted
	)
	if got := allowedOf(reply); !slices.Equal(got, []int64{1, 0, 1, 0, 1, 1, 1}) {
		t.Fatalf("allowed %v", got)
	}
	if rem := reply[1+4*DecideReplyFields+4]; rem != 0 {
		t.Fatalf("a's 9 after two denied groups: %d left at the tightest level, want 0", rem)
	}
	want := decideAt(t, c, now, requestOf("a", 1, 0), requestOf("b", 1, 0))
	if got := allowedOf(want); !slices.Equal(got, []int64{0, 0}) {
		t.Fatalf("after: %v; both tenants should be empty", got)
	}
	window := c.LRange(context.Background(), "qp:{g}:e:a:search:w", 0, -1).Val()
	if !slices.Equal(window, []string{"1000000000:1", "1000000000:9"}) {
		t.Fatalf("a's window %v: want the first request's entry and the single's", window)
	}
	if n := c.Get(context.Background(), "qp:{g}:d").Val(); n != "" {
		t.Fatalf("demand counter %q without ARGV[4]", n)
	}
}

// TestRefund: a bucket gets its tokens back up to its burst; a window loses
// the oldest entry of the refund's cost at or after the decision's time,
// and nothing when there is none.
func TestRefund(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	const now = 1_000_000_000
	decideAt(t, c, now, requestOf("a", 3, 0), requestOf("a", 2, 0))
	decideAt(t, c, now+10, requestOf("a", 3, 0))
	// a holds 10 − 8 = 2 tokens; its window has entries of 3 and 2 at now
	// and of 3 at now+10.
	records := slices.Concat(le(AlgorithmTokenBucket, 0, 10, 1e6, 5), le(AlgorithmTokenBucket, 0, 10, 1e6, 50),
		le(AlgorithmSlidingWindow, 30, 0, 60e6, 3), le(AlgorithmSlidingWindow, 30, 0, 60e6, 7))
	keys := []string{"qp:{g}:t:a", "qp:{g}:t:b", "qp:{g}:e:a:search:w", "qp:{g}:e:a:search:w"}
	n, err := Refund.Run(ctx, c, keys, now+20, now+5, records).Int64()
	if err != nil || n != 3 {
		t.Fatalf("Refund: %d, %v; want 3 records applied (no entry of cost 7)", n, err)
	}
	v, _ := c.Get(ctx, "qp:{g}:t:a").Bytes()
	if level := int64(binary.LittleEndian.Uint64(v)); level != 7e6 {
		t.Fatalf("a's bucket holds %d token·µs, want 7 tokens", level)
	}
	v, _ = c.Get(ctx, "qp:{g}:t:b").Bytes()
	if level := int64(binary.LittleEndian.Uint64(v)); level != 10e6 {
		t.Fatalf("b's bucket holds %d token·µs, want its burst, 10 tokens", level)
	}
	window := c.LRange(ctx, "qp:{g}:e:a:search:w", 0, -1).Val()
	if !slices.Equal(window, []string{"1000000000:3", "1000000000:2"}) {
		t.Fatalf("window %v: want the entry at now+10 gone, the earlier ones kept", window)
	}
}
