# vk-sandbox — build, test and run targets. `make help` lists them.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

CARGO ?= cargo
# Set by `make GOOS=linux GOARCH=amd64 build` (the Go project's spelling,
# kept so existing install instructions work): a static musl build copied to
# ./vk-sandbox-linux-<arch>.
GOOS ?=
GOARCH ?=

VK_VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
VK_REVISION ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
# The commit's time, not the clock: the same commit stamps the same value,
# so repeated builds are no-ops and release builds are reproducible.
VK_BUILT_AT ?= $(shell TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%dT%H:%M:%SZ 2>/dev/null || echo unknown)
export VK_VERSION VK_REVISION VK_BUILT_AT

# `make dist`: the architectures packed (arm64 needs a cross linker; see
# e2e/musl-build.sh).
DIST_ARCHS ?= amd64 arm64
IMAGE ?= vk-sandbox:dev

MUSL_TARGET_amd64 := x86_64-unknown-linux-musl
MUSL_TARGET_arm64 := aarch64-unknown-linux-musl

.PHONY: help
help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}'

.PHONY: all
all: deps fmt lint test build ## deps fmt lint test build

.PHONY: deps
deps: ## Install what builds and tests need (Rust components, Debian packages, the Go-built control plane and upstream agent-sandbox controller); seconds when done
	./e2e/deps.sh all

.PHONY: fmt
fmt: ## Format the code
	$(CARGO) fmt --all

.PHONY: fmt-check
fmt-check: ## Fail when the code is not formatted
	$(CARGO) fmt --all -- --check

.PHONY: lint
lint: ## clippy with warnings as errors
	$(CARGO) clippy --workspace --all-targets -- -D warnings

.PHONY: build
ifeq ($(GOARCH),)
build: ## Release build, copied to ./vk-sandbox (GOOS=linux GOARCH=amd64|arm64: static ./vk-sandbox-linux-<arch>)
	$(CARGO) build --release --bin vk-sandbox
	cp "$${CARGO_TARGET_DIR:-target}/release/vk-sandbox" ./vk-sandbox
	@echo "built ./vk-sandbox: $$(./vk-sandbox --version)"
else
build:
	@[ "$(GOOS)" = "linux" ] || { echo "only GOOS=linux is supported (got '$(GOOS)')" >&2; exit 2; }
	@[ -n "$(MUSL_TARGET_$(GOARCH))" ] || { echo "GOARCH must be amd64 or arm64 (got '$(GOARCH)')" >&2; exit 2; }
	./e2e/musl-build.sh $(MUSL_TARGET_$(GOARCH)) ./vk-sandbox-linux-$(GOARCH)
endif

.PHONY: dist
dist: ## Release archives dist/vk-sandbox_Linux_{x86_64,arm64}.tar.gz (static binary, unit, env template, manifests, SHA256SUMS) and the Helm chart dist/vk-sandbox-<version>.tgz (helm package)
	./e2e/dist.sh $(DIST_ARCHS)

.PHONY: image
image: ## Container image (docker build -t $(IMAGE) .)
	docker build --build-arg VK_VERSION=$(VK_VERSION) --build-arg VK_REVISION=$(VK_REVISION) --build-arg VK_BUILT_AT=$(VK_BUILT_AT) -t $(IMAGE) .

# The release image: one manifest list for both architectures, built by
# buildx on the builder's own platform (the arm64 binary is cross-compiled,
# no emulation) and pushed (IMAGE=<registry>/vk-sandbox:<tag>).
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64
.PHONY: image-multiarch
image-multiarch: ## Release image for $(IMAGE_PLATFORMS) as one manifest list, pushed to $(IMAGE) (docker buildx)
	docker buildx build --platform $(IMAGE_PLATFORMS) --build-arg VK_VERSION=$(VK_VERSION) --build-arg VK_REVISION=$(VK_REVISION) --build-arg VK_BUILT_AT=$(VK_BUILT_AT) -t $(IMAGE) --push .

.PHONY: image-archive
image-archive: ## The Dockerfile's image without a container engine (GOARCH=amd64|arm64): dist/vk-sandbox-image-<arch>.tar, docker-archive for `docker load` / `ctr images import`; needs root
	VK_IMAGE_ARCH=$(or $(GOARCH),amd64) ./e2e/image/build.sh product dist/vk-sandbox-image-$(or $(GOARCH),amd64).tar $(IMAGE) org.opencontainers.image.version=$(VK_VERSION) org.opencontainers.image.revision=$(VK_REVISION)

.PHONY: check-packaging
check-packaging: ## Manifests (server-side dry-run), systemd unit, static binary as UID 65532, shell scripts, image, Helm chart (e2e/check-chart.sh)
	VK_TEST_KUBECONFIG="$${VK_TEST_KUBECONFIG:-$$(./e2e/cluster.sh up)}" ./e2e/check-packaging.sh

.PHONY: kind-e2e
kind-e2e: ## kind cluster + image + DaemonSet + simulator, then the e2e suite against it (needs docker and kind)
	./e2e/kind.sh

.PHONY: crds
crds: ## Regenerate the NodeInventory CRDs in crds/ from src/inventory/types.rs (the tests fail when they differ)
	$(CARGO) run --quiet --bin crdgen

.PHONY: controlplane
controlplane: ## Build the local Kubernetes control plane from Go modules (cached in .cache/)
	./e2e/controlplane/build.sh

.PHONY: agent-sandbox
agent-sandbox: ## Fetch (Go module proxy) and build the upstream agent-sandbox controller at the version of e2e/agent-sandbox-version (VK_AGENT_SANDBOX=pre-1.0: the older tree); cached in .cache/
	./e2e/agent-sandbox.sh build

.PHONY: cluster-up
cluster-up: ## Start (or reuse) the local control plane; prints the admin kubeconfig path
	./e2e/cluster.sh up

.PHONY: cluster-down
cluster-down: ## Stop the local control plane
	./e2e/cluster.sh down

.PHONY: test
test: ## Set-up (e2e/deps.sh test), fmt check, clippy, unit + integration + e2e tests on the local control plane
	./e2e/deps.sh test
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	./e2e/run-tests.sh

.PHONY: reliability
reliability: ## Reliability suite, full size (kills, eviction storm, sandboxd/apiserver/state faults, owner churn, suspend/resume churn): report table
	./e2e/deps.sh test
	./e2e/run-tests.sh --reliability

.PHONY: test-unit
test-unit: ## Unit tests only (no cluster)
	$(CARGO) test --workspace --lib --bins

.PHONY: e2e
e2e: ## End-to-end suite against the local plane (or KUBECONFIG=... for any cluster)
	./e2e/run-tests.sh --e2e-only

.PHONY: fuzz
fuzz: ## Fuzz each target in fuzz/ for FUZZ_SECONDS (default 60) on nightly; failing inputs kept in fuzz/regressions/
	./e2e/fuzz.sh $(FUZZ_SECONDS)

.PHONY: demo
demo: ## Set-up (e2e/deps.sh demo), then local control plane + sandboxd simulator + upstream agent-sandbox controller + vk-sandbox + metrics-server: a Sandbox, a warm pool and a claim going Running
	./e2e/deps.sh demo
	./e2e/demo.sh up

.PHONY: demo-down
demo-down: ## Stop everything `make demo` started
	./e2e/demo.sh down

.PHONY: bench
bench: deps ## Benchmarks on the local plane + simulator (claim latency, throughput, claims-store commits, memory, apiserver load, start-up): one table, written into docs/benchmarks.md; BENCH_SCALE=k for bigger runs
	./benches/run.sh

.PHONY: clean
clean: ## Remove build outputs (keeps the cached control plane)
	$(CARGO) clean
	rm -f ./vk-sandbox ./vk-sandbox-linux-*
	rm -rf ./dist
