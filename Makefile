# A thin wrapper over CMake. `make demo` and `make test` install what is missing first.
MAKEFLAGS += --no-print-directory
BUILD   ?= build
JOBS    ?= $(shell nproc)
DATA    ?= data/fashion-mnist
RUN_DIR ?= runs/demo
MODEL   ?= examples/fashion_cnn.json

.PHONY: all deps build test guard fuzz python-test demo demo-gpt asan tsan mpich clean

FUZZ_TARGETS = $(basename $(notdir $(wildcard fuzz/fuzz_*.c)))

all: build

deps:
	@scripts/install-deps.sh

build: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release > /dev/null
	@cmake --build $(BUILD) -j $(JOBS)

# Every test, then every test again on the guarded backend, then every fuzz target for 10 seconds
# (libFuzzer needs clang), then the Python package's tests (pip-installed into build/venv).
test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)
	@$(MAKE) --no-print-directory guard
	@$(MAKE) --no-print-directory fuzz
	@$(MAKE) --no-print-directory python-test

# The Python package (python/crew, docs/PYTHON.md): built and installed by pip into build/venv
# with real Keras 3 on JAX's CPU backend, then its pytest suite.
python-test: deps
	@scripts/python-test.sh

# The test suite with every device's memory trapping host access (src/backend/cpu/cpu_guarded.c):
# the proof that only the backend touches tensors. It builds with OpenBLAS as the CPU's GEMM (the
# library of non-x86 builds; the default build's is oneDNN), so every test passes on both.
guard: deps
	@cmake -S . -B build-guard -DCMAKE_BUILD_TYPE=Release -DCREW_GUARD=ON -DCREW_GEMM=openblas > /dev/null
	@cmake --build build-guard -j $(JOBS)
	ctest --test-dir build-guard --output-on-failure -j $(JOBS)

fuzz:
	@CREW_WITH_CLANG=1 scripts/install-deps.sh
	@cmake -S . -B build-fuzz -DCREW_FUZZ=ON -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug > /dev/null
	@cmake --build build-fuzz -j $(JOBS) --target $(FUZZ_TARGETS)
	ctest --test-dir build-fuzz -L fuzz --output-on-failure -j $(JOBS)

# The MPI tests again, built against MPICH (mpicc.mpich) and launched by its Hydra
# (mpiexec.mpich): MPI's other family, which Debian ships beside Open MPI. cli_mpi_signal.sh picks
# the launcher of the family the crew it tests was built with.
mpich:
	@CREW_WITH_MPICH=1 scripts/install-deps.sh
	@cmake -S . -B build-mpich -DCMAKE_BUILD_TYPE=Release -DMPI_C_COMPILER=$$(command -v mpicc.mpich) \
	       -DCREW_MPIRUN=$$(command -v mpiexec.mpich) > /dev/null
	@cmake --build build-mpich -j $(JOBS) --target crew_cli test_comm_mpi test_fit_mpi
	ctest --test-dir build-mpich -R "test_comm_mpi|test_fit_mpi|cli_mpi_signal" --output-on-failure

# Prepares Fashion-MNIST once, then trains the CNN data-parallel on all cores (a new run in runs/demo
# each time: --replace removes the previous one).
demo: build
	@[ -f $(DATA)/manifest.json ] || $(BUILD)/crew prep fashion-mnist --out $(DATA)
	$(BUILD)/crew train $(MODEL) --data $(DATA) --run-dir $(RUN_DIR) --replace

# A GPT on text: the King James Bible from Debian's bible-kjv (public domain), as byte tokens, trains
# gpt_tiny data-parallel on all cores (about 6 minutes on 2), then continues a prompt with it.
GPT_DATA    ?= data/kjv
GPT_RUN_DIR ?= runs/demo-gpt
GPT_MODEL   ?= examples/gpt_tiny.json
demo-gpt: build
	@CREW_WITH_KJV=1 scripts/install-deps.sh
	@[ -f $(GPT_DATA)/manifest.json ] || { mkdir -p $(dir $(GPT_DATA)) && bible "Gen1:1-Rev22:21" > $(GPT_DATA).txt && \
	  $(BUILD)/crew prep text $(GPT_DATA).txt --seq-len 128 --out $(GPT_DATA); }
	$(BUILD)/crew train $(GPT_MODEL) --data $(GPT_DATA) --run-dir $(GPT_RUN_DIR) --replace --log-every 100
	$(BUILD)/crew sample $(GPT_MODEL) --weights $(GPT_RUN_DIR)/weights.safetensors --prompt "And God said" \
	  --tokens 400 --temperature 0.8

# The test suite under AddressSanitizer + UndefinedBehaviorSanitizer, and under ThreadSanitizer.
asan: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DCREW_SANITIZE=ON > /dev/null
	cmake --build build-asan -j $(JOBS)
	ctest --test-dir build-asan --output-on-failure -j $(JOBS)

tsan: deps
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Debug -DCREW_TSAN=ON > /dev/null
	cmake --build build-tsan -j $(JOBS)
	ctest --test-dir build-tsan --output-on-failure -j $(JOBS) -L threads

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz build-guard build-mpich
