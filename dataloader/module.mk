# dataloader/module.mk - programs and tests of dataloader/ (included by the top Makefile)

# ---- shard loader (dataloader.h): linked by every trainer ----
DATALOADER_OBJS := $(BUILD)/dataloader/dataloader.o
CPU_TESTS += $(BUILD)/tests/test_dataloader
$(BUILD)/tests/test_dataloader: $(BUILD)/tests/test_dataloader.o $(DATALOADER_OBJS)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
