# quotaplane — the front door. `make help` lists every target.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
.DEFAULT_GOAL := help

# Tools are pinned and installed from the Go module proxy into ./bin.
LOCALBIN ?= $(CURDIR)/bin
CONTROLLER_TOOLS_VERSION ?= v0.23.0
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen-$(CONTROLLER_TOOLS_VERSION)
# The newest kustomize v5 that Go 1.26 builds (v5.8.3 needs Go 1.27).
KUSTOMIZE_VERSION ?= v5.8.2
KUSTOMIZE ?= $(LOCALBIN)/kustomize-$(KUSTOMIZE_VERSION)
STATICCHECK_VERSION ?= v0.8.2
STATICCHECK ?= $(LOCALBIN)/staticcheck-$(STATICCHECK_VERSION)

GO ?= go
GOTEST_FLAGS ?= -race -count=1 -timeout 20m
PKGS ?= ./...
BENCH ?= .
BENCHTIME ?= 1s

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "Usage: make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) }' $(MAKEFILE_LIST)

##@ Run

.PHONY: run
run: ## Run the enforcer on the embedded sample policy (mode local, no cluster, no Redis) on :8080.
	$(GO) run ./cmd/enforcer

.PHONY: check
check: ## Compile the quota objects in config/samples/ and print every problem.
	$(GO) run ./cmd/enforcer check config/samples

##@ Development

.PHONY: build
build: ## Build every binary into ./bin.
	$(GO) build -o $(LOCALBIN)/ ./cmd/...

.PHONY: test
test: verify redis-server gateways helm chromium prometheus $(KUSTOMIZE) $(STATICCHECK) ## Run the whole suite (lint, generated-code check, go test -race, every fuzz target for 2s).
	@mkdir -p $(LOCALBIN)
	@# The lint, the simulations without -race and the fuzzing, one after
	@# another, run beside go test -race, whose packages mostly wait on
	@# real time; their output follows its. (The lint before the tests
	@# was 50 s of a 400 s run on a fresh clone.)
	( s=0; $(MAKE) --no-print-directory lint || s=1; \
		$(GO) test -count=1 -run '$(SIMULATIONS)' ./pkg/enforcer/ || s=1; \
		FUZZTIME=$(FUZZTIME) FUZZPARALLEL=1 hack/fuzz.sh || s=1; exit $$s ) >$(LOCALBIN)/.test-beside.log 2>&1 & beside=$$!; \
	status=0; \
	KUSTOMIZE=$(KUSTOMIZE) KUBEBUILDER_ASSETS="$$(hack/envtest-binaries.sh)" \
		QUOTAPLANE_HELM="$$(hack/helm.sh)" QUOTAPLANE_MONITORING_CRDS="$$(hack/monitoring-crds.sh)" \
		QUOTAPLANE_CADDY="$$(hack/caddy.sh)" QUOTAPLANE_NGINX="$$(command -v nginx || echo /usr/sbin/nginx)" \
		QUOTAPLANE_SIMULATIONS='$(SIMULATIONS)' $(GO) test $(GOTEST_FLAGS) -p 3 $(TEST_PKGS) || status=$$?; \
	wait $$beside || status=$$?; \
	cat $(LOCALBIN)/.test-beside.log; \
	exit $$status

# The engine's simulations on one goroutine in virtual time: under -race
# they skip (nothing for the detector to find, ten times slower: 96 s of the
# run's CPU), and make test runs them without it (10 s). A test that calls
# simulation(t) must be named here, or the -race run fails it.
SIMULATIONS := ^(TestAllocateMatchesTheReference|TestZipfOverloadAdmitsFairShares|TestLongTailGetsItsTierShare)$$

# The longest packages go first, three at a time on two cores: their tests
# mostly wait on real processes and real time (test/e2e 218 s, pkg/enforcer
# 211 s, controllers 88 s, config 64 s of a run's 760 s). go test starts
# packages in the order given: in ./...'s order pkg/enforcer began 102 s
# into the run, behind config and controllers, and was its tail (314 s).
# Four at a time was no faster (4 min 34 s to 5 min 20 s a run, three:
# 4 min 47 s) and failed the fault tests' timing bounds (TestToxiproxy's
# local-reconciled cell got 9 % under its limit).
TEST_PKGS ?= ./test/e2e/ ./pkg/enforcer/ ./controllers/ ./config/ $(PKGS)

# Each fuzz target runs this long in make test (hack/fuzz.sh; longer:
# make fuzz FUZZTIME=5m).
FUZZTIME ?= 2s

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each (hack/fuzz.sh; make test runs them for 2s).
	FUZZTIME=$(FUZZTIME) hack/fuzz.sh

.PHONY: bench
bench: ## Run the benchmarks (BENCH=regexp, BENCHTIME=1s).
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchtime $(BENCHTIME) -benchmem $(PKGS)

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code from the API markers.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...

.PHONY: dashboards
dashboards: ## Generate the Grafana dashboard (config/grafana) and the PrometheusRule from config/prometheus/quotaplane.rules.yaml (go run ./hack/grafana); copy the rules into the Helm chart.
	$(GO) run ./hack/grafana
	@cp config/prometheus/quotaplane.rules.yaml $(CHART)/files/quotaplane.rules.yaml

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate CRDs (config/crd/bases) and the manager's RBAC role (config/rbac/role.yaml) from markers; copy them and the static objects into the Helm chart.
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=quotaplane-manager paths=./controllers/... output:rbac:artifacts:config=config/rbac
	@# The chart carries copies, never edited: Helm reads only files inside it.
	@mkdir -p $(CHART)/crds $(CHART)/files
	@rm -f $(CHART)/crds/*.yaml
	@cp config/crd/bases/*.yaml $(CHART)/crds/
	@cp config/rbac/role.yaml $(CHART)/files/manager-role.yaml
	@cp config/rbac/quota_roles.yaml $(CHART)/files/quota-roles.yaml
	@cp config/admission/tenant-tier.yaml $(CHART)/files/tenant-tier.yaml

# The Helm chart (docs/helm.md).
CHART := deploy/helm/quotaplane

# GENERATED lists what the generators write; verify compares it before and after.
GENERATED := api/v1alpha1/zz_generated.deepcopy.go config/crd/bases config/rbac/role.yaml \
	$(CHART)/crds $(CHART)/files/manager-role.yaml $(CHART)/files/quota-roles.yaml $(CHART)/files/tenant-tier.yaml \
	config/grafana/quotaplane.json config/prometheus/prometheusrule.yaml $(CHART)/files/quotaplane.rules.yaml

.PHONY: verify
verify: $(CONTROLLER_GEN) ## Rerun every generator and the sample check; fail if generated files were stale.
	@mkdir -p $(LOCALBIN)
	@find $(GENERATED) -type f 2>/dev/null | sort | xargs -r sha256sum > $(LOCALBIN)/.generated.before
	@$(MAKE) --no-print-directory generate manifests dashboards
	@find $(GENERATED) -type f 2>/dev/null | sort | xargs -r sha256sum > $(LOCALBIN)/.generated.after
	@if ! diff -u $(LOCALBIN)/.generated.before $(LOCALBIN)/.generated.after; then \
		echo "generated files were out of date and have been regenerated: review and commit them"; exit 1; fi
	@$(MAKE) --no-print-directory check

.PHONY: lint
lint: $(STATICCHECK) ## go vet, staticcheck and gofmt.
	$(GO) vet ./...
	$(STATICCHECK) ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './bin/*')); \
		if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

##@ Deploy

.PHONY: kustomize-build
kustomize-build: $(KUSTOMIZE) ## Print what `kubectl apply -k config/default` installs.
	@$(KUSTOMIZE) build config/default

.PHONY: kind-e2e
kind-e2e: ## Build both images, install everything on a kind cluster, run test/e2e against it (needs kind, kubectl, curl, go, docker or podman).
	hack/kind-e2e.sh

##@ Tools

.PHONY: envtest
envtest: ## Build (once, cached outside the repo) the kube-apiserver and etcd that controller tests run against; prints their directory.
	@hack/envtest-binaries.sh

# Tests start their own redis-server processes on free loopback ports; the
# binary comes from Debian's package when it is missing.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
.PHONY: redis-server
redis-server: ## Install redis-server with apt-get when it is missing.
	@command -v redis-server >/dev/null || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends redis-server >/dev/null; }
	@redis-server --version

# The gateway tests (test/gateways) put Caddy and nginx in front of an
# enforcer: nginx from Debian's package when it is missing (it lives in
# /usr/sbin, which a user's PATH may lack), Caddy built from its Go module.
.PHONY: gateways
gateways: ## Install nginx with apt-get when it is missing; build Caddy once (hack/caddy.sh, cached outside the repo).
	@command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends nginx >/dev/null; }
	@"$$(command -v nginx || echo /usr/sbin/nginx)" -v
	@"$$(hack/caddy.sh)" version

# The chart tests (config/helm_test.go) lint and render the chart with the
# real Helm, and validate its ServiceMonitors and PrometheusRule against
# prometheus-operator's CRDs.
.PHONY: helm
helm: ## Build Helm once (hack/helm.sh, cached outside the repo); fetch prometheus-operator's CRDs (hack/monitoring-crds.sh).
	@"$$(hack/helm.sh)" version --short
	@hack/monitoring-crds.sh >/dev/null

# The live view's browser test (cmd/enforcer/ui_test.go) renders /quota/ui
# in headless Chromium from Debian's package, installed when missing
# (--no-install-recommends; on a Debian 12 machine with Go and the other
# prerequisites: 25 packages, 124 MB to download, 405 MB installed, 13 s
# with apt-get update).
.PHONY: chromium
chromium: ## Install chromium with apt-get when it is missing (the live view's browser test).
	@command -v chromium >/dev/null || [ -x /usr/bin/chromium ] || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends chromium >/dev/null; }
	@/usr/bin/chromium --version 2>/dev/null || chromium --version

# promtool (config/prometheus_test.go) and prometheus (test/e2e's
# TestObservability) come from Debian's package when they are missing.
.PHONY: prometheus
prometheus: ## Install prometheus and promtool with apt-get when they are missing.
	@command -v promtool >/dev/null && command -v prometheus >/dev/null || { $(SUDO) apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }
	@promtool --version | head -1

$(CONTROLLER_GEN):
	mkdir -p $(LOCALBIN)
	GOBIN=$(LOCALBIN) $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)
	mv $(LOCALBIN)/controller-gen $(CONTROLLER_GEN)

$(KUSTOMIZE):
	mkdir -p $(LOCALBIN)
	GOBIN=$(LOCALBIN) $(GO) install sigs.k8s.io/kustomize/kustomize/v5@$(KUSTOMIZE_VERSION)
	mv $(LOCALBIN)/kustomize $(KUSTOMIZE)

$(STATICCHECK):
	mkdir -p $(LOCALBIN)
	GOBIN=$(LOCALBIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	mv $(LOCALBIN)/staticcheck $(STATICCHECK)
