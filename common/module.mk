# common/module.mk - programs and tests of common/ (included by the top Makefile)

# Host-side helpers of common/ that are compiled (the rest is header-only):
# atomic_file.c (tmp + fsync + rename writes). Every program that writes a
# checkpoint, resume state, shard, capture or NCCL id file links COMMON_OBJS.
COMMON_OBJS := $(BUILD)/common/atomic_file.o
CPU_TESTS += $(BUILD)/tests/test_atomic_file
$(BUILD)/tests/test_atomic_file: $(BUILD)/tests/test_atomic_file.o $(COMMON_OBJS)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
