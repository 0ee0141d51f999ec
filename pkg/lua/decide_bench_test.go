package lua

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/quotaplane/quotaplane/pkg/keyspace"
	"github.com/quotaplane/quotaplane/pkg/redistest"
)

// BenchmarkDecideScript measures decide.lua's Redis CPU per decision (from
// INFO commandstats) for batches of n requests that share their tenant, key
// and endpoint ("same") or share nothing but the global bucket
// ("distinct"): the two ends of how much a batch coalesces.
//
//	make bench PKGS=./pkg/lua BENCH=DecideScript
func BenchmarkDecideScript(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client()
	ctx := context.Background()
	for _, shape := range []string{"same", "distinct"} {
		for _, n := range []int{1, 16, 128} {
			b.Run(fmt.Sprintf("%s/n=%d", shape, n), func(b *testing.B) {
				c.FlushDB(ctx)
				c.ConfigResetStat(ctx)
				b.ReportAllocs()
				call := decideCall(n, shape == "distinct", 0)
				for i := 0; b.Loop(); i++ {
					if shape == "distinct" { // fresh holders every call
						call = decideCall(n, true, i)
					}
					if err := Decide.RunCall(ctx, c, call).Err(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(redisMicrosPerCall(b, c)/float64(n), "redis-µs/decision")
			})
		}
	}
}

// decideCall is a batch of n requests with every level in force and a
// burst pool, all admitted: each holder's tenant, allowance and endpoint
// buckets in its hash, its key's bucket a key of its own (pkg/keyspace).
func decideCall(n int, distinct bool, call int) Call {
	prefix := keyspace.PlanePrefix("b")
	levels := &Levels{}
	levels.Add(keyspace.Level{Key: prefix.Global()}, Limit{AlgorithmTokenBucket, 1e9, 1e9, 1e6})
	levels.Add(keyspace.Level{Key: prefix.Pool()}, Limit{AlgorithmTokenBucket, 1e4, 1e5, 1e6})
	levels.Key(prefix.Demand())
	var requests []byte
	put := func(b []byte, vs ...int64) []byte {
		for _, v := range vs {
			b = binary.LittleEndian.AppendUint64(b, uint64(v))
		}
		return b
	}
	var first int64
	for i := range n {
		if distinct || i == 0 {
			h := keyspace.Holder(strconv.Itoa(call*n + i))
			first = levels.Add(prefix.Tenant(h, false), Limit{AlgorithmTokenBucket, 1e6, 1e6, 1e6})
			levels.Add(prefix.Allowance(h), Limit{AlgorithmTokenBucket, 1e4, 1000, 1e6})
			levels.Add(prefix.Endpoint(h, "read", false), Limit{AlgorithmTokenBucket, 1e6, 1e6, 1e6})
			levels.Add(prefix.Key(h, keyspace.KeyDigest("k1"), false), Limit{AlgorithmTokenBucket, 1e6, 1e6, 1e6})
		}
		requests = put(requests, 1, 0, 1, first, first+1, first+2, first+3, 0, 0)
	}
	return DecideCall(levels, 0, requests, false)
}

func redisMicrosPerCall(b *testing.B, c *redis.Client) float64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if !strings.HasPrefix(line, "cmdstat_evalsha:") {
			continue
		}
		for _, f := range strings.Split(strings.TrimSpace(strings.TrimPrefix(line, "cmdstat_evalsha:")), ",") {
			if v, ok := strings.CutPrefix(f, "usec_per_call="); ok {
				x, _ := strconv.ParseFloat(v, 64)
				return x
			}
		}
	}
	b.Fatal("no evalsha in commandstats")
	return 0
}
