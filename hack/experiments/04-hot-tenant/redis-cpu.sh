#!/usr/bin/env bash
# Experiment 4, the wall explained: where the CPU goes at the top of the
# sweep. One run of each set-up of run.sh at 240,000 reads/s offered (far
# past the central walls) for 6 s, under the bench lock, reading each Redis
# server's CPU time (INFO cpu: used_cpu_user + used_cpu_sys) before and
# after. A Redis at 100% of one core is saturated: its one thread is the
# wall. Prints one line per set-up.
#
#   RESULTS=/tmp/quotaplane-experiments/04-hot-tenant-cpu   raw output
#   RATE=240000 DURATION=6s WORKERS=256
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../../.."

RESULTS="${RESULTS:-/tmp/quotaplane-experiments/04-hot-tenant-cpu}"
RATE="${RATE:-240000}"
DURATION="${DURATION:-6s}"
WORKERS="${WORKERS:-256}"
EXP=hack/experiments/04-hot-tenant

mkdir -p "$RESULTS"
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
	cluster+=("$p")
done
redis-cli --cluster create "${cluster[@]/#/127.0.0.1:}" --cluster-replicas 0 --cluster-yes >"$RESULTS/cluster-create.txt"
until redis-cli -p "${cluster[0]}" cluster info | grep -q 'cluster_state:ok'; do sleep 0.2; done
clusterAddrs=$(
	IFS=,
	echo "${cluster[*]/#/127.0.0.1:}"
)

for setup in central sharded reconciled; do
	args=(-nodes 8 -tenants 1 -enterprise 1 -standard 0 -whales 1 -keys 16 -mix read=1 -workers "$WORKERS" -quiet
		-rate "$RATE" -duration "$DURATION" -out "$RESULTS/$setup")
	case $setup in
	central) args+=(-policy "$EXP/plane" -redis-addr "127.0.0.1:$single") servers=("$single") ;;
	sharded) args+=(-policy "$EXP/plane-sharded" -cluster-addrs "$clusterAddrs") servers=("${cluster[@]}") ;;
	reconciled) args+=(-policy "$EXP/plane" -redis-addr "127.0.0.1:$single" -mode local-reconciled -reconcile-ms 200) servers=("$single") ;;
	esac
	for p in "${ports[@]}"; do redis-cli -p "$p" flushall >/dev/null; done
	# The lock is taken first, so the CPU is read around this run alone;
	# cpu is the seconds of CPU a server has used.
	flock /tmp/quotaplane-bench.lock bash -c '
		cpu() { redis-cli -p "$1" info cpu | tr -d "\r" | awk -F: "/^used_cpu_(user|sys):/ { s += \$2 } END { printf \"%.3f\", s }"; }
		out=$1; shift; n=$1; shift; servers=("${@:1:n}"); shift "$n"
		for p in "${servers[@]}"; do echo "$p $(cpu "$p")"; done >"$out.before"
		"$@" >"$out.txt"
		for p in "${servers[@]}"; do echo "$p $(cpu "$p")"; done >"$out.after"
	' _ "$RESULTS/$setup" "${#servers[@]}" "${servers[@]}" "$RESULTS/load" "${args[@]}"
	wall=$(jq '.wallSeconds' "$RESULTS/$setup/summary.json")
	dps=$(jq '.decisionsPerWallSecond | floor' "$RESULTS/$setup/summary.json")
	busy=$(paste -d' ' "$RESULTS/$setup.before" "$RESULTS/$setup.after" |
		awk -v wall="$wall" '{ printf "%s:%.0f%% ", $1, 100 * ($4 - $2) / wall }')
	echo "$setup: offered $RATE/s, decided $dps/s over ${wall}s of wall time; Redis CPU (of one core) per server: $busy"
done
