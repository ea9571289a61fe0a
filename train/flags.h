/*
 * train/flags.h - the trainers' command line: ONE table of long flags that
 * drives the parser, --help, the start-up banner and the run's logged config.
 *
 * Why: llm.c's help text drifted from its parser because the two were written
 * separately. Here every flag is one row (name, type, default, allowed values,
 * help, GPU-only mark) and every consumer walks the same rows, so what --help
 * says is what the parser accepts and what the banner prints is what the run
 * uses. The CPU trainer (train_gpt_cpu.c) and the GPU trainer (train_gpt.cu)
 * share the table; flags that only the GPU trainer implements are marked and
 * the CPU trainer refuses non-default values for them, and --attn cudnn (flags_reject_gpu_only).
 *
 * Syntax: GNU long options, `--name value` or `--name=value`. Booleans also
 * take a bare `--name` (= 1); `--resume` alone means "latest". Numbers are
 * checked in full (no trailing junk) and against the row's range; choices
 * against the row's list. Errors are one line naming the flag and what is
 * allowed (plus a "did you mean" for misspelt names).
 *
 * Offers: TrainFlags (typed values), FlagId, flags_init, flags_set_default,
 * flags_parse, flags_print_help, flags_print_settings, flags_write_json,
 * flags_was_set, flags_reject_gpu_only, flags_info.
 */
#ifndef TRAIN_FLAGS_H
#define TRAIN_FLAGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    /* model */
    FLAG_MODEL = 0,
    FLAG_INIT_FROM,
    /* model architecture options (model/gpt_config.h, docs/modern_stacks.md) */
    FLAG_POS,
    FLAG_ROPE_BASE,
    FLAG_NORM,
    FLAG_MLP,
    FLAG_MLP_HIDDEN,
    FLAG_QK_NORM,
    FLAG_BIAS,
    FLAG_TIE_EMBEDDINGS,
    /* data */
    FLAG_TRAIN_DATA,
    FLAG_VAL_DATA,
    FLAG_VOCAB,
    FLAG_SHUFFLE,
    /* batch */
    FLAG_BATCH_SIZE,
    FLAG_SEQ_LEN,
    FLAG_TOTAL_BATCH_TOKENS,
    FLAG_STEPS,
    /* optimizer and schedule */
    FLAG_LR,
    FLAG_MIN_LR_FRAC,
    FLAG_WARMUP_STEPS,
    FLAG_SCHEDULE,
    FLAG_WEIGHT_DECAY,
    FLAG_BETA1,
    FLAG_BETA2,
    FLAG_ADAM_EPS,
    FLAG_GRAD_CLIP,
    FLAG_SEED,
    /* attention */
    FLAG_ATTN,
    FLAG_ATTN_TILE_MAX_SHIFT,
    FLAG_DETERMINISTIC,
    /* evaluation, sampling, output */
    FLAG_VAL_EVERY,
    FLAG_VAL_BATCHES,
    FLAG_SAMPLE_EVERY,
    FLAG_SAMPLE_TOKENS,
    FLAG_SAMPLE_TEMPERATURE,
    FLAG_CHECKPOINT_EVERY,
    FLAG_OUT_DIR,
    FLAG_STOP_AT,
    FLAG_RESUME,
    FLAG_OVERWRITE,
    FLAG_LOG_EVERY,
    FLAG_CHECKPOINT_DTYPE,
    /* run safety (train/run_driver.c) */
    FLAG_CHECKPOINT_MINUTES,
    FLAG_DIVERGE_MARGIN,
    FLAG_SKIP_UPDATE_Z,
    /* diagnostics (both trainers) */
    FLAG_DIAG_EVERY,
    FLAG_CAPTURE_STEPS,
    FLAG_CAPTURE_LAYERS,
    FLAG_CAPTURE_ATTN,
    FLAG_PROBE_EVERY,
    FLAG_ZERO_KEY_BIAS_GRAD,
    FLAG_WARN_RHO,
    FLAG_WARN_DQ_ERR,
    FLAG_CHECKPOINT_ON_WARNING,
    /* GPU trainer only */
    FLAG_RECOMPUTE,
    FLAG_ATTN_KERNELS,
    FLAG_ZERO_STAGE,
    FLAG_NCCL_ID_FILE,
    FLAG_CUDA_GRAPH,
    FLAG_MATMUL_TUNE,
    NUM_FLAGS
} FlagId;

typedef enum { FLAG_TYPE_INT, FLAG_TYPE_INT64, FLAG_TYPE_FLOAT, FLAG_TYPE_STRING, FLAG_TYPE_BOOL, FLAG_TYPE_CHOICE } FlagType;

/* Every flag's effective value. Strings point at argv or at static defaults
   (never freed). Choice flags hold the chosen name. */
typedef struct {
    const char* model;
    const char* init_from;
    /* architecture options: a given one overrides the preset's; with --init-from or --resume it must
       equal the checkpoint's. The trainers write the resolved values back here (banner, log). */
    const char* pos;           /* learned|rope */
    float rope_base;
    const char* norm;          /* layernorm|rmsnorm */
    const char* mlp;           /* gelu|swiglu */
    int mlp_hidden;            /* 0: the default for --mlp (4C, or round_up(8C/3, 64)) */
    int qk_norm;
    int bias;
    int tie_embeddings;
    const char* train_data;
    const char* val_data;
    const char* vocab;
    int shuffle;
    int batch_size;
    int seq_len;               /* 0: the model's context length */
    int64_t total_batch_tokens; /* 0: one micro-batch per step (no accumulation) */
    int steps;
    float lr;
    float min_lr_frac;
    int warmup_steps;
    const char* schedule;      /* cosine|linear|constant */
    float weight_decay;
    float beta1;
    float beta2;
    float adam_eps;
    float grad_clip;           /* 0: no clipping */
    uint64_t seed;
    const char* attn;          /* fp32|bf16|repair|gproj */
    int attn_tile_max_shift;
    int attn_deterministic;    /* --deterministic: AttnOptions.deterministic (GPU attention backward) */
    const char* attn_kernels;  /* auto|portable (GPU trainer only) */
    int val_every;             /* 0: only at the end */
    int val_batches;
    int sample_every;          /* 0: never */
    int sample_tokens;
    float sample_temperature;  /* 0: greedy (the argmax, no randomness) */
    int checkpoint_every;      /* 0: only at the end */
    const char* checkpoint_dtype; /* fp32|bf16: the weights' type in model_NNNNNNNN.bin (llm.c version 3|5) */
    const char* out_dir;       /* "": a fresh runs/run_<date>_<time> */
    int stop_at;               /* 0: run to --steps; else stop (with a checkpoint) after this many steps */
    const char* resume;        /* "": start fresh; "latest"; or a state file path */
    int overwrite;
    int log_every;
    float checkpoint_minutes;  /* 0: no wall-time checkpoints */
    float diverge_margin;      /* nats above the lowest loss that count as divergence; 0: off */
    float skip_update_z;       /* skip an update whose loss/grad-norm z-score exceeds this; 0: off */
    int recompute;
    int zero_stage;
    int diag_every;
    const char* capture_steps;
    const char* capture_layers;
    const char* capture_attn;  /* "STEPS:LAYERS", the combined form of the two above */
    int probe_every;           /* 0: never */
    int zero_key_bias_grad;    /* the gauge arm: zero the key-bias gradient before the optimizer */
    float warn_rho;            /* early warning thresholds (model/diagnostics.h); 0: off */
    float warn_dq_err;
    int checkpoint_on_warning; /* 1: a kept checkpoint right after the run's first attention warning */
    const char* nccl_id_file;  /* env-var multi-GPU launch: where rank 0 publishes the NCCL id */
    int cuda_graph;            /* 1: replay each micro-step's forward+backward as a captured CUDA graph */
    int matmul_tune;           /* GEMM algorithms: time the heuristic's first N per shape; 0: its first */
    /* which flags the command line gave (the rest are defaults) */
    unsigned char was_set[NUM_FLAGS];
} TrainFlags;

/* A read-only view of one table row, for tests and tools. */
typedef struct {
    const char* name;     /* without the leading "--" */
    FlagType type;
    const char* def;      /* default as text (after flags_set_default) */
    const char* choices;  /* "a|b|c" for choice flags, else NULL */
    const char* help;
    int gpu_only;
} FlagInfo;
FlagInfo flags_info(FlagId id);

/* Changes a default before flags_init (each trainer picks sizes that suit it,
   e.g. the CPU trainer a tiny model); --help then shows it. The value must
   parse; returns 0, or -1 with a message. */
int flags_set_default(FlagId id, const char* value, char* err, size_t errlen);

/* Sets every flag to its default. */
void flags_init(TrainFlags* f);

/* Parses argv[1..argc). Returns 0 when fine, 1 when --help/-h was given (the
   caller prints help and exits 0), -1 with a one-line message in err. */
int flags_parse(TrainFlags* f, int argc, char** argv, char* err, size_t errlen);

int flags_was_set(const TrainFlags* f, FlagId id);

/* Fails (-1, message) if a GPU-only flag was given a non-default value. */
int flags_reject_gpu_only(const TrainFlags* f, const char* program, char* err, size_t errlen);

/* The table as --help text, grouped, with types, defaults and choices. */
void flags_print_help(FILE* out, const char* program, const char* summary, int show_gpu_only);

/* Every effective value, one "  --name value" per line, "(set)" marking those
   given on the command line. */
void flags_print_settings(FILE* out, const TrainFlags* f, int show_gpu_only);

/* Writes `"name": value, ...` (a JSON object body without braces) for the log. */
void flags_write_json(FILE* out, const TrainFlags* f);

/* Writes a JSON string literal (quotes and escapes) of s to out. */
void json_write_string(FILE* out, const char* s);

#ifdef __cplusplus
}
#endif

#endif /* TRAIN_FLAGS_H */
