# dev/attention_lab/hopper_bwd64_fp32.mk - lab of the production Hopper key-major pass of fp32 mode at head size
# 64 (attention/cuda/hopper/attention_hopper_bwd64_fp32.cu; dK, dV, the dQ reduce-adds): its layout probe, then
# attention_backward_cuda's fp32 backward on the default path and the pass alone against force_portable, and the
# timings; -included by attention/module.mk. A lab, so in no test target; `make all` and cuda-compile-check build
# it. Host code, a spin kernel and a dQ post-pass only (the kernel is in the library), so it builds for any
# NVCC_ARCH; it refuses to run off sm_90. The kernel's registers: `make hopper_bwd64_fp32-regs`.
CUDA_PROGRAMS += $(BUILD)/dev/attention_lab/hopper_bwd64_fp32
$(BUILD)/dev/attention_lab/hopper_bwd64_fp32.cu.o: dev/attention_lab/hopper_bwd64_fp32.cu dev/attention_lab/hopper_lab.cuh \
        dev/attention_lab/hopper_fp32_keys_lab.cuh \
        attention/attention_cuda.cuh attention/cuda/hopper/attention_hopper_bwd.cuh attention/attention.h attention/support/attn_cases.h \
        tests/testing.h common/cuda_utils.cuh common/utils.h
$(BUILD)/dev/attention_lab/hopper_bwd64_fp32: $(BUILD)/dev/attention_lab/hopper_bwd64_fp32.cu.o $(ATTN_CUDA_OBJS) $(ATTN_CPU_OBJS)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lgomp -lm

# ptxas's registers and spills of the production kernel (the lab has none of its own)
.PHONY: hopper_bwd64_fp32-regs
hopper_bwd64_fp32-regs:
	$(NVCC) $(filter-out -gencode arch=%,$(NVCCFLAGS)) -gencode arch=compute_90a,code=sm_90a -Xptxas -v \
	    -c attention/cuda/hopper/attention_hopper_bwd64_fp32.cu -o /dev/null 2>&1 | grep -E "Compiling entry|registers|spill|C75|warning"
