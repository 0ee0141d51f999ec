#!/usr/bin/env bash
# Installs quotaplane on a kind cluster the way a user would and runs the
# end-to-end suite against it: builds both images from Dockerfile.manager and
# Dockerfile.enforcer, loads them into the cluster, runs
# `kubectl apply -k config/default`, applies the sample plane as the install
# runs it (`kubectl apply -k config/plane`: mode central) in quotaplane-system, waits until the manager has
# published its policy and the enforcers are ready, and asks the enforcer
# Service for a free-tier tenant's whole burst twice (the first answer must
# be 200, the next a 429 naming the limit). Then it forwards local ports to
# the Redis and to every enforcer pod and runs test/e2e
# (QUOTAPLANE_E2E_CLUSTER=1): 200s and attributed 429s on every enforcer,
# 100 limit edits timed until every enforcer reports them, the new limit
# enforced, the QuotaPlane's enforcersReady.
#
# Needs kind, kubectl, curl, go and a container engine: docker, or podman
# with KIND_EXPERIMENTAL_PROVIDER=podman.
#
#   KIND_CLUSTER=name    the cluster (default quotaplane-e2e); reused when it exists
#   KEEP_CLUSTER=1       keep the cluster afterwards (by default it is deleted,
#                        whether the run passed or not, reused or not)
#   LOCAL_PORT=18080     the local port the enforcer Service is forwarded to;
#                        the Redis gets LOCAL_PORT+1, enforcer pod i
#                        LOCAL_PORT+10+2i (API) and LOCAL_PORT+11+2i (admin)
#   TIMEOUT_SECONDS=300  how long each wait may take
#
# `make test` runs the same suite on this machine's own API server, manager
# and enforcer processes (test/e2e without QUOTAPLANE_E2E_CLUSTER).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

KIND_CLUSTER="${KIND_CLUSTER:-quotaplane-e2e}"
KEEP_CLUSTER="${KEEP_CLUSTER:-0}"
LOCAL_PORT="${LOCAL_PORT:-18080}"
TIMEOUT_SECONDS="${TIMEOUT_SECONDS:-300}"
timeout="${TIMEOUT_SECONDS}s"
NAMESPACE=quotaplane-system
PLANE=main
MANAGER_IMAGE=quotaplane-manager:latest
ENFORCER_IMAGE=quotaplane-enforcer:latest
# free-trial is a free-tier tenant of the sample plane: 50 tokens/s, burst
# 100. A read costs 1, so a read of 100 units takes the whole burst.
TENANT=free-trial
ENDPOINT="read"
UNITS=100

log() { printf '\n==> %s\n' "$*"; }
die() {
	printf 'kind-e2e: %s\n' "$*" >&2
	exit 1
}
need() {
	command -v "$1" >/dev/null 2>&1 || die "$1 is not on PATH: $2"
}

need kind "install it from https://kind.sigs.k8s.io/docs/user/quick-start/#installation"
need kubectl "install it from https://kubernetes.io/docs/tasks/tools/"
need curl "install it with your package manager"
need go "install it from https://go.dev/dl/ (the e2e suite is a Go test)"
if [[ "${KIND_EXPERIMENTAL_PROVIDER:-}" == podman ]]; then
	ENGINE=podman
	need podman "KIND_EXPERIMENTAL_PROVIDER=podman asks for podman; install it or unset KIND_EXPERIMENTAL_PROVIDER to use docker"
else
	ENGINE=docker
	need docker "install Docker, or set KIND_EXPERIMENTAL_PROVIDER=podman to use podman"
fi
"$ENGINE" info >/dev/null 2>&1 || die "$ENGINE is installed but does not answer ($ENGINE info failed): start its daemon or check your permissions"

work=$(mktemp -d)
cluster_up=0
pf_pid=""

# k is kubectl on the e2e cluster, whatever the current context is.
k() { kubectl --context "kind-$KIND_CLUSTER" "$@"; }

cleanup() {
	local rc=$?
	for pid in $pf_pid; do
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	if [[ $rc -ne 0 && $cluster_up -eq 1 ]]; then
		printf '\nkind-e2e: FAILED (exit %d); the state of %s:\n' "$rc" "$NAMESPACE" >&2
		k -n "$NAMESPACE" get deployments,pods,services -o wide >&2 || true
		k -n "$NAMESPACE" get quotaplanes -o yaml >&2 || true
		k -n "$NAMESPACE" get events --sort-by=.lastTimestamp >&2 || true
		for d in quotaplane-manager quotaplane-enforcer quotaplane-redis; do
			printf '\n--- logs of deployment/%s\n' "$d" >&2
			k -n "$NAMESPACE" logs "deployment/$d" --all-containers --tail=50 >&2 || true
		done
		for f in "$work"/port-forward-*.log; do
			[[ -s "$f" ]] || continue
			printf '\n--- kubectl port-forward (%s)\n' "${f##*/}" >&2
			cat "$f" >&2
		done
	fi
	if [[ $cluster_up -eq 1 && "$KEEP_CLUSTER" != 1 ]]; then
		log "deleting kind cluster $KIND_CLUSTER (KEEP_CLUSTER=1 keeps it)"
		kind delete cluster --name "$KIND_CLUSTER" || true
	fi
	rm -rf "$work"
	exit "$rc"
}
trap cleanup EXIT

reused=0
clusters=$(kind get clusters 2>/dev/null || true)
if grep -qx "$KIND_CLUSTER" <<<"$clusters"; then
	log "reusing kind cluster $KIND_CLUSTER"
	reused=1
	kind export kubeconfig --name "$KIND_CLUSTER"
else
	log "creating kind cluster $KIND_CLUSTER"
	kind create cluster --name "$KIND_CLUSTER" --wait 120s
fi
cluster_up=1

log "building $MANAGER_IMAGE and $ENFORCER_IMAGE with $ENGINE"
if [[ $ENGINE == docker ]]; then
	docker build -f Dockerfile.manager -t "$MANAGER_IMAGE" .
	docker build -f Dockerfile.enforcer -t "$ENFORCER_IMAGE" .
	log "loading the images into $KIND_CLUSTER"
	kind load docker-image --name "$KIND_CLUSTER" "$MANAGER_IMAGE" "$ENFORCER_IMAGE"
else
	# kind load docker-image reads from docker whatever the provider, so
	# podman's images go in as archives, one each (podman save merges several
	# names into one image). Podman would name an unqualified tag
	# localhost/...; the full docker.io/library/ name is the one the kubelet
	# looks up for quotaplane-manager:latest.
	for image in "$MANAGER_IMAGE" "$ENFORCER_IMAGE"; do
		name=${image%%:*}
		podman build -f "Dockerfile.${name#quotaplane-}" -t "docker.io/library/$image" .
		podman save -o "$work/$name.tar" "docker.io/library/$image"
		kind load image-archive --name "$KIND_CLUSTER" "$work/$name.tar"
	done
fi

log "kubectl apply -k config/default"
k apply -k config/default
k wait --for=condition=Established --timeout="$timeout" -f config/crd/bases/
if [[ $reused -eq 1 ]]; then
	# Same tags, new images: pods already running keep the old ones.
	k -n "$NAMESPACE" rollout restart deployment/quotaplane-manager deployment/quotaplane-enforcer
fi
k -n "$NAMESPACE" wait --for=condition=Available --timeout="$timeout" \
	deployment/quotaplane-redis deployment/quotaplane-manager
k -n "$NAMESPACE" rollout status --timeout="$timeout" deployment/quotaplane-manager

log "kubectl apply -k config/plane (the sample plane, mode central) in $NAMESPACE"
k apply -n "$NAMESPACE" -k config/plane

log "waiting for the manager to publish quotaplane/$PLANE"
deadline=$((SECONDS + TIMEOUT_SECONDS))
version=""
while :; do
	version=$(k -n "$NAMESPACE" get quotaplane "$PLANE" -o jsonpath='{.status.publishedVersion}' 2>/dev/null || true)
	if [[ -n "$version" && "$version" != 0 ]]; then
		break
	fi
	((SECONDS < deadline)) || die "quotaplane/$PLANE has no status.publishedVersion after $timeout"
	sleep 2
done
echo "published version $version"

# Enforcers are ready only once they hold a policy, so this wait comes after
# the publish.
k -n "$NAMESPACE" wait --for=condition=Available --timeout="$timeout" deployment/quotaplane-enforcer
k -n "$NAMESPACE" rollout status --timeout="$timeout" deployment/quotaplane-enforcer

# forward name target ports...: a kubectl port-forward in the background,
# logged to $work/port-forward-name.log; waits until the first local port
# accepts a connection. (kubectl itself, not the function k, so that $! is
# kubectl's pid.)
forward() {
	local name=$1 target=$2
	shift 2
	kubectl --context "kind-$KIND_CLUSTER" -n "$NAMESPACE" port-forward "$target" "$@" >"$work/port-forward-$name.log" 2>&1 &
	local pid=$!
	pf_pid="$pf_pid $pid"
	local first=${1%%:*} deadline=$((SECONDS + 30))
	until (exec 3<>"/dev/tcp/127.0.0.1/$first") 2>/dev/null; do
		kill -0 "$pid" 2>/dev/null || die "kubectl port-forward $target exited: $(cat "$work/port-forward-$name.log")"
		((SECONDS < deadline)) || die "localhost:$first ($target) does not answer after 30s"
		sleep 1
	done
}

log "forwarding localhost:$LOCAL_PORT to service/quotaplane-enforcer:8080"
forward service service/quotaplane-enforcer "$LOCAL_PORT:8080"
base="http://127.0.0.1:$LOCAL_PORT"

# decide sends one decision request and prints its status code; the
# response headers are in $work/headers, the body in $work/body.
decide() {
	curl -sS -X POST -o "$work/body" -D "$work/headers" -w '%{http_code}' \
		-H "X-Tenant: $TENANT" -H 'X-Api-Key: kind-e2e' -H "X-Quota-Units: $UNITS" \
		"$base/api/$ENDPOINT"
}
# header prints the value of the response header named $1 (any case).
header() {
	awk -v name="$1" '{
		i = index($0, ":")
		if (i > 0 && tolower(substr($0, 1, i - 1)) == tolower(name)) {
			v = substr($0, i + 1); sub(/^[ \t]+/, "", v); sub(/\r$/, "", v); print v
		}
	}' "$work/headers"
}

log "POST /api/$ENDPOINT as $TENANT, $UNITS units: the tenant's whole burst"
code=$(decide) || die "curl failed: is the port-forward up? $(cat "$work/port-forward-service.log")"
echo "$code $(cat "$work/body")"
[[ $code == 200 ]] || die "the first request got $code, want 200"

log "the same again: over the burst"
# The bucket refills at 50 tokens/s, so the next request is denied unless
# two seconds pass; a slow machine gets a few tries.
code=""
for _ in 1 2 3 4 5; do
	code=$(decide) || die "curl failed: is the port-forward up? $(cat "$work/port-forward-service.log")"
	echo "$code $(cat "$work/body")"
	if [[ $code == 429 ]]; then
		break
	fi
done
[[ $code == 429 ]] || die "no 429 after 5 requests over the burst; the last got $code"
level=$(header X-Quota-Level)
[[ -n "$level" ]] || die "the 429 has no X-Quota-Level header: $(cat "$work/headers")"

log "forwarding the Redis and every enforcer pod for the e2e suite"
redis_port=$((LOCAL_PORT + 1))
forward redis service/quotaplane-redis "$redis_port:6379"
enforcers=""
i=0
for pod in $(k -n "$NAMESPACE" get pods -l app.kubernetes.io/name=quotaplane-enforcer \
	--field-selector=status.phase=Running -o jsonpath='{.items[*].metadata.name}'); do
	api=$((LOCAL_PORT + 10 + 2 * i)) admin=$((LOCAL_PORT + 11 + 2 * i))
	forward "$pod" "pod/$pod" "$api:8080" "$admin:9090"
	enforcers="${enforcers:+$enforcers,}$pod=127.0.0.1:$api/127.0.0.1:$admin"
	i=$((i + 1))
done
[[ $i -gt 0 ]] || die "no running enforcer pod"
# The Redis password, when the optional Secret sets one.
password=$(k -n "$NAMESPACE" get secret quotaplane-redis -o jsonpath='{.data.password}' 2>/dev/null | base64 -d || true)

log "go test ./test/e2e/ against kind-$KIND_CLUSTER ($i enforcers)"
kubeconfig="$work/kubeconfig"
kind get kubeconfig --name "$KIND_CLUSTER" >"$kubeconfig"
KUBECONFIG="$kubeconfig" QUOTAPLANE_E2E_CLUSTER=1 QUOTAPLANE_E2E_NAMESPACE="$NAMESPACE" \
	QUOTAPLANE_E2E_REDIS="127.0.0.1:$redis_port" QUOTAPLANE_REDIS_PASSWORD="$password" QUOTAPLANE_E2E_ENFORCERS="$enforcers" \
	go test -count=1 -run TestEndToEnd -v ./test/e2e/ | tee "$work/e2e.log"
grep -q '^--- PASS: TestEndToEnd' "$work/e2e.log" || die "the e2e suite failed"

cat <<EOF

kind-e2e: PASS
  cluster          kind-$KIND_CLUSTER ($ENGINE)
  images           $MANAGER_IMAGE, $ENFORCER_IMAGE
  installed        kubectl apply -k config/default, -k config/plane in $NAMESPACE
  published        quotaplane/$PLANE version $version
  first request    200
  over the burst   429, X-Quota-Level: $level, Retry-After: $(header Retry-After), X-Quota-Reason: $(header X-Quota-Reason)
  Go e2e suite     passed against $i enforcer pods: $(grep -o 'p50 [^,]*, p99 [^,]*' "$work/e2e.log" | head -1) from a limit edit to every enforcer running it
EOF
