#!/usr/bin/env bash
# Builds the real Caddy that the gateway tests put in front of an upstream
# (forward_auth to a quotaplane enforcer), from its Go module at a pinned
# version: only the Go module proxy, no download site. The binary is cached
# outside the repository, so the first run takes minutes and later ones
# none. Prints the binary's path.
#
#   QUOTAPLANE_CADDY=$(hack/caddy.sh) go test -run Caddy ./test/gateways/
set -euo pipefail

# The newest Caddy that Go 1.26 builds (its go.mod says go 1.26.0).
CADDY_VERSION="${CADDY_VERSION:-v2.11.9}"
CACHE="${CADDY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/quotaplane/caddy}"
out="$CACHE/$CADDY_VERSION/caddy"

if [[ -x "$out" ]]; then
	echo "$out"
	exit 0
fi
mkdir -p "$(dirname "$out")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(
	cd "$work"
	# The module's own toolchain only: a dependency that wants a newer Go
	# fails here instead of downloading one.
	export GOTOOLCHAIN=local GOFLAGS=-mod=mod
	go mod init caddybuild >&2
	# cmd/caddy's main, as a main package of this module's own (what
	# xcaddy does): Caddy then finds itself among the binary's
	# dependencies, and `caddy version` says which version it is.
	cat > main.go <<'GO'
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	_ "github.com/caddyserver/caddy/v2/modules/standard"
)

func main() { caddycmd.Main() }
GO
	go get "github.com/caddyserver/caddy/v2@$CADDY_VERSION" >&2
	go mod tidy >&2
	# Build into the work directory and move into place, so that an
	# interrupted build never leaves a half-written binary in the cache.
	go build -trimpath -o "$work/caddy" . >&2
	"$work/caddy" version >&2
)
mv "$work/caddy" "$out"
echo "$out"
