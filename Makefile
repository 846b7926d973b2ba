# make build | run | test | format        (see README.md)
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release -DMOESERVE_WERROR=ON

.PHONY: all deps configure build run gpu-bundle test test-unit test-fuzz test-e2e format format-check clean

all: build

deps:
	@bash scripts/install-deps.sh

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

configure: $(BUILD)/CMakeCache.txt

build: deps configure
	cmake --build $(BUILD) -j $(JOBS)
	@echo "built $(BUILD)/moeserve"

run: build
	bash scripts/run-demo.sh $(BUILD)/moeserve

format:
	bash scripts/format.sh fix

format-check:
	bash scripts/format.sh check

test: deps format-check build
	bash scripts/check-layers.sh
	cd $(BUILD) && ctest -L cpu --output-on-failure -j $(JOBS)
	bash scripts/fuzz.sh $(BUILD)
	bash scripts/e2e.sh $(BUILD)/moeserve

clean:
	rm -rf $(BUILD)

# On a connected Debian machine: the dependency bundle a GPU machine without package access builds from
# (.gpu-bundle/, see scripts/make-gpu-bundle.sh and the README's GPU section).
gpu-bundle:
	bash scripts/make-gpu-bundle.sh
