# The project's verbs. `make` alone lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GO ?= go
export OUTBOX_TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test?sslmode=disable

.PHONY: help test bench migrate lint build clean

FUNCTIONS := dispatch reaper dlq-replay metrics
# Lambda builds: static, stripped, no RPC shim (provided.al2023 needs none).
LAMBDA_GOFLAGS := -tags lambda.norpc -trimpath -ldflags "-s -w"
LAMBDA_ARCH ?= arm64

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

build: ## Build every function as a static, stripped linux/$(LAMBDA_ARCH) bootstrap in bin/<function>/
	@for f in $(FUNCTIONS); do \
		CGO_ENABLED=0 GOOS=linux GOARCH=$(LAMBDA_ARCH) $(GO) build $(LAMBDA_GOFLAGS) -o bin/$$f/bootstrap ./functions/$$f || exit 1; \
	done
	@ls -l bin/*/bootstrap | awk '{printf "  %-28s %6.1f MB\n", $$9, $$5/1048576}'

clean: ## Remove build outputs
	rm -rf bin .aws-sam

# `sam build` (BuildMethod: makefile) runs build-<LogicalId> with ARTIFACTS_DIR.
lambda-build = CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) build $(LAMBDA_GOFLAGS) -o $(ARTIFACTS_DIR)/bootstrap ./functions/$(1)
build-DispatchFunction:
	$(call lambda-build,dispatch)
build-ReaperFunction:
	$(call lambda-build,reaper)
build-DlqReplayFunction:
	$(call lambda-build,dlq-replay)
build-MetricsFunction:
	$(call lambda-build,metrics)
