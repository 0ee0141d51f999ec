#!/usr/bin/env bash
# Prints the sustained run's tables from its raw output (run.sh calls it at
# the end; it can be run again on the same RESULTS):
#
#   hack/experiments/08-sustained/summarise.sh [RESULTS]
#
# The generator alone: each null run's offered and decided rate and lag.
# The sustained run: its totals; the admitted tokens against the global
# limit over the whole run and per second (tokens.csv counts wall seconds;
# the seconds after the scheduled end are left out); its worst seconds; the
# decided rate per minute of wall time. The central contrast: its totals.
#
#   LIMIT=1000000 BURST=1000000 WARMUP=10s   must match run.sh
set -euo pipefail
shopt -s nullglob

RESULTS="${1:-${RESULTS:-/tmp/quotaplane-experiments/08-sustained}}"
LIMIT="${LIMIT:-1000000}"
BURST="${BURST:-1000000}"
WARMUP="${WARMUP:-10s}"

echo "| generator alone (-target null) | run | offered/s (scheduled) | decided/s (wall) | generator lag p99 |"
echo "|---|---|---|---|---|"
for s in "$RESULTS"/null-*-run*/summary.json; do
	name=${s%/summary.json}
	name=${name##*/null-}
	jq -r --arg rate "${name%-run*}" --arg r "${name##*-run}" \
		'"| \($rate) | \($r) | \(.totals.Offered / .measuredSeconds | floor) | \(.decisionsPerWallSecond | floor) | \(.generatorLag.p99us) µs |"' "$s"
done

dir="$RESULTS/sustained"
if [ -f "$dir/summary.json" ]; then
	echo
	echo "sustained:"
	dur=$(jq '.measuredSeconds + ("'"${WARMUP%s}"'" | tonumber)' "$dir/summary.json")
	jq -r '"offered \(.totals.Offered / .measuredSeconds | floor)/s after the warmup (scheduled), decided \(.decisionsPerWallSecond | floor)/s over \(.wallSeconds * 10 | floor / 10) s of wall time, errors \(.errors); decision p50 \(.latency.p50us) µs, p99 \(.latency.p99us) µs, p99.9 \(.latency.p999us) µs; generator lag p50 \(.generatorLag.p50us) µs, p99 \(.generatorLag.p99us) µs"' "$dir/summary.json"
	wall=$(jq '.wallSeconds' "$dir/summary.json")
	# The last row also holds any seconds past cmd/load's slots; the whole
	# run is divided by the wall time, not by the rows.
	awk -F, -v limit="$LIMIT" -v burst="$BURST" -v warm="${WARMUP%s}" -v dur="$dur" -v wall="$wall" '
		NR > 1 { all += $2; offered += $3 }
		NR > 1 && $1 >= warm && $1 < dur { steady += $2; n++; o = 100 * ($2 / limit - 1); v[n] = o; if (n == 1 || o > max) max = o; if (n == 1 || o < min) min = o }
		END {
			for (i = 2; i <= n; i++) { x = v[i]; for (j = i - 1; j >= 1 && v[j] > x; j--) v[j + 1] = v[j]; v[j + 1] = x }
			med = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
			printf "tokens: offered %.0f/s over %.1f s of wall time; admitted over the whole run %+.3f%% vs limit × wall time + burst; from the warmup to %d s %+.3f%% vs limit × time; per second from the warmup: median %+.2f%%, min %+.2f%%, max %+.2f%% (%d s)\n",
				offered / wall, wall, 100 * (all / (limit * wall + burst) - 1), dur, 100 * (steady / (limit * (dur - warm)) - 1), med, min, max, n
		}' "$dir/tokens.csv"
	# A token bucket may admit up to rate × time + burst in any window: a
	# second over the limit after one under is the burst being spent. The
	# largest excess over any window of whole seconds (Kadane's maximum
	# subarray of admitted − limit) must stay within the burst.
	awk -F, -v limit="$LIMIT" -v burst="$BURST" -v warm="${WARMUP%s}" -v dur="$dur" '
		NR > 1 && $1 < dur { x = $2 - limit; cur = (cur > 0 ? cur : 0) + x; if (cur > best) { best = cur; end = $1 } }
		NR > 1 && $1 >= warm && $1 < dur { x = $2 - limit; cw = (cw > 0 ? cw : 0) + x; if (cw > bw) { bw = cw; ew = $1 } }
		END { printf "largest excess of admitted tokens over limit × seconds in any window: whole run %.0f (%.1f%% of the burst, ending at t=%d s); from the warmup %.0f (%.1f%% of the burst, ending at t=%d s)\n", best, 100 * best / burst, end, bw, 100 * bw / burst, ew }' "$dir/tokens.csv"
	awk -F, 'NR > 1 { n++; if ($14 + 0 > lag) { lag = $14; t = $1 } if ($11 + 0 > p99) { p99 = $11; tp = $1 } if ($14 + 0 > 10000) late++; if ($14 + 0 > 1000000) later++ }
		END { printf "worst second (scheduled): decision p99 %.0f µs (t=%d s), generator lag p99 %.0f µs (t=%d s); seconds whose lag p99 is over 10 ms: %d of %d, over 1 s: %d\n", p99, tp, lag, t, late, n, later }' "$dir/seconds.csv"
	echo "decided per second of wall time, by minute (tokens.csv):"
	awk -F, 'NR > 1 { m = int($1 / 60); s[m] += $4; c[m]++ } END { for (i = 0; i in s; i++) printf "  minute %d (%d s): %.0f/s\n", i + 1, c[i], s[i] / c[i] }' "$dir/tokens.csv"
fi

dir="$RESULTS/central"
if [ -f "$dir/summary.json" ]; then
	echo
	echo "central, for contrast:"
	jq -r '"offered \(.totals.Offered / .measuredSeconds | floor)/s (scheduled), decided \(.decisionsPerWallSecond | floor)/s over \(.wallSeconds * 10 | floor / 10) s of wall time, errors \(.errors); decision p50 \(.latency.p50us) µs, p99 \(.latency.p99us) µs; generator lag p99 \(.generatorLag.p99us) µs"' "$dir/summary.json"
fi
