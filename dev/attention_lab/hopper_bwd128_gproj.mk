# dev/attention_lab/hopper_bwd128_gproj.mk - lab of the production Hopper key-major pass of gproj mode at head
# size 128 (attention/cuda/hopper/attention_hopper_bwd128_gproj.cu; dK, dV): its layout probe, then attention_backward_cuda's
# gproj backward on the default (Hopper) path and the pass alone against force_portable, and the timings;
# -included by attention/module.mk. A lab, so in no test target; `make all` and cuda-compile-check build it.
# Host code and a spin kernel only (the kernel is in the library), so it builds for any NVCC_ARCH; it refuses to
# run off sm_90. The kernel's registers: attention_hopper_bwd128_gproj.cu's header (`make hopper_bwd128_gproj-regs`).
CUDA_PROGRAMS += $(BUILD)/dev/attention_lab/hopper_bwd128_gproj
$(BUILD)/dev/attention_lab/hopper_bwd128_gproj.cu.o: dev/attention_lab/hopper_bwd128_gproj.cu dev/attention_lab/hopper_lab.cuh \
        attention/attention_cuda.cuh attention/cuda/hopper/attention_hopper_bwd.cuh attention/attention.h attention/support/attn_cases.h \
        tests/testing.h common/cuda_utils.cuh common/utils.h
$(BUILD)/dev/attention_lab/hopper_bwd128_gproj: $(BUILD)/dev/attention_lab/hopper_bwd128_gproj.cu.o $(ATTN_CUDA_OBJS) $(ATTN_CPU_OBJS)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lgomp -lm

# ptxas's registers and spills of the production kernel (the lab has none of its own)
.PHONY: hopper_bwd128_gproj-regs
hopper_bwd128_gproj-regs:
	$(NVCC) $(filter-out -gencode arch=%,$(NVCCFLAGS)) -gencode arch=compute_90a,code=sm_90a -Xptxas -v \
	    -c attention/cuda/hopper/attention_hopper_bwd128_gproj.cu -o /dev/null 2>&1 | grep -E "Compiling entry|registers|spill|C75|warning"
