# mk/ring.mk: lesson 07's ring all-reduce (solutions/07-scale-out/ring.c) measured against MPI_Allreduce.
#
#   make bench-ring      NP ranks (default "2 4"), 64 KB..16 MB, MPI over shared memory and over TCP
#                        -> bench/results-ring.md (with the machine and its load average)

RING_BENCH := $(BUILD)/bench/ring_allreduce
RING_SOURCES := solutions/07-scale-out/ring.c solutions/07-scale-out/bootstrap.c

ifneq ($(HAVE_MPI),)
$(RING_BENCH): bench/ring_allreduce.c $(RING_SOURCES) $(KIT_LIB) $(wildcard solutions/07-scale-out/*.h solutions/03-ddp/*.h)
	@mkdir -p $(dir $@)
	$(say) LINK $@
	$(Q)$(CC) $(CPPFLAGS) $(MPI_CFLAGS) $(CFLAGS) -Isolutions/07-scale-out bench/ring_allreduce.c $(RING_SOURCES) -o $@ \
	  $(LDFLAGS) $(KIT_LIB) $(DIST_LIBS) $(LDLIBS)
ALL_TARGETS += $(RING_BENCH)
endif

HELP_TARGETS += bench-ring
.PHONY: bench-ring
bench-ring: $(RING_BENCH)
	@bench/run-ring.sh $< bench/results-ring.md
