# mk/dist.mk: the process group (kit/dist*.c, kit/buckets.c), its tests under mpirun, and the all-reduce benchmark.
#
# Only kit/dist.c includes <mpi.h>; it gets MPI's flags here (not globally), so the rest of the kit
# builds and links without MPI. Those objects sit in libkit.a like every kit object: a program that
# calls no pg_* function never pulls them in. A program that does links $(DIST_LIBS) after libkit.a.
#
#   make test-dist        the MPI tests (world 1..4 on this machine's cores, oversubscribed when needed)
#   make bench-allreduce  all-reduce bandwidth 1 KB..64 MB -> bench/results-allreduce.md

ifeq ($(HAVE_MPI),yes)
$(BUILD)/kit/dist.o: CPPFLAGS += $(MPI_CFLAGS) -DKIT_MPI
endif

DIST_LIBS = $(MPI_LIBS) $(if $(and $(HAVE_CUDA),$(HAVE_NCCL)),-lnccl)

DIST_TEST := $(BUILD)/tests/mpi_dist
BENCH_ALLREDUCE := $(BUILD)/bench/bench_allreduce

$(BUILD)/tests/mpi_%: tests/mpi_%.c $(KIT_LIB)
	@mkdir -p $(dir $@)
	$(say) LINK $@
	$(Q)$(CC) $(CPPFLAGS) $(MPI_CFLAGS) $(CFLAGS) $< -o $@ $(LDFLAGS) $(KIT_LIB) $(DIST_LIBS) $(LDLIBS)

$(BENCH_ALLREDUCE): bench/bench_allreduce.c $(KIT_LIB)
	@mkdir -p $(dir $@)
	$(say) LINK $@
	$(Q)$(CC) $(CPPFLAGS) $(MPI_CFLAGS) $(CFLAGS) $< -o $@ $(LDFLAGS) $(KIT_LIB) $(DIST_LIBS) $(LDLIBS)

.PHONY: test-dist bench-allreduce
HELP_TARGETS += test-dist bench-allreduce

ifeq ($(HAVE_MPI),yes)
ALL_TARGETS += $(DIST_TEST) $(BENCH_ALLREDUCE)
TEST_TARGETS += test-dist

test-dist: $(DIST_TEST)
	@tests/run-dist-tests.sh $(DIST_TEST)

# MPI backend on 2 ranks (the CPU machine); NCCL too when a GPU is usable (one rank per GPU).
bench-allreduce: $(BENCH_ALLREDUCE)
	@bench/run-allreduce.sh $(BENCH_ALLREDUCE) bench/results-allreduce.md
else
test-dist bench-allreduce:
	@echo "$@: skipped: Open MPI was not found (install libopenmpi-dev + openmpi-bin: make deps)"
endif
