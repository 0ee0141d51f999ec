#!/usr/bin/env bash
# Issue 15 §3: the scale simulation (docs/scale.md, "Simulation"). Fleets of
# local-reconciled engines in one process, each its own node, on one real
# redis-server, in virtual time: pkg/load's Zipf profile (s = 1.2, 20
# whales, seed 002's tier mix 1/19/80%) over TENANTS tenants, every one of
# them unknown to the plane (its tier's defaults), offers RATE reads/s
# (cost 1) against a global limit of GLOBAL tokens/s for VIRTUAL_SECONDS of virtual
# time, WARMUP of it left out of the per-tenant counts; every node
# reconciles every INTERVAL_MS of the same virtual time, staggered. The plane is
# experiment 5's (weighted max-min, shareBy tenant) in local-reconciled
# mode (pkg/enforcer/scale_sim_test.go, simPlane).
#
# Runs (TestScaleSimLarge, one test process each):
#   NODES_LIST nodes by round robin (default 1, 10, 30 and 100), then
#   PINNED_NODES by tenant (routing pinned: a balancer hashing by tenant).
# Each prints its lines ("sim:") and a table row; the table is printed at
# the end. Raw output in RESULTS.
#
#   RESULTS=/tmp/quotaplane-experiments/scale-sim
#   TENANTS=1000000 GLOBAL=20000 RATE=40000 VIRTUAL_SECONDS=30 WARMUP=10
#   NODES_LIST="1 10 30 100" PINNED_NODES=100 (empty: no pinned run)
#   INTERVAL_MS=200 (the plane's reconcileInterval)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../../.."

RESULTS="${RESULTS:-/tmp/quotaplane-experiments/scale-sim}"
TENANTS="${TENANTS:-1000000}"
GLOBAL="${GLOBAL:-20000}"
RATE="${RATE:-40000}"
VIRTUAL_SECONDS="${VIRTUAL_SECONDS:-30}"
WARMUP="${WARMUP:-10}"
NODES_LIST="${NODES_LIST:-1 10 30 100}"
PINNED_NODES="${PINNED_NODES-100}"
INTERVAL_MS="${INTERVAL_MS:-200}"

mkdir -p "$RESULTS"
rm -f "$RESULTS"/*.txt
go test -c -o "$RESULTS/enforcer.test" ./pkg/enforcer/

run() { # name nodes routing
	local name=$1 nodes=$2 routing=$3
	echo "== $name: $nodes nodes, $routing" >&2
	QUOTAPLANE_SIM=1 QUOTAPLANE_SIM_NODES=$nodes QUOTAPLANE_SIM_ROUTING=$routing QUOTAPLANE_SIM_TENANTS=$TENANTS \
		QUOTAPLANE_SIM_GLOBAL=$GLOBAL QUOTAPLANE_SIM_RATE=$RATE QUOTAPLANE_SIM_SECONDS=$VIRTUAL_SECONDS QUOTAPLANE_SIM_WARMUP=$WARMUP \
		QUOTAPLANE_SIM_INTERVAL_MS=$INTERVAL_MS \
		QUOTAPLANE_SIM_HEADER=${HEADER:-0} \
		/usr/bin/time -f "process: %e s wall, %M KB max RSS" \
		"$RESULTS/enforcer.test" -test.run '^TestScaleSimLarge$' -test.v -test.timeout 60m >"$RESULTS/$name.txt" 2>&1 ||
		{ cat "$RESULTS/$name.txt" >&2; exit 1; }
	grep -o 'sim: .*\|process: .*' "$RESULTS/$name.txt" >&2
}

HEADER=1
for n in $NODES_LIST; do
	run "round-robin-$n" "$n" round-robin
	HEADER=0
done
for n in $PINNED_NODES; do
	run "pinned-$n" "$n" pinned
	HEADER=0
done

echo
echo "== the table ($TENANTS tenants, global $GLOBAL tokens/s, offered $RATE reads/s, ${VIRTUAL_SECONDS} s virtual, ${WARMUP} s warmup, reconcile ${INTERVAL_MS} ms)"
for name in $(for n in $NODES_LIST; do echo "round-robin-$n"; done) $(for n in $PINNED_NODES; do echo "pinned-$n"; done); do
	grep -o 'row: .*' "$RESULTS/$name.txt" | sed 's/^row: //'
done
