#!/usr/bin/env bash
# Experiment 1 (seed 002 §10.1): noisy neighbour, fairness off vs on, in
# real time (latency matters). One in-process engine (mode local) on
# plane/ (global 20,000 tokens/s). Seed 002's profile offers a steady
# 10,000 reads/s (cost 1; half the global limit; whale-1's own share of it
# is about 2,100/s); from 10 s to 20 s of a 30 s run whale-1 adds 300,000
# req/s (seed 002's number). -fairness none, then maxmin, REPEATS times each,
# every run under the bench lock. Victims are all tenants but whale-1.
# analyze/ reads seconds.csv: victims' success (not denied at the global
# level) and p99 before/during/after, the generator's reach and lag, and
# whale-1's admitted rate against its reference fair share (pkg/load
# FairShares) plus the burst pool's ceiling; it plots the first repeat of
# each mode into docs/experiments/img/01-*.png.
#
# maxmin shares by tenant (the planes' default shareBy, seed 002's); the arm
# tier is maxmin with -share-by tier (tiers first, then their tenants).
# Two more arms, floors and floors-tier: maxmin by each shareBy on
# plane-floors/, plane/ with the free tier's floor raised from 5% to 20%,
# above the free tenants' demand; analyzed against its own plane, plotted
# into docs/experiments/img/01-floors-*.png.
#
#   RESULTS=/tmp/quotaplane-experiments/01-noisy-neighbour   raw output
#   REPEATS=3
#   ANALYZE_ONLY=1   skip the runs, analyze what RESULTS holds
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../../.."

RESULTS="${RESULTS:-/tmp/quotaplane-experiments/01-noisy-neighbour}"
REPEATS="${REPEATS:-3}"
PLANE=hack/experiments/01-noisy-neighbour/plane
FLOORS=hack/experiments/01-noisy-neighbour/plane-floors
SPIKE=whale-1:300000:10s:20s

mkdir -p "$RESULTS" docs/experiments/img
go run ./cmd/enforcer check "$PLANE"
go run ./cmd/enforcer check "$FLOORS"
go build -o "$RESULTS/load" ./cmd/load
go build -o "$RESULTS/analyze" ./hack/experiments/01-noisy-neighbour/analyze

declare -A dirs
for i in $(seq 1 "$REPEATS"); do
	for arm in none maxmin tier floors floors-tier; do
		out="$RESULTS/$arm-$i"
		dirs[$arm]="${dirs[$arm]:+${dirs[$arm]},}$out"
		[[ -n "${ANALYZE_ONLY:-}" ]] && continue
		plane=$PLANE fairness=maxmin shareBy=tenant
		case $arm in
		none) fairness=none ;;
		tier) shareBy=tier ;;
		floors) plane=$FLOORS ;;
		floors-tier) plane=$FLOORS shareBy=tier ;;
		esac
		flock /tmp/quotaplane-bench.lock "$RESULTS/load" -policy "$plane" -fairness "$fairness" -share-by "$shareBy" -seed 1 \
			-rate 10000 -mix read=1 -duration 30s -warmup 2s -spike "$SPIKE" -quiet -out "$out" >"$out.txt"
		echo "== $arm, run $i: $out" && cat "$out.txt"
	done
done

echo
"$RESULTS/analyze" -policy "$PLANE" -from 10s -to 20s -spike whale-1:300000 -img docs/experiments/img/01- \
	none="${dirs[none]}" maxmin="${dirs[maxmin]}"
echo
echo "== shareBy tier"
"$RESULTS/analyze" -policy "$PLANE" -share-by tier -from 10s -to 20s -spike whale-1:300000 -img docs/experiments/img/01-tier- \
	maxmin-tier="${dirs[tier]}"
echo
echo "== floors: plane-floors/ (free floor 20%)"
"$RESULTS/analyze" -policy "$FLOORS" -from 10s -to 20s -spike whale-1:300000 -img docs/experiments/img/01-floors- \
	maxmin="${dirs[floors]}"
echo
echo "== floors, shareBy tier"
"$RESULTS/analyze" -policy "$FLOORS" -share-by tier -from 10s -to 20s -spike whale-1:300000 -img docs/experiments/img/01-floors-tier- \
	maxmin-tier="${dirs[floors-tier]}"
