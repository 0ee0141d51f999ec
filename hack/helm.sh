#!/usr/bin/env bash
# Builds the real Helm that the chart tests (config/helm_test.go) lint and
# render deploy/helm/quotaplane with, from its Go module at a pinned
# version: only the Go module proxy, no download site. The binary is cached
# outside the repository, so the first run takes minutes and later ones
# none. Prints the binary's path.
#
#   QUOTAPLANE_HELM=$(hack/helm.sh) go test -run Helm ./config/
set -euo pipefail

# Helm 3, whose go.mod says go 1.26.0 and requires k8s.io/client-go v0.37.0,
# the Kubernetes minor of the test API server (hack/envtest-binaries.sh).
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
CACHE="${HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/quotaplane/helm}"
out="$CACHE/$HELM_VERSION/helm"

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
	export GOTOOLCHAIN=local
	# Helm's own go.mod decides every dependency (go install pkg@version),
	# as its release build does.
	gomod=$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's|.*"GoMod": "\(.*\)".*|\1|p')
	# What Helm's Makefile sets: the version `helm version` prints, and the
	# Kubernetes version `helm template` and `helm lint` assume without a
	# cluster (otherwise v1.20), from the client-go it is built with:
	# client-go v0.37.x is Kubernetes 1.37.
	client_go=$(sed -n 's|^[[:space:]]*k8s\.io/client-go v0\.\([0-9]*\)\..*|\1|p' "$gomod")
	if [[ -z "$client_go" ]]; then
		echo "hack/helm.sh: no k8s.io/client-go in $gomod" >&2
		exit 1
	fi
	ldflags="-w -s -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
	ldflags+=" -X helm.sh/helm/v3/internal/version.metadata="
	for pkg in pkg/lint/rules pkg/chartutil; do
		ldflags+=" -X helm.sh/helm/v3/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/$pkg.k8sVersionMinor=$client_go"
	done
	# Build into the work directory and move into place, so that an
	# interrupted build never leaves a half-written binary in the cache.
	CGO_ENABLED=0 GOBIN="$work" go install -trimpath -ldflags "$ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >&2
	"$work/helm" version >&2
)
mv "$work/helm" "$out"
echo "$out"
