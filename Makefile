# Everything a fresh machine needs is installed by these targets; Go itself
# is expected at /usr/local/go or on PATH.
export PATH := /usr/local/go/bin:$(PATH)
export GOFLAGS := -buildvcs=false

GO       ?= go
BIN      := bin/forwarder
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X main.version=$(VERSION)

.PHONY: all build mods deps run test test-heavy vet fmt-check fuzz-short fuzz alerts bench bench-go bench-e2e bench-catchup bench-partitions bench-tools crash powercut clean e2e soak image image-tools image-test

# Fuzz targets: package, target name, and the number of inputs make test tries
# (5 to 12 seconds each on 2 cores, most of it the seed corpus; make fuzz runs each for 5 minutes).
FUZZ_TARGETS := ./inputs/forward:FuzzDecode:30000 ./inputs/httpin:FuzzParseBody:50000 \
	./inputs/httpin:FuzzRequest:20000 \
	./inputs/httpin:FuzzScanner:40000 ./template:FuzzLookup:200000 ./template:FuzzFinder:50000 \
	./template:FuzzFinderOld:200000 ./internal/jsonscan:FuzzSkipKey:200000 \
	./sinks/cloudwatch:FuzzAppendMessage:30000

all: build

# What building needs: the Go modules. make run and make build need nothing else.
mods:
	$(GO) mod download

# What the tests need besides: Debian packages (apt-get, as root), and npm's
# @fluent-org/logger in NODE_CLIENT_DIR (inputs/forward's tests read the same default).
NODE_CLIENT_DIR ?= $(HOME)/.cache/forwarder-tests/node
NODE_CLIENT_VERSION = 1.0.10
export NODE_CLIENT_DIR
deps: mods
	@# An independent forward client for the tests: Debian's python3-fluent-logger.
	@/usr/bin/python3 -c 'import fluent.sender' 2>/dev/null || \
		{ apt-get install -y python3-fluent-logger || { apt-get update && apt-get install -y python3-fluent-logger; }; }
	@# systemd-analyze, for the test that verifies packaging/systemd/forwarder.service.
	@command -v systemd-analyze >/dev/null 2>&1 || \
		{ apt-get install -y --no-install-recommends systemd || { apt-get update && apt-get install -y --no-install-recommends systemd; }; }
	@# The aws CLI, for the test that runs the commands forwarder dev prints.
	@command -v aws >/dev/null 2>&1 || \
		{ apt-get install -y awscli || { apt-get update && apt-get install -y awscli; }; }
	@# fusermount3, for internal/faultfs's power-cut tests when mount(2) itself is refused.
	@command -v fusermount3 >/dev/null 2>&1 || \
		{ apt-get install -y fuse3 || { apt-get update && apt-get install -y fuse3; }; }
	@# A third independent forward client, with the handshake: npm's @fluent-org/logger,
	@# installed where inputs/forward's tests look for it.
	@command -v npm >/dev/null 2>&1 || \
		{ apt-get install -y nodejs npm || { apt-get update && apt-get install -y nodejs npm; }; }
	@test -f $(NODE_CLIENT_DIR)/node_modules/@fluent-org/logger/package.json || \
		npm install --silent --no-audit --no-fund --prefix $(NODE_CLIENT_DIR) @fluent-org/logger@$(NODE_CLIENT_VERSION)

build: mods
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/forwarder

# Starts the forwarder in dev mode: local S3 and CloudWatch Logs emulators in the same
# process, data under ./dev-data, sample logs (--demo). forwarder run -c config.yaml is the
# same pipeline against emulators you run yourself.
run: build
	./$(BIN) dev --demo

# The whole suite: formatting, vet, every package's tests with the race detector, and e2e
# twice: whole without it, beside the others (the binary under test is built as it ships,
# without -race; under it the emulators in the test process took five times the CPU and
# e2e was the longest package), and its -short tests with it (the harness itself), then
# fuzz-short, in the time e2e spends waiting for the binary. Test
# data goes to TEST_TMPDIR, /dev/shm when it is a tmpfs with 4 GiB free (a container's
# is often 64 MiB), else TMPDIR: no test measures the disk's
# fsync latency (crash tests kill processes, power-cut tests run on faultfs, full-disk
# tests mount their own tmpfs), and waiting for it was most of some packages' time.
# Budget: 6 minutes on 2 cores.
TEST_TMPDIR ?= $(shell d=/dev/shm; [ -d $$d ] && [ -w $$d ] && [ "$$(stat -f -c %T $$d)" = tmpfs ] && \
	[ "$$(df -Pk $$d | awk 'NR==2 {print $$4}')" -ge 4194304 ] && echo $$d || echo $${TMPDIR:-/tmp})
# Tests whose volume of data the race detector slows several times over: they skip
# under -race (internal/racedetect) and make test runs them without it.
HEAVY_TESTS = ./wal:TestPowerCut,TestFullDiskCyclesNeverRefuseCommits,TestRecentReadsMatchTheFile \
	./sinks/s3sink:TestMoto,TestManyPartitionsStayOpen,TestObjectRoundTrips \
	./queue:TestCatchUpAfterOutage,TestCrashRestartWithMaxPartitions

test: deps fmt-check vet
	@echo "test data under $(TEST_TMPDIR)"
	@side=$$(mktemp); \
	{ TMPDIR=$(TEST_TMPDIR) $(GO) test -count=1 -timeout 9m ./e2e && \
	  TMPDIR=$(TEST_TMPDIR) $(GO) test -race -short -count=1 -timeout 5m ./e2e && \
	  $(MAKE) --no-print-directory test-heavy && \
	  $(MAKE) --no-print-directory fuzz-short; } >$$side 2>&1 & pid=$$!; \
	TMPDIR=$(TEST_TMPDIR) $(GO) test -race -count=1 -timeout 9m $$($(GO) list ./... | grep -v '/e2e$$'); rc=$$?; \
	wait $$pid || rc=1; echo "--- e2e (without and with -race -short), then fuzzing:"; cat $$side; rm -f $$side; exit $$rc

test-heavy:
	@for t in $(HEAVY_TESTS); do \
		pkg=$${t%%:*}; names=$$(echo $${t#*:} | tr , '|'); \
		echo "without -race: $$names ($$pkg)"; \
		TMPDIR=$(TEST_TMPDIR) $(GO) test -count=1 -timeout 5m -run "^($$names)\$$" $$pkg || exit 1; \
	done

# Each fuzz target for its count of inputs in make test, for FUZZTIME (5m) each in
# make fuzz. make test counts inputs rather than time: Go 1.26's fuzzer can fail a run
# with a bare "context deadline exceeded" when a -fuzztime duration ends while a
# worker is busy (golang/go#75804), which a count does not race with.
FUZZTIME ?=
fuzz-short:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; rest=$${t#*:}; name=$${rest%%:*}; count=$${rest##*:}; \
		budget=$${FUZZTIME:-$${count}x}; \
		echo "fuzz $$name ($$pkg) for $$budget"; \
		$(GO) test -run '^$$' -fuzz "^$$name$$" -fuzztime $$budget $$pkg || exit 1; \
	done

fuzz:
	$(MAKE) fuzz-short FUZZTIME=5m

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# Throughput and memory figures: the Go benchmarks, then the real binary under cmd/loadgen.
bench: bench-go bench-e2e

# Every Go benchmark.
bench-go: deps
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s -timeout 30m ./...

# The real binary driven by cmd/loadgen: ingest, a backlog (BENCH_BACKLOG, default 1GiB),
# a drain to both sinks, 1,000,000 records into both sinks at loadgen standin, then the
# catch-up after an outage, then a tag per container (make bench-partitions); see
# scripts/bench-e2e.sh, scripts/bench-catchup.sh, scripts/bench-s3-partitions.sh and
# BENCHMARKS.md.
bench-e2e: bench-tools
	scripts/bench-e2e.sh
	scripts/bench-catchup.sh
	$(MAKE) bench-partitions

# A tag per container: 2,000 tags into S3 (a partition each) and CloudWatch Logs (a stream
# each) at 20,000 records/s for 5 minutes; then the mistake of a stream per record
# (max_partitions at work) for 30 s. Both against loadgen standin.
bench-partitions: bench-tools
	BENCH_SINKS="s3 cloudwatch" BENCH_SECONDS=300 scripts/bench-s3-partitions.sh
	BENCH_MISTAKE=1 BENCH_SECONDS=30 scripts/bench-s3-partitions.sh

# Catch-up after an outage alone: per sink, 1 and 100 partitions, against a restart
# on the same backlog (BENCH_RECORDS, default 1,000,000; BENCH_SINKS, BENCH_TAGS).
bench-catchup: bench-tools
	scripts/bench-catchup.sh

bench-tools: deps
	@command -v curl >/dev/null 2>&1 && command -v ss >/dev/null 2>&1 || \
		{ apt-get install -y curl iproute2 || { apt-get update && apt-get install -y curl iproute2; }; }

# The alerting rules (deploy/prometheus/alerts.yaml) checked by promtool, and the
# scenarios of deploy/prometheus/alerts_test.yaml run against them; promtool is
# installed with go install the first time (a few minutes: it is a large program).
PROMTOOL_VERSION := v0.316.0
PROMTOOL = $(shell $(GO) env GOPATH | cut -d: -f1)/bin/promtool
alerts:
	@test -x $(PROMTOOL) || $(GO) install github.com/prometheus/prometheus/cmd/promtool@$(PROMTOOL_VERSION)
	cd deploy/prometheus && $(PROMTOOL) check rules alerts.yaml && $(PROMTOOL) test rules alerts_test.yaml

# Long crash loops: SIGKILL an appending process 200 times and check every
# acknowledged record each time; SIGKILL an appending and draining process
# 100 times and check cursors, deliveries and re-sends.
crash: deps
	WAL_CRASH_RUNS=200 $(GO) test -run 'TestCrash' -count=1 -v -timeout 30m ./wal
	QUEUE_CRASH_RUNS=100 QUEUE_STRESS_ROUNDS=50 $(GO) test -run 'TestCrash|TestWatermark' -count=1 -v -timeout 30m ./queue
	FORWARD_CRASH_RUNS=100 $(GO) test -run 'TestCrash' -count=1 -v -timeout 30m ./inputs/forward

# Power cuts: the WAL on internal/faultfs, which drops whatever was not fsynced at
# a cut (and may tear the last write or keep some directory changes): 500 cuts
# under load, plus cuts at every fsync of a first and of a compacting open. Ends
# with one line: power cuts, acknowledged records checked, lost, corrupt.
# WAL_POWERCUT_SEED replays a run.
POWERCUT_RUNS ?= 500
powercut: deps
	@log=$$(mktemp); \
	{ WAL_POWERCUT_RUNS=$(POWERCUT_RUNS) $(GO) test -run '^TestPowerCut$$' -count=1 -v -timeout 60m ./wal; echo $$? >$$log.rc; } 2>&1 | tee $$log; \
	rc=$$(cat $$log.rc); sed -n 's/.*\(power cuts: .*\)/\1/p' $$log | tail -1; rm -f $$log $$log.rc; exit $$rc

# End to end: the real binary against the S3 and CloudWatch Logs emulators and moto_server:
# 10 SIGKILLs under load, an S3 outage, a full WAL, a full disk (root only), old and future
# events, a changed configuration. About 170 s on 2 cores; make test runs it without -race.
e2e: deps
	$(GO) test -race -count=1 -timeout 10m -v ./e2e

# The long end-to-end run: 100 SIGKILLs, longer outages and loads (about 12 minutes).
soak: deps
	E2E_LONG=1 $(GO) test -race -count=1 -timeout 60m -v ./e2e

# The container image (deploy/container/Containerfile), built without network: the binary
# is built here, static (CGO_ENABLED=0), and copied in with the host's CA bundle and
# deploy/kubernetes/forwarder.yaml as the default configuration. podman comes from Debian.
# --no-cache: podman 4.3 reuses a cached COPY layer whose --chown has changed, and the
# build takes seconds without the cache.
IMAGE     ?= localhost/forwarder:$(VERSION)
IMAGE_CTX := bin/image
CA_BUNDLE := /etc/ssl/certs/ca-certificates.crt

image-tools:
	@command -v podman >/dev/null 2>&1 || \
		{ apt-get install -y --no-install-recommends podman || { apt-get update && apt-get install -y --no-install-recommends podman; }; }
	@test -s $(CA_BUNDLE) || \
		{ apt-get install -y ca-certificates || { apt-get update && apt-get install -y ca-certificates; }; }
	@test -s $(CA_BUNDLE) || update-ca-certificates
	@test -s $(CA_BUNDLE) || { echo "no CA bundle at $(CA_BUNDLE) after installing ca-certificates"; exit 1; }

image: image-tools
	rm -rf $(IMAGE_CTX)
	mkdir -p $(IMAGE_CTX)/data $(IMAGE_CTX)/var-lib
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w $(LDFLAGS)' -o $(IMAGE_CTX)/forwarder ./cmd/forwarder
	install -m 0644 $(CA_BUNDLE) $(IMAGE_CTX)/ca-certificates.crt
	install -m 0644 deploy/kubernetes/forwarder.yaml $(IMAGE_CTX)/forwarder.yaml
	podman build --no-cache --network=none --pull=never --build-arg VERSION=$(VERSION) \
		-f deploy/container/Containerfile -t $(IMAGE) $(IMAGE_CTX)

# Builds the image and inspects it (it cannot be run here: see README.md, Kubernetes):
# entrypoint, user, volume, ports, the files in its layers, and the binary taken out of it.
image-test: image
	$(GO) vet -tags imagetest ./deploy/kubernetes
	FORWARDER_IMAGE=$(IMAGE) $(GO) test -tags imagetest -run '^TestImage' -count=1 -v ./deploy/kubernetes

clean:
	rm -rf bin
