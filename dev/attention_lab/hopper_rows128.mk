# dev/attention_lab/hopper_rows128.mk - lab of the Hopper row pass of the backward at head size 128
# (dev/attention_lab/hopper_rows128.cu: gproj's lambda and dQ, fp32's D; layout probe, then checked against
# attention_backward_cuda with force_portable and timed against the portable attn_bwd_rows_kernel<128>;
# written without a GPU); -included by attention/module.mk. A lab, so in no test target. wgmma/setmaxnreg
# exist only on sm_90a, so its object is compiled for that target alone (private: the setting does not leak).
# `make hopper_rows128-regs` prints ptxas's registers/spills of its kernels.
CUDA_PROGRAMS += $(BUILD)/dev/attention_lab/hopper_rows128
$(BUILD)/dev/attention_lab/hopper_rows128.cu.o: private override NVCC_ARCH := -gencode arch=compute_90a,code=sm_90a
$(BUILD)/dev/attention_lab/hopper_rows128.cu.o: dev/attention_lab/hopper_rows128.cu attention/attention_cuda.cuh \
        attention/hopper_wgmma.cuh attention/tile_order.cuh attention/attention.h attention/attn_cases.h \
        tests/testing.h common/cuda_utils.cuh common/utils.h dev/attention_lab/hopper_lab.cuh \
        dev/attention_lab/hopper_lab_hang.cuh
$(BUILD)/dev/attention_lab/hopper_rows128: $(BUILD)/dev/attention_lab/hopper_rows128.cu.o $(ATTN_CUDA_OBJS) $(ATTN_CPU_OBJS)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lgomp -lm

.PHONY: hopper_rows128-regs
hopper_rows128-regs:
	$(NVCC) $(filter-out -gencode arch=%,$(NVCCFLAGS)) -gencode arch=compute_90a,code=sm_90a -Xptxas -v \
	    -c dev/attention_lab/hopper_rows128.cu -o /dev/null 2>&1 | grep -E "Compiling entry|registers|spill|C75|warning|error"
