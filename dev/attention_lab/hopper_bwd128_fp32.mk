# dev/attention_lab/hopper_bwd128_fp32.mk - lab of fp32 mode's Hopper key-major pass at head size 128 (dK, dV and
# the dQ reduce-adds; dev/attention_lab/hopper_bwd128_fp32.cu: layout probe, then the kernel on the default
# backward's D and inside the composed backward graph, checked against attention_backward_cuda(fp32,
# force_portable) and timed; written without a GPU); -included by attention/module.mk. A lab, so in no test
# target. wgmma/setmaxnreg exist only on sm_90a, so its object is compiled for that target alone (private: the
# setting does not leak). `make hopper_bwd128_fp32-regs` prints ptxas's registers/spills of its kernels.
CUDA_PROGRAMS += $(BUILD)/dev/attention_lab/hopper_bwd128_fp32
$(BUILD)/dev/attention_lab/hopper_bwd128_fp32.cu.o: private override NVCC_ARCH := -gencode arch=compute_90a,code=sm_90a
$(BUILD)/dev/attention_lab/hopper_bwd128_fp32.cu.o: dev/attention_lab/hopper_bwd128_fp32.cu attention/attention_cuda.cuh \
        attention/attention_hopper_bwd.cuh attention/hopper_bwd_common.cuh attention/hopper_wgmma.cuh \
        attention/tile_order.cuh attention/attention.h attention/attn_cases.h tests/testing.h \
        common/cuda_utils.cuh common/utils.h dev/attention_lab/hopper_lab.cuh
$(BUILD)/dev/attention_lab/hopper_bwd128_fp32: $(BUILD)/dev/attention_lab/hopper_bwd128_fp32.cu.o $(ATTN_CUDA_OBJS) $(ATTN_CPU_OBJS)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lgomp -lm

.PHONY: hopper_bwd128_fp32-regs
hopper_bwd128_fp32-regs:
	$(NVCC) $(filter-out -gencode arch=%,$(NVCCFLAGS)) -gencode arch=compute_90a,code=sm_90a -Xptxas -v \
	    -c dev/attention_lab/hopper_bwd128_fp32.cu -o /dev/null 2>&1 | grep -E "Compiling entry|registers|spill|C75|warning"
