# attention/module.mk - programs and tests of attention/ (included by the top Makefile)

# CPU side of the attention module: mode names and BF16 helpers, the fp64
# reference, the hard-case generators and the error metrics (the CPU
# emulation of the modes, attention_cpu.o, joins in the next commit).
# Programs that use any of it link all of ATTN_CPU_OBJS.
ATTN_CPU_OBJS := $(BUILD)/attention/attention_common.o \
                 $(BUILD)/attention/attention_ref.o $(BUILD)/attention/attn_cases.o \
                 $(BUILD)/attention/attn_metrics.o
