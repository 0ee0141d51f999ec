#!/usr/bin/env bash
# Experiment 5 in central mode: seed 002's whale + long-tail profile (5,000
# tenants, Zipf s = 1.2, 20 whales, 50/950/4,000 tiers) at run.sh's 1.5x
# overload, in real time to a fleet of 4 in-process enforcers in mode
# central (cmd/load -nodes 4 -mode central), requests round robin over the
# nodes, every decision
# decide.lua in one real Redis (started here on a free loopback port), the
# fleet's fair shares computed by every node from the demand the nodes
# exchange every fairness interval (pkg/enforcer, central_fair.go). At half
# run.sh's scale: plane-central/ (global 10,000 tokens/s, tier limits half
# of plane/'s) offered 15,000 reads/s; at 30,000 decisions/s through Redis
# beside the generator on 2 cores the breaker opened now and then. Runs,
# each 100 s with the first 60 s left out (run.sh: 60 s and 20 s; a node
# sees a quarter of each tenant's arrivals, so the long tail's averages
# settle about four times later than one engine's: with 20 s left out the
# free tier got 1.09 of its share), REPEATS times, under the bench lock,
# Redis flushed before each:
#   maxmin       fairness maxmin
#   none         fairness none, the contrast
#   mix-maxmin   seed 002's 90/9/1 read/write/export mix at 8,108 requests/s
#                (15,000 tokens/s)
# analyze/ then compares every tenant's admitted rate with pkg/load's
# reference share, as for run.sh (share ≥ 1 token/s, and ≥ 0.1).
#
#   RESULTS=/tmp/quotaplane-experiments/05-fair-shares-central   raw output
#   SHARE_BY=tenant   the plane's shareBy (tenant or tier; the numbers in docs/ were
#                     measured with tier, before tenant became the default)
#   REPEATS=3 WORKERS=128
#   ANALYZE_ONLY=1   skip the runs, analyze what RESULTS holds
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../../.."

RESULTS="${RESULTS:-/tmp/quotaplane-experiments/05-fair-shares-central}"
SHARE_BY="${SHARE_BY:-tenant}"
REPEATS="${REPEATS:-3}"
WORKERS="${WORKERS:-128}"
PLANE=hack/experiments/05-fair-shares/plane-central

mkdir -p "$RESULTS"
go run ./cmd/enforcer check "$PLANE"
go build -o "$RESULTS/load" ./cmd/load
go build -o "$RESULTS/analyze" ./hack/experiments/05-fair-shares/analyze

if [[ -z "${ANALYZE_ONLY:-}" ]]; then
	port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
	redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
		--pidfile "$RESULTS/redis.pid" --logfile "$RESULTS/redis.log"
	trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true' EXIT
	until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done
fi

run() { # name fairness
	[[ -n "${ANALYZE_ONLY:-}" ]] && return
	redis-cli -p "$port" flushall >/dev/null
	flock /tmp/quotaplane-bench.lock "$RESULTS/load" -policy "$PLANE" -nodes 4 -redis-addr "127.0.0.1:$port" -mode central \
		-workers "$WORKERS" -seed 1 -rate "${RATE:-15000}" -mix "${MIX:-read=1}" -fairness "$2" -share-by "$SHARE_BY" \
		-duration 100s -warmup 60s -quiet -out "$RESULTS/$1" >"$RESULTS/$1.txt"
	echo "== $1: $RESULTS/$1" && cat "$RESULTS/$1.txt"
}
runs=()
for i in $(seq 1 "$REPEATS"); do
	run "maxmin-$i" maxmin
	run "none-$i" none
	MIX=read=0.9,write=0.09,export=0.01 RATE=8108 run "mix-maxmin-$i" maxmin
	runs+=(none-$i="$RESULTS/none-$i" mix-maxmin-$i="$RESULTS/mix-maxmin-$i" maxmin-$i="$RESULTS/maxmin-$i")
done

echo
echo "== filter: share ≥ 1 token/s"
"$RESULTS/analyze" -share-by "$SHARE_BY" -policy "$PLANE" -min-share 1 -tail-rank 101 "${runs[@]}"
echo
echo "== filter: share ≥ 0.1 token/s"
"$RESULTS/analyze" -share-by "$SHARE_BY" -policy "$PLANE" -min-share 0.1 -tail-rank 101 "${runs[@]}"
