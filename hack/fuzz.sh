#!/usr/bin/env bash
# Runs every fuzz target of the module (each func FuzzX in a _test.go file)
# for FUZZTIME (default 3s) each: what `make test` runs beside the tests, so
# that the fuzzers look past their seed corpora on every run for a bounded
# time. A failing input is written under the package's testdata/fuzz/ by
# `go test` itself: commit it, and it becomes a seed that every later
# `go test` runs. FUZZ=regexp narrows the targets.
#
#   hack/fuzz.sh                 # every target, 3 s each
#   FUZZTIME=5m FUZZ=FuzzDecide hack/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZTIME="${FUZZTIME:-3s}"
FUZZ="${FUZZ:-.}"
# FUZZPARALLEL: workers per target (default: the cores; make test runs 1,
# beside the tests).
parallel=()
[[ -n "${FUZZPARALLEL:-}" ]] && parallel=(-parallel "$FUZZPARALLEL")

# "dir:FuzzName" for every target, in a stable order.
targets=$(grep -rHoE '^func Fuzz[A-Za-z0-9_]+\(' --include='*_test.go' . |
	sed -E 's|^\./(.*)/[^/]*_test\.go:func (Fuzz[A-Za-z0-9_]+)\($|\1:\2|' | sort -u | grep -E "$FUZZ" || true)
if [[ -z "$targets" ]]; then
	echo "fuzz: no target matches $FUZZ" >&2
	exit 1
fi
for t in $targets; do
	dir=${t%%:*} name=${t#*:}
	echo "fuzz: $name in ./$dir for $FUZZTIME"
	go test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "${parallel[@]}" "./$dir" >/tmp/quotaplane-fuzz.$$ 2>&1 ||
		{ cat /tmp/quotaplane-fuzz.$$ >&2; rm -f /tmp/quotaplane-fuzz.$$; exit 1; }
	grep -E '^(ok|PASS|FAIL)|elapsed' /tmp/quotaplane-fuzz.$$ | tail -1
done
rm -f /tmp/quotaplane-fuzz.$$
