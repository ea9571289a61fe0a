# model/module.mk - programs and tests of model/ (included by the top Makefile)
MODEL_CPU_OBJS := $(BUILD)/model/gpt_config.o
