package lua

import (
	"context"
	"slices"
	"testing"

	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// shareKeys: the global bucket (100 tokens, no refill), no pool, the demand
// counter, and tenant a's share bucket (10 tokens/s, burst 5).
var shareKeys = []string{"qp:{s}:g", "qp:{s}:pool", "qp:{s}:d", "qp:{s}:s:a"}

func shareLimits(globalBurst int64) []byte {
	return slices.Concat(le(AlgorithmTokenBucket, 0, globalBurst, 1e6), le(AlgorithmNone, 0, 0, 0), le(AlgorithmNone, 0, 0, 0),
		le(AlgorithmShareBucket, 10, 5, 1e6))
}

// paced is a request of tenant a of cost, paced by its share bucket (KEYS[4]).
func paced(cost, group int64) []byte { return le(cost, 0, 0, 0, 0, 0, 0, group, 4) }

// TestDecideShareBucket: a share bucket paces its tenant at its rate: a
// missing one holds what its first request needs; one holding min(cost,
// burst) admits a costlier request into debt, repaid at the rate; a request
// it cannot cover is denied at the global level with reason 8 and the wait
// for its tokens; the global level's own denial comes first; a denied
// group leaves the share bucket as it was; and the bucket stays a minute
// after it would be full.
func TestDecideShareBucket(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	ctx := context.Background()
	const now = 1_000_000_000
	call := func(at, globalBurst int64, requests ...[]byte) []int64 {
		t.Helper()
		reply, err := Decide.Run(ctx, c, shareKeys, at, shareLimits(globalBurst), slices.Concat(requests...), 0).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		return reply
	}
	field := func(reply []int64, i, f int) int64 { return reply[1+i*DecideReplyFields+f] }

	reply := call(now, 100, paced(1, 0), paced(1, 0))
	if got := allowedOf(reply); !slices.Equal(got, []int64{1, 0}) {
		t.Fatalf("a fresh share bucket admitted %v; want its first request only", got)
	}
	if lvl, reason, retry := field(reply, 1, 1), field(reply, 1, 2), field(reply, 1, 3); lvl != 1 || reason != ReasonShare || retry != 100_000 {
		t.Fatalf("denied at level %d, reason %d, retry %dµs; want global, %d, 100000µs (one token at 10/s)", lvl, reason, retry, ReasonShare)
	}
	if ttl := c.PTTL(ctx, shareKeys[3]).Val().Milliseconds(); ttl < 60_000 {
		t.Fatalf("the share bucket expires in %dms; want a minute after it is full", ttl)
	}

	// A second later: full (5 of the 10 refilled), five pass.
	reply = call(now+1_000_000, 100, paced(1, 0), paced(1, 0), paced(1, 0), paced(1, 0), paced(1, 0), paced(1, 0))
	if got := allowedOf(reply); !slices.Equal(got, []int64{1, 1, 1, 1, 1, 0}) {
		t.Fatalf("a full share bucket of 5 admitted %v", got)
	}

	// Full again: a request of 20 (four times the burst) passes into debt
	// of 15 tokens; the next token is 1.6 s away.
	reply = call(now+2_000_000, 100, paced(20, 0), paced(1, 0))
	if got := allowedOf(reply); !slices.Equal(got, []int64{1, 0}) {
		t.Fatalf("a full share bucket and a request of 20: %v; want it admitted into debt", got)
	}
	if retry := field(reply, 1, 3); retry != 1_600_000 {
		t.Fatalf("after a debt of 15 tokens the next waits %dµs; want 1.6 s", retry)
	}

	// The global level denies first: 74 of its 100 tokens are left, and a
	// request of 80 fails both it and the share (1 token back).
	reply = call(now+3_600_000, 100, paced(80, 0))
	if reason := field(reply, 0, 2); reason != ReasonGlobal {
		t.Fatalf("a request the global bucket cannot cover: reason %d, want global (%d)", reason, ReasonGlobal)
	}

	// A group denied by its share leaves the bucket as it was.
	before := c.Get(ctx, shareKeys[3]).Val()
	reply = call(now+3_700_000, 100, paced(1, 1), paced(1, 1), paced(5, 1))
	if allowedOf(reply)[2] != 0 {
		t.Fatalf("the group's last request passed: %v", allowedOf(reply))
	}
	if after := c.Get(ctx, shareKeys[3]).Val(); after != before {
		t.Fatal("a denied group changed its tenant's share bucket")
	}
}
