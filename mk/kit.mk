# mk/kit.mk: the kit library and its tests.
#
#   kit/*.c, kit/cuda/*.cu  -> $(BUILD)/libkit.a           (the .cu files when CUDA + cuBLAS are found)
#   tests/test_*.c          -> $(BUILD)/tests/test_*        cmocka, one binary per file
#   tests/mpi_*.c           -> $(BUILD)/tests/mpi_*         the process group's tests, run under mpirun
#
#   make test-kit             the layer check of kit/ (tools/include_graph.py --check: no include or call pointing
#                             up kit/README.md's layer order, no cycle), then every tests/test_*.c but the CUDA
#                             one, each with a time limit
#   make test-cuda            CUDA ops against the CPU ops (tests/test_cuda.c); skips cleanly without a GPU
#   make test-cuda-memcheck   the same under compute-sanitizer (memcheck, racecheck, synccheck; on a GPU machine)
#   make test-dist            the process group on world sizes 1..4 (oversubscribed when needed)
#
# Only kit/dist.c includes <mpi.h>: it alone gets MPI's flags, so the rest of the kit builds and links without
# MPI, and a program that calls no pg_* function never pulls dist.o out of libkit.a. A program that does links
# $(DIST_LIBS) (mk/config.mk) after libkit.a.

KIT_C := $(wildcard kit/*.c)
KIT_CU := $(if $(HAVE_CUDA),$(wildcard kit/cuda/*.cu))
KIT_OBJ := $(KIT_C:%.c=$(BUILD)/%.o) $(KIT_CU:%.cu=$(BUILD)/%.o)
KIT_LIB := $(BUILD)/libkit.a
KIT_HEADERS := $(wildcard kit/*.h kit/cuda/*.h)

ifeq ($(HAVE_MPI),yes)
$(BUILD)/kit/dist.o: CPPFLAGS += $(MPI_CFLAGS) -DKIT_MPI
endif

$(BUILD)/kit/%.o: kit/%.c $(KIT_HEADERS)
	@mkdir -p $(dir $@)
	$(say) CC $<
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(BUILD)/kit/cuda/%.o: kit/cuda/%.cu $(KIT_HEADERS)
	@mkdir -p $(dir $@)
	$(say) NVCC $<
	$(Q)$(NVCC) $(NVCCFLAGS) -DKIT_CUDA -c $< -o $@

$(KIT_LIB): $(KIT_OBJ)
	@rm -f $@
	$(say) AR $@
	$(Q)ar rcs $@ $^

# ---------------------------------------------------------------- unit tests (cmocka)
# tests/test_cuda.c compiles without CUDA too (its tests skip), so it is built like the others.
CUDA_TEST := $(BUILD)/tests/test_cuda
KIT_TESTS := $(filter-out $(CUDA_TEST),$(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/test_*.c)))

$(BUILD)/tests/test_%: tests/test_%.c tests/testutil.h tests/lowp_gemm_cases.h $(KIT_LIB)
	@mkdir -p $(dir $@)
	$(say) LINK $@
	$(Q)$(CC) $(CPPFLAGS) $(CMOCKA_CFLAGS) $(CFLAGS) $< -o $@ $(LDFLAGS) $(KIT_LIB) $(CMOCKA_LIBS) $(LDLIBS)

$(BUILD)/tests/mpi_%: tests/mpi_%.c $(KIT_LIB)
	@mkdir -p $(dir $@)
	$(say) LINK $@
	$(Q)$(CC) $(CPPFLAGS) $(MPI_CFLAGS) $(CFLAGS) $< -o $@ $(LDFLAGS) $(KIT_LIB) $(DIST_LIBS) $(LDLIBS)

DIST_TEST := $(BUILD)/tests/mpi_dist
COMPUTE_SANITIZER := $(or $(shell command -v compute-sanitizer 2>/dev/null),$(firstword $(wildcard $(CUDA_HOME)/bin/compute-sanitizer $(CUDA_HOME)/compute-sanitizer/compute-sanitizer)))

ALL_TARGETS += $(KIT_LIB) $(KIT_TESTS) $(CUDA_TEST) $(if $(filter yes,$(HAVE_MPI)),$(DIST_TEST))
TEST_TARGETS += test-kit test-cuda test-dist
HELP_TARGETS += test-kit test-cuda test-cuda-memcheck test-dist deps

.PHONY: kit test-kit test-cuda test-cuda-memcheck test-dist deps
kit: $(KIT_LIB)

test-kit: $(KIT_TESTS)
	@python3 tools/include_graph.py --check
	@tests/run-tests.sh $(KIT_TESTS)

test-cuda: $(CUDA_TEST)
	@tests/run-tests.sh $(CUDA_TEST)

# memcheck: out-of-bounds and misaligned accesses; racecheck: shared-memory races (the block
# reductions); synccheck: __syncthreads misuse. --error-exitcode makes any report fail the target.
# Kernels run ~10-100x slower under the tools: the test's shapes are small on purpose.
test-cuda-memcheck: $(CUDA_TEST)
	@if [ -z "$(COMPUTE_SANITIZER)" ]; then echo "compute-sanitizer not found (it ships with the CUDA toolkit)"; exit 1; fi
	@for tool in memcheck racecheck synccheck; do \
	  echo "== compute-sanitizer --tool $$tool $(CUDA_TEST)"; \
	  timeout --kill-after=10 1800 $(COMPUTE_SANITIZER) --tool $$tool --error-exitcode 1 $(CUDA_TEST) || exit 1; \
	done

ifeq ($(HAVE_MPI),yes)
test-dist: $(DIST_TEST)
	@tests/run-dist-tests.sh $(DIST_TEST)
else
test-dist:
	@echo "$@: skipped: Open MPI was not found (install libopenmpi-dev + openmpi-bin: make deps)"
endif

deps:
	scripts/install-deps.sh

# ---------------------------------------------------------------- round_lowp against PyTorch (lesson 10)
#   make test-lowp-torch   regenerates tests/fixtures/lowp.bin with the installed PyTorch (x.to(bfloat16 / float16)
#                          and back) and compares it byte for byte with the committed file that tests/test_lowp.c
#                          checks the kit against; skipped, saying so, where torch does not import
.PHONY: test-lowp-torch
TEST_TARGETS += test-lowp-torch
HELP_TARGETS += test-lowp-torch
test-lowp-torch:
	@if ! python3 -c 'import torch' 2>/dev/null; then echo "test-lowp-torch: skipped: PyTorch not found (pip install torch)"; \
	else timeout --kill-after=5 300 python3 tests/fixtures/make_lowp.py --check; fi
