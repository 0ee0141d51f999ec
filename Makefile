# quotaplane — the front door. `make help` lists every target.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
.DEFAULT_GOAL := help

# Tools are pinned and installed from the Go module proxy into ./bin.
LOCALBIN ?= $(CURDIR)/bin
CONTROLLER_TOOLS_VERSION ?= v0.23.0
CONTROLLER_GEN ?= $(LOCALBIN)/controller-gen-$(CONTROLLER_TOOLS_VERSION)

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
test: lint verify ## Run the whole suite (lint, generated-code check, go test -race).
	$(GO) test $(GOTEST_FLAGS) $(PKGS)

.PHONY: bench
bench: ## Run the benchmarks (BENCH=regexp, BENCHTIME=1s).
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchtime $(BENCHTIME) -benchmem $(PKGS)

.PHONY: generate
generate: $(CONTROLLER_GEN) ## Generate deepcopy code from the API markers.
	$(CONTROLLER_GEN) object:headerFile=hack/boilerplate.go.txt paths=./api/...

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate CRDs from the API markers into config/crd/bases.
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases

.PHONY: verify
verify: generate manifests check ## Rerun every generator and the sample check; fail on any diff.
	@if [ -n "$$(git status --porcelain -- api config)" ]; then \
		echo "generated files are out of date; run 'make manifests generate' and commit:"; \
		git status --porcelain -- api config; git --no-pager diff --stat -- api config; exit 1; fi

.PHONY: lint
lint: ## go vet and gofmt.
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './bin/*')); \
		if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

##@ Tools

$(CONTROLLER_GEN):
	mkdir -p $(LOCALBIN)
	GOBIN=$(LOCALBIN) $(GO) install sigs.k8s.io/controller-tools/cmd/controller-gen@$(CONTROLLER_TOOLS_VERSION)
	mv $(LOCALBIN)/controller-gen $(CONTROLLER_GEN)
