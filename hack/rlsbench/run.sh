#!/usr/bin/env bash
# Envoy's rate limit service, measured: envoyproxy/ratelimit (the peer, built
# by hack/ratelimit-peer.sh) against quotaplane's enforcer in mode
# local-reconciled and in mode central, all three on one Redis on this
# machine, under the same load from hack/rlsbench (ShouldRateLimit from
# $STREAMS concurrent callers; 1 and 4 descriptors per request).
#
#   hack/rlsbench/run.sh                 # 3 repeats × {1, 4} descriptors × 3 arms, 10 s each: ~5 minutes
#   REPEATS=5 DURATION=20s hack/rlsbench/run.sh
#
# Each run starts its server afresh on an emptied Redis; the arms alternate
# within each repeat, so a machine that gets busier or quieter moves them
# alike. It prints every run's summary line, then the medians per arm and
# their ratios to the peer: of decisions/s, and of decisions per CPU-second
# of the server and Redis together. The load generator shares the machine
# (and costs ~30 µs of CPU a call itself), so decisions/s is bounded by what
# the three leave each other; CPU per decision is what a core given to the
# service would sustain.
#
# Configured alike (hack/rlsbench/TestPlaneMatchesPeerConfig checks it):
# domain main, 1,000,000/s per tenant and per (tenant, api key), never
# reached. The peer runs with what its README recommends for throughput
# (REDIS_PIPELINE_WINDOW=150us) and with stats off (DISABLE_STATS=true:
# with USE_STATSD=false alone it logs every timer to stdout, ~2 MB/s).
# Not a test: `make test` does not run it.
set -euo pipefail
cd "$(dirname "$0")/../.."

REPEATS="${REPEATS:-3}"
DURATION="${DURATION:-10s}"
WARMUP="${WARMUP:-2s}"
STREAMS="${STREAMS:-64}"
DESCRIPTORS="${DESCRIPTORS:-1 4}"
ARMS="${ARMS:-peer local-reconciled central}"
PEER_PIPELINE_WINDOW="${PEER_PIPELINE_WINDOW:-150us}"

work=$(mktemp -d)
# The processes this script started and has not stopped yet, by pid.
redis_pid="" server_pid=""
cleanup() {
	for pid in $server_pid $redis_pid; do
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	rm -rf "$work"
}
trap cleanup EXIT

peer=$(hack/ratelimit-peer.sh)
go build -o "$work/enforcer" ./cmd/enforcer
go build -o "$work/rlsbench" ./hack/rlsbench
if [[ "$("$work/enforcer" -h 2>&1 || true)" != *-grpc-listen* ]]; then
	echo "run.sh: this enforcer has no -grpc-listen flag (the gRPC rate limit service); nothing to compare" >&2
	exit 1
fi
port=($("$work/rlsbench" -free-ports 5))
redis_port=${port[0]} grpc_port=${port[1]} http_port=${port[2]} debug_port=${port[3]} admin_port=${port[4]}

# wait_port waits until something listens on 127.0.0.1:$1, at most 10 s.
wait_port() {
	for _ in $(seq 100); do
		if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
			return 0
		fi
		sleep 0.1
	done
	echo "run.sh: nothing listens on 127.0.0.1:$1 after 10 s" >&2
	return 1
}

redis-server --port "$redis_port" --bind 127.0.0.1 --save '' --appendonly no >"$work/redis.log" 2>&1 &
redis_pid=$!
wait_port "$redis_port"

mkdir -p "$work/runtime/peer"
cp -r hack/rlsbench/peer/config "$work/runtime/peer/"

# start ARM: starts the arm's server on $grpc_port; sets server_pid.
start() {
	case "$1" in
	peer)
		env RUNTIME_ROOT="$work/runtime" RUNTIME_SUBDIRECTORY=peer RUNTIME_WATCH_ROOT=false \
			REDIS_SOCKET_TYPE=tcp REDIS_URL="127.0.0.1:$redis_port" REDIS_PIPELINE_WINDOW="$PEER_PIPELINE_WINDOW" \
			USE_STATSD=false DISABLE_STATS=true LOG_LEVEL=warn \
			HOST=127.0.0.1 PORT="$http_port" GRPC_HOST=127.0.0.1 GRPC_PORT="$grpc_port" \
			DEBUG_HOST=127.0.0.1 DEBUG_PORT="$debug_port" \
			"$peer" >>"$work/peer.log" 2>&1 &
		;;
	local-reconciled | central)
		"$work/enforcer" -policy hack/rlsbench/plane -redis-addr "127.0.0.1:$redis_port" -mode "$1" \
			-node-id rlsbench -listen "127.0.0.1:$http_port" -admin-listen "127.0.0.1:$admin_port" \
			-grpc-listen "127.0.0.1:$grpc_port" >>"$work/enforcer-$1.log" 2>&1 &
		;;
	*)
		echo "run.sh: no arm $1" >&2
		return 1
		;;
	esac
	server_pid=$!
	wait_port "$grpc_port"
}

stop() {
	kill "$server_pid"
	wait "$server_pid" 2>/dev/null || true
	server_pid=""
}

results="$work/results.txt"
echo "envoyproxy/ratelimit: $peer"
if commit=$(git rev-parse --short HEAD 2>/dev/null); then
	git diff --quiet HEAD -- cmd pkg || commit+=" with uncommitted changes"
else
	commit="${QUOTAPLANE_REV:-unknown} (not a git checkout)"
fi
echo "quotaplane: $commit; $(go env GOVERSION); $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "runs: $REPEATS repeats × descriptors {$DESCRIPTORS} × arms {$ARMS}, $STREAMS streams, $WARMUP warmup + $DURATION each"
for repeat in $(seq "$REPEATS"); do
	for descriptors in $DESCRIPTORS; do
		for arm in $ARMS; do
			redis-cli -p "$redis_port" flushall >/dev/null
			start "$arm"
			if line=$("$work/rlsbench" -addr "127.0.0.1:$grpc_port" -streams "$STREAMS" -descriptors "$descriptors" \
				-warmup "$WARMUP" -duration "$DURATION" -pid "$server_pid" -redis-pid "$redis_pid"); then
				echo "arm=$arm repeat=$repeat $line" | tee -a "$results"
			else
				# rlsbench has said why on stderr; the table leaves the run out.
				echo "arm=$arm repeat=$repeat descriptors=$descriptors: no decisions" >&2
			fi
			stop
		done
	done
done
echo
echo "medians of $REPEATS runs:"
"$work/rlsbench" -table "$results" -base peer
