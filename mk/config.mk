# mk/config.mk: find the toolchain and libraries, and set the flags. Prints one line per item (once, at the
# top level). Every probe checks that the thing really works (headers AND library): no false positives.

CC ?= cc
ifeq ($(origin CC),default)
  CC := gcc
endif

# Where objects go: one folder per configuration, so a sanitizer build never mixes with a normal one:
# build[-cpu|-san][-debug][-clang]. SANITIZE=1 builds CPU-only (ASan and the CUDA runtime do not mix).
ifeq ($(SANITIZE),1)
  NO_CUDA := 1
endif
BUILD := build$(if $(filter 1,$(SANITIZE)),-san,$(if $(filter 1,$(NO_CUDA)),-cpu))$(if $(filter 1,$(DEBUG)),-debug)$(if $(findstring clang,$(CC)),-clang)

# Links a tiny program with the given flags; prints "yes" when it builds.
try_link = $(shell printf '$(1)\nint main(void){$(2);return 0;}\n' | \
             $(CC) -x c - -o /dev/null $(3) >/dev/null 2>&1 && echo yes)

# ---- OpenBLAS (CPU GEMM)
OPENBLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null)
OPENBLAS_LIBS := $(or $(shell pkg-config --libs openblas 2>/dev/null),-lopenblas)
HAVE_OPENBLAS := $(call try_link,#include <cblas.h>,cblas_sgemm(CblasRowMajor,CblasNoTrans,CblasNoTrans,0,0,0,0,0,0,0,0,0,0,0),$(OPENBLAS_CFLAGS) $(OPENBLAS_LIBS))

# ---- cmocka (tests)
CMOCKA_CFLAGS := $(shell pkg-config --cflags cmocka 2>/dev/null)
CMOCKA_LIBS := $(or $(shell pkg-config --libs cmocka 2>/dev/null),-lcmocka)
HAVE_CMOCKA := $(call try_link,#include <stdarg.h>\n#include <stddef.h>\n#include <stdint.h>\n#include <setjmp.h>\n#include <cmocka.h>,_cmocka_run_group_tests(0,0,0,0,0),$(CMOCKA_CFLAGS) $(CMOCKA_LIBS))

# ---- zlib (gzip datasets, CRC32)
HAVE_ZLIB := $(call try_link,#include <zlib.h>,crc32(0,0,0),-lz)

# ---- oneDNN (Debian: libdnnl-dev): the CPU's real bf16 GEMMs (kit/cpu_bf16.c, on AMX or AVX512-BF16). Optional:
# without it the CPU's bf16 is lesson 10's emulation, and the programs say why.
HAVE_DNNL := $(call try_link,#include <oneapi/dnnl/dnnl.h>,dnnl_version(),-ldnnl)

# ---- Open MPI (lessons 03+)
MPICC := $(shell command -v mpicc 2>/dev/null)
ifneq ($(MPICC),)
  MPI_CFLAGS := $(shell $(MPICC) --showme:compile 2>/dev/null)
  MPI_LIBS := $(shell $(MPICC) --showme:link 2>/dev/null)
  HAVE_MPI := $(call try_link,#include <mpi.h>,MPI_Init(0,0),$(MPI_CFLAGS) $(MPI_LIBS))
endif
MPIRUN := $(shell command -v mpirun 2>/dev/null)

# ---- CUDA + cuBLAS (the GPU backend): nvcc on PATH or in /usr/local/cuda
NVCC := $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))
CUDA_ARCH ?= 80 90
ifneq ($(NO_CUDA),1)
  ifneq ($(NVCC),)
    CUDA_HOME := $(abspath $(dir $(NVCC))..)
    CUDA_LIBDIR := $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib $(CUDA_HOME)/targets/x86_64-linux/lib))
    CUDA_LIBS := -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcublas -lcudart -lstdc++
    HAVE_CUDA := $(call try_link,#include <cuda_runtime.h>\n#include <cublas_v2.h>,cublasHandle_t h; cublasCreate(&h),-I$(CUDA_HOME)/include $(CUDA_LIBS))
    HAVE_NCCL := $(call try_link,#include <nccl.h>,ncclComm_t c; ncclCommDestroy(c),-I$(CUDA_HOME)/include $(CUDA_LIBS) -lnccl)
    # cuDNN 8 or 9 (optional): the convolutions on the GPU (kit/cuda/conv_cudnn.cu); without it, im2col + cuBLAS.
    # The toolkit's folders, else the wheel PyTorch brings (nvidia-cudnn-cu*), which a GPU image with PyTorch has
    # (it ships libcudnn.so.9 with no unversioned link, hence -l:).
    CUDNN_HOME := $(or $(if $(wildcard $(CUDA_HOME)/include/cudnn.h),$(CUDA_HOME)),$(shell python3 -c \
                    'import nvidia.cudnn as m; print(m.__path__[0])' 2>/dev/null))
    CUDNN_LIBDIR := $(firstword $(dir $(wildcard $(CUDNN_HOME)/lib64/libcudnn.so.[89] $(CUDNN_HOME)/lib/libcudnn.so.[89])))
    CUDNN_LIBS := -L$(CUDNN_LIBDIR) -Wl,-rpath,$(CUDNN_LIBDIR) -l:$(notdir $(firstword $(wildcard $(CUDNN_LIBDIR)libcudnn.so.[89])))
    HAVE_CUDNN := $(if $(CUDNN_LIBDIR),$(call try_link,#include <cudnn.h>,cudnnHandle_t h; cudnnCreate(&h),-I$(CUDNN_HOME)/include -I$(CUDA_HOME)/include $(CUDNN_LIBS) $(CUDA_LIBS)))
  endif
endif

yesno = $(if $(1),yes,no)
ifeq ($(MAKELEVEL),0)
  ifeq ($(filter clean help,$(MAKECMDGOALS)),)
    $(info config: compiler     $(CC) ($(shell $(CC) -dumpversion)); build folder $(BUILD))
    $(info config: OpenBLAS     $(call yesno,$(HAVE_OPENBLAS)))
    $(info config: cmocka       $(call yesno,$(HAVE_CMOCKA)))
    $(info config: zlib         $(call yesno,$(HAVE_ZLIB)))
    $(info config: Open MPI     $(call yesno,$(HAVE_MPI))$(if $(MPICC), ($(MPICC))))
    $(info config: CUDA+cuBLAS  $(if $(filter 1,$(NO_CUDA)),off (NO_CUDA=1),$(call yesno,$(HAVE_CUDA))$(if $(HAVE_CUDA), (nvcc $(NVCC), sm_$(CUDA_ARCH)))))
    $(info config: NCCL         $(call yesno,$(HAVE_NCCL)))
    $(info config: cuDNN        $(call yesno,$(HAVE_CUDNN))$(if $(HAVE_CUDNN), ($(CUDNN_LIBDIR)); the GPU's convolutions))
    $(info config: oneDNN       $(call yesno,$(HAVE_DNNL)) (the CPU's bf16 GEMMs, where it has AMX or AVX512-BF16))
    ifneq ($(HAVE_OPENBLAS)$(HAVE_ZLIB),yesyes)
      $(info config: missing packages: run `make deps` (or scripts/install-deps.sh))
    endif
  endif
endif

# ---- quiet build: one short line per file; V=1 shows the whole commands
ifeq ($(V),1)
  Q :=
  say := @:
else
  Q := @
  say := @printf '  %-5s %s\n'
endif

# ---- flags
WARN := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wno-unused-parameter
# _FORTIFY_SOURCE as Ubuntu's gcc turns it on by default (the GPU machines build with one): its checks and warnings
# (an unchecked freopen, say) then fail here first, not on a GPU machine's first build. Needs optimisation.
OPT := $(if $(filter 1,$(DEBUG)),-O0 -g,-O2 -g -march=x86-64-v2 -U_FORTIFY_SOURCE -D_FORTIFY_SOURCE=2)
comma := ,
SAN := $(if $(filter 1,$(SANITIZE)),-fsanitize=address$(comma)undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
CPPFLAGS += -I. $(OPENBLAS_CFLAGS) $(if $(HAVE_CUDA),-DKIT_CUDA -I$(CUDA_HOME)/include)
# KIT_NCCL: the process group's NCCL backend (kit/dist.c), built when CUDA and NCCL are both found.
CPPFLAGS += $(if $(and $(HAVE_CUDA),$(HAVE_NCCL)),-DKIT_NCCL)
# KIT_HAVE_DNNL: kit/cpu_bf16.c's oneDNN matmul (else it says the build has none).
CPPFLAGS += $(if $(HAVE_DNNL),-DKIT_HAVE_DNNL)
# The one link rule for programs that may call the process group (lessons with NEEDS := mpi, tests/mpi_*.c,
# the benchmarks): after libkit.a.
DIST_LIBS := $(MPI_LIBS) $(if $(and $(HAVE_CUDA),$(HAVE_NCCL)),-lnccl)
CFLAGS += -std=c11 -D_GNU_SOURCE -fopenmp $(OPT) $(WARN) $(SAN)
# clang cannot vectorise the `omp simd` loops (ops_cpu.c, winograd.c) under ASan and says so as a warning
# (-Wpass-failed, an error with -Werror): the loops stay correct, only scalar, in the sanitizer build.
CFLAGS += $(if $(and $(filter 1,$(SANITIZE)),$(findstring clang,$(CC))),-Wno-pass-failed)
LDFLAGS += -fopenmp $(SAN)
LDLIBS += $(OPENBLAS_LIBS) $(if $(HAVE_DNNL),-ldnnl) -lz -lm -lpthread $(if $(HAVE_CUDA),$(CUDA_LIBS))
LDLIBS += $(if $(and $(HAVE_CUDA),$(HAVE_CUDNN)),$(CUDNN_LIBS))
# KIT_CUDNN: kit/cuda/conv_cudnn.cu's cuDNN convolutions (else conv is im2col + cuBLAS only).
NVCCFLAGS := -O3 -std=c++17 -I. $(if $(HAVE_CUDNN),-DKIT_CUDNN -I$(CUDNN_HOME)/include) $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a)) \
             -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter -Werror all-warnings

# ======================================================================== the CUDA emulation build (EMU=1)

# The CUDA emulation build. The kit's .cu files (and lesson 01's kernel) compiled by
# the host C++ compiler against kit/cuda/emu/, so every kernel and cuBLAS call runs on a machine without a
# GPU. What it models and what it does not: kit/cuda/README.md.
#
#   make EMU=1 [target]   builds into build-emu[-debug][-clang]; the CUDA backend there is the emulator
#                         (device name "cuda-emu"), always with AddressSanitizer + UBSan, never NCCL
#   make test-emu         (part of make test, GPU or not) builds the emulation variant and runs the
#                         emulator's own test (tests/test_emu.cu), tests/test_cuda.c, lesson 01's
#                         kernel test (solution passes, starter fails), and one epoch of lessons 02 and 03's
#                         programs on the emulated CUDA path against the CPU (tests/emu-lessons.sh; also
#                         lessons 06 and 08, and 15 steps of lesson 09's stage 3)
#
# Included from the Makefile right after mk/config.mk: with EMU=1 it replaces config.mk's CUDA settings
# before mk/kit.mk and mk/lessons.mk read them.

EMU_BUILD := build-emu$(if $(filter 1,$(DEBUG)),-debug)$(if $(findstring clang,$(CC)),-clang)
EMU_CXX := $(if $(findstring clang,$(CC)),clang++,g++)
# test-emu's builds on every core when make itself has no -j (`make test` runs each step without one: its
# emulation build would otherwise compile one file at a time); under make -jN they share its jobs instead.
EMU_JOBS = $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(shell nproc 2>/dev/null || echo 1))
# Handed to tests/grade.py (mk/lessons.mk): a test skipped for want of a GPU is run again in the emulator.
GRADE_EMU_ARGS := --emu-build $(EMU_BUILD)

ifeq ($(EMU),1)
  BUILD := $(EMU_BUILD)
  HAVE_CUDA := emu
  HAVE_NCCL :=
  # cuDNN's convolutions are emulated too (kit/cuda/emu/cudnn_emu.cc): nothing to link.
  HAVE_CUDNN := emu
  CUDNN_LIBS :=
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
  NVCCFLAGS := -std=c++17 $(OPT) -Ikit/cuda/emu/include -I. -DKIT_CUDA_EMU -DKIT_CUDNN $(OPENBLAS_CFLAGS) $(EMU_SAN) \
               -Wall -Wextra -Werror -Wno-unused-parameter
  # Learner code: warnings shown, not fatal (mk/lessons.mk's own definition speaks nvcc).
  override LEARNER_NVCCFLAGS = $(filter-out -Werror,$(NVCCFLAGS)) -Wno-error

  $(BUILD)/kit/cuda/emu/cuda_emu.o: kit/cuda/emu/cuda_emu.cc kit/cuda/emu/cuda_emu.h
	@mkdir -p $(dir $@)
	$(say) CXX $<
	$(Q)$(NVCC) $(NVCCFLAGS) -c $< -o $@
  $(BUILD)/kit/cuda/emu/cudnn_emu.o: kit/cuda/emu/cudnn_emu.cc kit/cuda/emu/cudnn_emu.h kit/cuda/emu/cuda_emu.h kit/ops_dims.h
	@mkdir -p $(dir $@)
	$(say) CXX $<
	$(Q)$(NVCC) $(NVCCFLAGS) -c $< -o $@
  $(BUILD)/libkit.a: $(BUILD)/kit/cuda/emu/cuda_emu.o $(BUILD)/kit/cuda/emu/cudnn_emu.o

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
# Everything test-emu runs, built in one go (one make, so that every core has work until the last link).
EMU_MPI = $(filter yes,$(HAVE_MPI))
EMU_PROGRAMS = $(EMU_BUILD)/solutions/02-data-parallel/train \
  $(if $(EMU_MPI),$(EMU_BUILD)/solutions/03-ddp/train $(EMU_BUILD)/solutions/08-pipeline/train) \
  $(if $(EMU_MPI),$(EMU_BUILD)/solutions/09-zero/train $(EMU_BUILD)/solutions/10-precision/train) \
  $(if $(and $(EMU_MPI),$(wildcard solutions/11-tensor/train.c)),$(EMU_BUILD)/solutions/11-tensor/train) \
  $(if $(HAVE_PNG),$(EMU_BUILD)/solutions/06-inference/train) \
  $(if $(EMU_MPI),$(EMU_BUILD)/tests/mpi_dist)

.PHONY: test-emu
test-emu:
	@$(MAKE) --no-print-directory $(EMU_JOBS) EMU=1 $(EMU_BUILD)/tests/test_emu $(EMU_BUILD)/tests/test_cuda $(EMU_BUILD)/tests/test_memstat \
	  $(if $(EMU_LESSON01),$(EMU_BUILD)/grade-solutions/test_lesson01 $(EMU_BUILD)/grade-lessons/test_lesson01) \
	  $(EMU_PROGRAMS)
	@tests/run-tests.sh $(EMU_BUILD)/tests/test_emu $(EMU_BUILD)/tests/test_cuda $(EMU_BUILD)/tests/test_memstat
ifneq ($(EMU_LESSON01),)
	@echo "== lesson 01's CUDA kernel in the emulator: the solution must pass, the starter must fail"
	@$(EMU_BUILD)/grade-solutions/test_lesson01 --only $(EMU_SGD_TEST) >$(EMU_BUILD)/sgd-solution.log 2>&1 || \
	  { cat $(EMU_BUILD)/sgd-solution.log; echo "test-emu: solutions/$(EMU_LESSON01)'s kernel FAILS in the emulator"; exit 1; }
	@if $(EMU_BUILD)/grade-lessons/test_lesson01 --only $(EMU_SGD_TEST) >$(EMU_BUILD)/sgd-starter.log 2>&1 || \
	    ! grep -q '^\[  FAILED  \] 1 test' $(EMU_BUILD)/sgd-starter.log; then \
	  cat $(EMU_BUILD)/sgd-starter.log; echo "test-emu: the starter's kernel must FAIL (not pass, not crash)"; exit 1; fi
	@echo "== the lesson programs' CUDA path in the emulator, one epoch, against the CPU (tests/emu-lessons.sh)"
	@tests/emu-lessons.sh $(BUILD) $(EMU_BUILD)
ifeq ($(HAVE_MPI),yes)
	@echo "== the process group's collectives in flight on emulated device buffers (MPI staging through the host)"
	@for c in reduce-scatter traffic pieces; do ASAN_OPTIONS=detect_leaks=0 scripts/launch.sh 3 $(EMU_BUILD)/tests/mpi_dist $$c \
	  --device cuda-emu --backend mpi --timeout 60 | grep '^PASS' || { echo "test-emu: mpi_dist $$c FAILS on cuda-emu"; exit 1; }; done
endif
	@echo "test-emu: ok"
endif
