# k3 - build, test, bench.  `make` builds bin/k3 (and bin/k3-expertd when present).
# Layout: common/ (both processes), coordinator/ (bin/k3), workers/ (expert library + bin/k3-expertd).
CC      ?= gcc
WERROR  ?= -Werror
OPT     ?= -O2
CFLAGS  ?= $(OPT) -g
CFLAGS  += -std=gnu11 -Wall -Wextra -Wshadow -Wpointer-arith -Wvla $(WERROR) \
           -ffp-contract=off -fopenmp -fno-strict-aliasing -I. $(EXTRA_CFLAGS)
LDLIBS  += -fopenmp -lmicrohttpd -ljansson -lmsgpackc -lnuma -lm -lrt -lpthread
BUILD   ?= build
BIN     ?= bin

# Per-file SIMD flags: only these files are compiled for AVX2 / AVX-512; the
# choice between them is made at run time (kernels_get).
AVX2_FLAGS   = -mavx2 -mfma
SHANI_FLAGS  = -msha -msse4.1 -mssse3
AVX512_FLAGS = -mavx512f -mavx512bw -mavx512dq -mavx512vl -mavx2 -mfma
# Open MPI (--mpi): only coordinator/experts_mpi.c includes mpi.h and only bin/k3 links libmpi.
# Evaluated when used (after scripts/ensure_deps.sh has installed libopenmpi-dev); Debian's
# paths when neither mpicc (openmpi-bin) nor pkg-config is there.
MPI_DIR      = /usr/lib/$(shell $(CC) -print-multiarch)/openmpi
MPI_CFLAGS   = $(shell pkg-config --cflags ompi-c 2>/dev/null || echo -I$(MPI_DIR)/include -I$(MPI_DIR)/include/openmpi)
MPI_LIBS     = $(shell pkg-config --libs ompi-c 2>/dev/null || echo -L$(MPI_DIR)/lib -lmpi)

COMMON_SRCS = $(sort $(wildcard common/*.c))
WORKER_SRCS = $(filter-out workers/expertd_main.c,$(sort $(wildcard workers/*.c)))
COORD_SRCS  = $(filter-out coordinator/main.c,$(sort $(wildcard coordinator/*.c)))
LIB_SRCS    = $(COMMON_SRCS) $(WORKER_SRCS) $(COORD_SRCS)
LIB_OBJS    = $(LIB_SRCS:%.c=$(BUILD)/%.o)
LIB         = $(BUILD)/libk3.a

UNIT_SRCS   = $(sort $(wildcard tests/unit/test_*.c))
UNIT_BINS   = $(UNIT_SRCS:tests/unit/%.c=$(BIN)/%)
BENCH_SRCS  = $(sort $(wildcard bench/*.c))
BENCH_BINS  = $(BENCH_SRCS:bench/%.c=$(BIN)/%)

PROGS = $(BIN)/k3 $(if $(wildcard workers/expertd_main.c),$(BIN)/k3-expertd)
# The expert server with fault injection compiled in (tests only: K3_EXPERTD=bin/k3-expertd-faults);
# the release bin/k3-expertd has none of it.
TEST_PROGS = $(if $(wildcard workers/expertd_main.c),$(BIN)/k3-expertd-faults)

.PHONY: all deps test unit asan fuzz bench bench-model bench-limits ladder demo readme-options clean
all: $(PROGS) $(TEST_PROGS) $(UNIT_BINS)

$(BUILD)/%.o: %.c $(wildcard common/*.h coordinator/*.h workers/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(if $(findstring _avx512,$<),$(AVX512_FLAGS),$(if $(findstring _avx2,$<),$(AVX2_FLAGS)))$(if $(findstring _shani,$<), $(SHANI_FLAGS))$(if $(findstring _mpi,$<), $(MPI_CFLAGS)) -c $< -o $@

$(LIB): $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BIN)/k3: $(BUILD)/coordinator/main.o $(LIB)
	@mkdir -p $(BIN)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS) $(MPI_LIBS)

$(BIN)/k3-expertd: $(BUILD)/workers/expertd_main.o $(LIB)
	@mkdir -p $(BIN)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/workers/expertd_main_faults.o: workers/expertd_main.c $(wildcard common/*.h coordinator/*.h workers/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DK3_FAULT_INJECTION -c $< -o $@

$(BIN)/k3-expertd-faults: $(BUILD)/workers/expertd_main_faults.o $(LIB)
	@mkdir -p $(BIN)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

$(BIN)/test_%: $(BUILD)/tests/unit/test_%.o $(LIB)
	@mkdir -p $(BIN)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS) $(WRAP_ALLOC)

# test_forward counts the engine's own allocations (its __wrap_ functions see every call the
# test and libk3.a make; libgomp's and libc's own are not theirs)
$(BIN)/test_forward: WRAP_ALLOC = -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=aligned_alloc,--wrap=posix_memalign

$(BIN)/bench_%: $(BUILD)/bench/bench_%.o $(LIB)
	@mkdir -p $(BIN)
	$(CC) $(CFLAGS) -o $@ $^ $(LDLIBS)

# Debian packages: scripts/ensure_deps.sh GROUP installs what scripts/debian-packages.txt lists
# and the machine lacks (as root), or prints the `sudo apt-get install` line and exits 2.
# `demo`, `test`, `fuzz` check first, then build in a sub-make (so a fresh machine never
# reaches the compiler without its headers). K3_SKIP_DEPS=1 skips the check.
deps:
	@scripts/ensure_deps.sh build

# The whole suite: unit tests, model gates, traps, bad-input corpus, tokenizer.
test:
	@scripts/ensure_deps.sh test
	$(MAKE) all
	tests/run.sh

# Unit tests only (used by the sanitizer run).
unit: $(UNIT_BINS)
	@for t in $(UNIT_BINS); do echo "== $$t"; OMP_WAIT_POLICY=$${OMP_WAIT_POLICY:-PASSIVE} $$t || exit 1; done

# ASan/UBSan build of everything in build-asan/, bin-asan/, then unit tests + a model gate.
asan:
	@scripts/ensure_deps.sh test
	$(MAKE) BUILD=build-asan BIN=bin-asan OPT=-O1 \
	  EXTRA_CFLAGS="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer" \
	  LDLIBS="-fsanitize=address,undefined $(LDLIBS)" unit bin-asan/k3 bin-asan/k3-expertd
	K3_BIN=bin-asan/k3 tests/asan_gate.sh

fuzz:
	@scripts/ensure_deps.sh fuzz
	tests/fuzz/run_fuzz.sh

bench: $(BENCH_BINS) $(PROGS)
	scripts/bench.sh

# The real-width benchmark model (not committed, ~15 GB): K3's widths, 6 layers, 32 experts.
bench-model:
	test -f models-big/rw6/config.json || /usr/bin/python3 scripts/gen_model.py --preset realwidth --out models-big/rw6

# The engine against this machine's ceilings (read bandwidth, FMA peak, device read rate)
# on the real-width model, one run; report in markdown on stdout (docs/PERFORMANCE.md).
bench-limits: $(BIN)/bench_kernels $(PROGS)
	scripts/bench_limits.sh

# The memory ladder on it (results into docs/PERFORMANCE.md).
ladder: $(PROGS) bench-model
	/usr/bin/python3 scripts/memory_ladder.py models-big/rw6 --workers 1 --gen 5 --md docs/PERFORMANCE.md

# Bundled small model: generate (deterministically) and run it.
demo:
	@scripts/ensure_deps.sh build
	$(MAKE) $(PROGS)
	$(BIN)/k3 tests/models/m13 --prompt "The expert servers" --gen 24

# The README's options table is generated from the flag table in coordinator/cli.c.
readme-options: $(BIN)/k3
	/usr/bin/python3 scripts/readme_options.py $(BIN)/k3

clean:
	rm -rf build build-asan bin bin-asan
