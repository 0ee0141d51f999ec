#!/usr/bin/env bash
# Experiment 2 (seed 002 §10.2): distributed accuracy, central against
# local-reconciled. A fleet of 8 in-process nodes shares one real Redis
# (started here on a free loopback port) and is offered 20,000 reads/s
# (cost 1) against a global limit of 10,000 tokens/s, burst 10,000, by 100
# tenants whose own limits are far above their demand: only the global level
# binds (plane/). Central mode, then local-reconciled at each reconcile
# interval, REPEATS times each; every run is measured under the bench lock.
#
# (Central mode decides about 35,000/s on this 2-core machine with the
# generator beside it, so the offered rate stays below that: a generator
# that falls behind would stretch the run.)
#
# The generator is cmd/load's in-process fleet; its tokens.csv counts the
# admitted tokens per second of wall time, the clock the limit refills on.
# Overage (plot/):
#   cold   = admitted over the whole run / (rate × wall time + burst) − 1
#   steady = admitted in the seconds from the warmup to the scheduled end
#            / (rate × (duration − warmup)) − 1
# p99 is the decision latency over the whole run (summary.json).
#
#   RESULTS=/tmp/quotaplane-experiments/02-accuracy   raw output
#   DURATION=15s WARMUP=5s REPEATS=3 INTERVALS="25 50 100 200 500 1000 2000"
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../../.."

RESULTS="${RESULTS:-/tmp/quotaplane-experiments/02-accuracy}"
DURATION="${DURATION:-15s}"
WARMUP="${WARMUP:-5s}"
REPEATS="${REPEATS:-3}"
INTERVALS="${INTERVALS:-25 50 100 200 500 1000 2000}"
PLANE=hack/experiments/02-accuracy/plane
RATE=10000 BURST=10000 OFFERED=20000

mkdir -p "$RESULTS"
go run ./cmd/enforcer check "$PLANE"
go build -o "$RESULTS/load" ./cmd/load

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
	--pidfile "$RESULTS/redis.pid" --logfile "$RESULTS/redis.log"
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done

run() { # name mode [reconcile-ms]
	local name=$1 mode=$2 ms=${3:-}
	mkdir -p "$RESULTS/$name"
	for r in $(seq 1 "$REPEATS"); do
		redis-cli -p "$port" flushall >/dev/null
		local out="$RESULTS/$name/run$r"
		echo "== $name run $r" >&2
		flock /tmp/quotaplane-bench.lock "$RESULTS/load" -policy "$PLANE" -nodes 8 -redis-addr "127.0.0.1:$port" \
			-mode "$mode" ${ms:+-reconcile-ms "$ms"} -rate "$OFFERED" -duration "$DURATION" -warmup "$WARMUP" \
			-tenants 100 -enterprise 10 -standard 30 -whales 5 -mix read=1 -workers 128 -seed "$r" \
			-quiet -out "$out" >"$out.txt" 2>&1 || { cat "$out.txt" >&2; exit 1; }
	done
}

run central central
for ms in $INTERVALS; do
	run "reconciled-$ms" local-reconciled "$ms"
done

go run ./hack/experiments/02-accuracy/plot -results "$RESULTS" -rate "$RATE" -burst "$BURST" \
	-duration "$DURATION" -warmup "$WARMUP" -img docs/experiments/img
