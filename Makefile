# Makefile - builds every program of the project and runs its tests.
#
#   make run      set up the bundled default data and train on it (GPU trainer
#                 when a GPU is present, the CPU trainer otherwise; builds only that)
#   make test     build and run all CPU tests (ends with "N passed, N failed")
#   make gputest  build and run the GPU tests (needs an NVIDIA GPU)
#   make all      build every program this machine can build
#   make setup    fetch and verify the vocab and the default corpus, tokenize it
#   make cuda-compile-check   compile every CUDA source (nvcc, no GPU needed)
#   make clean    remove build/
#   make build/PROGRAM        one program, e.g. build/train_gpt_cpu, build/train_gpt,
#                 build/tokenize, build/attn_probe, build/bench_attention
#
# Each folder adds its own programs and tests through its module.mk; this file
# holds the toolchain detection and the shared rules only.

SHELL := /bin/bash
CC ?= gcc
ifeq ($(origin CC),default)
CC := gcc
endif
BUILD := build
# x86-64-v3 = AVX2 + FMA (Haswell, Zen and later): the CPU model's matmul and
# softmax kernels are written for 8-lane float vectors and run ~2x slower on
# SSE-only x86-64-v2. A fixed level, not -march=native, so a given compiler makes
# the same code (and bit-identical results) on every machine that runs it.
# -fno-math-errno: no program here reads errno after a math call, and without it
# gcc cannot vectorise sqrtf (the CPU AdamW step runs 3x faster with it).
#
# CFLAGS, NVCCFLAGS and LDLIBS are the user's to set (make CFLAGS=-O1 ...); what
# the build itself needs (include path, language level, OpenMP, dependency
# files) is in BUILD_CFLAGS, BUILD_NVCCFLAGS and BUILD_LDLIBS, which `override`
# appends to whatever the user gave, so a user value never drops them. The
# per-object pinned flags in the module.mk files are appended the same way.
CFLAGS ?= -O3 -march=x86-64-v3 -fno-math-errno
BUILD_CFLAGS := -std=gnu11 -Wall -Wextra -Wno-unused-parameter -fopenmp -I. -MMD -MP
override CFLAGS += $(BUILD_CFLAGS)
BUILD_LDLIBS := -lm -fopenmp
override LDLIBS += $(BUILD_LDLIBS)
PYTHON ?= python3
# A Python that can import torch (Debian's python3-torch lives under /usr/bin/python3,
# which a pyenv or venv python3 earlier on PATH may hide). Empty if none.
TORCH_PYTHON ?= $(shell for p in python3 /usr/bin/python3; do $$p -c 'import torch' >/dev/null 2>&1 && { command -v $$p; break; }; done)

# ---- optional parts: detect, and say what was found and what is left out ----
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= $(if $(NVCC),$(patsubst %/bin/nvcc,%,$(NVCC)),/usr/local/cuda)
CUDA_INC_DIRS := $(CUDA_HOME)/include /usr/include /usr/include/x86_64-linux-gnu
CUDA_LIB_DIRS := $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib /usr/lib/x86_64-linux-gnu
find_header = $(firstword $(wildcard $(addsuffix /$(1),$(CUDA_INC_DIRS))))
find_lib = $(firstword $(wildcard $(addsuffix /lib$(1).so*,$(CUDA_LIB_DIRS))))
HAVE_NVCC := $(if $(NVCC),1,)
HAVE_CUBLAS := $(if $(and $(HAVE_NVCC),$(call find_header,cublasLt.h),$(call find_lib,cublasLt)),1,)
HAVE_CUDNN := $(if $(and $(HAVE_NVCC),$(call find_header,cudnn.h),$(call find_lib,cudnn)),1,)
HAVE_NCCL := $(if $(and $(HAVE_NVCC),$(call find_header,nccl.h),$(call find_lib,nccl)),1,)
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LDFLAGS := $(shell mpicc --showme:link 2>/dev/null)
HAVE_MPI := $(if $(MPI_LDFLAGS),1,)
HAVE_GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)

ifeq ($(MAKELEVEL),0)
ifeq ($(filter clean help,$(MAKECMDGOALS)),)
$(info [build] nvcc:   $(if $(HAVE_NVCC),found ($(NVCC)),not found: CUDA programs (train_gpt, GPU tests, benchmarks) are left out; install the CUDA toolkit))
$(info [build] cuBLAS: $(if $(HAVE_CUBLAS),found,not found: train_gpt is left out (its matmuls need cuBLASLt)))
$(info [build] cuDNN:  $(if $(HAVE_CUDNN),found: --attn cudnn (cuDNN's fused attention) enabled,not found: --attn cudnn is left out (a run asking for it stops with the fix); the other modes need no cuDNN))
$(info [build] NCCL:   $(if $(HAVE_NCCL),found: multi-GPU data parallelism enabled,not found: train_gpt is built for one GPU only))
$(info [build] MPI:    $(if $(HAVE_MPI),found: mpirun launch enabled,not found: multi-GPU launch through mpirun left out (the env-var launch still works with NCCL)))
$(info [build] GPU:    $(if $(HAVE_GPU),present,none on this machine: GPU tests are skipped; make run builds and runs the CPU trainer))
endif
endif

NVCC_ARCH ?= -gencode arch=compute_90a,code=sm_90a -gencode arch=compute_80,code=sm_80
NVCCFLAGS ?= -O3 --use_fast_math
# Recursive (=): NVCC_ARCH is read when a rule runs, so an object's own NVCC_ARCH (module.mk) applies.
BUILD_NVCCFLAGS = -std=c++17 $(NVCC_ARCH) -I. -Xcompiler -fopenmp -lineinfo --expt-relaxed-constexpr
override NVCCFLAGS += $(BUILD_NVCCFLAGS)

# Programs and tests each module registers (appended to by the module.mk files).
PROGRAMS :=
CUDA_PROGRAMS :=
CPU_TESTS :=
GPU_TESTS :=
CUDA_OBJECTS :=

include common/module.mk
include dataloader/module.mk
include attention/module.mk
include model/module.mk
include train/module.mk
include dev/module.mk
include tests/module.mk

.PHONY: all run test gputest setup clean help cuda-compile-check
.DEFAULT_GOAL := all

all: $(PROGRAMS) $(if $(HAVE_NVCC),$(CUDA_PROGRAMS))

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -MF $(@:.o=.d) -c $< -o $@

# Set-up: fetch and verify the vocab and default corpus, tokenize it.
setup: $(BUILD)/tokenize
	bash scripts/setup_data.sh

# `make run` builds only the programs it runs: the tokenize tool and the GPU trainer where a GPU,
# nvcc and cuBLAS are all present, the CPU trainer otherwise (compiling CUDA code that cannot run
# here would be most of its time). `make all` and `make test` still build and check the rest.
RUN_PROGRAMS := $(BUILD)/tokenize $(if $(and $(HAVE_GPU),$(HAVE_CUBLAS)),$(BUILD)/train_gpt,$(BUILD)/train_gpt_cpu)
run: setup $(RUN_PROGRAMS)
	bash scripts/run_default.sh

# The compile check CI relies on: every CUDA source builds with nvcc, no GPU needed.
cuda-compile-check:
ifeq ($(HAVE_NVCC),1)
	@$(MAKE) --no-print-directory $(CUDA_OBJECTS) $(CUDA_PROGRAMS) && echo "cuda_compile: 1 passed, 0 failed" || { echo "cuda_compile: 0 passed, 1 failed"; exit 1; }
else
	@echo "cuda_compile: nvcc not found, CUDA sources not compiled"; echo "0 passed, 0 failed"
endif

test: setup $(CPU_TESTS)
	@bash tests/run_tests.sh $(foreach t,$(CPU_TESTS),"$(t)") $(CPU_TEST_COMMANDS) "$(MAKE) --no-print-directory cuda-compile-check"

gputest: $(GPU_TESTS)
	@bash tests/run_tests.sh $(foreach t,$(GPU_TESTS),"$(t)") $(GPU_TEST_COMMANDS)

clean:
	rm -rf $(BUILD)

help:
	@sed -n '2,/^$$/p' Makefile | sed -n '/^#   make/,/^#$$/p' | sed '$$d'

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
