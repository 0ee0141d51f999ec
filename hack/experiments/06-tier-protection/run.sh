#!/usr/bin/env bash
# Experiment 6 (seed 002 §10.6): tier protection under total overload.
# 30,000 reads/s (cost 1) are offered against a global limit of 20,000
# tokens/s: 150% of capacity, across all three tiers (plane/: weights 8/4/1,
# floors 40/25/5%). Virtual time: exact, deterministic, no bench lock. Two
# profiles, each with fairness maxmin by each shareBy (tenant, the plane's
# default: seed 002's; and tier, -share-by tier, the runs named *-tier)
# and, for contrast, none:
#   zipf      seed 002's: 5,000 tenants, Zipf s = 1.2, 50/950/4,000 tiers,
#             the 20 whales enterprise
#   balanced  5,000 tenants of equal rate (6 req/s each), 2,000 enterprise,
#             1,500 standard, 1,500 free: every tier offers more than its
#             floor, enterprise 60% of the capacity
# 60 s each, the first 20 s left out. The tier table comes from
# ../05-fair-shares/analyze: offered and admitted measured, floor and fair
# share from pkg/load's reference (FairShares).
#
# Then seed 002's read/write/export mix (90/9/1, costs 1/5/50, 1.85 tokens a
# request on average) on the Zipf profile at 16,216 requests/s: the same
# 30,000 tokens/s, with both fairness modes.
#
#   RESULTS=/tmp/quotaplane-experiments/06-tier-protection   raw output
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../../.."

RESULTS="${RESULTS:-/tmp/quotaplane-experiments/06-tier-protection}"
PLANE=hack/experiments/06-tier-protection/plane

mkdir -p "$RESULTS"
go run ./cmd/enforcer check "$PLANE"
go build -o "$RESULTS/load" ./cmd/load
go build -o "$RESULTS/analyze" ./hack/experiments/05-fair-shares/analyze

run() { # name fairness profile-flags...
	local name=$1 fairness=$2
	shift 2
	"$RESULTS/load" -policy "$PLANE" -virtual -seed 1 -rate 30000 -mix read=1 -fairness "$fairness" \
		-duration 60s -warmup 20s -quiet -out "$RESULTS/$name" "$@" >"$RESULTS/$name.txt"
	echo "== $name: $RESULTS/$name" && cat "$RESULTS/$name.txt"
}
balanced=(-zipf 0 -enterprise 2000 -standard 1500)
mix=(-mix read=0.9,write=0.09,export=0.01 -rate 16216)
run zipf-maxmin maxmin
run zipf-maxmin-tier maxmin -share-by tier
run zipf-none none
run balanced-maxmin maxmin "${balanced[@]}"
run balanced-maxmin-tier maxmin -share-by tier "${balanced[@]}"
run balanced-none none "${balanced[@]}"
run zipf-mix-maxmin maxmin "${mix[@]}"
run zipf-mix-maxmin-tier maxmin -share-by tier "${mix[@]}"
run zipf-mix-none none "${mix[@]}"

# Each shareBy's runs against its own reference; none against tenant's.
for by in tenant tier; do
	sfx=""
	[[ $by == tier ]] && sfx=-tier
	echo
	echo "== shareBy $by"
	"$RESULTS/analyze" -policy "$PLANE" -share-by "$by" -tiers-only \
		zipf-maxmin$sfx="$RESULTS/zipf-maxmin$sfx" zipf-none="$RESULTS/zipf-none" \
		balanced-maxmin$sfx="$RESULTS/balanced-maxmin$sfx" balanced-none="$RESULTS/balanced-none"
	echo
	"$RESULTS/analyze" -policy "$PLANE" -share-by "$by" -tiers-only \
		zipf-mix-maxmin$sfx="$RESULTS/zipf-mix-maxmin$sfx" zipf-mix-none="$RESULTS/zipf-mix-none"
done
