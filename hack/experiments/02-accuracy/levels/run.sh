#!/usr/bin/env bash
# Experiment 2, levels and routing: does every level hold its limit across a
# fleet however requests are routed? A fleet of 4 in-process nodes on one
# real Redis (started here on a free loopback port); 16 tenants, each
# offered 200 reads/s (cost 1) against a per-tenant limit of 100 tokens/s
# (burst 100) at one level — the tenant's, its endpoint's or its api key's
# (plane-LEVEL/) — with the global limit far above the load. Requests reach
# the nodes round-robin, pinned (every request of a tenant to one node, as a
# balancer that hashes by tenant) or skewed (9 in 10 to the tenant's node,
# the tenth to the next); modes central and local-reconciled (200 ms).
#
# Per run, from tenants.csv after the warmup: each tenant's admitted tokens
# per second against its limit; the table gives the mean over tenants and
# the worst tenant, medians over REPEATS runs.
#
#   RESULTS=/tmp/quotaplane-experiments/02-levels   raw output
#   DURATION=10s WARMUP=3s REPEATS=3 LEVELS="tenant endpoint key"
#   MODES="central local-reconciled" ROUTINGS="round-robin pinned skewed"
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."

RESULTS="${RESULTS:-/tmp/quotaplane-experiments/02-levels}"
DURATION="${DURATION:-10s}"
WARMUP="${WARMUP:-3s}"
REPEATS="${REPEATS:-3}"
LEVELS="${LEVELS:-tenant endpoint key}"
MODES="${MODES:-central local-reconciled}"
ROUTINGS="${ROUTINGS:-round-robin pinned skewed}"
DIR=hack/experiments/02-accuracy/levels
LIMIT=100

mkdir -p "$RESULTS"
go build -o "$RESULTS/load" ./cmd/load
for level in $LEVELS; do go run ./cmd/enforcer check "$DIR/plane-$level" >/dev/null; done

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
	--pidfile "$RESULTS/redis.pid" --logfile "$RESULTS/redis.log"
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true' EXIT
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done

# stats tenants.csv: the mean admitted tokens/s over tenants against the
# limit, and the worst tenant's, in percent.
stats() {
	python3 - "$1" "$LIMIT" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
limit = float(sys.argv[2])
got = [float(r["admitted_tokens_per_s"]) for r in rows]
mean = sum(got) / len(got)
worst = max(got, key=lambda g: abs(g / limit - 1))
print(f"{100 * (mean / limit - 1):+.1f} {100 * (worst / limit - 1):+.1f}")
PY
}

printf '| level | mode | routing | mean over tenants | worst tenant |\n|---|---|---|---|---|\n' >"$RESULTS/table.md"
for level in $LEVELS; do
	for mode in $MODES; do
		for routing in $ROUTINGS; do
			name="$level-$mode-$routing"
			mkdir -p "$RESULTS/$name"
			means=() worsts=()
			for r in $(seq 1 "$REPEATS"); do
				redis-cli -p "$port" flushall >/dev/null
				out="$RESULTS/$name/run$r"
				echo "== $name run $r" >&2
				flock /tmp/quotaplane-bench.lock "$RESULTS/load" -policy "$DIR/plane-$level" -nodes 4 \
					-redis-addr "127.0.0.1:$port" -mode "$mode" -routing "$routing" -rate 3200 \
					-duration "$DURATION" -warmup "$WARMUP" -tenants 16 -enterprise 0 -standard 0 -whales 0 \
					-zipf 0 -keys 1 -mix read=1 -workers 32 -seed "$r" -quiet -out "$out" >"$out.txt" 2>&1 ||
					{ cat "$out.txt" >&2; exit 1; }
				read -r mean worst < <(stats "$out/tenants.csv")
				means+=("$mean") worsts+=("$worst")
			done
			median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
			printf '| %s | %s | %s | %s%% | %s%% |\n' "$level" "$mode" "$routing" "$(median "${means[@]}")" "$(median "${worsts[@]}")" >>"$RESULTS/table.md"
		done
	done
done
cat "$RESULTS/table.md"
