#!/usr/bin/env bash
# Issue 17: faults on the Redis link, injected for real, the whole matrix.
# Two enforcer processes (cmd/enforcer, the sample plane) each reach one
# redis-server through their own Toxiproxy proxy (in the test's process:
# github.com/Shopify/toxiproxy/v2, pinned in go.mod), under HTTP load from
# 8 free-tier tenants at twice their limit, in central and
# local-reconciled. Faults: latency 5, 50 and 500 ms and 25 ± 25 ms on
# every link; a partition of one node (its proxy down); connection resets
# (reset_peer) on every connection and on 30 % of them; a half-open link
# (the timeout toxic: Redis stops answering, TCP stays up) on every node
# and on one. Each fault lasts FAULT (5 s), the load runs 1 s before it and
# 5 s after. It is TestToxiproxy with QUOTAPLANE_TOXI_MATRIX=full (make
# test runs its subset) and fails when a bound is broken; prints the table
# (docs/reliability.md). Raw output in RESULTS.
#
#   RESULTS=/tmp/quotaplane-chaos/toxiproxy MODES=central,local-reconciled
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

RESULTS="${RESULTS:-/tmp/quotaplane-chaos/toxiproxy}"
MODES="${MODES:-central,local-reconciled}"

command -v redis-server >/dev/null || make redis-server
rm -rf "$RESULTS"
mkdir -p "$RESULTS"
status=0
QUOTAPLANE_TOXI_MATRIX=full QUOTAPLANE_TOXI_MODES="$MODES" QUOTAPLANE_TOXI_TABLE="$RESULTS/table.md" \
	go test -count=1 -timeout 20m -run '^TestToxiproxy$' -v ./test/e2e/ >"$RESULTS/test.log" 2>&1 || status=$?
echo "| fault | mode | decisions | slowest (p99) | 5xx / failed | admitted tokens (limit × time + burst, bound) | overage | episodes on its own | recovery | log lines/s |"
echo "|---|---|---|---|---|---|---|---|---|---|"
sed 's/^/| /; s/$/ |/' "$RESULTS/table.md" 2>/dev/null || true
if [ "$status" -ne 0 ]; then
	grep -E -- '--- FAIL|toxiproxy_test.go:[0-9]+: (admitted|the slowest|[0-9]+ (5xx|decisions))' "$RESULTS/test.log" >&2 || true
	echo "a bound was broken (or the test failed): $RESULTS/test.log" >&2
fi
exit "$status"
