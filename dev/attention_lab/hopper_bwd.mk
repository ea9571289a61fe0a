# dev/attention_lab/hopper_bwd.mk - lab of the production Hopper key-major backward
# (attention/attention_hopper_bwd.cu; bf16/repair, HS 64): its layout probe, then attention_backward_cuda on the
# Hopper path against force_portable, checked and timed; -included by attention/module.mk. A lab, so in no test
# target; `make all` and cuda-compile-check build it. Host code only (the kernel is in the library), so it
# builds for any NVCC_ARCH; it refuses to run off sm_90.
CUDA_PROGRAMS += $(BUILD)/dev/attention_lab/hopper_bwd
$(BUILD)/dev/attention_lab/hopper_bwd.cu.o: dev/attention_lab/hopper_bwd.cu dev/attention_lab/hopper_lab.cuh attention/attention_cuda.cuh \
        attention/attention_hopper_bwd.cuh attention/attention.h attention/attn_cases.h tests/testing.h \
        common/cuda_utils.cuh common/utils.h
$(BUILD)/dev/attention_lab/hopper_bwd: $(BUILD)/dev/attention_lab/hopper_bwd.cu.o $(ATTN_CUDA_OBJS) $(ATTN_CPU_OBJS)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lgomp -lm
