package lua

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

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
				keys, args := decideCall(n, shape == "distinct", 0)
				for i := 0; b.Loop(); i++ {
					if shape == "distinct" { // fresh holders every call
						keys, args = decideCall(n, true, i)
					}
					if err := Decide.Run(ctx, c, keys, args...).Err(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(redisMicrosPerCall(b, c)/float64(n), "redis-µs/decision")
			})
		}
	}
}

// decideCall is a batch of n requests with every level in force and a
// burst pool, all admitted.
func decideCall(n int, distinct bool, call int) ([]string, []any) {
	keys := []string{"qp:{b}:g", "qp:{b}:pool", "qp:{b}:d"}
	var limits, requests []byte
	put := func(b []byte, vs ...int64) []byte {
		for _, v := range vs {
			b = binary.LittleEndian.AppendUint64(b, uint64(v))
		}
		return b
	}
	limits = put(limits, AlgorithmTokenBucket, 1e9, 1e9, 1e6, AlgorithmTokenBucket, 1e4, 1e5, 1e6, AlgorithmNone, 0, 0, 0)
	for i := range n {
		h := "1"
		if distinct {
			h = strconv.Itoa(call*n + i)
		}
		first := int64(len(keys)) + 1
		if !distinct && i > 0 {
			first = 4
		} else {
			keys = append(keys, "qp:{b}:t:"+h, "qp:{b}:a:"+h, "qp:{b}:e:"+h+":read", "qp:{b}:k:"+h+":k1")
			limits = put(limits, AlgorithmTokenBucket, 1e6, 1e6, 1e6, AlgorithmTokenBucket, 1e4, 1000, 1e6,
				AlgorithmTokenBucket, 1e6, 1e6, 1e6, AlgorithmTokenBucket, 1e6, 1e6, 1e6)
		}
		requests = put(requests, 1, 0, 1, first, first+1, first+2, first+3, 0, 0)
	}
	return keys, []any{0, limits, requests, 0}
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
