# The workshop kit's one entry point. `make help` lists the targets.
#
#   make run                 install what is missing, build, get data, train lesson 01's solution
#   make test                build everything and run every test (kit, autograder on solutions and starters)
#   make test-quick          checking a setup: the kit's tests, two lessons graded, one short run per lesson
#   make grade [LESSON=NN]   grade your work in lessons/ (SOLUTIONS=1 grades solutions/, HINTS=full: exact calls)
#
# Build switches: NO_CUDA=1 (CPU-only even when nvcc is found), SANITIZE=1 (ASan + UBSan, CPU-only),
# CC=clang, CUDA_ARCH="80 90" (GPU architectures), DEBUG=1 (-O0 -g), EMU=1 (CUDA code in the CPU emulator,
# build-emu/; kit/cuda/README.md).

.DEFAULT_GOAL := all
SHELL := /bin/bash

# Six make files, each with one job, included in this order (later ones use what earlier ones define).
# A feature with build rules of its own adds them to the file whose job it is.
include mk/config.mk      # finds the compilers and libraries, sets the flags; EMU=1, the CUDA emulation build
include mk/kit.mk         # kit/ -> $(BUILD)/libkit.a, and the kit's tests (unit, CUDA, process group)
include mk/lessons.mk     # lessons (found by pattern), starters, the autograder, grading, lesson extras
include mk/extras.mk      # run, slides, plots, benchmarks
include mk/suites.mk      # numeric suites under other OpenBLAS kernels; checkpoint reader, interchange, fuzzing, drill
include mk/scaleout.mk    # scale-out: Slurm scripts + local Slurm, network-namespace hosts, scaling study, ring bench

# test-runs (mk/lessons.mk): each lesson's solution, one short run
QUICK_TARGETS := all check-docs test-kit grade-quick test-runs

.PHONY: all help clean test test-quick
all: $(ALL_TARGETS)

# Every test, in order, the build first and the documents next (a second); the first failure stops the run.
# tools/run_suite.py prints the steps with their measured times (tests/suite-times.tsv) before it starts, and
# "[i/n] target (about ...)" as it goes; what it measured this time lands in $(BUILD)/suite-times.tsv.
SUITE = @$(PYTHON) tools/run_suite.py --make "$(MAKE)" --times tests/suite-times.tsv --parallel all
test:
	$(SUITE) --record $(BUILD)/suite-times.tsv --name "make test" all check-docs $(filter-out check-docs,$(TEST_TARGETS))

# For a newcomer checking a setup: under 5 minutes on 2 cores (README); `make test` is what CI runs.
test-quick:
	$(SUITE) --record $(BUILD)/suite-times-quick.tsv --name "make test-quick" $(QUICK_TARGETS)

help:
	@sed -n 's/^#   //p' Makefile
	@echo "Other targets: $(sort $(HELP_TARGETS))"

clean:
	rm -rf build build-*
