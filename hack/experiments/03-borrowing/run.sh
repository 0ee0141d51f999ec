#!/usr/bin/env bash
# Experiment 3: borrowing from the burst pool under partial load.
#
# 500 requests/s over seed 002's 5,000 tenants (reads only, one token each:
# most tenants idle), 60 s of virtual time, on a plane whose pool holds
# 8,000 tokens, refills 100/s and lets one tenant owe at most 5,000.
#   soft: whale-1 (soft, own limit 1,000/s) offers +3,000/s from 10 s to
#         50 s; whale-2 (the same limits) joins from 25 s: alone, whale-1
#         stops at its ceiling; together they drain the pool.
#   hard: whale-3 (hard, own limit 1,000/s) offers +3,000/s from 10 s to 50 s.
# Checks the bounds from the per-second counts and prints a markdown table.
#
#   hack/experiments/03-borrowing/run.sh
#
# Raw output under RESULTS (default /tmp/quotaplane-experiments/03-borrowing);
# plots into docs/experiments/img/.
set -euo pipefail

RESULTS=${RESULTS:-/tmp/quotaplane-experiments/03-borrowing}
PLANE=hack/experiments/03-borrowing/plane
IMG=docs/experiments/img
SIZE=8000 REFILL=100 CEILING=5000 OWN=1000
COMMON=(-policy "$PLANE" -virtual -quiet -rate 500 -mix read=1 -duration 60s)

mkdir -p "$RESULTS" "$IMG"
go run ./cmd/enforcer check "$PLANE"
go build -o "$RESULTS/load" ./cmd/load
go build -o "$RESULTS/plot" ./hack/experiments/03-borrowing/plot

"$RESULTS/load" "${COMMON[@]}" -spike whale-1:3000:10s:50s -spike whale-2:3000:25s:50s -out "$RESULTS/soft" >"$RESULTS/soft.txt"
"$RESULTS/load" "${COMMON[@]}" -spike whale-3:3000:10s:50s -out "$RESULTS/hard" >"$RESULTS/hard.txt"

echo
echo "commands: $RESULTS/load ${COMMON[*]} -spike whale-1:3000:10s:50s -spike whale-2:3000:25s:50s -out $RESULTS/soft"
echo "          $RESULTS/load ${COMMON[*]} -spike whale-3:3000:10s:50s -out $RESULTS/hard"

# Per second: the spikers' offered and admitted (their base load included)
# and the tokens borrowed (all tenants').
echo
echo "| second | soft: spikers offered | admitted | borrowed | hard: whale-3 offered | admitted | borrowed |"
echo "|---|---|---|---|---|---|---|"
paste -d, "$RESULTS/soft/seconds.csv" "$RESULTS/hard/seconds.csv" | awk -F, -v n=17 '
	NR > 1 { t = $1; if (t <= 14 || (t >= 23 && t <= 28) || t >= 48 && t <= 51)
		printf "| %d | %d | %d | %d | %d | %d | %d |\n", t, $7, $8, $9, $(n+7), $(n+8), $(n+9) }'

# The bounds, over every window of whole seconds i..j (k = j-i+1 seconds):
# a bucket of burst B refilled at R gives at most B + R·k in k seconds.
#   pool:    all borrowing ≤ SIZE + REFILL·k
#   ceiling: whale-1's borrowing ≤ CEILING + REFILL·k (it borrows alone
#            before 25 s; per tenant totals below for the rest)
#   hard:    whale-3 borrows nothing; its admitted ≤ OWN burst + OWN·k
windows() { # file column from to burst rate → the largest sum minus bound
	awk -F, -v c="$2" -v from="$3" -v to="$4" -v b="$5" -v r="$6" '
		NR > 1 && $1 >= from && $1 <= to { x[n++] = $c }
		END { worst = -1e18
			for (i = 0; i < n; i++) { s = 0
				for (j = i; j < n; j++) { s += x[j]; if (s - (b + r * (j - i + 1)) > worst) worst = s - (b + r * (j - i + 1)) } }
			print worst }' "$1"
}
pool=$(windows "$RESULTS/soft/seconds.csv" 9 0 59 $SIZE $REFILL)
ceiling=$(windows "$RESULTS/soft/seconds.csv" 9 0 24 $CEILING $REFILL)
hardb=$(awk -F, 'NR > 1 { s += $9 } END { print s + 0 }' "$RESULTS/hard/seconds.csv")
# whale-3's own admitted per second is attacker_admitted (its base included).
hardadm=$(windows "$RESULTS/hard/seconds.csv" 8 0 59 $OWN $OWN)
steady() { awk -F, -v c="$2" -v from="$3" -v to="$4" 'NR > 1 && $1 >= from && $1 <= to { s += $c; n++ } END { printf "%.1f", s / n }' "$1"; }
tenant() { awk -F, -v t="$2" '$1 == t { print $11 }' "$1/tenants.csv"; }

echo
echo "| check | measured | bound | holds |"
echo "|---|---|---|---|"
row() { awk -v what="$1" -v m="$2" -v b="$3" -v ok="$4" 'BEGIN { printf "| %s | %s | %s | %s |\n", what, m, b, (ok ? "yes" : "NO") }'; }
row "all borrowing, any window of k s, minus $SIZE + $REFILL·k (pool)" "$pool" "≤ 0" "$(awk -v x="$pool" 'BEGIN { print (x <= 0) }')"
row "whale-1's borrowing (alone, 0–24 s), any window, minus $CEILING + $REFILL·k (ceiling)" "$ceiling" "≤ 0" "$(awk -v x="$ceiling" 'BEGIN { print (x <= 0) }')"
w1=$(tenant "$RESULTS/soft" whale-1) w2=$(tenant "$RESULTS/soft" whale-2)
row "whale-1 borrowed in all (spike 40 s)" "$w1" "≤ $CEILING + $REFILL·40 = $((CEILING + REFILL * 40))" "$((w1 <= CEILING + REFILL * 40))"
row "whale-2 borrowed in all (spike 25 s)" "$w2" "≤ $CEILING + $REFILL·25 = $((CEILING + REFILL * 25))" "$((w2 <= CEILING + REFILL * 25))"
near() { awk -v m="$1" -v b="$2" 'BEGIN { d = m - b; if (d < 0) d = -d; print (d <= 0.01 * b) }'; } # within 1%
base2=$(awk -F, '$1 == "whale-2" { printf "%.1f", $4 }' "$RESULTS/soft/tenants.csv")
m=$(steady "$RESULTS/soft/seconds.csv" 9 15 24)
row "borrowed/s, 15–24 s (whale-1 at its ceiling)" "$m" "$REFILL (the ceiling's repayment) ±1%" "$(near "$m" $REFILL)"
b2=$(awk -F, 'NR > 1 && ($1 == 25 || $1 == 26) { s += $9 } END { print s }' "$RESULTS/soft/seconds.csv")
row "whale-2's borrowing in 25–26 s (all borrowing, less whale-1's ≤ 2·$REFILL)" "$((b2 - 2 * REFILL))–$b2" "< $CEILING: the dry pool stopped it, not its ceiling" "$((b2 < CEILING))"
m=$(steady "$RESULTS/soft/seconds.csv" 9 30 49)
row "borrowed/s, 30–49 s (the pool dry)" "$m" "$REFILL (the pool's refill) ±1%" "$(near "$m" $REFILL)"
m=$(steady "$RESULTS/soft/seconds.csv" 8 15 24)
want=$(awk -v b="$base2" "BEGIN { print $OWN + $REFILL + b }")
row "spikers admitted/s, 15–24 s (whale-1, and whale-2's base $base2/s)" "$m" "$OWN + $REFILL + $base2 = $want ±1%" "$(near "$m" "$want")"
m=$(steady "$RESULTS/soft/seconds.csv" 8 30 49)
row "spikers admitted/s, 30–49 s" "$m" "2·$OWN + $REFILL = $((2 * OWN + REFILL)) ±1%" "$(near "$m" $((2 * OWN + REFILL)))"
row "hard: whale-3 borrowed" "$hardb" "= 0" "$((hardb == 0))"
row "hard: whale-3 admitted, any window, minus $OWN + $OWN·k" "$hardadm" "≤ 0" "$(awk -v x="$hardadm" 'BEGIN { print (x <= 0) }')"
m=$(steady "$RESULTS/hard/seconds.csv" 8 15 49)
row "hard: whale-3 admitted/s, 15–49 s" "$m" "$OWN ±1%" "$(near "$m" $OWN)"
"$RESULTS/plot" -csv "$RESULTS/soft/seconds.csv" -out "$IMG/03-soft.png" -title "soft: whale-1 bursts at 10 s, whale-2 at 25 s (pool 8,000, ceiling 5,000, refill 100/s)" \
	attacker_offered="whale-1 + whale-2 offered/s" attacker_admitted="admitted/s" borrowed="borrowed tokens/s"
"$RESULTS/plot" -csv "$RESULTS/hard/seconds.csv" -out "$IMG/03-hard.png" -title "hard: whale-3 bursts at 10 s (own limit 1,000/s)" \
	attacker_offered="whale-3 offered/s" attacker_admitted="admitted/s" borrowed="borrowed tokens/s"
ls -l "$IMG"/03-*.png | awk '{ print $5, $9 }'
