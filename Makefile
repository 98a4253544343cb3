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

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

run: build
	@scripts/run.sh

# libFuzzer targets (tests/fuzz), each run FUZZ_SECONDS on its corpus; `make test` replays the corpora.
FUZZ_SECONDS ?= 60
fuzz:
	@scripts/install-deps.sh --fuzz
	@FUZZ_SECONDS=$(FUZZ_SECONDS) JOBS=$(JOBS) scripts/fuzz.sh

clean:
	rm -rf $(BUILD) build-fuzz
