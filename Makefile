# effectively: run `make` for the list of targets.
SHELL := /usr/bin/env bash
GO    ?= go

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: test
test: ## Run every test with -race, starting PostgreSQL when needed.
	@set -euo pipefail; eval "$$(scripts/services.sh)"; \
	$(GO) test -race -count=1 -timeout 15m ./...

.PHONY: tidy
tidy: ## Check that go.mod and go.sum are tidy.
	$(GO) mod tidy -diff

.PHONY: test-sqlite-pubsub
test-sqlite-pubsub: ## Run watermill's full universal suite on the SQLite Pub/Sub, five times.
	EFFECTIVELY_PUBSUB_FULL=1 $(GO) test -count=5 -timeout 30m -run 'TestPubSubUniversal' ./framework/sqlite/
