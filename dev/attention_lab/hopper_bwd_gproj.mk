# dev/attention_lab/hopper_bwd_gproj.mk - lab of a Hopper key-major pass for gproj mode (dK, dV; HS 64): its
# layout probe of the new operand bf(-lambda P), then the kernel on the production workspace's D and lambda
# against attention_backward_cuda (default path and force_portable), the composed Hopper gproj backward and its
# timing; -included by attention/module.mk. A lab, so in no test target. The kernel lives in the .cu (wgmma),
# so its object is compiled for sm_90a alone (private: the setting does not leak).
# Registers (CUDA 13.0, -Xptxas -v): gproj_keys_kernel 168 at entry (384 threads; setmaxnreg 40 producer / 232 consumers), 0 bytes spill, no C75xx warnings;
# gproj_probe_kernel 186 registers, 0 spill (re-check after any change, e.g. by running the nvcc line of
# `make -n build/dev/attention_lab/hopper_bwd_gproj.cu.o` with -Xptxas -v added).
CUDA_PROGRAMS += $(BUILD)/dev/attention_lab/hopper_bwd_gproj
$(BUILD)/dev/attention_lab/hopper_bwd_gproj.cu.o: private override NVCC_ARCH := -gencode arch=compute_90a,code=sm_90a
$(BUILD)/dev/attention_lab/hopper_bwd_gproj.cu.o: dev/attention_lab/hopper_bwd_gproj.cu dev/attention_lab/hopper_lab.cuh dev/attention_lab/hopper_lab_hang.cuh attention/attention_cuda.cuh \
        attention/attention_hopper_bwd.cuh attention/hopper_wgmma.cuh attention/attention.h attention/attn_cases.h \
        tests/testing.h common/cuda_utils.cuh common/utils.h
$(BUILD)/dev/attention_lab/hopper_bwd_gproj: $(BUILD)/dev/attention_lab/hopper_bwd_gproj.cu.o $(ATTN_CUDA_OBJS) $(ATTN_CPU_OBJS)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lgomp -lm
