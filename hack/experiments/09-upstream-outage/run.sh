#!/usr/bin/env bash
# Experiment 9 (seed 004): an upstream outage through a real enforcer fleet.
# Seed 002's 5,000-tenant profile (Zipf s = 1.2, 20 whales, 50/950/4,000
# tiers) at 1,800 requests/s, all on chat, in real time to 4 in-process
# enforcers in mode central on one real Redis (started here on a free
# loopback port). cmd/load -upstream llm plays the gateway in front of a
# fake provider (pkg/upstream/upstreamtest, timeline.json: 2,000 requests/s;
# from 60 s to 360 s it loses 60 % of its capacity — 800/s, half its
# answers 503, a 2.5 s p95, its stated limit cut to 40 % — then flaps
# every 10 s until 460 s, then recovers): every admitted request is sent to
# it and every call reported back to the enforcer that decided it. The
# plane (plane/) names the five biggest customers critical (enterprise,
# 500k contract, real-time; 60 requests/s each, 300/s reserved).
#
# Two runs of 800 s under the bench lock, Redis flushed before each:
#   sensing   seed 004's leader in the same process (probe every 5 s,
#             passive reports, cycles of 30 s / 10 s), the plan in Redis
#   static    no leader: static tiers, nothing gated
# Then analyze/ prints the targets' table and draws the plots into
# docs/experiments/img/.
#
#   RESULTS=/tmp/quotaplane-experiments/09-upstream-outage   raw output
#   RUNS="sensing static"   which runs (default both)
#   ANALYZE_ONLY=1   skip the runs
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../../.."

RESULTS="${RESULTS:-/tmp/quotaplane-experiments/09-upstream-outage}"
DIR=hack/experiments/09-upstream-outage
DURATION="${DURATION:-800s}"

mkdir -p "$RESULTS"
go run ./cmd/enforcer check "$DIR/plane"
go build -o "$RESULTS/load" ./cmd/load

if [[ -z "${ANALYZE_ONLY:-}" ]]; then
	command -v redis-server >/dev/null || { apt-get update -qq && apt-get install -y -qq redis-server >/dev/null; }
	port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
	redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
		--pidfile "$RESULTS/redis.pid" --logfile "$RESULTS/redis.log"
	trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true' EXIT
	until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done
	for name in ${RUNS:-sensing static}; do
		sensing=true
		[[ $name == static ]] && sensing=false
		redis-cli -p "$port" flushall >/dev/null
		flock /tmp/quotaplane-bench.lock "$RESULTS/load" -policy "$DIR/plane" -nodes 4 -redis-addr "127.0.0.1:$port" -workers 64 -seed 1 \
			-rate 1800 -mix chat=1 -duration "$DURATION" -quiet \
			-upstream llm -upstream-timeline "$DIR/timeline.json" -sensing="$sensing" \
			-out "$RESULTS/$name" >"$RESULTS/$name.txt" 2>"$RESULTS/$name.log"
		echo "== $name: $RESULTS/$name" && cat "$RESULTS/$name.txt"
	done
fi

go run ./$DIR/analyze -results "$RESULTS" -timeline "$DIR/timeline.json"
