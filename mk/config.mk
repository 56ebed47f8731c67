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
OPT := $(if $(filter 1,$(DEBUG)),-O0 -g,-O2 -g -march=x86-64-v2)
comma := ,
SAN := $(if $(filter 1,$(SANITIZE)),-fsanitize=address$(comma)undefined -fno-omit-frame-pointer -fno-sanitize-recover=all)
CPPFLAGS += -I. $(OPENBLAS_CFLAGS) $(if $(HAVE_CUDA),-DKIT_CUDA -I$(CUDA_HOME)/include)
# KIT_NCCL: the process group's NCCL backend (kit/dist.c), built when CUDA and NCCL are both found.
CPPFLAGS += $(if $(and $(HAVE_CUDA),$(HAVE_NCCL)),-DKIT_NCCL)
# The one link rule for programs that may call the process group (lessons with NEEDS := mpi, tests/mpi_*.c,
# the benchmarks): after libkit.a.
DIST_LIBS := $(MPI_LIBS) $(if $(and $(HAVE_CUDA),$(HAVE_NCCL)),-lnccl)
CFLAGS += -std=c11 -D_GNU_SOURCE -fopenmp $(OPT) $(WARN) $(SAN)
LDFLAGS += -fopenmp $(SAN)
LDLIBS += $(OPENBLAS_LIBS) -lz -lm -lpthread $(if $(HAVE_CUDA),$(CUDA_LIBS))
NVCCFLAGS := -O3 -std=c++17 -I. $(foreach a,$(CUDA_ARCH),-gencode arch=compute_$(a),code=sm_$(a)) \
             -Xcompiler -Wall,-Wextra,-Werror,-Wno-unused-parameter -Werror all-warnings
