#!/usr/bin/env bash
# Issue 17: the real-process faults of test/e2e/failover_test.go, run
# longer and again. A Redis failover (a replica promoted, the old primary
# demoted, the address moved) under HTTP load in central and
# local-reconciled; a local-reconciled enforcer SIGKILLed and another
# SIGTERMed under load; the leading manager killed -9 under a stream of
# TenantQuota edits. Each run logs what it measured (the figures of
# docs/reliability.md) and fails when a bound is broken.
#
#   SECONDS_STEADY=10  steady load before and after each fault, s
#                      (make test runs 1: QUOTAPLANE_FAULT_SECONDS)
#   COUNT=3            runs of each test
#   RUN='Failover|Kill|Handover'   which tests
#   RESULTS=/tmp/quotaplane-chaos/failover   where the log goes
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../.."

SECONDS_STEADY="${SECONDS_STEADY:-10}"
COUNT="${COUNT:-3}"
RUN="${RUN:-Failover|Kill|Handover}"
RESULTS="${RESULTS:-/tmp/quotaplane-chaos/failover}"

command -v redis-server >/dev/null || make redis-server
mkdir -p "$RESULTS"
assets=$(hack/envtest-binaries.sh)
status=0
KUBEBUILDER_ASSETS="$assets" QUOTAPLANE_FAULT_SECONDS="$SECONDS_STEADY" go test -count="$COUNT" -timeout 60m -run "$RUN" -v ./test/e2e/ \
	>"$RESULTS/test.log" 2>&1 || status=$?
# The measured figures, one line each, then the verdicts.
grep -E 'writes lost|hot tenant:|degraded from|killed .* at|survivors admit|SIGTERM:|leader killed' "$RESULTS/test.log" || true
grep -E '^(=== RUN|--- (PASS|FAIL)|FAIL|ok) ' "$RESULTS/test.log" | grep -v '=== RUN' || true
echo "full log: $RESULTS/test.log" >&2
exit "$status"
