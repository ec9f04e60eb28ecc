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
test: ## Run every test with -race, starting PostgreSQL and RabbitMQ when needed.
	@set -euo pipefail; services="$$(scripts/services.sh)"; eval "$$services"; \
	$(GO) test -race -count=1 -timeout 15m ./...

.PHONY: bench
bench: ## Run the benchmarks: messages per second and allocations per message.
	@set -euo pipefail; services="$$(scripts/services.sh)"; eval "$$services"; \
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s ./middleware/ ./framework/...

.PHONY: lint
lint: tidy ## Run go vet, staticcheck, golangci-lint (when installed: make lint-install) and the tidy check.
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
	@if [ -x "$(GOLANGCI_LINT)" ]; then "$(GOLANGCI_LINT)" run ./...; \
	else echo "golangci-lint is not installed: run make lint-install (about 3 minutes)"; fi

.PHONY: lint-install
lint-install: ## Install golangci-lint v2.15.0 from the module proxy.
	$(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0

.PHONY: tidy
tidy: ## Check that go.mod and go.sum are tidy.
	$(GO) mod tidy -diff

.PHONY: test-sqlite-pubsub
test-sqlite-pubsub: ## Run watermill's full universal suite on the SQLite Pub/Sub, five times.
	EFFECTIVELY_PUBSUB_FULL=1 $(GO) test -count=5 -timeout 30m -run 'TestPubSubUniversal' ./framework/sqlite/
