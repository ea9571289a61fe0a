/*
 * train/resume_state.h - the resume-state file: everything besides the
 * weights that a run needs to continue bit-exactly (optimizer moments and
 * step count, data position, sampling RNG, attention mode, batch shape).
 *
 * Why: llm.c-format model checkpoints hold weights only (and must stay
 * llm.c-compatible), so the rest of a run's state goes into this separate
 * file, written next to model_NNNNNNNN.bin as state_NNNNNNNN.bin. A resume
 * must either reproduce the uninterrupted run exactly or refuse with a clear
 * reason, so everything is checked on read: magic, version, sizes, a
 * checksum over the whole file, the model shape (config hash) and, through
 * params_hash, that the model file beside it is the one saved with it.
 *
 * File layout (little-endian; 64-bit offsets):
 *   header   RESUME_HEADER_INTS int64 values (see the RH_* indices in
 *            resume_state.c): magic 20261129, version 2, step, AdamW t,
 *            num_params, config hash and the six config fields, batch shape,
 *            attention mode/options, seeds, RNG state, params hash, ...,
 *            the gauge arm (--zero-key-bias-grad), the model's architecture
 *            options (version 3; a version-2 file is a GPT-2 model), the
 *            count of GEMM algorithm records and the cuBLASLt version that
 *            chose them (version 4; older files have none), the learning-rate
 *            schedule and optimizer settings (version 5; older files have none)
 *   data     the DataPosition struct as bytes (sizeof recorded in header)
 *   m, v     num_params float32 each (AdamW first and second moments)
 *   algos    the GPU trainer's MatmulAlgoRecord per GEMM shape (96 bytes
 *            each, model/matmul_record.h), so a resume runs the algorithms
 *            the run ran; none from the CPU trainer
 *   trailer  uint64 checksum (resume_hash) of every byte before it
 * Writes go to PATH.tmp, are fsync'ed, then renamed over PATH (and the folder
 * fsync'ed): a crash or a failed write never damages an existing file.
 *
 * Offers: ResumeState, resume_state_write/read/free, resume_state_check
 * (compatibility with the run being resumed), resume_hash, gpt_config_hash,
 * run-folder naming (run_file_path) and run_find_latest_state.
 */
#ifndef TRAIN_RESUME_STATE_H
#define TRAIN_RESUME_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "dataloader/dataloader.h"
#include "model/gpt_config.h"
#include "model/matmul_record.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RESUME_MAGIC 20261129
/* Version 5 adds the schedule and optimizer settings (ResumeSchedule); older files are read without
   them. Version 4 adds the GEMM algorithm records; version 3 and 2 files are read
   with none. Version 3 records the architecture options; version 2 files, which
   predate them, can only hold GPT-2 models and are read as such. Version 1
   files, which do not record the gauge arm (--zero-key-bias-grad), are
   refused: guessing would either switch an arm-on run off or an arm-off run
   on without a trace. */
#define RESUME_VERSION 5

/* The learning-rate schedule and AdamW settings a run was saved with (the flags of the same names): a resume
   that leaves a flag out takes the saved value, one that gives another value is noted. */
typedef struct {
    int32_t recorded;      /* 1: filled by the run, or read from a version-5 file that has them; 0: none */
    int32_t steps, warmup_steps;
    int32_t schedule;      /* ScheduleKind (train/schedule.h) */
    float lr, min_lr_frac, weight_decay, beta1, beta2, adam_eps, grad_clip;
} ResumeSchedule;

typedef struct {
    int64_t step;          /* optimizer steps completed */
    int64_t adam_t;        /* AdamW's step counter t (bias correction) */
    int64_t tokens_seen;   /* training tokens consumed so far */
    GPTConfig config;
    uint64_t config_hash;  /* gpt_config_hash(&config) */
    int32_t batch_size, seq_len, grad_accum, world_size, shuffle;
    int32_t attn_mode, attn_tile_max_shift;
    int32_t zero_key_bias_grad; /* the gauge arm (--zero-key-bias-grad): 0 or 1 */
    ResumeSchedule sched;  /* not compared by resume_state_check: a resume may change it (noted) */
    uint64_t seed;         /* the run's --seed */
    uint64_t rng_state;    /* sampler RNG state (SamplerRng.state) */
    uint64_t params_hash;  /* resume_hash of the fp32 parameters saved with this state */
    DataPosition data_pos; /* training loader position */
    size_t num_params;
    float* m;              /* num_params; read: allocated (resume_state_free) */
    float* v;
    /* the GPU trainer's GEMM algorithms (model/matmul.cuh), and the cuBLASLt version that chose them
       (cublasLtGetVersion; 0 with no records) */
    int64_t matmul_lib;
    int32_t num_matmul_algos;  /* 0 .. MATMUL_MAX_RECORDS */
    MatmulAlgoRecord matmul_algos[MATMUL_MAX_RECORDS];
} ResumeState;

/* Writes s to path (tmp + fsync + rename). 0, or -1 with a message; on
   failure any existing file at path is untouched and the tmp file removed. */
int resume_state_write(const char* path, const ResumeState* s, char* err, size_t errlen);

/* Reads and fully validates path into s (allocating m and v). 0, or -1 with
   a message naming the file and the problem (not a state file, other
   version, truncated, corrupt, inconsistent). */
int resume_state_read(const char* path, ResumeState* s, char* err, size_t errlen);
void resume_state_free(ResumeState* s);

/* Does a saved state fit the run about to continue it? Compares the model
   shape and parameter count (refused on mismatch) and the batch shape, data
   shuffling and seed (refused too: the data stream and the sums would differ,
   so the run would not be a continuation). 0, or -1 with a message. */
int resume_state_check(const ResumeState* saved, const ResumeState* current, char* err, size_t errlen);

/* The gauge arm on resume: the saved value when the flag was not given, the
   flag's value when it equals the saved one. A given value that differs is
   refused (-1 with a message naming both values and the fix): switching the
   arm mid-run turns one experiment arm into a mix of two without a trace. */
int resume_zero_key_bias_grad(const ResumeState* saved, int flag_value, int flag_given, char* err, size_t errlen);

/* 64-bit FNV-1a-style hash over 8-byte words (fast enough for GB of moments),
   chained through h (start with RESUME_HASH_INIT). */
#define RESUME_HASH_INIT 0xcbf29ce484222325ULL
uint64_t resume_hash(const void* data, size_t nbytes, uint64_t h);
/* Hash of the shape and, for a non-GPT-2 model, the options (a GPT-2 model hashes
   its six shape fields only, as version-2 files recorded). */
uint64_t gpt_config_hash(const GPTConfig* cfg);

/* "<dir>/<prefix>_<step as 8 digits>.bin", e.g. run_file_path(.., "runs/a", "model", 10)
   -> "runs/a/model_00000010.bin". */
void run_file_path(char* buf, size_t n, const char* dir, const char* prefix, int64_t step);

/* Newest state_NNNNNNNN.bin in dir: 0 with its path and step, 1 if there is
   none, -1 with a message if dir cannot be read. */
int run_find_latest_state(const char* dir, char* path, size_t n, int64_t* step, char* err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* TRAIN_RESUME_STATE_H */
