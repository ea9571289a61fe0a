# train/module.mk - programs and tests of train/ (included by the top Makefile)

# ---- multi-process arithmetic and start-up handshake (train/dist*.c) ----
# dist_mpi.c when MPI is found, else dist_nompi.c (its calls fail with a hint).
DIST_OBJS := $(BUILD)/train/dist.o $(COMMON_OBJS) $(if $(HAVE_MPI),$(BUILD)/train/dist_mpi.o,$(BUILD)/train/dist_nompi.o)
DIST_LDLIBS := $(if $(HAVE_MPI),$(MPI_LDFLAGS))
$(BUILD)/train/dist_mpi.o: override CFLAGS += $(MPI_CFLAGS)
$(BUILD)/tests/test_dist: $(BUILD)/tests/test_dist.o $(BUILD)/train/dist.o $(COMMON_OBJS)
	$(CC) $^ -o $@ $(LDLIBS)
CPU_TESTS += $(BUILD)/tests/test_dist
# NCCL communicator for the GPU trainer: comm_nccl.cu when NCCL is found, else
# comm_single.cu (one GPU only, says so when asked for more).
COMM_CUDA_OBJS := $(if $(HAVE_NCCL),$(BUILD)/train/comm_nccl.cu.o,$(BUILD)/train/comm_single.cu.o)
COMM_LDLIBS := $(if $(HAVE_NCCL),-lnccl)
CUDA_OBJECTS += $(BUILD)/train/comm_single.cu.o $(if $(HAVE_NCCL),$(BUILD)/train/comm_nccl.cu.o)
$(BUILD)/train/comm_nccl.cu.o $(BUILD)/train/comm_single.cu.o: train/comm.h train/dist.h common/cuda_utils.cuh \
                                                                common/utils.h

# ---- training infrastructure shared by both trainers (flags, schedule, run log,
# resume state, sampler, the run driver) and the CPU trainer train_gpt_cpu ----
TRAIN_INFRA_OBJS := $(BUILD)/train/flags.o $(BUILD)/train/schedule.o $(BUILD)/train/runlog.o \
                    $(BUILD)/train/resume_state.o $(BUILD)/train/sampler.o $(BUILD)/train/run_driver.o \
                    $(BUILD)/model/checkpoint.o $(BUILD)/train/dist.o $(DATALOADER_OBJS) $(COMMON_OBJS)
TRAIN_TOKENIZER_OBJS := $(BUILD)/dataloader/tokenizer.o $(BUILD)/dataloader/unicode_tables.o
CPU_TESTS += $(BUILD)/tests/test_train_cpu
$(BUILD)/tests/test_train_cpu: $(BUILD)/tests/test_train_cpu.o $(TRAIN_INFRA_OBJS) $(TRAIN_TOKENIZER_OBJS) \
                               $(BUILD)/model/gpt_config.o $(BUILD)/attention/attention_common.o
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
# The CPU trainer (train_gpt_cpu.c at the top level).
TRAIN_CPU_OBJS := $(sort $(BUILD)/train_gpt_cpu.o $(GPT_CPU_OBJS) $(DATALOADER_OBJS) $(TRAIN_INFRA_OBJS) \
                  $(TRAIN_TOKENIZER_OBJS) $(BUILD)/train/dist.o $(COMMON_OBJS))
PROGRAMS += $(BUILD)/train_gpt_cpu
$(BUILD)/train_gpt_cpu: $(TRAIN_CPU_OBJS)
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)
# End-to-end trainer tests (scripts; they need the trainer and the tokenize tool built).
CPU_TEST_COMMANDS += "bash tests/test_train_cpu.sh"
test: $(BUILD)/train_gpt_cpu $(BUILD)/tokenize
CPU_TEST_COMMANDS += "bash tests/test_train_cpu_run.sh"
# The CPU trainer's diagnostics (--diag-every, --probe-every, --capture-attn, --zero-key-bias-grad).
$(BUILD)/train_gpt_cpu: $(DIAG_CPU_OBJS)
# Its diagnostics end to end: records, captures, the gauge arm, resume with them on, matched_runs --cpu.
CPU_TEST_COMMANDS += "bash tests/test_train_cpu_diag.sh"
# The run recipes' own logic on synthetic logs (compare_runs.py's common step and damaged logs,
# matched_runs.sh --seeds / --per-gpu / --gauge-arm / --resume, as dry runs); no training.
CPU_TEST_COMMANDS += "python3 tests/test_run_scripts.py"
# compare_runs.py across seeds on synthetic logs: statistics, breaks, verdicts, warnings, bands, thinned logs.
CPU_TEST_COMMANDS += "python3 tests/test_compare_runs.py"
# probe_table.py (the capture table of a matched-run group) on synthetic attn_probe JSON.
CPU_TEST_COMMANDS += "python3 tests/test_probe_table.py"
