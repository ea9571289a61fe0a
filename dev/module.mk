# dev/module.mk - programs and tests of dev/ (included by the top Makefile)

# ---- attention capture file (attention/attn_capture.c) and its test ----
ATTN_CAPTURE_OBJS := $(BUILD)/attention/attn_capture.o $(BUILD)/attention/attention_common.o
$(BUILD)/tests/test_attn_capture: $(BUILD)/tests/test_attn_capture.o $(ATTN_CAPTURE_OBJS)
	$(CC) $^ -o $@ $(LDLIBS)
CPU_TESTS += $(BUILD)/tests/test_attn_capture
