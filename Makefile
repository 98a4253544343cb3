# Peregrine: the two commands of the README, and their parts.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: deps configure build test run fuzz clean

deps:
	@scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# The tests, then a short timed run of every fuzzer (FUZZ_SMOKE_SECONDS each; 0 skips it).
FUZZ_SMOKE_SECONDS ?= 5
test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	@if [ "$(FUZZ_SMOKE_SECONDS)" != 0 ]; then $(MAKE) --no-print-directory fuzz FUZZ_SECONDS=$(FUZZ_SMOKE_SECONDS); fi

run: build
	@scripts/run.sh

# libFuzzer targets (tests/fuzz), each run FUZZ_SECONDS on its corpus; `make test` replays the corpora.
FUZZ_SECONDS ?= 60
fuzz:
	@scripts/install-deps.sh --fuzz
	@FUZZ_SECONDS=$(FUZZ_SECONDS) JOBS=$(JOBS) scripts/fuzz.sh

clean:
	rm -rf $(BUILD) build-fuzz
