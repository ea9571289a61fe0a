# dataloader/module.mk - programs and tests of dataloader/ (included by the top Makefile)

# ---- shard loader (dataloader.h): linked by every trainer ----
DATALOADER_OBJS := $(BUILD)/dataloader/dataloader.o
CPU_TESTS += $(BUILD)/tests/test_dataloader
$(BUILD)/tests/test_dataloader: $(BUILD)/tests/test_dataloader.o $(DATALOADER_OBJS) $(COMMON_OBJS)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

# ---- GPT-2 tokenizer (tokenizer.h) and the tokenize tool: text -> llm.c shards ----
TOKENIZER_OBJS := $(BUILD)/dataloader/tokenizer.o $(BUILD)/dataloader/unicode_tables.o
PROGRAMS += $(BUILD)/tokenize
$(BUILD)/tokenize: $(BUILD)/dataloader/tokenize.o $(TOKENIZER_OBJS) $(COMMON_OBJS)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
# The test includes tokenizer.c itself (to cross-check its two BPE routines) and runs build/tokenize.
CPU_TESTS += $(BUILD)/tests/test_tokenizer
$(BUILD)/tests/test_tokenizer: $(BUILD)/tests/test_tokenizer.o $(BUILD)/dataloader/unicode_tables.o | $(BUILD)/tokenize
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
