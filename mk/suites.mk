# mk/suites.mk: test suites beyond the unit tests: the numeric suites under other OpenBLAS kernels (and the
# DDP drift tool), then the checkpoint checks (reader, PyTorch interchange, fuzzing, speed, kill drill).

# ======================================================================== numerics

# The numeric suites under other OpenBLAS kernels, and the DDP drift measurement.
#
#   make test-blas-kernels   kit numeric tests + solution autograders under the other OpenBLAS kernels this
#                            CPU supports (tests/run-blas-kernels.sh; part of `make test`)
#   make ddp-drift           DDP vs one process, step by step (bench/ddp_drift.c; DRIFT_ARGS="--steps 500 ...")

DDP_DRIFT := $(BUILD)/bench/ddp_drift

$(DDP_DRIFT): bench/ddp_drift.c $(KIT_LIB)
	@mkdir -p $(dir $@)
	$(say) LINK $@
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $< -o $@ $(LDFLAGS) $(KIT_LIB) $(LDLIBS)

.PHONY: test-blas-kernels ddp-drift
ALL_TARGETS += $(DDP_DRIFT)
TEST_TARGETS += test-blas-kernels
HELP_TARGETS += test-blas-kernels ddp-drift

test-blas-kernels: $(KIT_TESTS) $(foreach l,$(LESSONS_GRADED),$(GRADE_SOLUTIONS_OUT)/test_lesson$(call lesson_num,$(l)))
	@tests/run-blas-kernels.sh $(BUILD)

ddp-drift: $(DDP_DRIFT)
	$(DDP_DRIFT) $(DRIFT_ARGS)

# ======================================================================== checkpoint checks

# Checkpoints (kit/ckpt.c): the checks beyond tests/test_ckpt.c (built by mk/kit.mk), and
# the tool lesson 04's extra checks compare checkpoints with (tests/lesson04/run-tests.sh, from mk/lessons.mk).
#
#   make test-ckpt-python   the numpy reader (tools/ckpt_read.py) and a kit checkpoint loaded into PyTorch
#                           (tools/torch_models.py's resnet9) giving the kit's eval logits; the PyTorch part is
#                           skipped, saying so, without torch; the whole target without numpy
#   make fuzz               libFuzzer (clang, ASan + UBSan) over ckpt_decode and the dataset readers,
#                           FUZZ_SECONDS each (default 60), corpus kept in tests/machinery/fuzz/corpus/
#   make fuzz-smoke         the same for 5 s each (part of make test when clang's libFuzzer is installed)
#   make bench-ckpt         save/load MB/s against a plain write + fsync of the same bytes, and the kill -9
#                           drill (DRILL_TRIALS saves killed at random moments) -> bench/results-ckpt.md

CKPT_EXPORT := $(BUILD)/tests/ckpt_torch_export
CKPT_COMPARE := $(BUILD)/tests/ckpt_compare
BENCH_CKPT := $(BUILD)/bench/bench_ckpt

$(CKPT_EXPORT) $(CKPT_COMPARE): $(BUILD)/tests/ckpt_%: tests/ckpt_%.c $(KIT_LIB)
	@mkdir -p $(dir $@)
	$(say) LINK $@
	$(Q)$(CC) $(CPPFLAGS) $(CFLAGS) $< -o $@ $(LDFLAGS) $(KIT_LIB) $(LDLIBS)

# bench_ckpt: the pattern rule of mk/extras.mk.

ALL_TARGETS += $(CKPT_EXPORT) $(CKPT_COMPARE) $(BENCH_CKPT)
TEST_TARGETS += test-ckpt-python fuzz-smoke
HELP_TARGETS += test-ckpt-python fuzz fuzz-smoke bench-ckpt
.PHONY: test-ckpt-python fuzz fuzz-smoke bench-ckpt

# The first of $(PYTHON) and Debian's own python3 that has numpy (a pyenv or venv python may lack it).
CKPT_PY = $(firstword $(foreach p,$(PYTHON) /usr/bin/python3,$(if $(shell $(p) -c 'import numpy' 2>/dev/null && echo y),$(p))))

test-ckpt-python: $(CKPT_EXPORT)
	@if [ -z "$(CKPT_PY)" ]; then echo "test-ckpt-python: skipped: numpy not found (python3-numpy: make deps)"; \
	else timeout --kill-after=5 300 $(CKPT_PY) tests/test_ckpt_torch.py $(CKPT_EXPORT); fi

# ---- fuzzing: the kit's C sources (no MPI, no CUDA) rebuilt with clang's coverage + sanitizers in build-fuzz/
FUZZ_CC ?= clang
FUZZ_SECONDS ?= 60
FUZZ_BUILD := build-fuzz
FUZZ_FLAGS := -fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1 -Wno-pass-failed \
              -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION  # CRCs accepted: see kit/ckpt.c crc_differs
FUZZ_KIT_C := $(filter-out kit/dist.c kit/dist_socket.c kit/buckets.c,$(KIT_C))  # no MPI in the fuzz build (dist_plan.c needs none)
FUZZ_OBJ := $(FUZZ_KIT_C:%.c=$(FUZZ_BUILD)/%.o)
FUZZ_TARGETS := $(FUZZ_BUILD)/fuzz_ckpt $(FUZZ_BUILD)/fuzz_data
.SECONDARY: $(FUZZ_OBJ)
HAVE_LIBFUZZER := $(shell printf 'int LLVMFuzzerTestOneInput(const char *d, long n){return 0;}\n' | \
                    $(FUZZ_CC) -x c - -fsanitize=fuzzer -o /dev/null >/dev/null 2>&1 && echo yes)

$(FUZZ_BUILD)/kit/%.o: kit/%.c $(KIT_HEADERS)
	@mkdir -p $(dir $@)
	$(say) FUZZCC $<
	$(Q)$(FUZZ_CC) -I. $(OPENBLAS_CFLAGS) -std=c11 -D_GNU_SOURCE -fopenmp $(WARN) $(FUZZ_FLAGS) -fsanitize=fuzzer-no-link -c $< -o $@

$(FUZZ_BUILD)/fuzz_%: tests/machinery/fuzz/fuzz_%.c $(FUZZ_OBJ)
	$(say) FUZZLD $@
	$(Q)$(FUZZ_CC) -I. -std=c11 -D_GNU_SOURCE $(WARN) $(FUZZ_FLAGS) -fsanitize=fuzzer $^ -o $@ -fopenmp $(OPENBLAS_LIBS) -lz -lm -lpthread

# Runs each target on a scratch copy of its corpus (new inputs are kept only by `make fuzz`, which merges
# them back minimised); prints executions and crashes. A crash leaves crash-* in build-fuzz/ and fails.
define fuzz_run
	@set -e; for t in ckpt data; do \
	  work=$(FUZZ_BUILD)/corpus-$$t; rm -rf $$work; mkdir -p $$work; cp tests/machinery/fuzz/corpus/$$t/* $$work/ 2>/dev/null || true; \
	  echo "fuzz_$$t: $(1) s"; \
	  ASAN_OPTIONS=detect_leaks=1 $(FUZZ_BUILD)/fuzz_$$t $$work -max_total_time=$(1) -max_len=65536 \
	    -artifact_prefix=$(FUZZ_BUILD)/crash-$$t- -print_final_stats=1 2>$(FUZZ_BUILD)/fuzz_$$t.log \
	    || { tail -n 40 $(FUZZ_BUILD)/fuzz_$$t.log; echo "fuzz_$$t: CRASH (input in $(FUZZ_BUILD)/crash-$$t-*)"; exit 1; }; \
	  execs=$$(sed -n 's/^stat::number_of_executed_units: *//p' $(FUZZ_BUILD)/fuzz_$$t.log); \
	  echo "fuzz_$$t: $$execs executions, 0 crashes, corpus $$(ls $$work | wc -l) inputs"; \
	  if [ "$(2)" = merge ]; then $(FUZZ_BUILD)/fuzz_$$t -merge=1 tests/machinery/fuzz/corpus/$$t $$work 2>/dev/null; fi; \
	done
endef

ifeq ($(HAVE_LIBFUZZER),yes)
fuzz: $(FUZZ_TARGETS)
	$(call fuzz_run,$(FUZZ_SECONDS),merge)
fuzz-smoke: $(FUZZ_TARGETS)
	$(call fuzz_run,5,)
else
fuzz fuzz-smoke:
	@echo "$@: skipped: $(FUZZ_CC) with libFuzzer not found (Debian: clang; make deps)"
endif

# ---- speed and the kill -9 drill
DRILL_TRIALS ?= 200
bench-ckpt: $(BENCH_CKPT)
	$(BENCH_CKPT) --out bench/results-ckpt.md --trials $(DRILL_TRIALS)

# ---- lesson 04's extra checks (mk/lessons.mk runs tests/lesson04/run-tests.sh AUTOGRADER PROGRAM) also get
# the comparison tool, as their third argument.
ifneq ($(filter 04-checkpoint,$(LESSONS_GRADED)),)
test-lesson04: $(CKPT_COMPARE)
endif
ifneq ($(filter 05-syncbn,$(LESSONS_GRADED)),)
test-lesson05: $(CKPT_COMPARE)
endif
# lesson 08's checkpoint checks (tests/lesson08/ckpt-tests.sh) compare files and evaluate them with lesson 06.
ifneq ($(filter 08-pipeline,$(LESSONS_GRADED)),)
test-lesson08: $(CKPT_COMPARE) $(if $(filter 06-inference,$(LESSONS_GRADED)),$(BUILD)/solutions/06-inference/train)
endif
# lesson 09's sharded-checkpoint checks (tests/lesson09/ckpt-tests.sh) too.
ifneq ($(filter 09-zero,$(LESSONS_GRADED)),)
test-lesson09: $(CKPT_COMPARE) $(if $(filter 06-inference,$(LESSONS_GRADED)),$(BUILD)/solutions/06-inference/train)
endif
# lesson 10's extra checks compare one step of --accumulate K with more ranks (checkpoints) and --precision fp32
# with lesson 03's program.
ifneq ($(filter 10-precision,$(LESSONS_GRADED)),)
test-lesson10: $(CKPT_COMPARE) $(BUILD)/solutions/03-ddp/train
endif
# lesson 10's PyTorch references (tests/lesson10/fixtures: rounding cases, GradScaler's scales) regenerated and
# compared with the committed files; skipped, saying why, without torch (run-tests.sh runs it too).
.PHONY: torch-check-lesson10
HELP_TARGETS += torch-check-lesson10
torch-check-lesson10:
	@timeout --kill-after=5 300 python3 tests/lesson10/make-fixture.py --check

# ======================================================================== lesson 11 against PyTorch

# Lesson 11's tensor parallelism against PyTorch's (tests/lesson11/torch/torch_tp.py): the same resnet9, the same start
# and the same batches, k SGD steps through lesson 11's solution (TP=2, and a 2 x 2 tensor x data grid, under
# mpirun) and through torch.distributed.tensor.parallel's ColwiseParallel / RowwiseParallel on gloo (2 and 4
# processes), both against one process of each. Part of `make test`; skipped, saying why, without PyTorch.
#
#   make test-lesson11-torch

TP_EXPORT := $(BUILD)/tests/lesson11/torch/tp_export
# The first of $(PYTHON) and Debian's own python3 that has torch (the test says so when it lacks numpy).
TORCH_PY = $(firstword $(foreach p,$(PYTHON) /usr/bin/python3,$(if $(shell $(p) -c 'import torch' 2>/dev/null && echo y),$(p))))

.PHONY: test-lesson11-torch
HELP_TARGETS += test-lesson11-torch
TEST_TARGETS += test-lesson11-torch
ifneq ($(filter 11-tensor,$(LESSONS_BUILDABLE)),)
# tp_export links lesson 11's solution (tp.c, and lesson 03's sources it uses), as its program does, less train.c.
$(TP_EXPORT): tests/lesson11/torch/tp_export.c $(BUILD)/solutions/11-tensor/obj/tp.o \
              $(call lesson_uses_obj,11-tensor,$(BUILD)/solutions/11-tensor/obj) $(KIT_LIB)
	@mkdir -p $(@D)
	$(say) LINK $@
	$(Q)$(CC) $(CPPFLAGS) $(MPI_CFLAGS) $(CFLAGS) $(filter %.c %.o,$^) -o $@ $(LDFLAGS) $(KIT_LIB) $(DIST_LIBS) $(LDLIBS)
ALL_TARGETS += $(TP_EXPORT)

test-lesson11-torch: $(TP_EXPORT)
	@if [ -z "$(TORCH_PY)" ]; then echo "test-lesson11-torch: skipped: PyTorch not installed (pip install torch)"; \
	else timeout --kill-after=5 600 $(TORCH_PY) tests/lesson11/torch/torch_tp.py $(TP_EXPORT); fi
else
test-lesson11-torch:
	@echo "test-lesson11-torch: skipped: lesson 11 needs $(NEEDS_PACKAGE_mpi) (make deps)"
endif
