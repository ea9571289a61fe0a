# dev/attention_lab/hopper_bwd64_gproj_wide.mk - lab of gproj's HS-64 key-major pass (dK, dV) with 128-query steps
# (its own kernel and layout probe, checked against attention_backward_cuda's production gproj backward and timed
# next to production's key-major pass); -included by attention/module.mk. A lab, so in no test target.
# wgmma/setmaxnreg exist only on sm_90a, so its object is compiled for that target alone (private: the setting
# does not leak). Registers: `make hopper_bwd64_gproj_wide-regs`.
CUDA_PROGRAMS += $(BUILD)/dev/attention_lab/hopper_bwd64_gproj_wide
$(BUILD)/dev/attention_lab/hopper_bwd64_gproj_wide.cu.o: private override NVCC_ARCH := -gencode arch=compute_90a,code=sm_90a
$(BUILD)/dev/attention_lab/hopper_bwd64_gproj_wide.cu.o: dev/attention_lab/hopper_bwd64_gproj_wide.cu \
        dev/attention_lab/hopper_lab.cuh attention/attention_cuda.cuh attention/attention_hopper_bwd.cuh \
        attention/hopper_wgmma.cuh attention/hopper_bwd_common.cuh attention/tile_order.cuh attention/launch_overlap.cuh \
        attention/attention.h \
        attention/attn_cases.h tests/testing.h common/cuda_utils.cuh common/utils.h
$(BUILD)/dev/attention_lab/hopper_bwd64_gproj_wide: $(BUILD)/dev/attention_lab/hopper_bwd64_gproj_wide.cu.o \
        $(ATTN_CUDA_OBJS) $(ATTN_CPU_OBJS)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lgomp -lm

# ptxas's registers and spills of the lab's kernels (0 spill and no C75xx wanted)
.PHONY: hopper_bwd64_gproj_wide-regs
hopper_bwd64_gproj_wide-regs:
	$(NVCC) $(filter-out -gencode arch=%,$(NVCCFLAGS)) -gencode arch=compute_90a,code=sm_90a -Xptxas -v \
	    -c dev/attention_lab/hopper_bwd64_gproj_wide.cu -o /dev/null 2>&1 | grep -E "Compiling entry|registers|spill|C75|warning"
