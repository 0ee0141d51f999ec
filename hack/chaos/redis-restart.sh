#!/usr/bin/env bash
# Issue 17: Redis killed (kill -9) under HTTP load and restarted empty, as
# a new user would try it. Two enforcer processes (MODE, default central)
# on one redis-server run the sample plane (global 10,000 tokens/s);
# cmd/load offers RATE requests/s of seed 002's profile over HTTP for
# DURATION; Redis is killed at DOWN_AT s and restarted, empty, DOWN s later.
# Prints cmd/load's seconds.csv (admitted, denied at global, errors per
# second); raw output in RESULTS.
#
#   RESULTS=/tmp/quotaplane-chaos/redis-restart MODE=central RATE=3000
#   DURATION=14 DOWN_AT=4 DOWN=5 PORT=6399
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

RESULTS="${RESULTS:-/tmp/quotaplane-chaos/redis-restart}"
MODE="${MODE:-central}"
RATE="${RATE:-3000}"
DURATION="${DURATION:-14}"
DOWN_AT="${DOWN_AT:-4}"
DOWN="${DOWN:-5}"
PORT="${PORT:-6399}"

command -v redis-server >/dev/null || make redis-server
rm -rf "$RESULTS"
mkdir -p "$RESULTS/bin"
go build -o "$RESULTS/bin/enforcer" ./cmd/enforcer
go build -o "$RESULTS/bin/load" ./cmd/load

pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT

redis() { redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no >>"$RESULTS/redis.log" 2>&1 & redis_pid=$!; pids+=("$redis_pid"); }
redis
sleep 0.5
for i in 0 1; do
	"$RESULTS/bin/enforcer" -mode "$MODE" -redis-addr "127.0.0.1:$PORT" -policy config/samples -node-id "n$i" \
		-listen "127.0.0.1:1808$i" -admin-listen "127.0.0.1:1909$i" -grpc-listen 127.0.0.1:0 -drain 0s >"$RESULTS/enforcer$i.log" 2>&1 &
	pids+=($!)
done
for i in 0 1; do
	until curl -sf "127.0.0.1:1909$i/readyz" >/dev/null; do sleep 0.1; done
done

"$RESULTS/bin/load" -target http -urls http://127.0.0.1:18080,http://127.0.0.1:18081 -rate "$RATE" -duration "${DURATION}s" \
	-out "$RESULTS/out" -quiet >"$RESULTS/load.log" 2>&1 &
load_pid=$!
sleep "$DOWN_AT"
kill -9 "$redis_pid"
echo "redis killed at ${DOWN_AT}s, restarted empty ${DOWN}s later" >&2
sleep "$DOWN"
redis
wait "$load_pid"
cut -d, -f1-6,17 "$RESULTS/out/seconds.csv"
