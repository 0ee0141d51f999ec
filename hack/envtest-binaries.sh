#!/usr/bin/env bash
# Builds the real kube-apiserver and etcd that controller tests (envtest) run
# against, from Go modules at pinned versions: no container registry, no
# download site, only the Go module proxy. The binaries are cached outside the
# repository, so the first run takes minutes (on a 2-core VM: about 6 with
# a warm Go module cache, up to ~14 with a cold one) and later ones none. Prints the directory to use as
# KUBEBUILDER_ASSETS.
#
#   KUBEBUILDER_ASSETS=$(hack/envtest-binaries.sh) go test ./controllers/...
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.37.0}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.6}"
CACHE="${ENVTEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/quotaplane/envtest}"
out="$CACHE/k8s-$K8S_VERSION-etcd-$ETCD_VERSION"

if [[ -x "$out/kube-apiserver" && -x "$out/etcd" ]]; then
	echo "$out"
	exit 0
fi
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# kube-apiserver: k8s.io/kubernetes as a dependency, each staging module it
# replaces with a local path mapped to its release (v0.<minor>.<patch>).
staging="v0.${K8S_VERSION#v1.}"
mkdir -p "$work/apiserver"
(
	cd "$work/apiserver"
	cat > go.mod <<MOD
module envtest/apiserver

go 1.26

require k8s.io/kubernetes $K8S_VERSION
MOD
	gomod=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's|.*"GoMod": "\(.*\)".*|\1|p')
	sed -n 's|^[[:space:]]*\(k8s\.io/[^ ]*\) => ./staging/.*|\1|p' "$gomod" |
		while read -r mod; do echo "replace $mod => $mod $staging" >> go.mod; done
	cat > tools.go <<'GO'
//go:build tools

package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver/app"
GO
	go mod tidy -e >&2
	minor="${K8S_VERSION#v1.}"
	minor="${minor%%.*}"
	go build -o "$out/kube-apiserver" -ldflags "\
		-X k8s.io/component-base/version.gitVersion=$K8S_VERSION \
		-X k8s.io/component-base/version.gitMajor=1 \
		-X k8s.io/component-base/version.gitMinor=$minor" \
		k8s.io/kubernetes/cmd/kube-apiserver >&2
)

mkdir -p "$work/etcd"
(
	cd "$work/etcd"
	cat > go.mod <<MOD
module envtest/etcd

go 1.26

require go.etcd.io/etcd/server/v3 $ETCD_VERSION
MOD
	cat > tools.go <<'GO'
//go:build tools

package tools

import _ "go.etcd.io/etcd/server/v3/etcdmain"
GO
	go mod tidy -e >&2
	# etcd needs no version ldflags: its version is a constant of its own
	# module (go.etcd.io/etcd/api/v3/version), so the binary reports it.
	go build -o "$out/etcd" go.etcd.io/etcd/server/v3 >&2
)
echo "$out"
