# model/module.mk - programs and tests of model/ (included by the top Makefile)
MODEL_CPU_OBJS := $(BUILD)/model/gpt_config.o

# ---- GPU model and its layer kernels (model/*.cuh, header-only; CUDA) ----
GPU_MODEL_HEADERS := $(wildcard model/*.cuh) common/cuda_utils.cuh
$(BUILD)/tests/test_layers_gpu: tests/test_layers_gpu.cu $(GPU_MODEL_HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $< -o $@ -lcublasLt
ifeq ($(HAVE_CUBLAS),1)
CUDA_PROGRAMS += $(BUILD)/tests/test_layers_gpu
GPU_TESTS += $(BUILD)/tests/test_layers_gpu
endif
