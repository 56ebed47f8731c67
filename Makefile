# The workshop kit's one entry point. `make help` lists the targets.
#
#   make run                 install what is missing, build, get data, train lesson 01's solution
#   make test                build everything and run every test (kit, autograder on solutions and starters)
#   make grade [LESSON=NN]   grade your work in lessons/ (SOLUTIONS=1 grades solutions/)
#
# Build switches: NO_CUDA=1 (CPU-only even when nvcc is found), SANITIZE=1 (ASan + UBSan, CPU-only),
# CC=clang, CUDA_ARCH="80 90" (GPU architectures), DEBUG=1 (-O0 -g), EMU=1 (CUDA code in the CPU emulator,
# build-emu/; kit/cuda/README.md).

.DEFAULT_GOAL := all
SHELL := /bin/bash

include mk/config.mk      # finds the compilers and libraries, prints what it found
include mk/emu.mk         # EMU=1: the CUDA emulation build (issue 12; must follow config.mk)
include mk/kit.mk         # builds kit/ into $(BUILD)/libkit.a and the kit's unit tests
-include mk/cuda.mk       # CUDA-only tests and benchmarks
-include mk/dist.mk       # the process group (MPI / NCCL) and its tests
-include mk/lessons.mk    # lessons, solutions, starters, the autograder, grading
-include mk/lesson03.mk   # lesson 03's multi-rank checks (world sizes 1-4, a killed rank)
-include mk/extras.mk     # run, slides, plots
-include mk/bench.mk      # CPU benchmark against PyTorch

.PHONY: all help clean test
all: $(ALL_TARGETS)

# Every test, in order; each part stops the run on failure.
test: all
	@for t in $(TEST_TARGETS); do $(MAKE) --no-print-directory $$t || exit 1; done
	@echo "make test: everything passed"

help:
	@sed -n 's/^#   //p' Makefile
	@echo "Other targets: $(sort $(HELP_TARGETS))"

clean:
	rm -rf build build-*
