#!/usr/bin/env bash
# Experiment 7: throttle attribution against an independent oracle.
#
# Seed 002's profile at 20,000 requests/s for 20 s of virtual time, on a
# plane where the global, tenant, endpoint and key limits all fire. Every
# decision is checked against load.BucketOracle (-oracle), a model that
# shares no code with the engine. Three seeds. Then a negative control: the
# oracle must refuse a plane it does not model (fairness maxmin).
#
#   hack/experiments/07-attribution/run.sh
#
# Raw output under RESULTS (default /tmp/quotaplane-experiments/07-attribution);
# prints a markdown table.
set -euo pipefail

RESULTS=${RESULTS:-/tmp/quotaplane-experiments/07-attribution}
PLANE=hack/experiments/07-attribution/plane
RATE=${RATE:-20000}
DURATION=${DURATION:-20s}
SEEDS=${SEEDS:-"1 2 3"}

mkdir -p "$RESULTS"
go run ./cmd/enforcer check "$PLANE"
go build -o "$RESULTS/load" ./cmd/load

for seed in $SEEDS; do
	out="$RESULTS/seed-$seed"
	"$RESULTS/load" -policy "$PLANE" -virtual -oracle -quiet -seed "$seed" \
		-rate "$RATE" -duration "$DURATION" -out "$out" >"$out.txt"
	cp "$out.txt" "$out/stdout.txt"
done

echo
echo "command: $RESULTS/load -policy $PLANE -virtual -oracle -seed N -rate $RATE -duration $DURATION -out DIR"
echo
echo "| seed | decisions | checked by the oracle | disagreements | agreement | admitted (engine / oracle) | denied global (engine / oracle) | tenant | endpoint | key |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for seed in $SEEDS; do
	s="$RESULTS/seed-$seed/summary.json"
	tally=$(grep "^oracle's own tally" "$RESULTS/seed-$seed.txt")
	# oracle's own tally: N decisions, A admitted; denied global G, tenant T, endpoint E, key K
	read -r o_n o_adm o_g o_t o_e o_k < <(echo "$tally" | tr -c '0-9\n' ' ' | awk '{print $1, $2, $3, $4, $5, $6}')
	jq -r --arg seed "$seed" --arg on "$o_n" --arg oa "$o_adm" --arg og "$o_g" --arg ot "$o_t" --arg oe "$o_e" --arg ok "$o_k" '
		(.oracleChecked // 0) as $c | (.oracleMismatches // 0) as $m |
		"| \($seed) | \(.totals.Offered) | \($c) | \($m) | \(if $c > 0 then (100 * ($c - $m) / $c * 10000 | round / 10000 | tostring) + "%" else "n/a" end) | \(.totals.Admitted) / \($oa) | \(.totals.Denied[0]) / \($og) | \(.totals.Denied[1]) / \($ot) | \(.totals.Denied[2]) / \($oe) | \(.totals.Denied[3]) / \($ok) |"' "$s"
	if grep -q "OUT OF MODEL" "$RESULTS/seed-$seed.txt"; then
		echo "seed $seed: the oracle was out of its model: the check is void" >&2
		exit 1
	fi
done

echo
echo "negative control: -fairness maxmin -oracle must be refused:"
if "$RESULTS/load" -policy "$PLANE" -virtual -oracle -quiet -fairness maxmin -duration 1s -rate 10 >"$RESULTS/control.txt" 2>&1; then
	echo "  the oracle accepted a plane it does not model" >&2
	exit 1
fi
sed 's/^/  /' "$RESULTS/control.txt"

echo
first=${SEEDS%% *}
echo "seed $first, the engine's denials by tier and level (tenants.csv):"
echo
echo "| tier | offered | admitted | denied global | tenant | endpoint | key |"
echo "|---|---|---|---|---|---|---|"
awk -F, -v secs="${DURATION%s}" 'NR > 1 {
	tier = $2; off[tier] += $5 * secs; adm[tier] += $6 * secs
	g[tier] += $7; t[tier] += $8; e[tier] += $9; k[tier] += $10
} END {
	split("enterprise standard free", order, " ")
	for (i = 1; i <= 3; i++) { x = order[i]
		printf "| %s | %.0f | %.0f | %d | %d | %d | %d |\n", x, off[x], adm[x], g[x], t[x], e[x], k[x] }
}' "$RESULTS/seed-$first/tenants.csv"
