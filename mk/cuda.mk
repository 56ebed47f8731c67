# mk/cuda.mk: the CUDA backend's tests and GPU benchmark.
#
#   make test-cuda            CUDA ops against the CPU ops (tests/test_cuda.c); skips cleanly without a GPU
#   make test-cuda-memcheck   the same under compute-sanitizer --tool memcheck (on a GPU machine)
#   make bench-gpu            resnet9 training throughput on one GPU beside PyTorch -> bench/results-gpu.md
#
# tests/test_cuda.c is built by mk/kit.mk like every tests/test_*.c (it compiles without CUDA too).

CUDA_TEST := $(BUILD)/tests/test_cuda
BENCH_GPU := $(BUILD)/bench/bench_gpu
COMPUTE_SANITIZER := $(or $(shell command -v compute-sanitizer 2>/dev/null),$(firstword $(wildcard $(CUDA_HOME)/bin/compute-sanitizer $(CUDA_HOME)/compute-sanitizer/compute-sanitizer)))

# Explicit rule (mk/dist.mk has a pattern rule for bench/bench_%; this one needs no MPI).
$(BENCH_GPU): bench/bench_gpu.c $(KIT_LIB)
	@mkdir -p $(dir $@)
	$(say) LINK $@
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $< -o $@ $(LDFLAGS) $(KIT_LIB) $(LDLIBS)

ALL_TARGETS += $(if $(HAVE_CUDA),$(BENCH_GPU))
TEST_TARGETS += test-cuda
HELP_TARGETS += test-cuda test-cuda-memcheck bench-gpu

.PHONY: test-cuda test-cuda-memcheck bench-gpu

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

bench-gpu: $(BENCH_GPU)
	python3 bench/torch_gpu.py --kit $(BENCH_GPU) --batch $(or $(BATCH),512) --out bench/results-gpu.md
