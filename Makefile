# effectively: run `make` for the list of targets.
SHELL := /usr/bin/env bash
GO    ?= go
GOLANGCI_LINT ?= $(shell command -v golangci-lint || echo "$$($(GO) env GOPATH)/bin/golangci-lint")

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-20s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: run
run: ## Run the example service's demo on SQLite (no server needed).
	$(GO) run ./examples/notifications demo

.PHONY: test
# Most tests wait on servers, leases and child processes more than they
# compute, so a package runs at least 4 of its parallel tests at once
# (go test's default is GOMAXPROCS): on two cores the suite takes about
# 6 minutes instead of 10.
TESTPARALLEL ?= $(shell n="$$(nproc 2>/dev/null || echo 1)"; echo $$(( n > 4 ? n : 4 )))
# For the same reason go test runs at least 3 packages at once (its
# default is GOMAXPROCS): on two cores the framework's packages take about
# 7 minutes instead of 8.5, their processors busy two thirds of the time.
TESTPACKAGES ?= $(shell n="$$(nproc 2>/dev/null || echo 1)"; echo $$(( n > 3 ? n : 3 )))

# MODULES are the nested modules that make test, tidy and lint cover too:
# internal/faults, the network fault tests, keeps Toxiproxy out of the
# framework's go.mod; internal/tools/sqlitedrivers, the SQLite drivers
# measured against the framework's (make bench-sqlite-drivers), keeps them
# out of it. They run after the framework's tests, not beside
# them: the fault tests are timed, and two cores running both suites at
# once would stretch the times they measure.
MODULES := internal/faults internal/tools/sqlitedrivers

# A program built with -race sleeps a second as it exits by default, for
# goroutines still running to report a race: every test binary and every
# child process the tests start and stop, over a minute of the suite on two
# cores. A race is still reported, and fails its test, when it happens.
export GORACE ?= atexit_sleep_ms=0

test: ## Run every test with -race, starting PostgreSQL and RabbitMQ when needed; then the network fault tests (internal/faults, about 2 minutes).
	@set -euo pipefail; services="$$(scripts/services.sh)"; eval "$$services"; \
	out="$$(mktemp)"; trap 'rm -f "$$out"' EXIT; status=0; \
	$(GO) test -race -count=1 -p $(TESTPACKAGES) -parallel $(TESTPARALLEL) -timeout 15m ./... 2>&1 | tee "$$out" || status=1; \
	for m in $(MODULES); do \
		(cd "$$m" && $(GO) test -race -count=1 -parallel $(TESTPARALLEL) -timeout 15m ./...) 2>&1 | tee -a "$$out" || status=1; \
	done; \
	if [ "$$status" -ne 0 ]; then \
		echo; echo "== failures (the full output is above)"; \
		grep -E -e '^(--- FAIL|FAIL|panic:)' -e '^ +--- FAIL' -e '^ +[A-Za-z0-9_]+_test\.go:[0-9]+: ' "$$out" | grep -v '^ok ' | tail -80; \
		exit 1; \
	fi

FUZZTIME ?= 3m

.PHONY: fuzz
fuzz: ## Run each fuzz target (func Fuzz... in a _test.go file) for FUZZTIME, default 3m, starting PostgreSQL and RabbitMQ when needed; a failing input lands in its testdata/fuzz.
	@set -euo pipefail; services="$$(scripts/services.sh)"; eval "$$services"; out="$$(mktemp)"; trap 'rm -f "$$out"' EXIT; \
	for dir in $$(grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u); do \
		for name in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$$dir"/*_test.go | cut -c6- | sort -u); do \
			echo "== $$dir $$name for $(FUZZTIME)"; \
			if ! $(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 10s "$$dir" 2>&1 | tee "$$out"; then \
				if grep -q 'Failing input written' "$$out" || ! grep -q '^    context deadline exceeded' "$$out"; then exit 1; fi; \
				echo "(no failing input: Go's fuzzing coordinator reported its own deadline, go.dev/issue/75804)"; \
			fi; \
		done; \
	done

BENCHFLAGS ?=

.PHONY: bench
bench: ## Run the framework against hand-written Watermill, side by side, on every transport (real servers as for make test); prints a table and writes docs/benchmarks.md. BENCHFLAGS="-events 2000" for a quick run.
	@set -euo pipefail; services="$$(scripts/services.sh)"; eval "$$services"; \
	$(GO) run ./internal/tools/bench/cmd/bench $(BENCHFLAGS)

SOAKFLAGS ?=

.PHONY: soak
soak: ## Run the soak (a few minutes): 20,000 events through the outbox and a three-node RabbitMQ cluster of its own, consumers killed at random, a node and PostgreSQL restarted; prints its figures (docs/reliability.md). Needs root.
	@set -euo pipefail; services="$$(scripts/services.sh)"; eval "$$services"; \
	$(GO) run ./internal/tools/soak/cmd/soak $(SOAKFLAGS)

.PHONY: bench-micro
bench-micro: ## Run the in-process microbenchmarks of the chain: messages per second and allocations per message.
	@set -euo pipefail; services="$$(scripts/services.sh)"; eval "$$services"; \
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s ./middleware/ ./framework/...

.PHONY: bench-sqlite-drivers
bench-sqlite-drivers: ## Measure the SQLite drivers for Go on the SQLite transport's writes: modernc.org/sqlite (the framework's), ncruces/go-sqlite3 (pure Go too, by way of WebAssembly) and mattn/go-sqlite3 (cgo: needs a C compiler).
	cd internal/tools/sqlitedrivers && $(GO) test -run '^$$' -bench . -benchmem -benchtime 200000x -count 3 .
	cd internal/tools/sqlitedrivers && CGO_ENABLED=1 $(GO) test -tags mattn -run '^$$' -bench 'Drivers/mattn' -benchmem -benchtime 200000x -count 3 .

.PHONY: lint
lint: tidy ## Run go vet, staticcheck, golangci-lint (when installed: make lint-install) and the tidy check.
	$(GO) vet ./...
	@set -e; for m in $(MODULES); do echo "cd $$m && $(GO) vet ./..."; (cd "$$m" && $(GO) vet ./...); done
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
	@if [ -x "$(GOLANGCI_LINT)" ]; then "$(GOLANGCI_LINT)" run ./...; \
	else echo "golangci-lint is not installed: run make lint-install (about 3 minutes)"; fi

.PHONY: lint-install
lint-install: ## Install golangci-lint v2.15.0 from the module proxy.
	$(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0

.PHONY: tidy
tidy: ## Check that go.mod and go.sum are tidy, the nested modules' (MODULES) too.
	$(GO) mod tidy -diff
	@set -e; for m in $(MODULES); do echo "cd $$m && $(GO) mod tidy -diff"; (cd "$$m" && $(GO) mod tidy -diff); done

.PHONY: test-sqlite-pubsub
test-sqlite-pubsub: ## Run watermill's full universal suite on the SQLite Pub/Sub, five times.
	EFFECTIVELY_PUBSUB_FULL=1 $(GO) test -count=5 -timeout 30m -run 'TestPubSubUniversal' ./framework/sqlite/
