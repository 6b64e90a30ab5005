# volume-healer: `make help` lists the targets.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

GO         ?= go
BIN        := bin
# The control plane's binaries (kube-apiserver, etcd): built or installed once, cached under .cache/.
ASSETS      = $(shell hack/control-plane.sh)
# -count=1: several suites build and run the binaries as processes, which the test cache cannot see.
TEST_FLAGS ?= -race -count=1 -timeout 40m
PKGS       ?= ./...

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# Every binary is stamped with the version of the VERSION file and the commit (--version, and the
# metric volume_healer_build_info); hack/images stamps the images' binaries the same way.
MODULE     := github.com/volume-healer/volume-healer
VERSION    := v$(shell cat VERSION)
COMMIT     := $(shell git rev-parse HEAD 2>/dev/null || echo unknown)$(shell git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo -dirty)
LDFLAGS    := -X $(MODULE)/version.version=$(VERSION) -X $(MODULE)/version.commit=$(COMMIT)

.PHONY: build
build: ## Build every binary into bin/, and bin/kubectl-healer (healerctl as a kubectl plugin).
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/ ./cmd/...
	ln -sf healerctl $(BIN)/kubectl-healer

.PHONY: images
images: ## Build the container images (controller, sidecar, reference driver; amd64 and arm64) into .cache/images.
	$(GO) run ./hack/images --out .cache/images

# The folder `make release` writes to, and the URL its archives are to be published below (the
# krew manifest's download links; empty: the GitHub release of the version).
DIST             ?= dist
RELEASE_BASE_URL ?=

.PHONY: release
release: ## Build every release artifact into DIST (default dist/), pushing nothing: images, Helm charts, kustomize bundle, healerctl/kubectl-healer archives, krew manifest, SBOMs, SHA256SUMS (docs/release.md).
	RELEASE_BASE_URL="$(RELEASE_BASE_URL)" $(GO) run ./hack/release --out $(DIST) --images .cache/images

.PHONY: control-plane
control-plane: ## Build kube-apiserver and install etcd for tests (cached in .cache/control-plane).
	@hack/control-plane.sh

.PHONY: tools
tools: ## Build promtool, helm, kustomize (deployment tests) and staticcheck (cached in .cache/bin).
	@hack/tools.sh

.PHONY: test
test: node fuse ## Run the whole test suite: unit, integration (real kube-apiserver + etcd), end-to-end and the real node; then, for the whole suite, test-oldest.
	KUBEBUILDER_ASSETS="$(ASSETS)" $(GO) test $(TEST_FLAGS) $(PKGS)
	@if [ "$(PKGS)" = "./..." ]; then $(MAKE) --no-print-directory test-oldest; fi

# The oldest Kubernetes release supported (the charts' kubeVersion, docs/operations.md "Kubernetes
# versions"), and the part of the suites that runs against its kube-apiserver too: registration,
# tokens and certificates, restart sweeps, eviction, the webhooks, the node binding's manifests.
OLDEST_KUBE_VERSION ?= v1.30.14
OLDEST_PKGS  ?= ./test/controlplane ./sidecar ./cmd/volume-healer/controller ./cmd/volume-healer/controller/sidecarsigner \
                ./admission/propagation ./test/integration ./test/deploy
OLDEST_TESTS ?= ^(TestStorageObjectsRoundTrip|TestRegister|TestCreatesCSIAddonsNode|TestRestartMarker|TestAuthentication|TestClusterWarningsOfTheRealAPIServer|TestNodeTokensAgainstRealAPIServer|TestRunAgainstRealAPIServer|TestSidecarServesItsRequestedCertificateAcrossRenewals|TestRequestForAnotherNodeIsDenied|TestWebhookAgainstAPIServer|TestRestartHealsExactlyTheBrokenHealableVolumes|TestRestartBeforeControllerStartIsSwept|TestEvictionOncePerHeal|TestEvictionBlockedByDisruptionBudget|TestBaseWebhookRefusesABrokenPolicy|TestNodePluginWritesOnlyItsNodesCSIAddonsNodes)$$

.PHONY: test-oldest
test-oldest: ## Run a part of the suite (OLDEST_TESTS) against the oldest supported kube-apiserver (OLDEST_KUBE_VERSION, built once into .cache/control-plane).
	@KUBE_VERSION=$(OLDEST_KUBE_VERSION) hack/control-plane.sh >/dev/null
	env -u KUBEBUILDER_ASSETS VOLUME_HEALER_KUBE_VERSION=$(OLDEST_KUBE_VERSION) $(GO) test $(TEST_FLAGS) -run '$(OLDEST_TESTS)' $(OLDEST_PKGS)

.PHONY: node
node: ## Get a real node where one can run: as root, install runc, iptables and the CNI plugins from Debian; build kubelet, containerd and the CSI sidecars (cached in .cache/node; up to 15 min cold).
	@if why="$$(hack/node.sh --check)"; then hack/node.sh >/dev/null; else echo "node: no real node on this machine ($$why): test/realcluster will skip"; fi

.PHONY: fuse
fuse: ## Install rclone and fusermount from Debian where missing (root): the reference driver's third-party mounter (--mounter rclone).
	@if ! hack/fuse.sh >/dev/null; then echo "fuse: rclone or fusermount is missing and cannot be installed here: the tests that mount with rclone will skip (and fail under CI=true)"; fi

# The chaos soak's length of faults and its seed (0: a new one, printed at the start).
SOAK_DURATION ?= 30m
SOAK_SEED     ?= 0
SOAK_TIMEOUT  ?= 90m

.PHONY: soak
soak: node ## Run the chaos soak on the real node: SOAK_DURATION (default 30m) of faults at random; SOAK_SEED=N replays a run (docs/operations.md, "Chaos soak").
	KUBEBUILDER_ASSETS="$(ASSETS)" $(GO) test -count=1 -run '^TestSoak$$' -timeout $(SOAK_TIMEOUT) -v ./test/realcluster/ \
	  -args -soak.duration=$(SOAK_DURATION) -soak.seed=$(SOAK_SEED)

.PHONY: test-short
test-short: ## Run only the fast tests (no control plane, no builds of external tools).
	$(GO) test -short $(PKGS)

FUZZTIME ?= 30s

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME each (default 30s); make test runs their seeds.
	@for dir in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u); do \
	  for target in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$dir/*_test.go); do \
	    echo "== $$dir $$target ($(FUZZTIME))"; \
	    $(GO) test -run '^$$' -fuzz "^$$target$$" -fuzztime $(FUZZTIME) $$dir || exit 1; \
	  done; \
	done

.PHONY: lint
lint: ## Check formatting (gofmt), run go vet, staticcheck (built once into .cache/bin) and the import rules (hack/importrules).
	@out="$$(gofmt -l $$(git ls-files '*.go'))"; if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	@# The import rules' driver module is tidied offline: the module cache must hold every module
	@# the main module's packages and their tests need, which a machine that built nothing yet lacks.
	$(GO) mod download
	$(GO) run ./hack/importrules
	@staticcheck="$$(hack/tools.sh staticcheck)"; echo "staticcheck $(PKGS)"; "$$staticcheck" $(PKGS)

.PHONY: generate
generate: ## Regenerate the Go code of the healer protocol from api/healer/v1alpha1/healer.proto.
	hack/generate.sh

DEMO_FLAGS ?=

.PHONY: demo
demo: build ## Run the demo (docs/demo.md): a node plugin restarted and its FUSE volumes healed (on a real node also a stock driver's rclone volumes recycled), on a real node where one can run (make node), else on kubelet stand-ins (simulated without root or /dev/fuse).
	KUBEBUILDER_ASSETS="$(ASSETS)" $(GO) run ./test/demo --controller $(BIN)/volume-healer --refdriver $(BIN)/refdriver --healerctl $(BIN)/healerctl $(DEMO_FLAGS)

.PHONY: demo-hold
demo-hold: ## Run the demo and keep its cluster up afterwards to look with kubectl (make demo-down ends it).
	$(MAKE) demo DEMO_FLAGS=--hold

.PHONY: demo-down
demo-down: ## Stop a demo that is still running, unmount what it left and remove its state (.demo/).
	@if [ -f .demo/demo.pid ] && kill "$$(cat .demo/demo.pid)" 2>/dev/null; then \
	  for i in $$(seq 60); do kill -0 "$$(cat .demo/demo.pid)" 2>/dev/null || break; sleep 1; done; \
	fi
	@if [ -f .demo/controller.pid ]; then kill "$$(cat .demo/controller.pid)" 2>/dev/null || true; fi
	@# A demo killed without its cleanups leaves its mounts (deepest first; stacked ones take rounds).
	@for i in 1 2 3 4 5; do \
	  mounts="$$(awk -v d="$(CURDIR)/.demo" '$$5 == d || index($$5, d "/") == 1 { print $$5 }' /proc/self/mountinfo | sort -r)"; \
	  [ -n "$$mounts" ] || break; \
	  for m in $$mounts; do umount -l "$$m" 2>/dev/null || true; done; \
	done
	rm -rf .demo

.PHONY: bench
bench: bench-envelope ## Run the scale harness at full size (201 nodes, 21,000 volumes, then 40,000, 100,000 and 300,000 for memory; up to 60 min; writes bench/results.json and .md), after bench-envelope.
	KUBEBUILDER_ASSETS="$(ASSETS)" $(GO) test -run '^TestScale$$' -timeout 60m -v ./test/scale -args -full

.PHONY: bench-memory
bench-memory: ## Measure the controller's memory alone at 40,000, 100,000 and 300,000 volumes (written into etcd), against a real apiserver; up to 40 min; writes bench/memory.json and .md.
	KUBEBUILDER_ASSETS="$(ASSETS)" $(GO) test -run '^TestControllerMemory$$' -timeout 40m -v ./test/scale -args -full

.PHONY: bench-envelope
bench-envelope: ## Measure one controller's envelope in-process (sweeps of 100,000 and 300,000 volumes, decisions beside OPA's floor; no control plane); writes bench/envelope.json and .md.
	$(GO) test -run '^TestEnvelope$$' -timeout 30m -v ./test/scale -args -full

.PHONY: clean
clean: ## Remove built binaries and images, the tests' too (the cached control plane stays; rm -rf .cache to drop it).
	rm -rf $(BIN) .cache/test-bin .cache/images
