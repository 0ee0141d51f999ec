#!/usr/bin/env bash
# Experiment 1 over HTTP: the victims' success and decision latency as a
# client sees them, through a real enforcer process (cmd/enforcer, mode
# local) on loopback, with cmd/load -target http. The in-process runs of
# run.sh measure a decision in µs, where the victims' p99 says more about
# the generator's sleeps than about the engine; here every decision is an
# HTTP round trip through the enforcer's server, on the same 2 cores as the
# generator.
#
# Scaled to what one enforcer and the generator carry over loopback here:
# plane-http/ (global 2,000 tokens/s, whale-1 1,500 of its own, the free
# floor above the victims' demand) offered 1,000 reads/s, and whale-1 adds
# 10,000/s from 10 s to 20 s of a 30 s run. A request's tier cannot travel
# over HTTP, so the profile's tenants are all free (-enterprise 0 -standard
# 0), as the enforcer sees them; whale-1 is enterprise by its TenantQuota.
# Fairness none, then maxmin (the enforcer's -fairness), REPEATS times each,
# every run under the bench lock; analyze/ as for run.sh, plots into
# docs/experiments/img/01-http-*.png.
#
#   RESULTS=/tmp/quotaplane-experiments/01-noisy-neighbour-http   raw output
#   SHARE_BY=tenant   the plane's shareBy (tenant or tier; the numbers in docs/ were
#                     measured with tier, before tenant became the default)
#   REPEATS=3 WORKERS=64 CONNS=64
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../../.."

RESULTS="${RESULTS:-/tmp/quotaplane-experiments/01-noisy-neighbour-http}"
SHARE_BY="${SHARE_BY:-tenant}"
REPEATS="${REPEATS:-3}"
WORKERS="${WORKERS:-64}"
CONNS="${CONNS:-64}"
PLANE=hack/experiments/01-noisy-neighbour/plane-http
SPIKE=whale-1:10000:10s:20s

mkdir -p "$RESULTS" docs/experiments/img
go run ./cmd/enforcer check "$PLANE"
go build -o "$RESULTS/load" ./cmd/load
go build -o "$RESULTS/enforcer" ./cmd/enforcer
go build -o "$RESULTS/analyze" ./hack/experiments/01-noisy-neighbour/analyze

freeport() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
pid=""
trap '[[ -n "$pid" ]] && kill "$pid" 2>/dev/null; true' EXIT

declare -A dirs
for i in $(seq 1 "$REPEATS"); do
	for fairness in none maxmin; do
		out="$RESULTS/$fairness-$i"
		dirs[$fairness]="${dirs[$fairness]:+${dirs[$fairness]},}$out"
		api=$(freeport) admin=$(freeport)
		"$RESULTS/enforcer" -policy "$PLANE" -fairness "$fairness" -share-by "$SHARE_BY" -listen "127.0.0.1:$api" \
			-admin-listen "127.0.0.1:$admin" -grpc-listen "" >"$out.enforcer.log" 2>&1 &
		pid=$!
		until curl -sf -o /dev/null "http://127.0.0.1:$admin/readyz"; do sleep 0.1; done
		flock /tmp/quotaplane-bench.lock "$RESULTS/load" -target http -urls "http://127.0.0.1:$api" \
			-conns "$CONNS" -workers "$WORKERS" -seed 1 -rate 1000 -mix read=1 -enterprise 0 -standard 0 \
			-duration 30s -warmup 2s -spike "$SPIKE" -quiet -out "$out" >"$out.txt"
		kill "$pid" && wait "$pid" 2>/dev/null || true
		pid=""
		echo "== $fairness, run $i: $out" && cat "$out.txt"
	done
done

echo
"$RESULTS/analyze" -share-by "$SHARE_BY" -policy "$PLANE" -from 10s -to 20s -spike whale-1:10000 -img docs/experiments/img/01-http- \
	none="${dirs[none]}" maxmin="${dirs[maxmin]}"
