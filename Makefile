# effectively: run `make` for the list of targets.
SHELL := /usr/bin/env bash
GO    ?= go

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: run
run: ## Run the example service's demo on SQLite (no server needed).
	$(GO) run ./examples/notifications demo

.PHONY: test
test: ## Run every test with -race, starting PostgreSQL when needed.
	@set -euo pipefail; eval "$$(scripts/services.sh)"; \
	$(GO) test -race -count=1 -timeout 15m ./...

.PHONY: bench
bench: ## Run the benchmarks: messages per second and allocations per message.
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s ./middleware/ ./framework/...

.PHONY: lint
lint: tidy ## Run go vet, staticcheck and golangci-lint (installed on first use) and the tidy check.
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
	@if command -v golangci-lint >/dev/null 2>&1; then golangci-lint run ./...; \
	else echo "golangci-lint not installed: go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0"; fi

.PHONY: tidy
tidy: ## Check that go.mod and go.sum are tidy.
	$(GO) mod tidy -diff

.PHONY: test-sqlite-pubsub
test-sqlite-pubsub: ## Run watermill's full universal suite on the SQLite Pub/Sub, five times.
	EFFECTIVELY_PUBSUB_FULL=1 $(GO) test -count=5 -timeout 30m -run 'TestPubSubUniversal' ./framework/sqlite/
