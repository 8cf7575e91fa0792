# The project's verbs. `make` alone lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GO ?= go
export OUTBOX_TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test?sslmode=disable

.PHONY: help test bench migrate lint

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

test: ## Run every test, race detector on, against the PostgreSQL at $OUTBOX_TEST_DATABASE_URL
	$(GO) test -race -count=1 ./...

bench: ## Benchmarks: enqueue and the claim -> complete cycle, in messages per second
	$(GO) test -run '^$$' -bench . -benchtime 2s ./shared/outbox ./shared/lease

migrate: ## Apply the outbox migrations to $OUTBOX_DATABASE_URL
	$(GO) run ./cmd/outboxctl migrate up

lint: ## go vet and gofmt; cfn-lint on template.yaml when both exist
	$(GO) vet ./...
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt would change:"; echo "$$unformatted"; exit 1; fi
	@if [ -f template.yaml ] && command -v cfn-lint >/dev/null; then cfn-lint template.yaml; \
	elif [ -f template.yaml ]; then echo "cfn-lint not installed: template.yaml not linted"; fi
