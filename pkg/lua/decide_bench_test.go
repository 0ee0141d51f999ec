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

// BenchmarkDecideScript measures decide.lua's Redis CPU per decision for
// batches of n requests that share their tenant, key and endpoint ("same"),
// that share nothing but the global bucket with holders new every call
// ("distinct": every bucket a new key, as with a million tenants) or with
// holders drawn again from 1,024 ("reused": as 1,000 busy tenants, whose
// buckets exist when a batch reads them): the ends of how much a batch
// coalesces and of how much Redis creates and expires. redis-µs/decision is
// EVALSHA's time in INFO commandstats, which is wall time and grows when
// the machine is busy and Redis waits for a core; redis-cpu-µs/decision is
// the CPU the Redis process used meanwhile (INFO cpu), which does not, and
// counts reading and parsing the calls, writing the replies and expiring
// the keys too.
//
//	make bench PKGS=./pkg/lua BENCH=DecideScript
func BenchmarkDecideScript(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client()
	ctx := context.Background()
	for _, shape := range []string{"same", "distinct", "reused"} {
		for _, n := range []int{1, 16, 128} {
			b.Run(fmt.Sprintf("%s/n=%d", shape, n), func(b *testing.B) {
				c.FlushDB(ctx)
				c.ConfigResetStat(ctx)
				cpu := srv.CPUMicros()
				b.ReportAllocs()
				keys, args := decideCall(n, shape != "same", 0)
				calls := 0
				for ; b.Loop(); calls++ {
					switch shape {
					case "distinct":
						keys, args = decideCall(n, true, calls)
					case "reused":
						keys, args = decideCall(n, true, calls%(1024/n))
					}
					if err := Decide.Run(ctx, c, keys, args...).Err(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(redisMicrosPerCall(b, c)/float64(n), "redis-µs/decision")
				b.ReportMetric((srv.CPUMicros()-cpu)/float64(calls*n), "redis-cpu-µs/decision")
			})
		}
	}
}

// BenchmarkDecideFloor measures the Redis CPU per decision of the commands
// alone that a batch of 128 holders (BenchmarkDecideScript's distinct and
// reused shapes at n=128, the same KEYS and ARGV) costs in each layout of
// the levels' state, without any of decide.lua's arithmetic: a floor under
// what the script can cost. call is the script call alone (reading the
// call, making KEYS and ARGV, the reply); key-per-level is today's layout:
// a GET and a SET PX of each of the request's tenant, endpoint and key
// buckets; hash-per-tenant keeps a tenant's buckets in one hash (HMGET,
// HSET of the three, PEXPIRE); string-per-tenant in one string (GET, SET
// PX).
//
//	go test -run '^$' -bench DecideFloor ./pkg/lua/
func BenchmarkDecideFloor(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client()
	ctx := context.Background()
	// KEYS from 4 on: per request its tenant, allowance, endpoint and key
	for _, layout := range []struct{ name, src string }{
		{"call", `return #KEYS`},
		{"key-per-level", `local v = string.rep('b', 32)
for i = 4, #KEYS, 4 do
  for j = 0, 3 do if j ~= 1 then redis.call('GET', KEYS[i + j]) end end
  for j = 0, 3 do if j ~= 1 then redis.call('SET', KEYS[i + j], v, 'PX', '1001') end end
end`},
		{"hash-per-tenant", `local v, k = string.rep('b', 32), 'k:' .. string.rep('d', 32)
for i = 4, #KEYS, 4 do
  redis.call('HMGET', KEYS[i], 't', 'e:read', k)
  redis.call('HSET', KEYS[i], 't', v, 'e:read', v, k, v)
  redis.call('PEXPIRE', KEYS[i], '1001')
end`},
		{"string-per-tenant", `local v = string.rep('b', 96)
for i = 4, #KEYS, 4 do
  redis.call('GET', KEYS[i])
  redis.call('SET', KEYS[i], v, 'PX', '1001')
end`},
	} {
		sha, err := c.ScriptLoad(ctx, layout.src).Result()
		if err != nil {
			b.Fatal(err)
		}
		for _, holders := range []string{"distinct", "reused"} {
			b.Run(layout.name+"/"+holders, func(b *testing.B) {
				c.FlushDB(ctx)
				cpu := srv.CPUMicros()
				calls := 0
				for ; b.Loop(); calls++ {
					call := calls
					if holders == "reused" {
						call %= 1024 / 128
					}
					keys, args := decideCall(128, true, call)
					if err := c.EvalSha(ctx, sha, keys, args...).Err(); err != nil && err != redis.Nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric((srv.CPUMicros()-cpu)/float64(calls*128), "redis-cpu-µs/decision")
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
