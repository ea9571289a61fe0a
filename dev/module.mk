# dev/module.mk - programs and tests of dev/ (included by the top Makefile)

# ---- attention capture file (attention/support/attn_capture.c) and its test ----
ATTN_CAPTURE_OBJS := $(BUILD)/attention/support/attn_capture.o $(BUILD)/attention/attention_common.o $(COMMON_OBJS)
$(BUILD)/tests/test_attn_capture: $(BUILD)/tests/test_attn_capture.o $(ATTN_CAPTURE_OBJS)
	$(CC) $^ -o $@ $(LDLIBS)
CPU_TESTS += $(BUILD)/tests/test_attn_capture

# ---- attention benchmark and probe (CUDA; they compile without a GPU) ----
# The CUDA attention objects: attention/module.mk's list if it defines one.
ATTN_CUDA_OBJS ?= $(BUILD)/attention/cuda/attention_cuda.cu.o
CUDA_PROGRAMS += $(BUILD)/bench_attention
CUDA_OBJECTS += $(BUILD)/dev/bench_attention.cu.o
$(BUILD)/bench_attention: $(BUILD)/dev/bench_attention.cu.o $(ATTN_CUDA_OBJS) $(ATTN_CPU_OBJS)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lm $(ATTN_CUDA_LDLIBS)
# Time and bandwidth of the modern-stack kernels (model/rmsnorm, rope, qknorm, swiglu .cuh); a GPU tool.
CUDA_PROGRAMS += $(BUILD)/bench_modern_layers
$(BUILD)/bench_modern_layers: dev/bench_modern_layers.cu $(GPU_PROGRAM_HEADERS)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $< -o $@
CUDA_PROGRAMS += $(BUILD)/attn_probe
CUDA_OBJECTS += $(BUILD)/dev/attn_probe.cu.o
$(BUILD)/attn_probe: $(BUILD)/dev/attn_probe.cu.o $(BUILD)/attention/support/attn_capture.o $(COMMON_OBJS) $(ATTN_CUDA_OBJS) $(ATTN_CPU_OBJS)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lm $(ATTN_CUDA_LDLIBS)
# cudnn mode's one-run check on a GPU machine (dev/cudnn_check.sh OUTDIR builds and runs it). It builds
# without cuDNN too (the no-cuDNN unit), and then stops at its first line with the fix.
CUDA_PROGRAMS += $(BUILD)/dev/cudnn_check
CUDA_OBJECTS += $(BUILD)/dev/cudnn_check.cu.o
$(BUILD)/dev/cudnn_check.cu.o: dev/cudnn_check.cu attention/cudnn/attention_cudnn.cuh attention/attention_cuda.cuh \
        attention/attention.h attention/support/attn_cases.h attention/support/attn_metrics.h common/cuda_utils.cuh common/utils.h \
        tests/gpu_tensor.cuh tests/testing.h model/kernel_common.cuh
$(BUILD)/dev/cudnn_check: $(BUILD)/dev/cudnn_check.cu.o $(ATTN_CUDA_OBJS) $(ATTN_CPU_OBJS)
	$(NVCC) $(NVCCFLAGS) $^ -o $@ -lgomp -lm $(ATTN_CUDA_LDLIBS)
# End-to-end CPU test of the probe on a numpy-written capture (builds build/attn_probe with nvcc; skips without it).
CPU_TEST_COMMANDS += "bash tests/test_attn_probe.sh"
# dev/ptx_blocks.py (a kernel's PTX blocks and machine-code size, read without a GPU) on a synthetic module and cubin.
CPU_TEST_COMMANDS += "python3 tests/test_ptx_blocks.py"
# The Hopper passes' barrier protocols (dev/attention_lab/protocol_model.py) under random interleavings.
CPU_TEST_COMMANDS += "python3 dev/attention_lab/protocol_model.py"
# dev/bench_ab.py (bench_attention consoles of several builds as one A/B table) on consoles with known numbers.
CPU_TEST_COMMANDS += "python3 tests/test_bench_ab.py"

# ---- gproj variants study (docs/gproj_variants.md): CPU emulation of cheaper gproj forms ----
# The engine rounds where the emulation does, so it is compiled with the
# emulation's pinned flags (no fused multiply-add the contract does not name,
# scalar libm, fixed vector width): see attention/module.mk.
GPROJ_VARIANTS_OBJS := $(BUILD)/dev/gproj_variants.o $(ATTN_CPU_OBJS)
$(BUILD)/dev/gproj_variants.o: override CFLAGS += -ffp-contract=off -fmath-errno -march=x86-64-v2 -mtune=generic
$(BUILD)/gproj_variants: $(BUILD)/dev/gproj_variants_main.o $(GPROJ_VARIANTS_OBJS) $(BUILD)/attention/support/attn_capture.o $(COMMON_OBJS)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
PROGRAMS += $(BUILD)/gproj_variants
CPU_TESTS += $(BUILD)/tests/test_gproj_variants
$(BUILD)/tests/test_gproj_variants: $(BUILD)/tests/test_gproj_variants.o $(GPROJ_VARIANTS_OBJS)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# ---- model_logits: our CPU model's logits and loss on given tokens (dev/hf_parity.sh, tests/test_hf_export.py) ----
PROGRAMS += $(BUILD)/model_logits
$(BUILD)/model_logits: $(BUILD)/dev/model_logits.o $(GPT_CPU_OBJS)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
