# model/module.mk - programs and tests of model/ (included by the top Makefile)
MODEL_CPU_OBJS := $(BUILD)/model/gpt_config.o

# ---- GPU model and its layer kernels (model/*.cuh, header-only; CUDA) ----
GPU_MODEL_HEADERS := $(wildcard model/*.cuh) common/cuda_utils.cuh
# Every header a GPU program of ours may include (nvcc objects get no .d files here): a change to a
# shared struct (e.g. TrainFlags) must rebuild them, or the binary reads fields at stale offsets.
GPU_PROGRAM_HEADERS = $(GPU_MODEL_HEADERS) $(wildcard common/*.h model/*.h train/*.h dataloader/*.h \
                      attention/*.h attention/*.cuh attention/*/*.h attention/*/*.cuh \
                      attention/cuda/hopper/*.cuh tests/testing.h tests/*.cuh)
$(BUILD)/tests/test_layers_gpu: tests/test_layers_gpu.cu $(GPU_PROGRAM_HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $< -o $@ -lcublasLt
ifeq ($(HAVE_CUBLAS),1)
CUDA_PROGRAMS += $(BUILD)/tests/test_layers_gpu
GPU_TESTS += $(BUILD)/tests/test_layers_gpu
endif
# The modern-stack kernels (rmsnorm, rope, qknorm, swiglu .cuh) against fp64 (a GPU test; CI compiles it).
$(BUILD)/tests/test_modern_layers_gpu: tests/test_modern_layers_gpu.cu $(GPU_PROGRAM_HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $< -o $@
ifeq ($(HAVE_NVCC),1)
CUDA_PROGRAMS += $(BUILD)/tests/test_modern_layers_gpu
GPU_TESTS += $(BUILD)/tests/test_modern_layers_gpu
endif

# ---- CPU model (gpt_cpu.c), checkpoints, CPU AdamW and their tests ----
# Programs that run the CPU model link GPT_CPU_OBJS (model + checkpoint + AdamW
# + the attention module's CPU objects).
ATTN_FOR_MODEL_OBJS := $(sort $(ATTN_CPU_OBJS) $(BUILD)/attention/attention_common.o \
                       $(BUILD)/attention/cpu/attention_ref.o $(BUILD)/attention/cpu/attention_cpu.o)
GPT_CPU_OBJS := $(BUILD)/model/gpt_cpu.o $(BUILD)/model/checkpoint.o $(BUILD)/model/gpt_config.o \
                $(BUILD)/train/adamw_cpu.o $(ATTN_FOR_MODEL_OBJS) $(COMMON_OBJS)
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
                                $(BUILD)/model/gpt_config.o $(BUILD)/attention/attention_common.o $(COMMON_OBJS)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
$(BUILD)/tests/test_gpt_cpu: $(BUILD)/tests/test_gpt_cpu.o $(GPT_CPU_OBJS)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
CPU_TESTS += $(BUILD)/tests/test_gpt_grad $(BUILD)/tests/test_checkpoint $(BUILD)/tests/test_gpt_cpu
# The model's matmul and softmax kernels on awkward shapes (the test includes model/gpt_cpu.c).
$(BUILD)/tests/test_gpt_cpu_kernels: $(BUILD)/tests/test_gpt_cpu_kernels.o $(BUILD)/model/gpt_config.o \
                                     $(BUILD)/train/adamw_cpu.o $(ATTN_FOR_MODEL_OBJS)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
CPU_TESTS += $(BUILD)/tests/test_gpt_cpu_kernels
# PyTorch-twin parity: tests/twin_driver runs our model, the script checks it
# against dev/gpt_twin.py. Without torch the script fails (it never skips).
$(BUILD)/tests/twin_driver: $(BUILD)/tests/twin_driver.o $(GPT_CPU_OBJS)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
test: $(BUILD)/tests/twin_driver
CPU_TEST_COMMANDS += "$(or $(TORCH_PYTHON),python3) tests/test_twin_parity.py"

# ---- the GPU trainer (train_gpt.cu at the top level; CUDA) ----
# Its objects come from modules included after this one, hence $$ (second expansion).
# The attention kernels: ATTN_CUDA_OBJS if attention/module.mk defines it, else every .cu under attention/.
.SECONDEXPANSION:
TRAIN_GPT_ATTN_OBJS = $(or $(ATTN_CUDA_OBJS),$(patsubst %.cu,$(BUILD)/%.cu.o,$(wildcard attention/cuda/*.cu attention/cuda/hopper/*.cu)))
# Multi-GPU: the communicator (NCCL, or the one-GPU stand-in) and the launcher code (MPI when found),
# from train/module.mk; the diagnostics' CPU side (JSON record, capture writer, probe summary).
TRAIN_GPT_HOST_OBJS = $(GPT_CPU_OBJS) $(TRAIN_INFRA_OBJS) $(TRAIN_TOKENIZER_OBJS) $(DATALOADER_OBJS) $(DIST_OBJS) \
                      $(DIAG_CPU_OBJS)
$(BUILD)/train_gpt.cu.o: train_gpt.cu $(GPU_PROGRAM_HEADERS)
$(BUILD)/train_gpt: $(BUILD)/train_gpt.cu.o $$(TRAIN_GPT_ATTN_OBJS) $$(COMM_CUDA_OBJS) $$(sort $$(TRAIN_GPT_HOST_OBJS))
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lcublasLt -lgomp $(COMM_LDLIBS) $(DIST_LDLIBS) $(ATTN_CUDA_LDLIBS)
ifeq ($(HAVE_CUBLAS),1)
CUDA_PROGRAMS += $(BUILD)/train_gpt
# launch refusals that need no GPU (bad launcher variables, batch vs process count, diagnostics flags)
CPU_TEST_COMMANDS += "bash tests/test_train_gpt_launch.sh"
test: $(BUILD)/train_gpt
endif

# ---- run diagnostics (model/diagnostics.h, diagnostics_cpu.c, diagnostics.cuh) ----
# Programs that use the CPU diagnostics link DIAG_CPU_OBJS (plus the attention
# module's CPU objects, for the probe's fp64 reference and the capture file).
DIAG_CPU_OBJS := $(BUILD)/model/diagnostics_cpu.o $(BUILD)/attention/support/attn_capture.o $(ATTN_CPU_OBJS) $(COMMON_OBJS)
$(BUILD)/tests/test_diagnostics: $(BUILD)/tests/test_diagnostics.o $(DIAG_CPU_OBJS) $(GPT_CPU_OBJS)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
CPU_TESTS += $(BUILD)/tests/test_diagnostics
# dev/parity_gpu: the GPU model against the CPU reference, per attention mode (a GPU test).
$(BUILD)/dev/parity_gpu.cu.o: dev/parity_gpu.cu $(GPU_PROGRAM_HEADERS)
$(BUILD)/dev/parity_gpu: $(BUILD)/dev/parity_gpu.cu.o $$(TRAIN_GPT_ATTN_OBJS) $$(sort $$(GPT_CPU_OBJS))
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lcublasLt -lgomp $(ATTN_CUDA_LDLIBS)
ifeq ($(HAVE_CUBLAS),1)
CUDA_PROGRAMS += $(BUILD)/dev/parity_gpu
GPU_TESTS += $(BUILD)/dev/parity_gpu
endif
# GPU diagnostics against the CPU ones (a GPU test; `--bench` times them at the 450m shape).
$(BUILD)/tests/test_diagnostics_gpu.cu.o: tests/test_diagnostics_gpu.cu model/diagnostics.cuh model/diagnostics.h \
        model/kernel_common.cuh attention/attention_cuda.cuh attention/support/attn_capture.h attention/support/attn_metrics.h \
        attention/support/attn_cases.h tests/testing.h
$(BUILD)/tests/test_diagnostics_gpu: $(BUILD)/tests/test_diagnostics_gpu.cu.o $$(TRAIN_GPT_ATTN_OBJS) \
        $$(sort $(DIAG_CPU_OBJS) $(BUILD)/model/gpt_config.o)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lgomp -lm $(ATTN_CUDA_LDLIBS)
ifeq ($(HAVE_NVCC),1)
CUDA_PROGRAMS += $(BUILD)/tests/test_diagnostics_gpu
GPU_TESTS += $(BUILD)/tests/test_diagnostics_gpu
endif
# dev/profile_gpu_step: tokens/s of the training step and its per-kernel-kind breakdown (a GPU tool).
$(BUILD)/dev/profile_gpu_step.cu.o: dev/profile_gpu_step.cu $(GPU_PROGRAM_HEADERS)
$(BUILD)/dev/profile_gpu_step: $(BUILD)/dev/profile_gpu_step.cu.o $$(TRAIN_GPT_ATTN_OBJS) $$(sort $$(GPT_CPU_OBJS))
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lcublasLt -lgomp $(ATTN_CUDA_LDLIBS)
ifeq ($(HAVE_CUBLAS),1)
CUDA_PROGRAMS += $(BUILD)/dev/profile_gpu_step
endif
# dev/bench_matmul: the step's GEMMs under the heuristic's first cuBLASLt algorithm against the fastest of its
# first candidates (a GPU tool).
$(BUILD)/dev/bench_matmul.cu.o: dev/bench_matmul.cu $(GPU_PROGRAM_HEADERS)
$(BUILD)/dev/bench_matmul: $(BUILD)/dev/bench_matmul.cu.o $(BUILD)/model/gpt_config.o $(COMMON_OBJS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lcublasLt
ifeq ($(HAVE_CUBLAS),1)
CUDA_PROGRAMS += $(BUILD)/dev/bench_matmul
endif
# tests/test_gpu_host: host-side logic of the GPU model (bucketing, memory plan, OOM message); runs on the
# CPU but includes CUDA headers, so it is built with nvcc and registered only where nvcc and cuBLAS exist.
$(BUILD)/tests/test_gpu_host.cu.o: tests/test_gpu_host.cu $(GPU_PROGRAM_HEADERS)
$(BUILD)/tests/test_gpu_host: $(BUILD)/tests/test_gpu_host.cu.o $$(TRAIN_GPT_ATTN_OBJS) $(BUILD)/model/gpt_config.o \
                              $(BUILD)/attention/attention_common.o
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lcublasLt -lgomp $(ATTN_CUDA_LDLIBS)
ifeq ($(HAVE_CUBLAS),1)
CPU_TESTS += $(BUILD)/tests/test_gpu_host
endif
# Data-parallel range arithmetic (model/param_ranges.h: gradient buckets, ZeRO-1 owner pieces, optimizer pieces).
$(BUILD)/tests/test_param_ranges: $(BUILD)/tests/test_param_ranges.o $(BUILD)/model/gpt_config.o $(BUILD)/train/dist.o \
                                  $(COMMON_OBJS)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
CPU_TESTS += $(BUILD)/tests/test_param_ranges
# Presets, architecture options and the parameter table (GPT-2's layout unchanged, the options' shapes).
$(BUILD)/tests/test_gpt_config: $(BUILD)/tests/test_gpt_config.o $(BUILD)/model/gpt_config.o
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
CPU_TESTS += $(BUILD)/tests/test_gpt_config
