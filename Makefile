# volume-healer: `make help` lists the targets.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO         ?= go
BIN        := bin
# The control plane's binaries (kube-apiserver, etcd): built or installed once, cached under .cache/.
ASSETS      = $(shell hack/control-plane.sh)
TEST_FLAGS ?= -race -timeout 40m
PKGS       ?= ./...

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build every binary into bin/.
	$(GO) build -o $(BIN)/ ./cmd/...

.PHONY: control-plane
control-plane: ## Build kube-apiserver and install etcd for tests (cached in .cache/control-plane).
	@hack/control-plane.sh

.PHONY: test
test: ## Run the whole test suite: unit, integration (real kube-apiserver + etcd) and end-to-end.
	KUBEBUILDER_ASSETS="$(ASSETS)" $(GO) test $(TEST_FLAGS) $(PKGS)

.PHONY: test-short
test-short: ## Run only the fast tests (no control plane, no builds of external tools).
	$(GO) test -short $(PKGS)

.PHONY: lint
lint: ## Check formatting (gofmt) and run go vet.
	@out="$$(gofmt -l $$(git ls-files '*.go'))"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

.PHONY: generate
generate: ## Regenerate the Go code of the healer protocol from api/healer/v1alpha1/healer.proto.
	hack/generate.sh

.PHONY: demo
demo: build ## Run the demo: a local control plane, simulated nodes, the controller, a node plugin restart.
	KUBEBUILDER_ASSETS="$(ASSETS)" $(BIN)/healer-demo

.PHONY: demo-down
demo-down: ## Stop what a demo left running and remove its state.
	$(BIN)/healer-demo down 2>/dev/null || true
	rm -rf .demo

.PHONY: bench
bench: ## Run the benchmarks and write bench/results.json.
	KUBEBUILDER_ASSETS="$(ASSETS)" $(GO) test -run '^$$' -bench . -benchmem $(PKGS)

.PHONY: clean
clean: ## Remove built binaries (the cached control plane stays; rm -rf .cache to drop it).
	rm -rf $(BIN)
