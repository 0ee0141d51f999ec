#!/usr/bin/env bash
# The sustained run (seed 002 §4, §12): the full seed 002 profile (5,000
# tenants, Zipf s = 1.2, 20 whales, 4 keys each, read/write/export 90/9/1)
# offered at 1,000,000 requests/s to a fleet of 8 in-process nodes sharing
# one Redis (started here on a free loopback port), mode local-reconciled,
# reconcile 200 ms, against a global limit of 1,000,000 tokens/s (plane/),
# for DURATION. Before it, the generator alone (-target null) at 1M and 2M
# requests/s; after it, a short central run at the same offered rate for
# contrast. Every run holds the bench lock: they use the whole machine.
#
# The generator is ./driver: cmd/load's in-process fleet plus a count of
# the admitted tokens per second (tokens.csv), since the global limit counts
# tokens (read 1, write 5, export 50), not requests.
#
#   RESULTS=/tmp/quotaplane-experiments/08-sustained   raw output
#   DURATION=600s WARMUP=10s RATE=1000000 WORKERS=2 NULL_DURATION=20s
#   CENTRAL_DURATION=3s CENTRAL_WORKERS=256 REPEATS=3 (null runs)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../../.."

RESULTS="${RESULTS:-/tmp/quotaplane-experiments/08-sustained}"
DURATION="${DURATION:-600s}"
WARMUP="${WARMUP:-10s}"
RATE="${RATE:-1000000}"
WORKERS="${WORKERS:-2}"
NULL_DURATION="${NULL_DURATION:-20s}"
CENTRAL_DURATION="${CENTRAL_DURATION:-3s}"
CENTRAL_WORKERS="${CENTRAL_WORKERS:-256}"
REPEATS="${REPEATS:-3}"
LIMIT=1000000 BURST=1000000
EXP=hack/experiments/08-sustained

mkdir -p "$RESULTS"
go run ./cmd/enforcer check "$EXP/plane"
go build -o "$RESULTS/load" ./cmd/load
go build -o "$RESULTS/driver" ./$EXP/driver

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
	--pidfile "$RESULTS/redis.pid" --logfile "$RESULTS/redis.log"
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done

# The generator alone.
echo "| generator alone (-target null) | run | offered/s (scheduled) | decided/s (wall) | generator lag p99 |"
echo "|---|---|---|---|---|"
for rate in 1000000 2000000; do
	for r in $(seq 1 "$REPEATS"); do
		out="$RESULTS/null-$rate-run$r"
		flock /tmp/quotaplane-bench.lock "$RESULTS/load" -target null -rate "$rate" -duration "$NULL_DURATION" \
			-workers "$WORKERS" -seed "$r" -quiet -out "$out" >"$out.txt"
		jq -r --arg rate "$rate" --arg r "$r" \
			'"| \($rate) | \($r) | \(.totals.offered / .measuredSeconds | floor) | \(.decisionsPerWallSecond | floor) | \(.generatorLag.p99us) µs |"' \
			"$out/summary.json"
	done
done

# summarise DIR: the run's totals and its per-second overage after the
# warmup, from tokens.csv (wall seconds; the partial seconds after the
# scheduled end are left out).
summarise() {
	local dir=$1 secs
	secs=$(jq '.measuredSeconds + 0' "$dir/summary.json")
	jq -r '"offered \(.totals.offered / .measuredSeconds | floor)/s (after the warmup), decided \(.decisionsPerWallSecond | floor)/s over \(.wallSeconds * 10 | floor / 10) s of wall time, errors \(.errors); decision p50 \(.latency.p50us) µs, p99 \(.latency.p99us) µs, p99.9 \(.latency.p999us) µs; generator lag p99 \(.generatorLag.p99us) µs"' "$dir/summary.json"
	awk -F, -v limit="$LIMIT" -v burst="$BURST" -v warm="${WARMUP%s}" -v dur="${2%s}" '
		NR > 1 && $1 < dur { all += $2; if ($1 >= warm) { steady += $2; n++; o = 100 * ($2 / limit - 1); v[n] = o; if (n == 1 || o > max) max = o; if (n == 1 || o < min) min = o } }
		END {
			asort(v); med = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
			printf "admitted tokens: whole run %+.3f%% vs rate × duration + burst; after the warmup %+.3f%% vs rate × time; per second after the warmup: median %+.2f%%, min %+.2f%%, max %+.2f%% (%d s)\n",
				100 * (all / (limit * dur + burst) - 1), 100 * (steady / (limit * (dur - warm)) - 1), med, min, max, n
		}' "$dir/tokens.csv"
	awk -F, 'NR > 1 { if ($14 + 0 > lag) { lag = $14; t = $1 } if ($11 + 0 > p99) { p99 = $11; tp = $1 } }
		END { printf "worst second: decision p99 %.0f µs (t=%d s), generator lag p99 %.0f µs (t=%d s)\n", p99, tp, lag, t }' "$dir/seconds.csv"
}

# The sustained run.
redis-cli -p "$port" flushall >/dev/null
out="$RESULTS/sustained"
echo
echo "sustained: local-reconciled, 8 nodes, $RATE req/s offered for $DURATION"
flock /tmp/quotaplane-bench.lock "$RESULTS/driver" -policy "$EXP/plane" -nodes 8 -redis-addr "127.0.0.1:$port" \
	-rate "$RATE" -duration "$DURATION" -warmup "$WARMUP" -workers "$WORKERS" -out "$out" \
	-plots docs/experiments/img/08-sustained -plot-limit "$LIMIT" >"$out.txt" 2>"$out.progress"
summarise "$out" "$DURATION"

# Central, for contrast.
redis-cli -p "$port" flushall >/dev/null
out="$RESULTS/central"
echo
echo "central, for contrast: 8 nodes, $RATE req/s offered for $CENTRAL_DURATION, $CENTRAL_WORKERS generator goroutines"
flock /tmp/quotaplane-bench.lock "$RESULTS/driver" -policy "$EXP/plane" -mode central -nodes 8 -redis-addr "127.0.0.1:$port" \
	-rate "$RATE" -duration "$CENTRAL_DURATION" -workers "$CENTRAL_WORKERS" -out "$out" -quiet >"$out.txt" 2>&1
jq -r '"offered (scheduled) \(.totals.offered / .measuredSeconds | floor)/s, decided \(.decisionsPerWallSecond | floor)/s over \(.wallSeconds * 10 | floor / 10) s of wall time, errors \(.errors); decision p50 \(.latency.p50us) µs, p99 \(.latency.p99us) µs; generator lag p99 \(.generatorLag.p99us) µs"' "$out/summary.json"
