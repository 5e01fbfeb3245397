# nodeops. `make demo` and `make test` do all the set-up on a fresh machine.
SHELL := /usr/bin/env bash
BIN := $(CURDIR)/bin
export PATH := $(BIN):$(PATH)
# envtest and the e2e tests find etcd, kube-apiserver, kwok and the nodeops binaries here.
export KUBEBUILDER_ASSETS := $(BIN)
export NODEOPS_BIN := $(BIN)
# Every Go build here but the race detector's compiles as the pinned tools (hack/tools.sh) and the images
# (hack/images) do: cgo off, paths trimmed. The go command keys its cache on both, so one setting for all
# lets the build, go vet, the tests and the images reuse the packages the tools' Kubernetes build already
# compiled (1,037 of the manager's and agent's 1,128), where two settings compiled them all twice. The
# race detector needs cgo: test-unit and test-race turn it back on for themselves.
export CGO_ENABLED := 0
export GOFLAGS := $(strip $(GOFLAGS) -trimpath)
GO_TEST_FLAGS ?=
DEMO_ARGS ?=
BENCH_PROFILE ?=
BENCH_FLAGS ?=
# The version and commit stamped into nodeops' binaries (internal/version), the same `make images` labels
# its images with; empty outside a git checkout (a tarball), where the binaries report what Go recorded.
VERSION ?= $(shell git describe --always --dirty 2>/dev/null)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
VERSION_LDFLAGS = -X github.com/nodeops/nodeops/internal/version.version=$(VERSION) -X github.com/nodeops/nodeops/internal/version.revision=$(REVISION)
# `make images`: where the OCI layouts go and the repository prefix they are named under.
IMAGES_OUT ?= $(BIN)/images
IMAGE_REGISTRY ?= ghcr.io/nodeops

.PHONY: all tools tools-run build images generate verify-generate lint test test-unit test-race test-load test-fuzz test-e2e test-faults demo bench clean \
	realnode realnode-down e2e-realnode realnode-bin docs docs-check

all: build

tools: ## Build the pinned Kubernetes, etcd, kwok and tool binaries into bin/ (seconds when current).
	@hack/install-deps.sh
	@hack/tools.sh

tools-run: ## Only what a local cluster needs (Kubernetes, etcd, kwok): the demo does not lint or use helm.
	@hack/install-deps.sh run
	@hack/tools.sh kubernetes kwok

build: ## Build nodeops' own binaries into bin/.
	@echo "build: nodeops' binaries (manager, agent, kubectl-nodeops, nodeops-local) into bin/, version $(or $(VERSION),unknown); on an empty Go cache minutes, progress follows"
	@hack/progress.sh build go build -v -ldflags "$(VERSION_LDFLAGS)" -o $(BIN)/ ./cmd/...

images: ## OCI layouts of the manager and agent (linux/amd64 and linux/arm64) in $(IMAGES_OUT), by hack/images; no container daemon.
	@echo "images: cross-compiling the manager and agent for linux/amd64 and linux/arm64 (CGO off); on an empty Go cache about 4 minutes on 2 cores, seconds afterwards"
	@start=$$SECONDS; cd hack/images && go run ./cmd/images --repo $(CURDIR) --out $(IMAGES_OUT) --registry $(IMAGE_REGISTRY) --version "$(VERSION)" --revision "$(REVISION)" && echo "images: done in $$((SECONDS - start))s"

generate: tools ## Regenerate the command kinds' CEL rules (hack/commandkinds), deepcopy, CRDs, RBAC and the reference pages under docs/reference.
	go generate ./api/...
	$(BIN)/controller-gen object:headerFile=hack/boilerplate.go.txt paths=./api/...
	$(BIN)/controller-gen crd paths=./api/... output:crd:artifacts:config=config/crd
	hack/crd-selector-bounds.sh config/crd/nodeops.io_*.yaml
	$(BIN)/controller-gen rbac:roleName=nodeops-manager paths="./internal/controller/...;./internal/metrics/..." output:rbac:artifacts:config=config/rbac
	rm -f charts/nodeops/crds/*.yaml && cp config/crd/nodeops.io_*.yaml charts/nodeops/crds/
	cp config/rbac/role.yaml charts/nodeops/files/manager-role.yaml
	cp config/admission/agent-confinement.yaml config/admission/nodetask-creation.yaml config/admission/manager-pods.yaml config/admission/manager-nodetask-status.yaml charts/nodeops/files/
	cp config/rbac/people.yaml charts/nodeops/files/people-rbac.yaml
	cp config/rbac/metrics-reader.yaml charts/nodeops/files/metrics-reader.yaml
	go run ./hack/docgen

verify-generate: generate ## Fail when committed generated files are stale.
	@git diff --exit-code -- api config/crd config/rbac charts/nodeops/crds charts/nodeops/files docs/reference || { echo "generated files are stale: run 'make generate' and commit" >&2; exit 1; }
	@new=$$(git ls-files --others --exclude-standard -- docs/reference); [ -z "$$new" ] || { echo "generated files are not committed: $$new" >&2; exit 1; }

lint: tools ## gofmt, go mod tidy, go vet and golangci-lint.
	@for m in . hack/images hack/realnode hack/realnode/kubernetes-v1.36 hack/tools hack/tools/helm hack/tools/kwok hack/tools/lint; do \
		(cd $$m && go mod tidy -diff >/dev/null) || { echo "$$m/go.mod or go.sum is not tidy: run 'go mod tidy' there and commit" >&2; (cd $$m && go mod tidy -diff) >&2; exit 1; }; \
	done
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	go vet ./...
	$(BIN)/golangci-lint run --allow-parallel-runners ./...

test: tools verify-generate build test-unit test-fuzz test-e2e test-faults ## All tests: unit, envtest, fuzz (short), end to end, then the fault suite (make test-faults, at most 10 minutes).

# UNIT_RACE=1 (CI sets it): test-unit runs internal/... and api/... under the race detector and the other packages
# without, so each package runs once, where `make test test-race` would run those packages twice (about 10 minutes
# more on 2 cores from an empty cache).
UNIT_RACE ?=
# How many test packages run at once in test-unit. Its envtest packages wait on their API servers much of the
# time (a third of 2 cores idle at 2 at once, the go command's default here): 4 at once took 491 s where 2 took
# 703 s for internal/... and api/... under the race detector.
UNIT_P ?= 4

test-unit: ## Unit and envtest (controller) tests; UNIT_RACE=1 runs internal/... and api/... under the race detector.
	@start=$$SECONDS; \
	if [ "$(UNIT_RACE)" = 1 ]; then \
		echo "test-unit: internal/... and api/... under the race detector (UNIT_RACE=1), the other packages without"; \
		CGO_ENABLED=1 go test -race -p $(UNIT_P) $(GO_TEST_FLAGS) -timeout 45m ./internal/... ./api/... && \
		go test -p $(UNIT_P) $(GO_TEST_FLAGS) -timeout 30m $$(go list ./... | grep -v -e /test/e2e -e /internal/ -e /api/); \
	else \
		go test -p $(UNIT_P) $(GO_TEST_FLAGS) -timeout 30m $$(go list ./... | grep -v /test/e2e); \
	fi && (cd hack/images && go test $(GO_TEST_FLAGS) -timeout 30m ./...); rc=$$?; \
	echo "test-unit: $$((SECONDS - start))s"; exit $$rc

test-race: ## Unit and envtest tests of internal/... and api/... under the race detector.
	@echo "test-race: go test -race over internal/... and api/... (builds with race instrumentation first; minutes on an empty Go cache)"
	@start=$$SECONDS; CGO_ENABLED=1 go test -race $(GO_TEST_FLAGS) -timeout 45m ./internal/... ./api/...; rc=$$?; \
		echo "test-race: $$((SECONDS - start))s"; exit $$rc

# The load check's rounds; LOAD_PKGS, LOAD_RUN and LOAD_HOG narrow it (hack/test-load.sh).
LOAD_ROUNDS ?= 3

test-load: tools build ## Unit and envtest tests while a CPU hog holds one core, LOAD_ROUNDS times; a table of failures per test in bin/test-load.md.
	@LOAD_ROUNDS=$(LOAD_ROUNDS) hack/test-load.sh

# Each fuzz target tries this many generated inputs on top of its committed seeds (testdata/fuzz), which
# test-unit replays: about 10 to 20 s each on 2 cores. A count, not a duration: with -fuzztime as a duration, Go's
# fuzzing coordinator before Go 1.27 can fail a clean run with a bare "context deadline exceeded" when the deadline
# races a busy worker (go.dev/issue/75804; CI failed that way on FuzzResolve). FUZZ_TIME (a count or a duration)
# replaces all three counts.
FUZZ_TIME ?=
FUZZ_TARGETS := ./internal/objname:FuzzTaskName:100000x ./internal/containerdtoml:FuzzContainerdConfig:50000x \
	./internal/hostfs:FuzzResolve:3000x

test-fuzz: ## Short fuzz runs: the object names' hashing, the containerd TOML editor, the host path resolver.
	@echo "test-fuzz: each target is built with fuzzing instrumentation first (silent; minutes on an empty Go cache, seconds after), then fuzzed"
	@start=$$SECONDS; \
	for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; rest=$${t#*:}; name=$${rest%%:*}; budget=$${rest#*:}; [ -z "$(FUZZ_TIME)" ] || budget="$(FUZZ_TIME)"; \
		echo "test-fuzz: $$name, $$budget"; t0=$$SECONDS; \
		go test -run '^$$' -fuzz "^$$name$$" -fuzztime $$budget -parallel 2 -timeout 10m "$$pkg" || exit 1; \
		echo "test-fuzz: $$name took $$((SECONDS - t0))s"; \
	done; echo "test-fuzz: $$((SECONDS - start))s"

# How many e2e tests run at once, each on its own nodeops-local: they spend most of their time waiting on
# their clusters (about 65% of 2 cores idle when run one at a time), so three at once take about half as long.
E2E_PARALLEL ?= 3

test-e2e: tools build ## End-to-end tests on nodeops-local, E2E_PARALLEL (3) at a time, each on its own cluster.
	@start=$$SECONDS; go test $(GO_TEST_FLAGS) -p 1 -parallel $(E2E_PARALLEL) -timeout 60m ./test/e2e/...; rc=$$?; \
		echo "test-e2e: $$((SECONDS - start))s ($(E2E_PARALLEL) tests at a time)"; exit $$rc

# The fault suite's seed: the order and moments of its faults and the nodes they hit.
FAULTS_SEED ?= 1

test-faults: tools build ## Faults on nodeops-local (test/faults, tag faults): kills, a second manager, a 503 proxy; prints one table (bin/faults-results.md).
	@echo "test-faults: FAULTS_SEED=$(FAULTS_SEED) (make test-faults FAULTS_SEED=N for another run)"
	@start=$$SECONDS; FAULTS_SEED=$(FAULTS_SEED) FAULTS_RESULTS=$(BIN)/faults-results.md go test $(GO_TEST_FLAGS) -tags faults -count=1 -v -timeout 10m -run '^TestFaults$$' ./test/faults/; rc=$$?; \
		echo "test-faults: $$((SECONDS - start))s"; exit $$rc

demo: tools-run build ## Walk through nodeops on nodeops-local, narrated and live; DEMO_ARGS=--keep leaves the cluster running.
	@hack/demo.sh $(DEMO_ARGS)

bench: tools build ## Benchmark at 100, 1,000, 5,000 and 10,000 nodes (about 40 minutes on 2 shared cores); prints a table and writes bench/results.md. BENCH_PROFILE=DIR: CPU profiles of the manager and the agent there; BENCH_FLAGS: more flags (go run ./bench -h).
	go run ./bench $(if $(BENCH_PROFILE),-profile $(BENCH_PROFILE)) $(BENCH_FLAGS)

realnode-bin: ## The real node's driver (hack/realnode, its own module).
	@cd hack/realnode && CGO_ENABLED=0 go build -trimpath -o $(BIN)/realnode ./cmd/realnode

realnode: tools realnode-bin images ## Build and start a real single-node kubeadm cluster (v1.36) with nodeops installed from `make images`' layouts.
	@hack/install-deps.sh realnode
	$(BIN)/realnode --repo $(CURDIR) --bin $(BIN) --images $(IMAGES_OUT) up

realnode-down: realnode-bin ## Tear the real node down and leave the machine as it was.
	$(BIN)/realnode down

e2e-realnode: tools build ## Upgrade the real node to v1.37.2 through kubectl nodeops; tears down even on failure.
	@start=$$SECONDS; status=0; \
	{ $(MAKE) --no-print-directory realnode && \
	  NODEOPS_IMAGES=$(IMAGES_OUT) go test -tags realnode -count=1 -v -timeout 45m ./test/realnode/; } || status=$$?; \
	$(MAKE) --no-print-directory realnode-down || status=1; \
	echo "e2e-realnode: exit $$status after $$((SECONDS - start))s"; exit $$status

docs: ## Build the docs site into bin/site with mkdocs --strict: a page missing from the nav, a broken link or anchor, or a missing example fails.
	@hack/install-deps.sh docs
	@start=$$SECONDS; /usr/bin/mkdocs build --strict && echo "docs: bin/site built in $$((SECONDS - start))s"

docs-check: ## Open every page of the docs site in headless chromium on loopback; fails on a broken link or missing image.
	@hack/docs-check.sh

clean:
	rm -rf $(BIN)
