# jetsync: `make run` and `make test` work on a fresh machine (Go and, for
# tests and the demo upstream, Debian's postgresql-15, which `make test`
# installs when missing).

GO       ?= go
PGBIN    ?= /usr/lib/postgresql/15/bin
BIN      := bin/jetsync
BENCHTIME ?= 1s
FUZZTIME ?= 20s

# Unit and light packages run under the race detector, and so do the two
# concurrent consumers (the replica and the sync server), whose suites stay
# small enough (~10 s). Everything else that has tests starts real servers or
# leans on SQLite: those run one package at a time and without -race, since
# modernc SQLite is 18-23x slower under it. e2e drives ./bin/jetsync and runs
# last.
RACE_PATTERNS := ./streams/... ./projections/... ./producers/pgvalue/... ./consumers/replicator/... ./consumers/viewsyncer/... ./consumers/auth/... ./consumers/zql/permissions/... ./consumers/cvrstore/... ./consumers/appapi/... ./examples/...
list = $(shell $(GO) list -e $(1) 2>/dev/null | grep '^github.com/')
RACE_PKGS   = $(call list,$(RACE_PATTERNS))
ALL_PKGS    = $(call list,./...)
SERVER_PKGS = $(filter-out $(RACE_PKGS) %/e2e,$(ALL_PKGS))

export CGO_ENABLED ?= 0

.PHONY: all build run test deps pg-deps vet fmt-check test-race test-servers test-e2e bench fuzz soak clean

all: build

# The revision is stamped by hand too: the go command's own VCS stamp is
# missing where GOFLAGS has -buildvcs=false or git can't read the checkout.
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)$(shell git diff --quiet HEAD 2>/dev/null || echo +dirty)

build: demo-web
	$(GO) build -ldflags "-X main.buildRevision=$(REVISION)" -o $(BIN) ./cmd/jetsync

# demo-web bundles the demo page (web/demo: the real Zero client in the
# browser) with esbuild from npm into cmd/jetsync/demoweb, which the binary
# embeds. Nothing of it is committed: a plain `go build` serves a note in
# the page's place.
DEMO_WEB := web/demo
DEMO_OUT := cmd/jetsync/demoweb/demo.js
.PHONY: demo-web
demo-web: $(DEMO_OUT)
$(DEMO_WEB)/node_modules/.ci-stamp: $(DEMO_WEB)/package-lock.json
	cd $(DEMO_WEB) && npm ci --no-audit --no-fund --loglevel=error
	touch $@
$(DEMO_OUT): $(DEMO_WEB)/node_modules/.ci-stamp $(wildcard $(DEMO_WEB)/src/*.ts) $(DEMO_WEB)/index.html $(DEMO_WEB)/demo.css $(DEMO_WEB)/build.mjs
	cd $(DEMO_WEB) && node build.mjs

run: pg-deps build
	./$(BIN) run

# deps installs what the tests need and a fresh machine lacks: Postgres 15
# (the tests and the demo run their own clusters from its binaries), Node
# 22 with the Zero client, the nats CLI and jq for the CLI walkthrough, and
# Debian's chromium for the demo page's browser test.
deps: pg-deps node-deps nats-cli chromium-deps

# chromium-deps installs Debian's chromium when it is missing: the browser
# test (e2e/demo_browser_test.go) drives it headless.
.PHONY: chromium-deps
chromium-deps:
	@if ! command -v chromium >/dev/null; then \
		echo "installing chromium"; \
		SUDO=; [ "$$(id -u)" -eq 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends chromium; \
	fi

# pg-deps installs Debian's postgresql-15 when its binaries are missing,
# keeping the package from creating and starting a cluster of its own.
pg-deps:
	@if [ ! -x $(PGBIN)/initdb ]; then \
		echo "installing postgresql-15"; \
		SUDO=; [ "$$(id -u)" -eq 0 ] || SUDO=sudo; \
		$$SUDO mkdir -p /etc/postgresql-common; \
		echo 'create_main_cluster = false' | $$SUDO tee /etc/postgresql-common/createcluster.conf >/dev/null; \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends postgresql-15 postgresql-client-15; \
	fi

# nats-cli installs the stock nats CLI into .tools/bin for the walkthrough
# in examples/nats-cli (its test runs the README's commands), and jq, which
# the walkthrough uses, when it is missing.
NATS_CLI_VERSION := v0.5.0
.PHONY: nats-cli
nats-cli: .tools/bin/nats
	@if ! command -v jq >/dev/null; then \
		echo "installing jq"; \
		SUDO=; [ "$$(id -u)" -eq 0 ] || SUDO=sudo; \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends jq; \
	fi
.tools/bin/nats:
	GOBIN=$(CURDIR)/.tools/bin CGO_ENABLED=0 $(GO) install github.com/nats-io/natscli/nats@$(NATS_CLI_VERSION)

# node-deps installs Node 22, the real Zero client and zero-cache for the e2e
# client tests, as pinned in e2e/client/package-lock.json. npm ci starts from
# scratch each time, so it runs only when the lockfile is newer than the
# install.
NODE_CLIENT := e2e/client
# The TypeScript analytics example (examples/analytics-ts) has its own
# lockfile, installed the same way; it runs under the Node 22 above.
NODE_EXAMPLE := examples/analytics-ts
.PHONY: node-deps e2e-reference
node-deps: $(NODE_CLIENT)/node_modules/.ci-stamp $(NODE_EXAMPLE)/node_modules/.ci-stamp
$(NODE_CLIENT)/node_modules/.ci-stamp: $(NODE_CLIENT)/package-lock.json
	cd $(NODE_CLIENT) && npm ci --no-audit --no-fund --loglevel=error
	touch $@
$(NODE_EXAMPLE)/node_modules/.ci-stamp: $(NODE_EXAMPLE)/package-lock.json
	cd $(NODE_EXAMPLE) && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# e2e-reference runs the Zero client suite against zero-cache 1.9.0 itself,
# which shows that its assertions describe the real behaviour. CI need not.
e2e-reference: node-deps build
	JETSYNC_E2E_REFERENCE=1 JETSYNC_BIN=$(CURDIR)/$(BIN) $(GO) test -p 1 -count=1 -timeout 10m -run '^TestZeroClient_(Reference|CRUDReference)$$' -v ./e2e/

# conformance runs the differential suite at length (e2e/conformance_test.go):
# random ZQL, materialized by the real client against jetsync and zero-cache
# 1.9.0, compared with Postgres after every round of random writes. make test
# runs a short version of it. CONFORMANCE_SEEDS etc. override the defaults.
# 320 generated queries leave at least 300 once the shapes the 1.9.0 client
# cannot hold are left out (about 3%).
CONFORMANCE_SEEDS   ?= 1,2
CONFORMANCE_QUERIES ?= 320
CONFORMANCE_ROUNDS  ?= 60
CONFORMANCE_PER_CLIENT ?= 10
.PHONY: conformance
conformance: node-deps build
	CONFORMANCE_SEEDS=$(CONFORMANCE_SEEDS) CONFORMANCE_QUERIES=$(CONFORMANCE_QUERIES) CONFORMANCE_ROUNDS=$(CONFORMANCE_ROUNDS) CONFORMANCE_PER_CLIENT=$(CONFORMANCE_PER_CLIENT) \
	JETSYNC_BIN=$(CURDIR)/$(BIN) $(GO) test -p 1 -count=1 -timeout 90m -run '^TestConformance$$' -v ./e2e/

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(find . -name '*.go' -not -path './.tools/*' -not -path './jetsync-data/*')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

test-race:
	CGO_ENABLED=1 $(GO) test -race -timeout 15m $(RACE_PKGS)

test-servers:
	$(GO) test -p 1 -timeout 25m $(SERVER_PKGS)

test-e2e: build
	JETSYNC_BIN=$(CURDIR)/$(BIN) $(GO) test -p 1 -count=1 -timeout 30m ./e2e/...

# Plain `go test` prints one line per package with its duration, so a slow
# package shows.
test: deps vet fmt-check test-race test-servers test-e2e

# bench runs the Go benchmarks, every bench/*.sh and bench/*/main.go, and
# bench-viewsyncer last (it has its own target, and the loop skips it).
# Each bench reports its issues' aims into BENCH_REPORT (benchenv.Report);
# bench/summary prints them as one table at the end.
BENCH_REPORT ?= bin/bench-aims.jsonl
bench: build
	@rm -f $(BENCH_REPORT)
	$(GO) test -p 1 -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) -timeout 30m $(filter-out %/e2e,$(ALL_PKGS))
	@set -e; export JETSYNC_BENCH_REPORT=$(CURDIR)/$(BENCH_REPORT); \
	for s in bench/*.sh; do \
		[ -f "$$s" ] || continue; echo "== $$s"; bash "$$s"; \
	done; \
	for d in bench/*/; do \
		[ -f "$$d/main.go" ] || continue; \
		case "$$d" in bench/viewsyncer/|bench/summary/) continue;; esac; \
		echo "== $$d"; $(GO) run ./$$d; \
	done; \
	$(MAKE) --no-print-directory bench-viewsyncer; \
	$(MAKE) --no-print-directory bench-crud; \
	$(MAKE) --no-print-directory bench-otel
	@$(GO) run ./bench/summary $(BENCH_REPORT)

# bench-viewsyncer measures the sync server of ./bin/jetsync run against
# zero-cache 1.9.0's figures on seed.sh 100000: server-side and real-client
# hydration, 50 groups x 5 queries, commit -> client latency and peak RSS.
# VIEWSYNCER_BENCH_FLAGS adds flags (go run ./bench/viewsyncer -h).
BENCH_RUNS ?= 3
VIEWSYNCER_BENCH_FLAGS ?=
.PHONY: bench-viewsyncer
bench-viewsyncer: build node-deps
	@echo "== bench/viewsyncer/"
	$(GO) run ./bench/viewsyncer -bin $(BIN) -runs $(BENCH_RUNS) $(VIEWSYNCER_BENCH_FLAGS)

# bench-otel measures what exporting OpenTelemetry costs: throughput, the
# process's CPU per transaction (as fast as Postgres commits, and at 500/s
# offered) and commit -> client p50 of two ./bin/jetsync run side by side on
# one upstream, one with OTEL_* unset and one exporting to a receiver in the
# bench, in short rounds, against the aims (< 5% of throughput, < 0.3 ms of
# p50) on the medians of the rounds' differences. The per-span and per-export costs are
# internal/telemetry's Go benchmarks, run by bench above.
OTEL_BENCH_RUNS ?= 8
.PHONY: bench-otel
bench-otel: build
	@echo "== OpenTelemetry export cost"
	$(GO) run ./bench/viewsyncer -bin $(BIN) -otel -issues 2000 -otel-txns 10000 -otel-paced 2000 -otel-rate 500 -updates 150 -rate 20 -runs $(OTEL_BENCH_RUNS)

# bench-crud measures a legacy CRUD write's round trip, from the push to the
# poke that carries its lastMutationID, p50 and p99 over 300 writes, on
# jetsync and on zero-cache 1.9.0 (e2e/crud_roundtrip_test.go).
.PHONY: bench-crud
bench-crud: build node-deps
	@echo "== CRUD write round trip"
	@out=$$(mktemp); rc=0; \
	JETSYNC_E2E_CRUD_ROUNDTRIP=1 JETSYNC_E2E_REFERENCE=1 JETSYNC_BIN=$(CURDIR)/$(BIN) \
		$(GO) test -p 1 -count=1 -timeout 10m -run '^TestCRUDRoundTrip$$' -v ./e2e/ >$$out 2>&1 || rc=$$?; \
	grep -E 'round trip|^(---|ok|FAIL)' $$out || cat $$out; rm -f $$out; exit $$rc

# fuzz runs every Fuzz* target for FUZZTIME; go test -fuzz takes one target
# per run.
fuzz:
	@set -e; for pkg in $(filter-out %/e2e,$(ALL_PKGS)); do \
		for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
			echo "== $$pkg $$f"; \
			$(GO) test -run '^$$' -fuzz "^$$f\$$" -fuzztime $(FUZZTIME) -timeout 10m $$pkg; \
		done; \
	done

# soak runs the long tests, named Soak*, which skip without JETSYNC_SOAK.
soak: build
	JETSYNC_SOAK=1 JETSYNC_BIN=$(CURDIR)/$(BIN) $(GO) test -p 1 -count=1 -run 'Soak' -timeout 60m $(ALL_PKGS)

clean:
	rm -rf bin
