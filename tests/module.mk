# tests/module.mk - programs and tests of tests/ (included by the top Makefile)

# The sampler's text and its log.jsonl records are valid UTF-8 and JSON (train/sampler.c, train/runlog.c).
CPU_TESTS += $(BUILD)/tests/test_sampler_text
$(BUILD)/tests/test_sampler_text: $(BUILD)/tests/test_sampler_text.o $(TRAIN_INFRA_OBJS) $(TRAIN_TOKENIZER_OBJS) \
                                  $(BUILD)/model/gpt_config.o $(BUILD)/attention/attention_common.o
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
# The Makefile itself: user CFLAGS/NVCCFLAGS/LDLIBS keep the build's own flags (an ASan build of
# tokenize in a temporary build folder, also checked for leaks on its error path), what `make run` builds.
CPU_TEST_COMMANDS += "bash tests/test_build.sh"
# llm.c interop through the CPU trainer: --checkpoint-dtype bf16 (version-5 files) and its resume
# (needs build/train_gpt_cpu and build/tokenize, as train/module.mk's tests).
CPU_TEST_COMMANDS += "bash tests/test_llmc_interop.sh"
# Hugging Face export/import (scripts/export_hf.py, import_hf.py) without transformers: the safetensors
# format, GPT2LMHeadModel's names and shapes, the fp32 round trip, bf16 rounding, and our CPU model's
# logits (build/model_logits) against transformers' semantics read from the exported folder.
test: $(BUILD)/train_gpt_cpu $(BUILD)/model_logits
CPU_TEST_COMMANDS += "python3 tests/test_hf_export.py"
