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
# The generator is cmd/load's in-process fleet; its tokens.csv counts the
# admitted tokens per second of wall time, since the global limit counts
# tokens (read 1, write 5, export 50), not requests, and refills on the wall
# clock whether or not the generator keeps its schedule.
#
# summarise.sh prints the tables and plot/ draws the time series.
#
#   RESULTS=/tmp/quotaplane-experiments/08-sustained   raw output
#   DURATION=600s WARMUP=10s RATE=1000000 WORKERS=2 NULL_DURATION=20s
#   CENTRAL_DURATION=3s CENTRAL_WORKERS=256 REPEATS=3 (null runs)
#   PLOTS=docs/experiments/img/08-sustained   the PNGs' path prefix
#   NULL=1 CENTRAL=1                           0 leaves those runs out
#
# Central mode decides far fewer than 1M/s here, so its 3 scheduled
# seconds take much longer in wall time; decided/s is what it does.
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
PLOTS="${PLOTS:-docs/experiments/img/08-sustained}"
NULL="${NULL:-1}"
CENTRAL="${CENTRAL:-1}"
export LIMIT=1000000 BURST=1000000 WARMUP
EXP=hack/experiments/08-sustained

mkdir -p "$RESULTS"
go run ./cmd/enforcer check "$EXP/plane"
go build -o "$RESULTS/load" ./cmd/load

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
	--pidfile "$RESULTS/redis.pid" --logfile "$RESULTS/redis.log"
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done

# The generator alone.
if [ "$NULL" = 1 ]; then
	for rate in 1000000 2000000; do
		for r in $(seq 1 "$REPEATS"); do
			out="$RESULTS/null-$rate-run$r"
			flock /tmp/quotaplane-bench.lock "$RESULTS/load" -target null -rate "$rate" -duration "$NULL_DURATION" \
				-workers "$WORKERS" -seed "$r" -quiet -out "$out" >"$out.txt"
		done
	done
fi

# The sustained run.
redis-cli -p "$port" flushall >/dev/null
out="$RESULTS/sustained"
flock /tmp/quotaplane-bench.lock "$RESULTS/load" -policy "$EXP/plane" -nodes 8 -redis-addr "127.0.0.1:$port" \
	-rate "$RATE" -duration "$DURATION" -warmup "$WARMUP" -workers "$WORKERS" -out "$out" >"$out.txt" 2>"$out.progress"
go run ./$EXP/plot -dir "$out" -prefix "$PLOTS" -limit "$LIMIT" -seconds "${DURATION%s}"

# Central, for contrast.
if [ "$CENTRAL" = 1 ]; then
	redis-cli -p "$port" flushall >/dev/null
	flock /tmp/quotaplane-bench.lock "$RESULTS/load" -policy "$EXP/plane" -mode central -nodes 8 -redis-addr "127.0.0.1:$port" \
		-rate "$RATE" -duration "$CENTRAL_DURATION" -workers "$CENTRAL_WORKERS" -out "$RESULTS/central" -quiet >"$RESULTS/central.txt" 2>&1
fi

$EXP/summarise.sh "$RESULTS"
