#!/usr/bin/env bash
# Experiment 4 (seed 002 §10.4): one hot tenant on the central store. A
# fleet of 8 in-process nodes decides the reads (cost 1) of a single tenant,
# whale-1, over 16 api keys, with limits far above what is offered
# (plane/), so that every decision is admitted and the question is only how
# many decisions per second the store takes. The offered rate is swept
# upward in real time in three set-ups:
#
#   central      one Redis; every decision checks whale-1's bucket, one key
#   sharded      a 3-master Redis Cluster (started here); the plane has
#                spec.shards 3 and whale-1 spec.shards 3 (plane-sharded/)
#   reconciled   local-reconciled on one Redis, reconcile 200 ms
#
# Then the accuracy cost of each relief: the same three at a global limit
# of 40,000 tokens/s (-global-rps, burst 40,000) offered 80,000 reads/s,
# overage as in experiment 2 (cold start and after the warmup).
#
# The generator is cmd/load (-cluster-addrs for the cluster). Every run is
# measured under the bench lock.
#
#   RESULTS=/tmp/quotaplane-experiments/04-hot-tenant   raw output
#   RATES="20000 40000 80000 120000 160000 240000" SWEEP_DURATION=6s REPEATS=3
#   ACC_DURATION=15s ACC_WARMUP=5s WORKERS=256
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../../.."

RESULTS="${RESULTS:-/tmp/quotaplane-experiments/04-hot-tenant}"
RATES="${RATES:-20000 40000 80000 120000 160000 240000}"
SWEEP_DURATION="${SWEEP_DURATION:-6s}"
REPEATS="${REPEATS:-3}"
ACC_DURATION="${ACC_DURATION:-15s}"
ACC_WARMUP="${ACC_WARMUP:-5s}"
WORKERS="${WORKERS:-256}"
EXP=hack/experiments/04-hot-tenant

mkdir -p "$RESULTS"
go run ./cmd/enforcer check "$EXP/plane"
go run ./cmd/enforcer check "$EXP/plane-sharded"
go build -o "$RESULTS/load" ./cmd/load

# freeport: a free loopback port whose cluster bus port (port + 10000) is
# free too; Redis Cluster refuses ports above 55535.
freeport() {
	python3 -c '
import random, socket
while True:
    p = random.randint(20000, 45000)
    try:
        for q in (p, p + 10000):
            s = socket.socket(); s.bind(("127.0.0.1", q)); s.close()
    except OSError:
        continue
    print(p); break'
}
ports=()
cleanup() {
	for p in "${ports[@]}"; do redis-cli -p "$p" shutdown nosave >/dev/null 2>&1 || true; done
}
trap cleanup EXIT
startredis() { # port [extra args]
	local p=$1
	shift
	mkdir -p "$RESULTS/redis-$p"
	(cd "$RESULTS/redis-$p" && redis-server --port "$p" --bind 127.0.0.1 --save "" --appendonly no --daemonize yes \
		--pidfile "$RESULTS/redis-$p/pid" --logfile "$RESULTS/redis-$p/log" "$@")
	ports+=("$p")
	until redis-cli -p "$p" ping >/dev/null 2>&1; do sleep 0.1; done
}

single=$(freeport)
startredis "$single"
cluster=()
for _ in 1 2 3; do
	p=$(freeport)
	startredis "$p" --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000
	cluster+=("127.0.0.1:$p")
done
redis-cli --cluster create "${cluster[@]}" --cluster-replicas 0 --cluster-yes >"$RESULTS/cluster-create.txt"
until redis-cli -p "${cluster[0]#*:}" cluster info | grep -q 'cluster_state:ok'; do sleep 0.2; done
clusterAddrs=$(
	IFS=,
	echo "${cluster[*]}"
)

flushall() {
	redis-cli -p "$single" flushall >/dev/null
	for a in "${cluster[@]}"; do redis-cli -p "${a#*:}" flushall >/dev/null; done
}

# drive name setup out extra...: one measured run; prints its line for plot/.
drive() {
	local name=$1 setup=$2 out=$3
	shift 3
	local args=(-nodes 8 -tenants 1 -enterprise 1 -standard 0 -whales 1 -keys 16 -mix read=1 -workers "$WORKERS" -quiet -out "$out")
	case $setup in
	central) args+=(-policy "$EXP/plane" -redis-addr "127.0.0.1:$single") ;;
	sharded) args+=(-policy "$EXP/plane-sharded" -cluster-addrs "$clusterAddrs") ;;
	reconciled) args+=(-policy "$EXP/plane" -redis-addr "127.0.0.1:$single" -mode local-reconciled -reconcile-ms 200) ;;
	esac
	flushall
	mkdir -p "$out"
	flock /tmp/quotaplane-bench.lock "$RESULTS/load" "${args[@]}" "$@" >"$out/stdout.txt" 2>"$out/stderr.txt" || {
		cat "$out/stderr.txt" >&2
		exit 1
	}
	echo "$name dir=$out"
}

: >"$RESULTS/sweep.txt"
for r in $(seq 1 "$REPEATS"); do
	for rate in $RATES; do
		for setup in central sharded reconciled; do
			echo "== sweep $setup $rate run $r" >&2
			drive "sweep setup=$setup offered=$rate run=$r" "$setup" "$RESULTS/sweep/$setup-$rate-run$r" \
				-rate "$rate" -duration "$SWEEP_DURATION" -seed "$r" >>"$RESULTS/sweep.txt"
		done
	done
done

: >"$RESULTS/accuracy.txt"
for r in $(seq 1 "$REPEATS"); do
	for setup in central sharded reconciled; do
		echo "== accuracy $setup run $r" >&2
		drive "accuracy setup=$setup run=$r" "$setup" "$RESULTS/accuracy/$setup-run$r" \
			-global-rps 40000 -rate 80000 -duration "$ACC_DURATION" -warmup "$ACC_WARMUP" -seed "$r" >>"$RESULTS/accuracy.txt"
	done
done

go run ./hack/experiments/04-hot-tenant/plot -results "$RESULTS" -img docs/experiments/img \
	-rate 40000 -burst 40000 -duration "$ACC_DURATION" -warmup "$ACC_WARMUP"
