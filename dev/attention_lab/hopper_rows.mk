# dev/attention_lab/hopper_rows.mk - the Hopper row-pass lab (included by attention/module.mk).
# wgmma + TMA row pass of the backward (gproj's lambda and dQ, fp32's D) next to the production backward:
# checked and timed on an H200; a lab, so in no test target. wgmma exists only on sm_90a, so its object is
# compiled for that target alone, whatever NVCC_ARCH says (private: the setting does not leak into the
# objects it links with).
CUDA_PROGRAMS += $(BUILD)/dev/attention_lab/hopper_rows
$(BUILD)/dev/attention_lab/hopper_rows.cu.o: private override NVCC_ARCH := -gencode arch=compute_90a,code=sm_90a
$(BUILD)/dev/attention_lab/hopper_rows.cu.o: dev/attention_lab/hopper_rows.cu attention/attention_cuda.cuh \
        attention/hopper_wgmma.cuh attention/attention.h attention/attn_cases.h tests/testing.h \
        common/cuda_utils.cuh common/utils.h
$(BUILD)/dev/attention_lab/hopper_rows: $(BUILD)/dev/attention_lab/hopper_rows.cu.o $(ATTN_CUDA_OBJS) $(ATTN_CPU_OBJS)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lgomp -lm
