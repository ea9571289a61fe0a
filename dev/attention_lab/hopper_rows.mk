# dev/attention_lab/hopper_rows.mk - lab of the production Hopper row pass of the backward
# (attention/cuda/hopper/attention_hopper_rows.cu: gproj's lambda and dQ, fp32's D; HS 64), included by attention/module.mk:
# its layout probe, then attention_backward_cuda on the Hopper path against force_portable, checked and timed
# on an H200; a lab, so in no test target. Host code only (the kernel is in the library), so it builds for any
# NVCC_ARCH; it refuses to run off sm_90.
CUDA_PROGRAMS += $(BUILD)/dev/attention_lab/hopper_rows
$(BUILD)/dev/attention_lab/hopper_rows.cu.o: dev/attention_lab/hopper_rows.cu dev/attention_lab/hopper_lab.cuh attention/attention_cuda.cuh \
        attention/cuda/hopper/attention_hopper_bwd.cuh attention/attention.h attention/support/attn_cases.h tests/testing.h \
        common/cuda_utils.cuh common/utils.h
$(BUILD)/dev/attention_lab/hopper_rows: $(BUILD)/dev/attention_lab/hopper_rows.cu.o $(ATTN_CUDA_OBJS) $(ATTN_CPU_OBJS)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lgomp -lm
