# dev/attention_lab/hopper_bwd.mk - the Hopper key-major backward lab (wgmma + TMA, bf16/repair, HS 64),
# checked against attention_backward_cuda and timed next to it; -included by attention/module.mk. A lab,
# so in no test target; `make all` and cuda-compile-check build it. wgmma exists only on sm_90a, so its
# object is compiled for that target alone (private: the setting does not leak into what it links with).
CUDA_PROGRAMS += $(BUILD)/dev/attention_lab/hopper_bwd
$(BUILD)/dev/attention_lab/hopper_bwd.cu.o: private override NVCC_ARCH := -gencode arch=compute_90a,code=sm_90a
$(BUILD)/dev/attention_lab/hopper_bwd.cu.o: dev/attention_lab/hopper_bwd.cu attention/attention_cuda.cuh \
        attention/hopper_wgmma.cuh attention/attention.h attention/attn_cases.h tests/testing.h \
        common/cuda_utils.cuh common/utils.h
$(BUILD)/dev/attention_lab/hopper_bwd: $(BUILD)/dev/attention_lab/hopper_bwd.cu.o $(ATTN_CUDA_OBJS) $(ATTN_CPU_OBJS)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lgomp -lm
