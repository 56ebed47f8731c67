# mk/numerics.mk: the numeric suites under other OpenBLAS kernels, and the DDP drift measurement (issue 10).
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
