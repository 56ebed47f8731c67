# mk/scaleout.mk: scale-out infrastructure: Slurm batch scripts against a local Slurm,
# two hosts on one machine (network namespaces), and the scaling study.
#
#   make test-scaleout     tests/scale-out/: torchrun-style env from Slurm's (always), the batch scripts under a
#                          real Slurm started here (2 slurmd), 2 hosts x 2 ranks across network namespaces equal
#                          to 1 host x 4 ranks; each part skipped with its reason (not root, no Slurm, no netns)
#   make bench-scaling     strong/weak scaling over 1-8 ranks, bucket size, shared memory vs TCP between
#                          namespaces -> bench/results-scaling.md + bench/figures/scaling-*.csv, then the plots
#   make plot-scaling      bench/figures/scaling-*.csv -> bench/figures/scaling-*.png (also part of `make plot`)
#   make slurm-up / slurm-down   a local Slurm (SLURM_NODES=2) in $(BUILD)/slurm to try scripts/slurm/*.sbatch
#   make test-torchrun     lesson 07's program under the real torchrun (standalone, c10d and static rendezvous;
#                          a worker killed, the group restarted and resumed bit for bit); skipped with its reason
#                          when `python3 -c 'import torch'` fails
#   make stress-multirank  lessons 03, 04 and 07's multi-rank extra tests (tests/lessonNN/run-tests.sh), 3 at a
#                          time, STRESS_ROUNDS rounds (default 5): the failures counted (not part of `make test`)
#
# The program the tests and the study drive: SCALEOUT_PROGRAM (needs --checkpoint-dir/--resume: lesson 04 or
# later), SCALING_PROGRAM (needs --bucket-mb and the DDP summary lines: lesson 03 or later).
# SCALEOUT_ENV_PROGRAM: a program with the torchrun-style bootstrap, also started without mpirun (srun --mpi=none
# + torchrun's variables; 4 processes across the namespaces): lesson 07's solution once it is in the tree.

SCALEOUT_PROGRAM ?= $(BUILD)/solutions/04-checkpoint/train
SCALING_PROGRAM ?= $(BUILD)/solutions/03-ddp/train
SCALEOUT_ENV_PROGRAM ?= $(if $(wildcard solutions/07-scale-out/lesson.mk),$(BUILD)/solutions/07-scale-out/train)
SLURM_DIR ?= $(BUILD)/slurm
SLURM_NODES ?= 2
SCALEOUT_SCRIPTS := scripts/slurm/*.sh scripts/netns-cluster.sh scripts/netns-rsh.sh tests/scale-out/*.sh \
                    bench/run-scaling.sh bench/plot-scaling.sh

.PHONY: test-scaleout bench-scaling plot-scaling slurm-up slurm-down test-torchrun stress-multirank
TEST_TARGETS += test-scaleout test-torchrun
HELP_TARGETS += test-scaleout bench-scaling plot-scaling slurm-up slurm-down test-torchrun stress-multirank

ifeq ($(HAVE_MPI),yes)
test-scaleout: $(SCALEOUT_PROGRAM) $(CKPT_COMPARE) $(SCALEOUT_ENV_PROGRAM)
	@if command -v shellcheck >/dev/null 2>&1; then shellcheck -x $(SCALEOUT_SCRIPTS) && \
	  echo "ok   scale-out: shellcheck clean"; else echo "skip scale-out: shellcheck not installed"; fi
	@tests/scale-out/torchrun-env.sh
	@tests/scale-out/slurm-port-race.sh
	@SCALEOUT_ENV_PROGRAM=$(SCALEOUT_ENV_PROGRAM) tests/scale-out/slurm.sh $(SCALEOUT_PROGRAM) $(CKPT_COMPARE)
	@SCALEOUT_ENV_PROGRAM=$(SCALEOUT_ENV_PROGRAM) tests/scale-out/netns.sh $(SCALEOUT_PROGRAM) $(CKPT_COMPARE)
else
test-scaleout:
	@tests/scale-out/torchrun-env.sh
	@echo "test-scaleout: Slurm and netns parts skipped: Open MPI was not found (make deps)"
endif

ifeq ($(HAVE_MPI),yes)
test-torchrun: $(BUILD)/solutions/07-scale-out/train $(CKPT_COMPARE)
	@tests/scale-out/torchrun.sh $(BUILD)/solutions/07-scale-out/train $(CKPT_COMPARE)

STRESS_ROUNDS ?= 5
stress-multirank: $(foreach n,03 04 07,$(BUILD)/grade-solutions/test_lesson$(n)) $(BUILD)/solutions/03-ddp/train \
                  $(BUILD)/solutions/04-checkpoint/train $(BUILD)/solutions/07-scale-out/train $(CKPT_COMPARE)
	@tests/scale-out/stress-multirank.sh $(BUILD) $(STRESS_ROUNDS)
else
test-torchrun stress-multirank:
	@echo "$@: skipped: Open MPI was not found (make deps)"
endif

bench-scaling: $(SCALING_PROGRAM)
	@bench/run-scaling.sh $(SCALING_PROGRAM)
	@$(MAKE) --no-print-directory plot-scaling

plot-scaling:
	@bench/plot-scaling.sh bench/figures
plot: plot-scaling

slurm-up:
	@scripts/slurm/local-cluster.sh start $(SLURM_DIR) $(SLURM_NODES)
slurm-down:
	@scripts/slurm/local-cluster.sh stop $(SLURM_DIR)

# ======================================================================== lesson 07's ring against MPI_Allreduce

# Lesson 07's ring all-reduce (solutions/07-scale-out/ring.c) measured against MPI_Allreduce.
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
