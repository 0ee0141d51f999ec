#!/usr/bin/env bash
# Experiment 6 in central mode: tier protection at 150% overload, run.sh's
# two profiles (Zipf and balanced; weights 8/4/1, floors 40/25/5%) at half
# its scale (plane-central/: global 10,000 tokens/s, tier limits half of
# plane/'s, offered 15,000 reads/s; 30,000 decisions/s through Redis beside
# the generator on 2 cores opened the breaker now and then; the balanced
# profile's tenants offer 3 req/s each) in real time to a fleet of 4
# in-process enforcers in mode central (cmd/load -nodes 4 -mode central),
# requests round robin over the nodes, every decision decide.lua in one real
# Redis (started here on a free loopback port), the fleet's fair shares
# exchanged every fairness interval (pkg/enforcer, central_fair.go). Each
# profile with fairness maxmin and none, 100 s with the first 60 s left out
# (run.sh: 60 s, 20 s; a node sees a quarter of each tenant's arrivals, so
# the tail's averages settle about four times later than one engine's),
# REPEATS times, under the bench lock, Redis flushed before each; the tier
# table from ../05-fair-shares/analyze, as for run.sh.
#
#   RESULTS=/tmp/quotaplane-experiments/06-tier-protection-central   raw output
#   SHARE_BY=tenant   the plane's shareBy (tenant or tier; the numbers in docs/ were
#                     measured with tier, before tenant became the default)
#   REPEATS=3 WORKERS=128
#   ANALYZE_ONLY=1   skip the runs, analyze what RESULTS holds
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../../.."

RESULTS="${RESULTS:-/tmp/quotaplane-experiments/06-tier-protection-central}"
SHARE_BY="${SHARE_BY:-tenant}"
REPEATS="${REPEATS:-3}"
WORKERS="${WORKERS:-128}"
PLANE=hack/experiments/06-tier-protection/plane-central

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

run() { # name fairness profile-flags...
	local name=$1 fairness=$2
	shift 2
	[[ -n "${ANALYZE_ONLY:-}" ]] && return
	redis-cli -p "$port" flushall >/dev/null
	flock /tmp/quotaplane-bench.lock "$RESULTS/load" -policy "$PLANE" -nodes 4 -redis-addr "127.0.0.1:$port" -mode central \
		-workers "$WORKERS" -seed 1 -rate 15000 -mix read=1 -fairness "$fairness" -share-by "$SHARE_BY" \
		-duration 100s -warmup 60s -quiet -out "$RESULTS/$name" "$@" >"$RESULTS/$name.txt"
	echo "== $name: $RESULTS/$name" && cat "$RESULTS/$name.txt"
}
balanced=(-zipf 0 -enterprise 2000 -standard 1500)
runs=()
for i in $(seq 1 "$REPEATS"); do
	run "zipf-maxmin-$i" maxmin
	run "zipf-none-$i" none
	run "balanced-maxmin-$i" maxmin "${balanced[@]}"
	run "balanced-none-$i" none "${balanced[@]}"
	for r in zipf-maxmin zipf-none balanced-maxmin balanced-none; do
		runs+=("$r-$i=$RESULTS/$r-$i")
	done
done

echo
"$RESULTS/analyze" -share-by "$SHARE_BY" -policy "$PLANE" -tiers-only "${runs[@]}"
