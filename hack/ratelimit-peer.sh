#!/usr/bin/env bash
# Builds envoyproxy/ratelimit (Envoy's reference rate limit service, the peer
# that hack/rlsbench measures quotaplane against) from Go modules at a pinned
# version: no container image, only the Go module proxy. `go install
# module/pkg@version` builds it with exactly the versions its own go.mod
# selects, as a checkout of that commit would, from a temporary directory
# outside this repository (whose go.mod plays no part). The binary is cached
# outside the repository: the first run takes 24 s on a 2-core VM with a warm
# Go module cache (a cold one adds the download of the 53 modules it is
# built from), later ones none. Prints the binary's path.
#
#   peer=$(hack/ratelimit-peer.sh)
#
# RATELIMIT_VERSION picks another version. The module proxy lists no tagged
# versions of github.com/envoyproxy/ratelimit (`go list -m -versions`), so
# it is a pseudo-version of a commit on main; `go list -m
# github.com/envoyproxy/ratelimit@latest` names the newest.
set -euo pipefail

RATELIMIT_VERSION="${RATELIMIT_VERSION:-v1.4.1-0.20260122083618-3fb702589d36}"
CACHE="${RATELIMIT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/quotaplane/ratelimit}"
out="$CACHE/$RATELIMIT_VERSION"

if [[ -x "$out/ratelimit" ]]; then
	echo "$out/ratelimit"
	exit 0
fi
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

start=$SECONDS
(
	cd "$work"
	GOBIN="$work/bin" GOFLAGS=-buildvcs=false GOWORK=off \
		go install "github.com/envoyproxy/ratelimit/src/service_cmd@$RATELIMIT_VERSION" >&2
)
mv "$work/bin/service_cmd" "$out/ratelimit"
echo "built envoyproxy/ratelimit $RATELIMIT_VERSION with $(go env GOVERSION) in $((SECONDS - start)) s" >&2
echo "$out/ratelimit"
