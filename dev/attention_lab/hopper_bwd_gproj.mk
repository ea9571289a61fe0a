# dev/attention_lab/hopper_bwd_gproj.mk - lab of the production Hopper key-major pass of gproj mode
# (attention/cuda/hopper/attention_hopper_bwd_gproj.cu; dK, dV; HS 64): its layout probe, then attention_backward_cuda's
# gproj backward on the Hopper path against force_portable, the pass alone against the default path, and the
# timings; -included by attention/module.mk. A lab, so in no test target; `make all` and cuda-compile-check
# build it. Host code only (the kernel is in the library), so it builds for any NVCC_ARCH; it refuses to run
# off sm_90. The kernel's registers: attention_hopper_bwd_gproj.cu's header.
CUDA_PROGRAMS += $(BUILD)/dev/attention_lab/hopper_bwd_gproj
$(BUILD)/dev/attention_lab/hopper_bwd_gproj.cu.o: dev/attention_lab/hopper_bwd_gproj.cu dev/attention_lab/hopper_lab.cuh \
        attention/attention_cuda.cuh attention/cuda/hopper/attention_hopper_bwd.cuh attention/attention.h attention/support/attn_cases.h \
        tests/testing.h common/cuda_utils.cuh common/utils.h
$(BUILD)/dev/attention_lab/hopper_bwd_gproj: $(BUILD)/dev/attention_lab/hopper_bwd_gproj.cu.o $(ATTN_CUDA_OBJS) $(ATTN_CPU_OBJS)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lgomp -lm
