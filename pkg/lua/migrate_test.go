package lua

import (
	"cmp"
	"context"
	"encoding/binary"
	"os"
	"slices"
	"testing"

	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// TestMigrationFromV1: buckets that version 1 of the keyspace wrote, each
// under a key of its own (its decide.lua, testdata/decide_v1.lua), are
// read by this version's scripts from there while the tenant's hash lacks
// them: peek.lua shows their tokens, decide.lua carries them over (an
// empty tenant bucket denies, an allowance lends what it had left, not
// its burst; an empty share bucket paces), and the buckets it changes
// move into the hash. Refund and debit read them too.
func TestMigrationFromV1(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	const now = 1_000_000_000
	prefix := keyspace.PlanePrefix("m")
	holder := keyspace.Holder("a")
	digest := keyspace.KeyDigest("k1")
	tenant, allowance := prefix.Tenant(holder, false), prefix.Allowance(holder)
	endpoint, key, share := prefix.Endpoint(holder, "read", false), prefix.Key(holder, digest, false), prefix.Share(holder)
	limits := map[keyspace.Level]Limit{
		{Key: prefix.Global()}: {AlgorithmTokenBucket, 0, 1000, 1e6},
		{Key: prefix.Pool()}:   {AlgorithmTokenBucket, 0, 100, 1e6},
		tenant:                 {AlgorithmTokenBucket, 0, 10, 1e6},
		allowance:              {AlgorithmTokenBucket, 0, 5, 1e6},
		endpoint:               {AlgorithmTokenBucket, 0, 100, 1e6},
		key:                    {AlgorithmTokenBucket, 0, 20, 1e6},
		share:                  {AlgorithmShareBucket, 1, 10, 1e6},
	}

	// Version 1: every level a key of its own, named as keyspace's Name.
	v1, err := os.ReadFile("testdata/decide_v1.lua")
	if err != nil {
		t.Fatal(err)
	}
	order := []keyspace.Level{{Key: prefix.Global()}, {Key: prefix.Pool()}, {Key: prefix.Demand()}, tenant, allowance, endpoint, key, share}
	var keys []string
	var v1Limits []byte
	for _, l := range order {
		keys = append(keys, cmp.Or(l.Name, l.Key))
		lim := limits[l]
		v1Limits = slices.Concat(v1Limits, le(lim.Algorithm, lim.Rate, lim.Burst, lim.PeriodMicros))
	}
	// 7 of the tenant's 10 paced by a fresh share bucket (7 of its 10),
	// then 5 more, 2 of them borrowed (the allowance keeps 3, the pool 98).
	requests := slices.Concat(le(7, 0, 1, 4, 5, 6, 7, 0, 8), le(5, 0, 1, 4, 5, 6, 7, 0, 0))
	reply, err := c.Eval(ctx, string(v1), keys, now, v1Limits, requests, 0).Int64Slice()
	if err != nil || !slices.Equal(allowedOf(reply), []int64{1, 1}) || reply[1+DecideReplyFields+5] != 2 {
		t.Fatalf("version 1 decided %v, %v; want both admitted, the second borrowing 2", reply, err)
	}

	levels := func(order ...keyspace.Level) *Levels {
		l := &Levels{}
		l.Add(keyspace.Level{Key: prefix.Global()}, limits[keyspace.Level{Key: prefix.Global()}])
		l.Add(keyspace.Level{Key: prefix.Pool()}, limits[keyspace.Level{Key: prefix.Pool()}])
		l.Key(prefix.Demand())
		for _, at := range order {
			l.Add(at, limits[at])
		}
		return l
	}
	// peek.lua reads version 1's buckets: tenant 0, allowance 3, endpoint
	// 88, key 8, pool 98; all present.
	peek, err := Peek.RunCall(ctx, c, PeekCall(levels(tenant, allowance, endpoint, key), now)).Int64Slice()
	if want := []int64{now, 988, 1, 98, 1, 0, 1, 3, 1, 88, 1, 8, 1}; err != nil || !slices.Equal(peek, want) {
		t.Fatalf("peek: %v, %v; want %v", peek, err, want)
	}

	// decide.lua: levels 3-7 are tenant, allowance, endpoint, key, share.
	decide := func(requests ...[]byte) []int64 {
		t.Helper()
		reply, err := Decide.RunCall(ctx, c, DecideCall(levels(tenant, allowance, endpoint, key, share), now, slices.Concat(requests...), false)).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		return reply
	}
	field := func(reply []int64, i, f int) int64 { return reply[1+i*DecideReplyFields+f] }
	reply = decide(
		le(1, 0, 0, 3, 0, 5, 6, 0, 0), // the tenant's own: empty
		le(1, 0, 0, 0, 0, 5, 6, 0, 7), // its share: empty (a fresh one would hold 1)
		le(3, 0, 1, 3, 4, 5, 6, 0, 0), // borrowing 3: what the allowance had left
		le(1, 0, 1, 3, 4, 5, 6, 0, 0), // borrowing 1 more: the allowance is dry
	)
	if got := allowedOf(reply); !slices.Equal(got, []int64{0, 0, 1, 0}) {
		t.Fatalf("allowed %v; want the tenant's version 1 state carried over (%v)", got, reply)
	}
	if r0, r1, r3 := field(reply, 0, 2), field(reply, 1, 2), field(reply, 3, 2); r0 != ReasonTenant || r1 != ReasonShare || r3 != ReasonTenantCeiling {
		t.Fatalf("reasons %d, %d, %d; want tenant, share, tenant ceiling", r0, r1, r3)
	}
	if rem, bound := field(reply, 2, 4), field(reply, 2, 6); rem != 0 || bound != 2 {
		t.Fatalf("after borrowing 3: %d left at level %d, want the tenant's 0", rem, bound)
	}
	// The allowance, the endpoint and the pool changed: the allowance and
	// the endpoint now live in the hash; the key keeps its own key.
	hash := c.HGetAll(ctx, prefix.TenantHash(holder)).Val()
	if a := hash["a"]; len(a) != 32 || binary.LittleEndian.Uint64([]byte(a)) != 0 {
		t.Fatalf("the hash's allowance %x; want the empty bucket", a)
	}
	if e := hash["e:read"]; len(e) != 32 || binary.LittleEndian.Uint64([]byte(e)) != 85e6 {
		t.Fatalf("the hash's endpoint bucket %x; want 85 tokens", e)
	}
	if _, ok := hash["t"]; ok {
		t.Fatal("the tenant bucket, which did not change, was written to the hash")
	}

	// refund.lua and debit.lua read the tenant's version 1 bucket too.
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
