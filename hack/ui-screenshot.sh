#!/usr/bin/env bash
# Takes docs/images/ui.png, the screenshot of the enforcer's live view
# (/quota/ui, docs/ui.md) under load: an enforcer on the sample plane with
# its global limit cut to 2,000 tokens/s (-global-rps) and, so that every
# tier has tenants, eight more whales named enterprise and forty of
# cmd/load's tenants named standard; cmd/load offers it seed 002's profile
# over HTTP at 2,500 requests/s (about 4,600 tokens/s) for 40 s; after 20 s
# headless Chromium takes the picture at 1280x900.
#
#   hack/ui-screenshot.sh [OUT.png]      (default docs/images/ui.png)
#
# Needs go, curl and chromium (CHROMIUM=path to override; `make chromium`
# installs Debian's). Everything listens on 127.0.0.1 only.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(realpath -m "${1:-docs/images/ui.png}")
chromium=${CHROMIUM:-$(command -v chromium || echo /usr/bin/chromium)}
[ -x "$chromium" ] || { echo "ui-screenshot: no chromium at $chromium (make chromium)" >&2; exit 1; }

tmp=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT

# A free loopback port: one nothing answers on.
port() {
	local p
	while :; do
		p=$((20000 + RANDOM % 40000))
		(echo >"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
	done
}
api=$(port) admin=$(port) grpc=$(port)

go build -o "$tmp/" ./cmd/enforcer ./cmd/load

mkdir "$tmp/plane"
cp config/samples/*.yaml "$tmp/plane/"
{
	for i in $(seq 3 10); do
		printf -- '---\napiVersion: quotaplane.io/v1alpha1\nkind: TenantQuota\nmetadata: {name: whale-%d}\nspec: {tenant: whale-%d, tier: enterprise}\n' "$i" "$i"
	done
	for i in $(seq 21 60); do
		printf -- '---\napiVersion: quotaplane.io/v1alpha1\nkind: TenantQuota\nmetadata: {name: t-%05d}\nspec: {tenant: t-%05d, tier: standard}\n' "$i" "$i"
	done
} >"$tmp/plane/screenshot-tenants.yaml"

"$tmp/enforcer" -policy "$tmp/plane" -global-rps 2000 -node-id enforcer-0 \
	-listen "127.0.0.1:$api" -admin-listen "127.0.0.1:$admin" -grpc-listen "127.0.0.1:$grpc" >"$tmp/enforcer.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do
	curl -fs "http://127.0.0.1:$admin/readyz" >/dev/null && break
	sleep 0.1
done
curl -fs "http://127.0.0.1:$admin/readyz" >/dev/null || { cat "$tmp/enforcer.log" >&2; exit 1; }

"$tmp/load" -target http -urls "http://127.0.0.1:$api" -conns 32 -rate 2500 -duration 40s \
	-tenants 1000 -enterprise 10 -standard 100 -whales 10 -quiet >"$tmp/load.log" 2>&1 &
pids+=($!)
sleep 18
curl -fs "http://127.0.0.1:$admin/quota/ui" >/dev/null # the baseline of the page's rates
sleep 2
profile=$(mktemp -d -p "$tmp")
timeout 60 "$chromium" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
	--disable-background-networking --disable-component-update --disable-sync --hide-scrollbars \
	--user-data-dir="$profile" --window-size=1280,900 --screenshot="$out" \
	"http://127.0.0.1:$admin/quota/ui" 2>"$tmp/chromium.log" || { cat "$tmp/chromium.log" >&2; exit 1; }
echo "ui-screenshot: wrote $out"
