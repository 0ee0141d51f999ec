#!/usr/bin/env bash
# Every fault of docs/reliability.md, in one command: Redis killed under
# cmd/load's HTTP load (redis-restart.sh), the Toxiproxy matrix on the
# Redis link (toxiproxy.sh), Redis failover, enforcers killed and the
# leading manager killed (failover.sh), then the soak (soak.sh, SOAK=1h by
# default: about 1 h 15 min in all). Each script's own variables pass
# through; every script runs even when one fails, and the summary lists
# which failed. Results under RESULTS, one directory per script.
#
#   RESULTS=/tmp/quotaplane-chaos SOAK=1h
set -uo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

RESULTS="${RESULTS:-/tmp/quotaplane-chaos}"
failed=()
for script in redis-restart toxiproxy failover soak; do
	echo "=== hack/chaos/$script.sh"
	start=$(date +%s)
	if RESULTS="$RESULTS/$script" "hack/chaos/$script.sh"; then
		echo "=== $script: ok in $(($(date +%s) - start)) s"
	else
		echo "=== $script: FAILED in $(($(date +%s) - start)) s (see $RESULTS/$script)"
		failed+=("$script")
	fi
done
if ((${#failed[@]})); then
	echo "failed: ${failed[*]}"
	exit 1
fi
echo "every fault within its bound"
