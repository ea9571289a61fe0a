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

# ---- CPU model (gpt_cpu.c), checkpoints, CPU AdamW and their tests ----
# Programs that run the CPU model link GPT_CPU_OBJS (model + checkpoint + AdamW
# + the attention module's CPU objects).
ATTN_FOR_MODEL_OBJS := $(sort $(ATTN_CPU_OBJS) $(BUILD)/attention/attention_common.o \
                       $(BUILD)/attention/attention_ref.o $(BUILD)/attention/attention_cpu.o)
GPT_CPU_OBJS := $(BUILD)/model/gpt_cpu.o $(BUILD)/model/checkpoint.o $(BUILD)/model/gpt_config.o \
                $(BUILD)/train/adamw_cpu.o $(ATTN_FOR_MODEL_OBJS)
# The same model source compiled with double as its element type, for the
# finite-difference test only (see model/gpt_cpu.h).
$(BUILD)/model/gpt_cpu_f64.o: model/gpt_cpu.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DGPT_CPU_REAL=double -c $< -o $@
$(BUILD)/tests/test_gpt_grad.o: tests/test_gpt_grad.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -DGPT_CPU_REAL=double -c $< -o $@
$(BUILD)/tests/test_gpt_grad: $(BUILD)/tests/test_gpt_grad.o $(BUILD)/model/gpt_cpu_f64.o \
                              $(BUILD)/model/gpt_config.o $(ATTN_FOR_MODEL_OBJS)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/tests/test_checkpoint: $(BUILD)/tests/test_checkpoint.o $(BUILD)/model/checkpoint.o \
                                $(BUILD)/model/gpt_config.o $(BUILD)/attention/attention_common.o
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
CPU_TESTS += $(BUILD)/tests/test_gpt_grad $(BUILD)/tests/test_checkpoint
