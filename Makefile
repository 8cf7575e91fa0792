# The project's verbs. `make` alone lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

GO ?= go
export OUTBOX_TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/test?sslmode=disable

.PHONY: help test bench migrate lint build clean

FUNCTIONS := dispatch reaper dlq-replay metrics migrate
# Lambda builds: static, stripped, no RPC shim (provided.al2023 needs none).
LAMBDA_GOFLAGS := -tags lambda.norpc -trimpath -ldflags "-s -w"
LAMBDA_ARCH ?= arm64
# The modules of this repository that `go test ./...` at the root leaves out:
# the producer API is a module of its own (shared/outbox/go.mod). bench has
# its own verb, bench-compare.
MODULES := . shared/outbox

# awk reads the Makefile's text: the variables a description names are
# expanded here, with the values this make run has.
help: ## List the targets
	@awk -v arch='$(LAMBDA_ARCH)' 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {gsub(/\$$\(LAMBDA_ARCH\)/, arch, $$2); printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: run outboxctl
run: outboxctl ## The whole data path on this machine in one command (outboxctl demo): PostgreSQL, 20,000 messages, a signed webhook sink, dispatch, reaper, dead letters, replay (ARGS="--messages 5000 …" passes flags)
	bin/outboxctl demo $(ARGS)

# go build prints nothing while it compiles, and the first build (an empty
# build cache) takes minutes: say so before it starts.
outboxctl: ## Build the operator CLI as bin/outboxctl (with its VCS revision: bin/outboxctl version)
	@if [ ! -x bin/outboxctl ]; then echo "compiling outboxctl into bin/outboxctl: about 2 minutes the first time (an empty Go build cache), seconds after"; fi
	@$(GO) build -buildvcs=auto -o bin/outboxctl ./cmd/outboxctl

test: test-postgres test-modules ## Run every test, race detector on, against the PostgreSQL at $OUTBOX_TEST_DATABASE_URL; ends with one line of totals

# make test without its PostgreSQL check: every module's tests, each
# module's even when another's failed, then one line of totals
# (.ci/testsum reads go test -json). Built, not go run, which would print
# "exit status 1" after the totals; in a directory of its own, since the
# infra tests run this target while make test runs it. -timeout: go test's
# default of 10 minutes per package is a wall-clock bound a loaded machine
# can reach with the end-to-end packages; a hung test still ends the run.
.PHONY: test-modules
test-modules:
	@dir=$$(mktemp -d) && trap 'rm -rf "$$dir"' EXIT && \
	$(GO) build -o "$$dir/testsum" ./.ci/testsum && \
	"$$dir/testsum" -label "make test" -go "$(GO)" -modules "$(MODULES)" -- -race -count=1 -timeout 30m ./...

# Without a server every database test would fail with the same hint, a
# few hundred times: check once first (when pg_isready is installed).
.PHONY: test-postgres
test-postgres:
	@if command -v pg_isready >/dev/null && ! pg_isready -q -t 5 -d "$(OUTBOX_TEST_DATABASE_URL)"; then \
		echo "make test: no PostgreSQL answers at $$(echo '$(OUTBOX_TEST_DATABASE_URL)' | sed -E 's#(://[^:/@]*):[^@]*@#\1:xxxxx@#')"; \
		echo "  start the machine's cluster:  pg_ctlcluster --skip-systemctl-redirect \$$(ls /etc/postgresql) main start"; \
		echo "  or point OUTBOX_TEST_DATABASE_URL at a PostgreSQL 15+ server whose user may create databases and roles"; \
		echo "  (make run starts a throwaway cluster of its own when none answers)"; \
		exit 1; \
	fi

bench: ## Benchmarks: enqueue and the claim -> complete cycle, in messages per second
	$(GO) test -run '^$$' -bench . -benchtime 2s ./shared/outboxdb ./shared/lease

migrate: outboxctl ## Apply the outbox migrations to $OUTBOX_DATABASE_URL (or the functions' OUTBOX_DB_SECRET_ARN / IAM settings)
	bin/outboxctl migrate up

lint: ## go vet and gofmt; cfn-lint on template.yaml when both exist
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) vet ./...); done
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
# Routes beyond Lambda's 4 KB environment: a routes file at the root ships
# next to the dispatch function's bootstrap, for RoutesFile=/var/task/routes.json.
ROUTES_FILES ?= $(wildcard routes.json routes.yaml routes.yml)
build-DispatchFunction:
	$(call lambda-build,dispatch)
	$(if $(ROUTES_FILES),cp $(ROUTES_FILES) $(ARTIFACTS_DIR)/)
build-ReaperFunction:
	$(call lambda-build,reaper)
build-DlqReplayFunction:
	$(call lambda-build,dlq-replay)
build-MetricsFunction:
	$(call lambda-build,metrics)
build-MigrateFunction:
	$(call lambda-build,migrate)

.PHONY: bench-compare
bench-compare: ## Compare with River, watermill-sql and the bare-SQL floor; rewrites docs/BENCHMARKS.md and its plot (QUICK=1: a small run, written to $TMPDIR)
	cd bench && BENCH_MAKE_STARTED=$$(date +%s) $(GO) run ./cmd/compare $(if $(QUICK),-quick)

.PHONY: bench-lambda-share
bench-lambda-share: ## The 2-client SQL floor beside one dispatch bootstrap at Lambda's CPU share for the template's MemorySize (a cgroup; root), draining to EventBridge and a webhook; last line "... ratio R" (R = rate x DispatchMaxWorkers / floor). A throwaway cluster with autovacuum on (ARGS="-cluster host": $OUTBOX_TEST_DATABASE_URL's server)
	cd bench && $(GO) run ./cmd/lambdashare $(ARGS)

.PHONY: bench-archive
bench-archive: ## The attempts archive at volume: 50M rows over 30 daily partitions (about 10 GB); prints the purge of one day (partition dropped vs row by row), claim and completion CPU with that archive vs an empty one, bytes per million rows. A throwaway cluster with autovacuum on (ARGS="-rows 5000000": the quick run)
	cd bench && $(GO) run ./cmd/archive $(ARGS)

.PHONY: bench-deployment
bench-deployment: ## The deployment under the Lambda emulation, each environment at the CPU share of its memory (-cpu-share=false: the whole machine): dispatch with the template's defaults (schedule, linger, fan-out; real time), 1,000 msgs/s offered to a 20 ms webhook for 60 s; prints commit-to-receipt latency, throughput, claims per second (ARGS="-rate 0 -backlog 200000 …"; -target eventbridge -bulk-backlog: a drain to an endpoint answering at once); then one invocation's drain unconstrained and at the template MemorySize's CPU share (-invocation-drain 0: skip)
	$(GO) run ./shared/testkit/deploybench/cmd/deploybench $(ARGS)

# ---- Reliability: the fault-injection soak and the fuzz targets ----
.PHONY: soak fuzz
# The soak reads SOAK_MESSAGES, SOAK_KILLS, SOAK_RESTARTS, SOAK_BURSTS,
# SOAK_DISPATCHERS, SOAK_PRODUCERS, SOAK_TIMEOUT, SOAK_PAUSES, SOAK_TAKEOVERS,
# SOAK_READ_ONLY_TURNS, SOAK_POOLER (pgbouncer) and SOAK_JSON (shared/testkit/soak/cmd/soak).
export SOAK_MESSAGES SOAK_KILLS SOAK_RESTARTS SOAK_BURSTS SOAK_DISPATCHERS SOAK_PRODUCERS SOAK_TIMEOUT SOAK_JSON
export SOAK_PAUSES SOAK_TAKEOVERS SOAK_READ_ONLY_TURNS SOAK_POOLER

soak: ## Fault-injection soak: 1,000,000 messages (SOAK_MESSAGES=n for fewer) through 8 real dispatch processes, with kills, PostgreSQL restarts and read-only turns, lease takeovers, operator pauses and replays, and a failing target (SOAK_POOLER=pgbouncer: through PgBouncer); prints the figures (docs/RELIABILITY.md)
	$(GO) run ./shared/testkit/soak/cmd/soak

.PHONY: statemachine
statemachine: ## The SQL state machine's concurrency invariant harness for minutes: 10 seeds x 30 s on $OUTBOX_TEST_DATABASE_URL and on a throwaway cluster with autovacuum on (ARGS="-seed N -seeds 1 -cluster host -v" replays one)
	$(GO) run ./shared/testkit/statemachine/cmd/statemachine $(ARGS)

FUZZTIME ?= 30s
# package:target, every fuzz target of the module; plain `go test` replays
# their seed corpora (f.Add and testdata/fuzz) as regression tests.
FUZZ_TARGETS := \
	./shared/route:FuzzParse \
	./shared/publish/webhook:FuzzClassifyResponse \
	./shared/publish:FuzzEncodeEnvelope \
	./shared/publish/cloudevent:FuzzStructured \
	./shared/publish/eventbridge:FuzzPutEventsRequestIsTheSDKs \
	./migrations:FuzzTraceContextAgreesWithOpenTelemetry \
	./shared/handler/dispatchfn:FuzzParseEvent \
	./shared/handler/reaperfn:FuzzParseEvent \
	./shared/handler/replayfn:FuzzParseEvent \
	./shared/handler:FuzzDecodeMetricsEvent \
	./shared/outboxdb:FuzzEnqueue

fuzz: ## Run every fuzz target for FUZZTIME each (default 30s; e.g. FUZZTIME=10m); a crasher lands in the package's testdata/fuzz
	@set -e; for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; name=$${t##*:}; \
		echo "== $$name in $$pkg for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$pkg; \
	done
