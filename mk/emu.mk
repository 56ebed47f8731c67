# mk/emu.mk: the CUDA emulation build (issue 12). The kit's .cu files (and lesson 01's kernel) compiled by
# the host C++ compiler against kit/cuda/emu/, so every kernel and cuBLAS call runs on a machine without a
# GPU. What it models and what it does not: kit/cuda/README.md.
#
#   make EMU=1 [target]   builds into build-emu[-debug][-clang]; the CUDA backend there is the emulator
#                         (device name "cuda-emu"), always with AddressSanitizer + UBSan, never NCCL
#   make test-emu         (part of make test, GPU or not) builds the emulation variant and runs the
#                         emulator's own test (tests/test_emu.cu), tests/test_cuda.c, lesson 01's
#                         kernel test (solution passes, starter fails), and one epoch of lessons 02 and 03's
#                         programs on the emulated CUDA path against the CPU (tests/emu-lessons.sh)
#
# Included from the Makefile right after mk/config.mk: with EMU=1 it replaces config.mk's CUDA settings
# before mk/kit.mk and mk/lessons.mk read them.

EMU_BUILD := build-emu$(if $(filter 1,$(DEBUG)),-debug)$(if $(findstring clang,$(CC)),-clang)
EMU_CXX := $(if $(findstring clang,$(CC)),clang++,g++)
# Handed to tests/grade.py (mk/lessons.mk): a test skipped for want of a GPU is run again in the emulator.
GRADE_EMU_ARGS := --emu-build $(EMU_BUILD)

ifeq ($(EMU),1)
  BUILD := $(EMU_BUILD)
  HAVE_CUDA := emu
  HAVE_NCCL :=
  # config.mk adds -I$(CUDA_HOME)/include: this puts the emulator's cuda_runtime.h and cublas_v2.h there.
  CUDA_HOME := kit/cuda/emu
  CUDA_LIBS := -lstdc++
  # The emulator is a correctness tool: AddressSanitizer catches a kernel's out-of-bounds access of device
  # memory (heap) or of a __shared__ array (a static), the job compute-sanitizer does on a GPU.
  EMU_SAN := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
  CPPFLAGS += -DKIT_CUDA_EMU
  # clang cannot vectorise ops_cpu.c's `omp simd` loops under ASan and says so as a warning (-Werror).
  CFLAGS += $(EMU_SAN) $(if $(findstring clang,$(CC)),-Wno-pass-failed)
  # Linked by the C driver: clang must be told that C++ objects need UBSan's C++ part.
  LDFLAGS += $(EMU_SAN) $(if $(findstring clang,$(CC)),-fsanitize-link-c++-runtime)
  NVCC := $(EMU_CXX) -x c++
  NVCCFLAGS := -std=c++17 $(OPT) -Ikit/cuda/emu/include -I. -DKIT_CUDA_EMU $(OPENBLAS_CFLAGS) $(EMU_SAN) \
               -Wall -Wextra -Werror -Wno-unused-parameter
  # Learner code: warnings shown, not fatal (mk/lessons.mk's own definition speaks nvcc).
  override LEARNER_NVCCFLAGS = $(filter-out -Werror,$(NVCCFLAGS)) -Wno-error

  $(BUILD)/kit/cuda/emu/cuda_emu.o: kit/cuda/emu/cuda_emu.cc kit/cuda/emu/cuda_emu.h
	@mkdir -p $(dir $@)
	$(say) CXX $<
	$(Q)$(NVCC) $(NVCCFLAGS) -c $< -o $@
  $(BUILD)/libkit.a: $(BUILD)/kit/cuda/emu/cuda_emu.o

  # The emulator's own test (tests/test_emu.cu): CUDA source, so it is built like the kit's .cu files.
  $(BUILD)/tests/test_emu: tests/test_emu.cu $(wildcard kit/*.h kit/cuda/*.h kit/cuda/emu/*.h) $(BUILD)/libkit.a
	@mkdir -p $(dir $@)
	$(say) LINK $@
	$(Q)$(NVCC) $(NVCCFLAGS) -DKIT_CUDA $(CMOCKA_CFLAGS) -c $< -o $@.o
	$(Q)$(CC) $@.o -o $@ $(LDFLAGS) $(BUILD)/libkit.a $(CMOCKA_LIBS) $(LDLIBS)

  ifeq ($(MAKELEVEL),0)
    $(info config: CUDA         emulated on the CPU (EMU=1, kit/cuda/emu): build folder $(BUILD), ASan + UBSan)
  endif
else
  TEST_TARGETS += test-emu
endif
HELP_TARGETS += test-emu

# Lesson 01's CUDA kernel test, run alone from the solution's and the starter's autograder.
EMU_SGD_TEST := test_sgd_cuda_kernel
EMU_LESSON01 := $(firstword $(filter 01-%,$(patsubst solutions/%/,%,$(wildcard solutions/[0-9][0-9]-*/))))

.PHONY: test-emu
test-emu:
	@$(MAKE) --no-print-directory EMU=1 $(EMU_BUILD)/tests/test_emu $(EMU_BUILD)/tests/test_cuda \
	  $(if $(EMU_LESSON01),$(EMU_BUILD)/grade-solutions/test_lesson01 $(EMU_BUILD)/grade-lessons/test_lesson01)
	@tests/run-tests.sh $(EMU_BUILD)/tests/test_emu $(EMU_BUILD)/tests/test_cuda
ifneq ($(EMU_LESSON01),)
	@echo "== lesson 01's CUDA kernel in the emulator: the solution must pass, the starter must fail"
	@$(EMU_BUILD)/grade-solutions/test_lesson01 --only $(EMU_SGD_TEST) >$(EMU_BUILD)/sgd-solution.log 2>&1 || \
	  { cat $(EMU_BUILD)/sgd-solution.log; echo "test-emu: solutions/$(EMU_LESSON01)'s kernel FAILS in the emulator"; exit 1; }
	@if $(EMU_BUILD)/grade-lessons/test_lesson01 --only $(EMU_SGD_TEST) >$(EMU_BUILD)/sgd-starter.log 2>&1 || \
	    ! grep -q '^\[  FAILED  \] 1 test' $(EMU_BUILD)/sgd-starter.log; then \
	  cat $(EMU_BUILD)/sgd-starter.log; echo "test-emu: the starter's kernel must FAIL (not pass, not crash)"; exit 1; fi
	@echo "== the lesson programs' CUDA path in the emulator, one epoch, against the CPU (tests/emu-lessons.sh)"
	@$(MAKE) --no-print-directory EMU=1 $(EMU_BUILD)/solutions/02-data-parallel/train \
	  $(if $(filter yes,$(HAVE_MPI)),$(EMU_BUILD)/solutions/03-ddp/train) \
	  $(if $(HAVE_PNG),$(EMU_BUILD)/solutions/06-inference/train)
	@tests/emu-lessons.sh $(BUILD) $(EMU_BUILD)
	@echo "test-emu: ok"
endif
