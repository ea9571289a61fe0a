# attention/module.mk - programs and tests of attention/ (included by the top Makefile)

# CPU side of the attention module: mode names and BF16 helpers, the exact CPU
# emulation of the four modes, the fp64 reference, the hard-case generators
# and the error metrics. Programs that use any of it link all of ATTN_CPU_OBJS.
ATTN_CPU_OBJS := $(BUILD)/attention/attention_common.o $(BUILD)/attention/cpu/attention_cpu.o \
                 $(BUILD)/attention/cpu/attention_ref.o $(BUILD)/attention/support/attn_cases.o \
                 $(BUILD)/attention/support/attn_metrics.o

CPU_TESTS += $(BUILD)/tests/test_attention_cpu
$(BUILD)/tests/test_attention_cpu: $(BUILD)/tests/test_attention_cpu.o $(ATTN_CPU_OBJS)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# The CUDA kernels' tile order (attention/cuda/tile_order.cuh, plain C on the host): bijection, sections, LPT.
CPU_TESTS += $(BUILD)/tests/test_tile_order
$(BUILD)/tests/test_tile_order: $(BUILD)/tests/test_tile_order.o
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# The run-time -> template step of the CUDA entry points (attention/cuda/mode_dispatch.cuh, plain C++ on the host).
CPU_TESTS += $(BUILD)/tests/test_mode_dispatch
$(BUILD)/tests/test_mode_dispatch: tests/test_mode_dispatch.cc attention/cuda/mode_dispatch.cuh \
                                   $(BUILD)/attention/attention_common.o
	@mkdir -p $(dir $@)
	$(CXX) -std=c++17 -O2 -Wall -Wextra -I. tests/test_mode_dispatch.cc $(BUILD)/attention/attention_common.o -o $@

# The emulation must be one fixed function whatever the top CFLAGS say:
# - its rounding points are the contract, so the compiler may not fuse a
#   multiply and an add on its own (only the explicit fmaf of bf16 mode);
# - expf/exp2f stay the scalar libm calls (-fmath-errno keeps -O3 from
#   switching to the vector math library);
# - the ISA is pinned: its `omp simd` dot products sum in the target's vector
#   width (4 lanes with SSE, 8 with AVX2), and that order moves the emulated
#   BF16 roundings enough to matter on the sharp and offset cases checked
#   against the PyTorch emulation (tests/test_attention_torch.py).
# `override`: they hold even when the user sets CFLAGS on the command line.
$(BUILD)/attention/cpu/attention_cpu.o: override CFLAGS += -ffp-contract=off -fmath-errno -march=x86-64-v2 -mtune=generic

# ---- CUDA side: the tensor-core kernels of every emulated mode (attention_cuda.cu) and cudnn mode ----
# Programs that call attention_forward_cuda / attention_backward_cuda link
# ATTN_CUDA_OBJS and ATTN_CPU_OBJS (mode names, softmax constants).
# attention_hopper.cu is the Hopper (wgmma + TMA) forward that attention_forward_cuda picks on sm_90
# devices. wgmma exists only on sm_90a, so its object is compiled for that target alone, whatever
# NVCC_ARCH says (private: the setting does not leak into the objects it links with); a build for other
# targets links it all the same and the dispatch never launches it off sm_90.
# attention_hopper_bwd_dispatch.cu is the Hopper backward's entry point and chain table (host code, which
# attention_backward_cuda calls on sm_90 devices in the portable passes' place); attention_hopper_bwd.cu is the
# Hopper key-major backward kernel (bf16, repair; HS 64) of that chain (attention_hopper_bwd128.cu: the same at
# HS 128), attention_hopper_rows.cu the Hopper row pass (gproj, fp32; HS 64); same sm_90a-only rule.
ATTN_CUDA_OBJS := $(BUILD)/attention/cuda/attention_cuda.cu.o $(BUILD)/attention/cuda/hopper/attention_hopper.cu.o \
                  $(BUILD)/attention/cuda/hopper/attention_hopper_bwd_dispatch.cu.o \
                  $(BUILD)/attention/cuda/hopper/attention_hopper_bwd.cu.o $(BUILD)/attention/cuda/hopper/attention_hopper_rows.cu.o \
                  $(BUILD)/attention/cuda/hopper/attention_hopper_bwd128.cu.o
CUDA_OBJECTS += $(ATTN_CUDA_OBJS)
$(BUILD)/attention/cuda/attention_cuda.cu.o: attention/cuda/attention_cuda.cu attention/attention_cuda.cuh \
        attention/cuda/hopper/attention_hopper.cuh attention/cuda/hopper/attention_hopper_bwd.cuh attention/cuda/mma_bf16.cuh attention/cuda/tile_order.cuh \
        attention/cuda/launch_overlap.cuh attention/attention.h common/cuda_utils.cuh common/utils.h
$(BUILD)/attention/cuda/hopper/attention_hopper.cu.o: private override NVCC_ARCH := -gencode arch=compute_90a,code=sm_90a
$(BUILD)/attention/cuda/hopper/attention_hopper.cu.o: attention/cuda/hopper/attention_hopper.cu attention/cuda/hopper/attention_hopper.cuh \
        attention/cuda/hopper/hopper_wgmma.cuh attention/cuda/tile_order.cuh attention/attention.h common/cuda_utils.cuh common/utils.h
$(BUILD)/attention/cuda/hopper/attention_hopper_bwd_dispatch.cu.o: private override NVCC_ARCH := -gencode arch=compute_90a,code=sm_90a
$(BUILD)/attention/cuda/hopper/attention_hopper_bwd_dispatch.cu.o: attention/cuda/hopper/attention_hopper_bwd_dispatch.cu \
        attention/cuda/hopper/attention_hopper_bwd.cuh attention/cuda/hopper/hopper_host.cuh attention/cuda/hopper/hopper_lab_hooks.cuh \
        attention/cuda/hopper/hopper_wgmma.cuh attention/attention.h common/cuda_utils.cuh common/utils.h
$(BUILD)/attention/cuda/hopper/attention_hopper_bwd.cu.o: private override NVCC_ARCH := -gencode arch=compute_90a,code=sm_90a
$(BUILD)/attention/cuda/hopper/attention_hopper_bwd.cu.o: attention/cuda/hopper/attention_hopper_bwd.cu attention/cuda/hopper/attention_hopper_bwd.cuh \
        attention/cuda/hopper/hopper_bwd_common.cuh attention/cuda/hopper/hopper_wgmma.cuh attention/cuda/launch_overlap.cuh attention/cuda/tile_order.cuh attention/attention.h \
        common/cuda_utils.cuh common/utils.h
$(BUILD)/attention/cuda/hopper/attention_hopper_bwd128.cu.o: private override NVCC_ARCH := -gencode arch=compute_90a,code=sm_90a
$(BUILD)/attention/cuda/hopper/attention_hopper_bwd128.cu.o: attention/cuda/hopper/attention_hopper_bwd128.cu attention/cuda/hopper/kernel_keys128.cuh attention/cuda/hopper/attention_hopper_bwd.cuh \
        attention/cuda/hopper/hopper_bwd_common.cuh attention/cuda/hopper/hopper_wgmma.cuh attention/cuda/launch_overlap.cuh attention/attention.h common/cuda_utils.cuh \
        common/utils.h
$(BUILD)/attention/cuda/hopper/attention_hopper_rows.cu.o: private override NVCC_ARCH := -gencode arch=compute_90a,code=sm_90a
$(BUILD)/attention/cuda/hopper/attention_hopper_rows.cu.o: attention/cuda/hopper/attention_hopper_rows.cu attention/cuda/launch_overlap.cuh attention/cuda/hopper/attention_hopper_bwd.cuh \
        attention/cuda/hopper/hopper_rows_common.cuh attention/cuda/hopper/hopper_wgmma.cuh attention/cuda/tile_order.cuh attention/attention.h \
        common/cuda_utils.cuh common/utils.h
# attention_hopper_rows128.cu: the Hopper row pass at HS 128 (gproj, fp32; setmaxnreg), which
# the dispatch (attention_hopper_bwd_dispatch.cu) runs on HS 128; same sm_90a-only rule.
ATTN_CUDA_OBJS += $(BUILD)/attention/cuda/hopper/attention_hopper_rows128.cu.o
CUDA_OBJECTS += $(BUILD)/attention/cuda/hopper/attention_hopper_rows128.cu.o
$(BUILD)/attention/cuda/hopper/attention_hopper_rows128.cu.o: private override NVCC_ARCH := -gencode arch=compute_90a,code=sm_90a
$(BUILD)/attention/cuda/hopper/attention_hopper_rows128.cu.o: attention/cuda/hopper/attention_hopper_rows128.cu attention/cuda/launch_overlap.cuh \
        attention/cuda/hopper/attention_hopper_bwd.cuh attention/cuda/hopper/hopper_bwd_common.cuh attention/cuda/hopper/hopper_rows_common.cuh \
        attention/cuda/hopper/hopper_wgmma.cuh attention/cuda/tile_order.cuh attention/attention.h common/cuda_utils.cuh common/utils.h
# attention_hopper_bwd_gproj.cu: gproj's Hopper key-major pass (dK, dV; HS 64), run in
# attn_bwd_kernel<64, ATTN_GPROJ>'s place on sm_90 devices after the Hopper row pass; same sm_90a-only rule.
ATTN_CUDA_OBJS += $(BUILD)/attention/cuda/hopper/attention_hopper_bwd_gproj.cu.o
CUDA_OBJECTS += $(BUILD)/attention/cuda/hopper/attention_hopper_bwd_gproj.cu.o
$(BUILD)/attention/cuda/hopper/attention_hopper_bwd_gproj.cu.o: private override NVCC_ARCH := -gencode arch=compute_90a,code=sm_90a
$(BUILD)/attention/cuda/hopper/attention_hopper_bwd_gproj.cu.o: attention/cuda/hopper/attention_hopper_bwd_gproj.cu attention/cuda/launch_overlap.cuh attention/cuda/hopper/attention_hopper_bwd.cuh \
        attention/cuda/hopper/hopper_bwd_common.cuh attention/cuda/hopper/hopper_wgmma.cuh attention/cuda/tile_order.cuh attention/attention.h \
        common/cuda_utils.cuh common/utils.h
# attention_hopper_bwd128_gproj.cu: the same pass at HS 128 (setmaxnreg 24/240), which
# the dispatch runs on HS 128; same sm_90a-only rule.
ATTN_CUDA_OBJS += $(BUILD)/attention/cuda/hopper/attention_hopper_bwd128_gproj.cu.o
CUDA_OBJECTS += $(BUILD)/attention/cuda/hopper/attention_hopper_bwd128_gproj.cu.o
$(BUILD)/attention/cuda/hopper/attention_hopper_bwd128_gproj.cu.o: private override NVCC_ARCH := -gencode arch=compute_90a,code=sm_90a
$(BUILD)/attention/cuda/hopper/attention_hopper_bwd128_gproj.cu.o: attention/cuda/hopper/attention_hopper_bwd128_gproj.cu attention/cuda/hopper/kernel_keys128.cuh attention/cuda/launch_overlap.cuh \
        attention/cuda/hopper/attention_hopper_bwd.cuh attention/cuda/hopper/hopper_bwd_common.cuh attention/cuda/hopper/hopper_wgmma.cuh \
        attention/attention.h common/cuda_utils.cuh common/utils.h
# attention_hopper_bwd128_fp32.cu: fp32 mode's key-major pass at HS 128 (dK, dV, dQ partials; setmaxnreg
# 24/240), run in attn_bwd_kernel<128, ATTN_FP32>'s place on sm_90 after the Hopper row pass; same sm_90a-only rule.
ATTN_CUDA_OBJS += $(BUILD)/attention/cuda/hopper/attention_hopper_bwd128_fp32.cu.o
CUDA_OBJECTS += $(BUILD)/attention/cuda/hopper/attention_hopper_bwd128_fp32.cu.o
$(BUILD)/attention/cuda/hopper/attention_hopper_bwd128_fp32.cu.o: private override NVCC_ARCH := -gencode arch=compute_90a,code=sm_90a
$(BUILD)/attention/cuda/hopper/attention_hopper_bwd128_fp32.cu.o: attention/cuda/hopper/attention_hopper_bwd128_fp32.cu attention/cuda/hopper/kernel_keys128.cuh attention/cuda/launch_overlap.cuh \
        attention/cuda/hopper/attention_hopper_bwd.cuh attention/cuda/hopper/hopper_bwd_common.cuh attention/cuda/hopper/hopper_wgmma.cuh \
        attention/cuda/tile_order.cuh attention/attention.h common/cuda_utils.cuh common/utils.h
# attention_hopper_bwd64_fp32.cu: fp32 mode's key-major pass at HS 64 (dK, dV, dQ partials; 288 threads, no
# setmaxnreg), run in attn_bwd_kernel<64, ATTN_FP32>'s place on sm_90 after the Hopper row pass; same sm_90a-only rule.
ATTN_CUDA_OBJS += $(BUILD)/attention/cuda/hopper/attention_hopper_bwd64_fp32.cu.o
CUDA_OBJECTS += $(BUILD)/attention/cuda/hopper/attention_hopper_bwd64_fp32.cu.o
$(BUILD)/attention/cuda/hopper/attention_hopper_bwd64_fp32.cu.o: private override NVCC_ARCH := -gencode arch=compute_90a,code=sm_90a
$(BUILD)/attention/cuda/hopper/attention_hopper_bwd64_fp32.cu.o: attention/cuda/hopper/attention_hopper_bwd64_fp32.cu attention/cuda/launch_overlap.cuh \
        attention/cuda/hopper/attention_hopper_bwd.cuh attention/cuda/hopper/hopper_bwd_common.cuh attention/cuda/hopper/hopper_wgmma.cuh \
        attention/cuda/mma_bf16.cuh attention/cuda/tile_order.cuh attention/attention.h common/cuda_utils.cuh common/utils.h

# cudnn mode (attention/cudnn/): attention_cudnn.cu (cuDNN's fused attention through its backend API) where
# the top Makefile found cuDNN, else attention_cudnn_none.cu, whose calls stop with the fix. Every program
# that links ATTN_CUDA_OBJS links ATTN_CUDA_LDLIBS too (-lcudnn, with the library's folder as rpath).
ATTN_CUDNN_LIBDIR := $(patsubst %/,%,$(dir $(call find_lib,cudnn)))
ATTN_CUDNN_OBJ := $(BUILD)/attention/cudnn/$(if $(HAVE_CUDNN),attention_cudnn,attention_cudnn_none).cu.o
ATTN_CUDA_OBJS += $(ATTN_CUDNN_OBJ)
CUDA_OBJECTS += $(ATTN_CUDNN_OBJ)
ATTN_CUDA_LDLIBS := $(if $(HAVE_CUDNN),-L$(ATTN_CUDNN_LIBDIR) -Xlinker -rpath=$(ATTN_CUDNN_LIBDIR) -lcudnn)
$(ATTN_CUDNN_OBJ): attention/cudnn/attention_cudnn.cuh attention/attention.h common/cuda_utils.cuh common/utils.h
$(BUILD)/attention/cuda/attention_cuda.cu.o: attention/cudnn/attention_cudnn.cuh

# GPU test: every mode against the CPU emulation and the fp64 reference on the hard cases.
GPU_TESTS += $(BUILD)/tests/test_attention_gpu
CUDA_PROGRAMS += $(BUILD)/tests/test_attention_gpu
$(BUILD)/tests/test_attention_gpu.cu.o: tests/test_attention_gpu.cu attention/attention_cuda.cuh attention/cuda/hopper/attention_hopper.cuh \
        attention/cuda/hopper/attention_hopper_bwd.cuh attention/attention.h attention/support/attn_cases.h attention/support/attn_metrics.h tests/testing.h \
        common/cuda_utils.cuh common/utils.h
$(BUILD)/tests/test_attention_gpu: $(BUILD)/tests/test_attention_gpu.cu.o $(ATTN_CUDA_OBJS) $(ATTN_CPU_OBJS)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lgomp -lm $(ATTN_CUDA_LDLIBS)

# Kernel lab: naive SIMT reference kernels next to the fast ones, checked and timed.
CUDA_PROGRAMS += $(BUILD)/dev/attention_lab/attention_lab
$(BUILD)/dev/attention_lab/attention_lab.cu.o: dev/attention_lab/attention_lab.cu attention/attention_cuda.cuh \
        attention/attention.h tests/testing.h common/cuda_utils.cuh common/utils.h
$(BUILD)/dev/attention_lab/attention_lab: $(BUILD)/dev/attention_lab/attention_lab.cu.o $(ATTN_CUDA_OBJS) $(ATTN_CPU_OBJS)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lgomp -lm $(ATTN_CUDA_LDLIBS)

# Independent PyTorch emulation of the four modes vs the C emulation: the driver
# runs attention_cpu.c on the script's inputs. Without torch the script fails.
$(BUILD)/tests/attn_emul_driver: $(BUILD)/tests/attn_emul_driver.o $(ATTN_CPU_OBJS)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
test: $(BUILD)/tests/attn_emul_driver
CPU_TEST_COMMANDS += "$(or $(TORCH_PYTHON),python3) tests/test_attention_torch.py"

# Labs of the Hopper kernels (dev/attention_lab/LAB.cu, one per production kernel: its layout probe, the
# kernel against force_portable, the timings, and the next experiment named in the source's header). Labs, so
# in no test target; `make all` and cuda-compile-check build them. A lab is host code (it builds for any
# NVCC_ARCH and refuses to run off sm_90) linked with the layout probes, ATTN_HOPPER_PROBE_OBJS
# (dev/attention_lab/probes/: lab code that includes the kernels' device code, attention/cuda/hopper/kernel_*.cuh,
# compiled for sm_90a alone like the kernels). `make LAB-regs` prints ptxas's registers and spills of the lab's
# production object (0 spill and no C75xx wanted). Each entry: LAB:production unit of attention/cuda/hopper/.
ATTN_HOPPER_LABS := hopper_fwd:attention_hopper hopper_rows:attention_hopper_rows hopper_rows128:attention_hopper_rows128 \
                    hopper_bwd64_wide:attention_hopper_bwd hopper_bwd128:attention_hopper_bwd128 \
                    hopper_bwd_gproj:attention_hopper_bwd_gproj hopper_bwd128_gproj:attention_hopper_bwd128_gproj \
                    hopper_bwd64_fp32:attention_hopper_bwd64_fp32 hopper_bwd128_fp32:attention_hopper_bwd128_fp32
ATTN_HOPPER_PROBE_OBJS := $(patsubst %.cu,$(BUILD)/%.cu.o,$(wildcard dev/attention_lab/probes/*.cu))
CUDA_OBJECTS += $(ATTN_HOPPER_PROBE_OBJS)
$(ATTN_HOPPER_PROBE_OBJS): private override NVCC_ARCH := -gencode arch=compute_90a,code=sm_90a
define attn_hopper_lab
CUDA_PROGRAMS += $(BUILD)/dev/attention_lab/$(1)
$(BUILD)/dev/attention_lab/$(1): $(BUILD)/dev/attention_lab/$(1).cu.o $(ATTN_HOPPER_PROBE_OBJS) $(ATTN_CUDA_OBJS) $(ATTN_CPU_OBJS)
	$$(NVCC) $$(NVCCFLAGS) $$^ -o $$@ -lgomp -lm $$(ATTN_CUDA_LDLIBS)
.PHONY: $(1)-regs
$(1)-regs:
	$$(NVCC) $$(filter-out -gencode arch=%,$$(NVCCFLAGS)) -gencode arch=compute_90a,code=sm_90a -Xptxas -v \
	    -c attention/cuda/hopper/$(2).cu -o /dev/null 2>&1 | grep -E "Compiling entry|registers|spill|C75|warning"
endef
$(foreach l,$(ATTN_HOPPER_LABS),$(eval $(call attn_hopper_lab,$(word 1,$(subst :, ,$(l))),$(word 2,$(subst :, ,$(l))))))
