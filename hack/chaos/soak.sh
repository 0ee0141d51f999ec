#!/usr/bin/env bash
# Issue 17's soak (TestSoak in test/e2e/soak_test.go), for as long as
# you like: the manager on a real API server, one Redis, two enforcer
# processes for each of two planes (central, local-reconciled) under
# steady HTTP load, a TenantQuota edit every SOAK/360 (10 s an hour),
# Redis killed and restarted empty every SOAK/12, one enforcer of each
# plane restarted every SOAK/6. It fails when a request goes unanswered
# or gets a 5xx, a tenant under its limits is denied, the hot tenant's
# accuracy moves between the first and the last quiet span, or
# goroutines, open files, heap or Redis keys grow; then it prints the
# heap growth of each process between the first reading and the last
# (go tool pprof -diff_base).
#
#   SOAK=1h   how long (make test runs 60s; at least 30s)
#   RESULTS=/tmp/quotaplane-chaos/soak   where the log and the profiles go
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

SOAK="${SOAK:-1h}"
RESULTS="${RESULTS:-/tmp/quotaplane-chaos/soak}"

command -v redis-server >/dev/null || make redis-server
mkdir -p "$RESULTS"
rm -f "$RESULTS"/*.pb.gz
assets=$(hack/envtest-binaries.sh)
status=0
KUBEBUILDER_ASSETS="$assets" QUOTAPLANE_SOAK="$SOAK" QUOTAPLANE_SOAK_PROFILES="$RESULTS" \
	go test -count=1 -timeout 0 -run '^TestSoak$' -v ./test/e2e/ >"$RESULTS/test.log" 2>&1 || status=$?
grep -E 'soak_test.go' "$RESULTS/test.log" || true
for first in "$RESULTS"/*-first.pb.gz; do
	[ -e "$first" ] || break
	last="${first%-first.pb.gz}-last.pb.gz"
	echo "== heap in use, $(basename "${first%-first.pb.gz}"): the last reading against the first"
	go tool pprof -sample_index=inuse_space -top -nodecount=15 -diff_base "$first" "$last" 2>/dev/null | sed -n '1,22p'
done
grep -E '^(--- (PASS|FAIL)|FAIL|ok) ' "$RESULTS/test.log" || true
echo "full log: $RESULTS/test.log" >&2
exit "$status"
