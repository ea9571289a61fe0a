# dev/attention_lab/hopper_bwd128_gproj.mk - lab of gproj's Hopper key-major pass at head size 128 (dK, dV;
# dev/attention_lab/hopper_bwd128_gproj.cu: layout probe of the chained dK batches, then the kernel on the
# production workspace's D and lambda and inside the composed backward, checked against attention_backward_cuda
# with force_portable and timed; written without a GPU); -included by attention/module.mk. A lab, so in no test
# target. wgmma/setmaxnreg exist only on sm_90a, so its object is compiled for that target alone (private: the
# setting does not leak). `make hopper_bwd128_gproj-regs` prints ptxas's registers/spills of its kernels.
CUDA_PROGRAMS += $(BUILD)/dev/attention_lab/hopper_bwd128_gproj
$(BUILD)/dev/attention_lab/hopper_bwd128_gproj.cu.o: private override NVCC_ARCH := -gencode arch=compute_90a,code=sm_90a
$(BUILD)/dev/attention_lab/hopper_bwd128_gproj.cu.o: dev/attention_lab/hopper_bwd128_gproj.cu attention/attention_cuda.cuh \
        attention/hopper_wgmma.cuh attention/attention.h attention/attn_cases.h tests/testing.h \
        common/cuda_utils.cuh common/utils.h dev/attention_lab/hopper_lab.cuh dev/attention_lab/hopper_lab_hang.cuh
$(BUILD)/dev/attention_lab/hopper_bwd128_gproj: $(BUILD)/dev/attention_lab/hopper_bwd128_gproj.cu.o $(ATTN_CUDA_OBJS) $(ATTN_CPU_OBJS)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lgomp -lm

.PHONY: hopper_bwd128_gproj-regs
hopper_bwd128_gproj-regs:
	$(NVCC) $(filter-out -gencode arch=%,$(NVCCFLAGS)) -gencode arch=compute_90a,code=sm_90a -Xptxas -v \
	    -c dev/attention_lab/hopper_bwd128_gproj.cu -o /dev/null 2>&1 | grep -E "Compiling entry|registers|spill|C75"
