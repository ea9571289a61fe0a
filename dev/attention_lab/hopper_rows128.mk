# dev/attention_lab/hopper_rows128.mk - lab of the production Hopper row pass of the backward at head size 128
# (attention/cuda/hopper/attention_hopper_rows128.cu: gproj's lambda and dQ, fp32's D): its layout probe, then
# attention_backward_cuda on the Hopper path against force_portable, checked and timed kernel by kernel;
# -included by attention/module.mk. A lab, so in no test target. Host code (and a spin kernel) only, so it
# builds for any NVCC_ARCH; it refuses to run off sm_90. `make hopper_rows128-regs` prints ptxas's
# registers/spills of the library's HS-128 row-pass kernels (sm_90a).
CUDA_PROGRAMS += $(BUILD)/dev/attention_lab/hopper_rows128
$(BUILD)/dev/attention_lab/hopper_rows128.cu.o: dev/attention_lab/hopper_rows128.cu dev/attention_lab/hopper_lab.cuh \
        attention/attention_cuda.cuh attention/cuda/hopper/attention_hopper_bwd.cuh attention/attention.h attention/support/attn_cases.h \
        tests/testing.h common/cuda_utils.cuh common/utils.h
$(BUILD)/dev/attention_lab/hopper_rows128: $(BUILD)/dev/attention_lab/hopper_rows128.cu.o $(ATTN_CUDA_OBJS) $(ATTN_CPU_OBJS)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lgomp -lm

.PHONY: hopper_rows128-regs
hopper_rows128-regs:
	$(NVCC) $(filter-out -gencode arch=%,$(NVCCFLAGS)) -gencode arch=compute_90a,code=sm_90a -Xptxas -v \
	    -c attention/cuda/hopper/attention_hopper_rows128.cu -o /dev/null 2>&1 | grep -E "Compiling entry|registers|spill|C75|warning"
