# dev/attention_lab/hopper_bwd_fast.mk - the next version of the Hopper key-major backward lab (producer
# warpgroup + setmaxnreg, overlapped wgmma batches, one dQ atomic set per CTA, 3 stages), each step a
# template variant checked against attention_backward_cuda and timed next to hopper_bwd.cu's kernel;
# -included by attention/module.mk. A lab, so in no test target. wgmma/setmaxnreg exist only on sm_90a,
# so its object is compiled for that target alone (private: the setting does not leak).
CUDA_PROGRAMS += $(BUILD)/dev/attention_lab/hopper_bwd_fast
$(BUILD)/dev/attention_lab/hopper_bwd_fast.cu.o: private override NVCC_ARCH := -gencode arch=compute_90a,code=sm_90a
$(BUILD)/dev/attention_lab/hopper_bwd_fast.cu.o: dev/attention_lab/hopper_bwd_fast.cu dev/attention_lab/hopper_lab.cuh dev/attention_lab/hopper_lab_hang.cuh attention/attention_cuda.cuh \
        attention/hopper_wgmma.cuh attention/attention.h attention/attn_cases.h tests/testing.h \
        common/cuda_utils.cuh common/utils.h
$(BUILD)/dev/attention_lab/hopper_bwd_fast: $(BUILD)/dev/attention_lab/hopper_bwd_fast.cu.o $(ATTN_CUDA_OBJS) $(ATTN_CPU_OBJS)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lgomp -lm
