#!/usr/bin/env bash
# Experiment 1 in central mode: the noisy neighbour against a fleet of 4
# in-process enforcers in mode central (cmd/load -nodes 4), every decision
# decide.lua in one real Redis (started here on a free loopback port), the
# fleet's fair shares exchanged every fairness interval (pkg/enforcer,
# central_fair.go). Requests go to the nodes round robin.
#
# Scaled to what central mode carries here beside the generator (about
# 35,000 decisions/s on 2 cores, experiment 2): plane-central/ is plane/ at
# a tenth (global 2,000 tokens/s, whale-1's own limit 1,500/s), offered
# 1,000 reads/s by seed 002's profile, and whale-1 adds 10,000/s from 10 s
# to 20 s of a 30 s run (5× the global rate, where run.sh's spike is 15×:
# above its share, the whale's extra requests are only more denials). The
# same three arms as run.sh: fairness none, maxmin, and maxmin on
# plane-central-floors/ (the free floor at 20%), REPEATS times each, every
# run under the bench lock, Redis flushed before each; analyze/ as for
# run.sh, plots into docs/experiments/img/01-central-*.png.
#
#   RESULTS=/tmp/quotaplane-experiments/01-noisy-neighbour-central   raw output
#   SHARE_BY=tenant   the plane's shareBy (tenant or tier; the numbers in docs/ were
#                     measured with tier, before tenant became the default)
#   REPEATS=3 WORKERS=128
#   ANALYZE_ONLY=1   skip the runs, analyze what RESULTS holds
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../../.."

RESULTS="${RESULTS:-/tmp/quotaplane-experiments/01-noisy-neighbour-central}"
SHARE_BY="${SHARE_BY:-tenant}"
REPEATS="${REPEATS:-3}"
WORKERS="${WORKERS:-128}"
PLANE=hack/experiments/01-noisy-neighbour/plane-central
FLOORS=hack/experiments/01-noisy-neighbour/plane-central-floors
SPIKE=whale-1:10000:10s:20s

mkdir -p "$RESULTS" docs/experiments/img
go run ./cmd/enforcer check "$PLANE"
go run ./cmd/enforcer check "$FLOORS"
go build -o "$RESULTS/load" ./cmd/load
go build -o "$RESULTS/analyze" ./hack/experiments/01-noisy-neighbour/analyze

if [[ -z "${ANALYZE_ONLY:-}" ]]; then
	port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
	redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
		--pidfile "$RESULTS/redis.pid" --logfile "$RESULTS/redis.log"
	trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true' EXIT
	until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done
fi

declare -A dirs
for i in $(seq 1 "$REPEATS"); do
	for arm in none maxmin floors; do
		out="$RESULTS/$arm-$i"
		dirs[$arm]="${dirs[$arm]:+${dirs[$arm]},}$out"
		[[ -n "${ANALYZE_ONLY:-}" ]] && continue
		plane=$PLANE fairness=$arm
		[[ $arm == floors ]] && plane=$FLOORS fairness=maxmin
		redis-cli -p "$port" flushall >/dev/null
		flock /tmp/quotaplane-bench.lock "$RESULTS/load" -policy "$plane" -nodes 4 -redis-addr "127.0.0.1:$port" \
			-mode central -fairness "$fairness" -share-by "$SHARE_BY" -workers "$WORKERS" -seed 1 -rate 1000 -mix read=1 \
			-duration 30s -warmup 2s -spike "$SPIKE" -quiet -out "$out" >"$out.txt"
		echo "== $arm, run $i: $out" && cat "$out.txt"
	done
done

echo
"$RESULTS/analyze" -share-by "$SHARE_BY" -policy "$PLANE" -from 10s -to 20s -spike whale-1:10000 -img docs/experiments/img/01-central- \
	none="${dirs[none]}" maxmin="${dirs[maxmin]}"
echo
echo "== floors: plane-central-floors/ (free floor 20%)"
"$RESULTS/analyze" -share-by "$SHARE_BY" -policy "$FLOORS" -from 10s -to 20s -spike whale-1:10000 -img docs/experiments/img/01-central-floors- \
	maxmin="${dirs[floors]}"
