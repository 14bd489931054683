# Everything a fresh machine needs is installed by these targets; Go itself
# is expected at /usr/local/go or on PATH.
export PATH := /usr/local/go/bin:$(PATH)
export GOFLAGS := -buildvcs=false

GO       ?= go
BIN      := bin/forwarder
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -X main.version=$(VERSION)

.PHONY: all build deps run test vet fmt-check bench crash clean

all: build

deps:
	$(GO) mod download

build: deps
	$(GO) build -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/forwarder

# Starts the forwarder on the local example configuration (data under ./data).
run: build
	./$(BIN) run -c config.yaml

# The whole suite: formatting, vet, and every test with the race detector.
# Budget: about 10 minutes on 2 cores.
test: deps fmt-check vet
	$(GO) test -race -count=1 -timeout 9m ./...

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# Throughput and memory figures (records/s, MB/s) of every package's benchmarks.
bench: deps
	$(GO) test -run '^$$' -bench . -benchmem -benchtime 2s -timeout 30m ./...

# Long crash loops: SIGKILL an appending process 200 times and check every
# acknowledged record each time; SIGKILL an appending and draining process
# 100 times and check cursors, deliveries and re-sends.
crash: deps
	WAL_CRASH_RUNS=200 $(GO) test -run 'TestCrash' -count=1 -v -timeout 30m ./wal
	QUEUE_CRASH_RUNS=100 $(GO) test -run 'TestCrash' -count=1 -v -timeout 30m ./queue

clean:
	rm -rf bin
