package lua

import (
	"context"
	"encoding/binary"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// TestStateFromPreviousVersion: buckets that decide.lua wrote before
// bucket.lua and pkg/keyspace (testdata/decide_previous.lua) are where and
// as this version reads them: peek.lua shows their tokens, decide.lua
// carries them over (an empty tenant bucket denies, an allowance lends
// what it had left, not its burst; an empty share bucket paces), and
// refund.lua and debit.lua read them too. A rolling upgrade keeps every
// bucket.
func TestStateFromPreviousVersion(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	const now = 1_000_000_000
	prefix := keyspace.PlanePrefix("m")
	holder := keyspace.Holder("a")
	tenant, allowance := prefix.Tenant(holder, false), prefix.Allowance(holder)
	endpoint, key := prefix.Endpoint(holder, "read", false), prefix.Key(holder, keyspace.KeyDigest("k1"), false)
	share := prefix.Share(holder)
	limits := map[string]Limit{
		prefix.Global(): {AlgorithmTokenBucket, 0, 1000, 1e6},
		prefix.Pool():   {AlgorithmTokenBucket, 0, 100, 1e6},
		tenant:          {AlgorithmTokenBucket, 0, 10, 1e6},
		allowance:       {AlgorithmTokenBucket, 0, 5, 1e6},
		endpoint:        {AlgorithmTokenBucket, 0, 100, 1e6},
		key:             {AlgorithmTokenBucket, 0, 20, 1e6},
		share:           {AlgorithmShareBucket, 1, 10, 1e6},
	}
	levels := func(keys ...string) *Levels {
		l := &Levels{}
		for _, k := range keys {
			l.Add(k, limits[k])
		}
		return l
	}
	all := levels(prefix.Global(), prefix.Pool(), prefix.Demand(), tenant, allowance, endpoint, key, share)

	// The previous version: 7 of the tenant's 10 paced by a fresh share
	// bucket (7 of its 10), then 5 more, 2 of them borrowed (the allowance
	// keeps 3, the pool 98).
	previous, err := os.ReadFile("testdata/decide_previous.lua")
	if err != nil {
		t.Fatal(err)
	}
	requests := slices.Concat(le(7, 0, 1, 4, 5, 6, 7, 0, 8), le(5, 0, 1, 4, 5, 6, 7, 0, 0))
	reply, err := c.Eval(ctx, string(previous), all.Keys(), now, all.Records(), requests, 0).Int64Slice()
	if err != nil || !slices.Equal(allowedOf(reply), []int64{1, 1}) || reply[1+DecideReplyFields+5] != 2 {
		t.Fatalf("the previous version decided %v, %v; want both admitted, the second borrowing 2", reply, err)
	}

	// peek.lua: global 988, pool 98, tenant 0, allowance 3, endpoint 88,
	// key 8; all present.
	peek, err := Peek.RunCall(ctx, c, PeekCall(levels(prefix.Global(), prefix.Pool(), tenant, allowance, endpoint, key), now)).Int64Slice()
	if want := []int64{now, 988, 1, 98, 1, 0, 1, 3, 1, 88, 1, 8, 1}; err != nil || !slices.Equal(peek, want) {
		t.Fatalf("peek: %v, %v; want %v", peek, err, want)
	}

	// decide.lua (levels as KEYS above: 4 tenant, 5 allowance, 6 endpoint,
	// 7 key, 8 share).
	field := func(reply []int64, i, f int) int64 { return reply[1+i*DecideReplyFields+f] }
	reply, err = Decide.RunCall(ctx, c, DecideCall(all, now, slices.Concat(
		le(1, 0, 0, 4, 0, 6, 7, 0, 0), // the tenant's own: empty
		le(1, 0, 0, 0, 0, 6, 7, 0, 8), // its share: empty (a fresh one would hold 1)
		le(3, 0, 1, 4, 5, 6, 7, 0, 0), // borrowing 3: what the allowance had left
		le(1, 0, 1, 4, 5, 6, 7, 0, 0), // borrowing 1 more: the allowance is dry
	), false)).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	if got := allowedOf(reply); !slices.Equal(got, []int64{0, 0, 1, 0}) {
		t.Fatalf("allowed %v; want the previous version's state carried over (%v)", got, reply)
	}
	if r0, r1, r3 := field(reply, 0, 2), field(reply, 1, 2), field(reply, 3, 2); r0 != ReasonTenant || r1 != ReasonShare || r3 != ReasonTenantCeiling {
		t.Fatalf("reasons %d, %d, %d; want tenant, share, tenant ceiling", r0, r1, r3)
	}
	if v, _ := c.Get(ctx, endpoint).Bytes(); len(v) != 32 || binary.LittleEndian.Uint64(v) != 85e6 {
		t.Fatalf("the endpoint bucket %x; want 85 tokens", v)
	}

	// refund.lua and debit.lua read it too: 4 back to the empty tenant
	// bucket, then 1 debited.
	refund := &Levels{}
	refund.Add(tenant, limits[tenant], 4)
	if n, err := Refund.RunCall(ctx, c, RefundCall(refund, now, now)).Int64(); err != nil || n != 1 {
		t.Fatalf("refund: %d, %v", n, err)
	}
	debit := &Levels{}
	debit.Add(tenant, limits[tenant], 1)
	if left, err := Debit.RunCall(ctx, c, DebitCall(debit, now)).Int64Slice(); err != nil || !slices.Equal(left, []int64{3}) {
		t.Fatalf("debit after a refund of 4 to an empty bucket: %v, %v; want 3 left", left, err)
	}
}

// TestComposed: the scripts that keep levels carry bucket.lua in front of
// their own text (after peek.lua's flags line, which Redis reads first),
// and the SHA is the composed text's.
func TestComposed(t *testing.T) {
	bucket := embedded(bucketLua)
	for name, s := range map[string]*Script{"decide.lua": Decide, "refund.lua": Refund, "debit.lua": Debit, "reconcile.lua": Reconcile, "peek.lua": Peek} {
		own := embedded(name)
		want := bucket + "\n" + own
		if flags, rest, ok := strings.Cut(own, "\n"); ok && strings.HasPrefix(own, "#!") {
			want = flags + "\n" + bucket + "\n" + rest
		}
		if s.src != want {
			t.Errorf("%s is not bucket.lua and its own text", name)
		}
		if s.SHA() != load(name, bucketLua).SHA() || s.SHA() == load(name).SHA() {
			t.Errorf("%s: the SHA is not the composed text's", name)
		}
	}
}
