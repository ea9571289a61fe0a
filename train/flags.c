/*
 * train/flags.c - the flag table and everything that walks it (see flags.h).
 *
 * Each row says where its value lives in TrainFlags (offsetof), how to parse
 * it, its default as text (parsed by the same code as the command line, so a
 * default can never be something the parser would refuse), its range or
 * choices, and its help line. Adding a flag = one FlagId + one row + one
 * TrainFlags field; the parser, --help, banner and JSON follow.
 */
#include "train/flags.h"
#include "attention/attention.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    FlagId id;
    const char* name;
    FlagType type;
    size_t offset;         /* of the value in TrainFlags */
    const char* def;       /* default, as text */
    const char* choices;   /* choice flags: "a|b|c" */
    double min, max;       /* numeric range, inclusive */
    const char* metavar;   /* shown in --help after the name */
    const char* implicit;  /* value used when the flag is given bare (NULL: a value is required) */
    const char* group;     /* --help section heading */
    int gpu_only;
    const char* help;
} FlagRow;

#define OFF(field) offsetof(TrainFlags, field)
#define BIG 1e18

/* The one table. Order = order in --help and in the banner. */
static const FlagRow g_rows[NUM_FLAGS] = {
    {FLAG_MODEL, "model", FLAG_TYPE_STRING, OFF(model), "d12", NULL, 0, 0, "NAME", NULL, "model", 0,
     "model preset to train from scratch: tiny|small|d6|d12|d24|d36|d48|450m|llama-small|llama-d12 (llama-*: "
     "small's and d12's shapes with --pos rope --norm rmsnorm --mlp swiglu --bias 0)"},
    {FLAG_INIT_FROM, "init-from", FLAG_TYPE_STRING, OFF(init_from), "", NULL, 0, 0, "CHECKPOINT", NULL, "model", 0,
     "start from the weights (and shape) of an llm.c-format model checkpoint instead of --model"},
    {FLAG_POS, "pos", FLAG_TYPE_CHOICE, OFF(pos), "learned", "learned|rope", 0, 0, NULL, NULL, "model", 0,
     "position encoding: learned (GPT-2's wpe) or rope (rotary, rotate-half pairs (i, i+HS/2), on q and k before "
     "attention; no wpe). Default: the preset's (llama-*: rope); given, it overrides the preset"},
    {FLAG_ROPE_BASE, "rope-base", FLAG_TYPE_FLOAT, OFF(rope_base), "10000", NULL, 1, 1e30, "F", NULL, "model",
     0, "RoPE base: inv_freq_i = F^(-2i/HS)"},
    {FLAG_NORM, "norm", FLAG_TYPE_CHOICE, OFF(norm), "layernorm", "layernorm|rmsnorm", 0, 0, NULL, NULL, "model", 0,
     "normalisation (eps 1e-5): layernorm (weight and bias) or rmsnorm (x * rsqrt(mean(x^2) + eps) * gain). "
     "Default: the preset's (llama-*: rmsnorm)"},
    {FLAG_MLP, "mlp", FLAG_TYPE_CHOICE, OFF(mlp), "gelu", "gelu|swiglu", 0, 0, NULL, NULL, "model", 0,
     "MLP: gelu (tanh GELU) or swiglu (silu(gate) * up; fcw holds the gate rows then the up rows). "
     "Default: the preset's (llama-*: swiglu)"},
    {FLAG_MLP_HIDDEN, "mlp-hidden", FLAG_TYPE_INT, OFF(mlp_hidden), "0", NULL, 0, 1 << 20, "H", NULL, "model", 0,
     "MLP hidden size; 0 = 4C for gelu, round_up(8C/3, 64) for swiglu (704 at C 256, 2048 at C 768)"},
    {FLAG_QK_NORM, "qk-norm", FLAG_TYPE_BOOL, OFF(qk_norm), "0", NULL, 0, 1, "0|1", "1", "model", 0,
     "1: RMSNorm of each head's q and k (eps 1e-5) with learned gains of size HS per layer, before RoPE"},
    {FLAG_BIAS, "bias", FLAG_TYPE_BOOL, OFF(bias), "1", NULL, 0, 1, "0|1", "1", "model", 0,
     "0: no qkv, attproj, fc and fcproj biases (LayerNorm keeps its bias). Default: the preset's (llama-*: 0)"},
    {FLAG_TIE_EMBEDDINGS, "tie-embeddings", FLAG_TYPE_BOOL, OFF(tie_embeddings), "1", NULL, 0, 1, "0|1", "1",
     "model", 0, "1: the output head is wte (GPT-2); 0: a separate lm_head (Vp, C), initialised like wte"},
    {FLAG_TRAIN_DATA, "train-data", FLAG_TYPE_STRING, OFF(train_data), "data/default/default_train_*.bin", NULL, 0,
     0, "GLOB", NULL, "data", 0, "training token shards (llm.c format; a glob, quote it)"},
    {FLAG_VAL_DATA, "val-data", FLAG_TYPE_STRING, OFF(val_data), "data/default/default_val_*.bin", NULL, 0, 0,
     "GLOB", NULL, "data", 0, "validation token shards; \"\" = no validation"},
    {FLAG_VOCAB, "vocab", FLAG_TYPE_STRING, OFF(vocab), ".cache/gpt2", NULL, 0, 0, "DIR", NULL, "data", 0,
     "folder with encoder.json and vocab.bpe, or llm.c's gpt2_tokenizer.bin (to print samples as text); "
     "\"\" = print token ids"},
    {FLAG_SHUFFLE, "shuffle", FLAG_TYPE_BOOL, OFF(shuffle), "1", NULL, 0, 1, "0|1", "1", "data", 0,
     "shuffle shards and samples per epoch (seeded by --seed)"},
    {FLAG_BATCH_SIZE, "batch-size", FLAG_TYPE_INT, OFF(batch_size), "16", NULL, 1, 1 << 20, "B", NULL, "batch", 0,
     "sequences per micro-batch (per process)"},
    {FLAG_SEQ_LEN, "seq-len", FLAG_TYPE_INT, OFF(seq_len), "0", NULL, 0, 1 << 20, "T", NULL, "batch", 0,
     "tokens per sequence; 0 = the model's context length"},
    {FLAG_TOTAL_BATCH_TOKENS, "total-batch-tokens", FLAG_TYPE_INT64, OFF(total_batch_tokens), "0", NULL, 0, BIG,
     "N", NULL, "batch", 0,
     "tokens per optimizer step; gradient accumulation = N / (B*T*processes), must divide; 0 = B*T*processes"},
    {FLAG_STEPS, "steps", FLAG_TYPE_INT, OFF(steps), "1000", NULL, 1, 2147483647.0, "N", NULL, "batch", 0,
     "optimizer steps to train for (the total, counting steps done before a --resume)"},
    {FLAG_LR, "lr", FLAG_TYPE_FLOAT, OFF(lr), "6e-4", NULL, 0, 1e6, "X", NULL, "optimizer", 0,
     "peak learning rate (AdamW)"},
    {FLAG_MIN_LR_FRAC, "min-lr-frac", FLAG_TYPE_FLOAT, OFF(min_lr_frac), "0.1", NULL, 0, 1, "X", NULL, "optimizer", 0,
     "final learning rate as a fraction of --lr (cosine and linear schedules)"},
    {FLAG_WARMUP_STEPS, "warmup-steps", FLAG_TYPE_INT, OFF(warmup_steps), "0", NULL, 0, 2147483647.0, "N", NULL,
     "optimizer", 0, "linear warmup from lr/N to lr over the first N steps"},
    {FLAG_SCHEDULE, "schedule", FLAG_TYPE_CHOICE, OFF(schedule), "cosine", "cosine|linear|constant", 0, 0, NULL,
     NULL, "optimizer", 0, "learning-rate decay after warmup"},
    {FLAG_WEIGHT_DECAY, "weight-decay", FLAG_TYPE_FLOAT, OFF(weight_decay), "0.1", NULL, 0, 1e3, "X", NULL,
     "optimizer", 0, "AdamW decoupled weight decay, applied to 2-D weights only"},
    {FLAG_BETA1, "beta1", FLAG_TYPE_FLOAT, OFF(beta1), "0.9", NULL, 0, 0.999999, "X", NULL, "optimizer", 0,
     "AdamW first-moment decay"},
    {FLAG_BETA2, "beta2", FLAG_TYPE_FLOAT, OFF(beta2), "0.95", NULL, 0, 0.999999999, "X", NULL, "optimizer", 0,
     "AdamW second-moment decay"},
    {FLAG_ADAM_EPS, "adam-eps", FLAG_TYPE_FLOAT, OFF(adam_eps), "1e-8", NULL, 1e-30, 1, "X", NULL, "optimizer", 0,
     "AdamW epsilon"},
    {FLAG_GRAD_CLIP, "grad-clip", FLAG_TYPE_FLOAT, OFF(grad_clip), "1.0", NULL, 0, 1e30, "X", NULL, "optimizer", 0,
     "clip the global gradient norm to X; 0 = no clipping"},
    {FLAG_SEED, "seed", FLAG_TYPE_INT64, OFF(seed), "1337", NULL, 0, BIG, "N", NULL, "optimizer", 0,
     "seed of the initial weights, the data order and sampling"},
    {FLAG_ATTN, "attn", FLAG_TYPE_CHOICE, OFF(attn), "gproj", "fp32|bf16|repair|gproj|cudnn", 0, 0, NULL, NULL,
     "attention", 0, "attention numerics mode (docs/attention_numerics.md); cudnn = cuDNN's fused kernel, GPU "
     "trainer only, in a build with cuDNN"},
    {FLAG_ATTN_TILE_MAX_SHIFT, "attn-tile-max-shift", FLAG_TYPE_BOOL, OFF(attn_tile_max_shift), "0", NULL, 0, 1,
     "0|1", "1", "attention", 0, "repair mode only: the Qiu & Yao tile-max shift arm"},
    {FLAG_DETERMINISTIC, "deterministic", FLAG_TYPE_BOOL, OFF(attn_deterministic), "0", NULL, 0, 1, "0|1", "1",
     "attention", 0, "1: the GPU attention backward sums dQ in a fixed order, so a run repeats bit for bit in every "
     "--attn mode (bf16/repair/fp32: ceil(T/128) x the FP32 dQ of extra workspace; gproj's attention is "
     "deterministic either way; the CPU trainer always repeats); refused with --matmul-tune N > 0. "
     "docs/determinism.md"},
    {FLAG_VAL_EVERY, "val-every", FLAG_TYPE_INT, OFF(val_every), "250", NULL, 0, 2147483647.0, "N", NULL, "output",
     0, "validation loss every N steps (and at the end); 0 = only at the end"},
    {FLAG_VAL_BATCHES, "val-batches", FLAG_TYPE_INT, OFF(val_batches), "20", NULL, 1, 2147483647.0, "N", NULL,
     "output", 0, "micro-batches per validation (always the same first N)"},
    {FLAG_SAMPLE_EVERY, "sample-every", FLAG_TYPE_INT, OFF(sample_every), "0", NULL, 0, 2147483647.0, "N", NULL,
     "output", 0, "generate a sample every N steps (and at the end); 0 = never"},
    {FLAG_SAMPLE_TOKENS, "sample-tokens", FLAG_TYPE_INT, OFF(sample_tokens), "64", NULL, 1, 1 << 20, "N", NULL,
     "output", 0, "tokens per sample (at most the sequence length)"},
    {FLAG_SAMPLE_TEMPERATURE, "sample-temperature", FLAG_TYPE_FLOAT, OFF(sample_temperature), "1", NULL, 0, 100,
     "X", NULL, "output", 0, "softmax temperature of the samples; 0 = greedy (the most likely token each time)"},
    {FLAG_CHECKPOINT_EVERY, "checkpoint-every", FLAG_TYPE_INT, OFF(checkpoint_every), "0", NULL, 0, 2147483647.0,
     "N", NULL, "output", 0, "write model + resume state every N steps (and at the end); 0 = only at the end"},
    {FLAG_OUT_DIR, "out-dir", FLAG_TYPE_STRING, OFF(out_dir), "", NULL, 0, 0, "DIR", NULL, "output", 0,
     "run folder for log.jsonl, model_NNNNNNNN.bin, state_NNNNNNNN.bin; \"\" = a new runs/run_DATE_TIME"},
    {FLAG_STOP_AT, "stop-at", FLAG_TYPE_INT, OFF(stop_at), "0", NULL, 0, 2147483647.0, "STEP", NULL, "output", 0,
     "end this invocation after STEP steps with a checkpoint, the schedule still spanning --steps (split a run into "
     "jobs; continue with --resume); 0 = run to --steps"},
    {FLAG_RESUME, "resume", FLAG_TYPE_STRING, OFF(resume), "", NULL, 0, 0, "latest|STATE", "latest", "output", 0,
     "continue bit-exactly from the newest state in --out-dir (bare --resume), or from a state file"},
    {FLAG_OVERWRITE, "overwrite", FLAG_TYPE_BOOL, OFF(overwrite), "0", NULL, 0, 1, "0|1", "1", "output", 0,
     "allow starting over in a run folder that holds a previous run (its log and checkpoints are deleted)"},
    {FLAG_LOG_EVERY, "log-every", FLAG_TYPE_INT, OFF(log_every), "1", NULL, 1, 2147483647.0, "N", NULL, "output", 0,
     "print the console progress line every N steps (log.jsonl gets every step)"},
    {FLAG_CHECKPOINT_DTYPE, "checkpoint-dtype", FLAG_TYPE_CHOICE, OFF(checkpoint_dtype), "fp32", "fp32|bf16", 0, 0,
     NULL, NULL, "output", 0, "weights in model_NNNNNNNN.bin: fp32 (llm.c version 3) or bf16 (llm.c version 5, "
     "round-to-nearest-even: what llm.c's default BF16 trainer loads; a --resume then continues from the rounded "
     "weights, not bit-exactly). docs/llmc.md"},
    {FLAG_CHECKPOINT_MINUTES, "checkpoint-minutes", FLAG_TYPE_FLOAT, OFF(checkpoint_minutes), "30", NULL, 0, 1e9,
     "X", NULL, "run safety", 0, "also checkpoint when X minutes of wall time have passed since the last one; such "
     "a checkpoint is deleted once a newer one exists (those of --checkpoint-every, --stop-at, the end and a "
     "signal are kept); 0 = off"},
    {FLAG_DIVERGE_MARGIN, "diverge-margin", FLAG_TYPE_FLOAT, OFF(diverge_margin), "5", NULL, 0, 1e9, "NATS", NULL,
     "run safety", 0, "stop as diverged (before the update, no checkpoint of the diverged weights) when a step's "
     "loss exceeds the lowest loss of this invocation by more than NATS; a non-finite loss or gradient norm always "
     "stops; 0 = only non-finite values stop"},
    {FLAG_SKIP_UPDATE_Z, "skip-update-z", FLAG_TYPE_FLOAT, OFF(skip_update_z), "0", NULL, 0, 1e9, "Z", NULL,
     "run safety", 0, "skip the optimizer update of a step whose loss or gradient norm is more than Z standard "
     "deviations above the mean of the last 128 steps (judged after 16; logged as skip_update); 0 = off"},
    {FLAG_DIAG_EVERY, "diag-every", FLAG_TYPE_INT, OFF(diag_every), "0", NULL, 0, 2147483647.0, "N", NULL,
     "diagnostics", 0, "per-layer attention diagnostics (rho, max |q|, |k|, logit, entropy) every N steps"},
    {FLAG_CAPTURE_STEPS, "capture-steps", FLAG_TYPE_STRING, OFF(capture_steps), "", NULL, 0, 0, "S1,S2,...", NULL,
     "diagnostics", 0, "steps at which to write attention inputs (Q, K, V, dO) for the probe"},
    {FLAG_CAPTURE_LAYERS, "capture-layers", FLAG_TYPE_STRING, OFF(capture_layers), "", NULL, 0, 0, "L1,L2,...",
     NULL, "diagnostics", 0, "layers to capture at --capture-steps; \"\" = all"},
    {FLAG_CAPTURE_ATTN, "capture-attn", FLAG_TYPE_STRING, OFF(capture_attn), "", NULL, 0, 0, "STEPS:LAYERS", NULL,
     "diagnostics", 0, "the two flags above in one, e.g. 1000,2000:0,5,11 (\":LAYERS\" left out = all layers)"},
    {FLAG_PROBE_EVERY, "probe-every", FLAG_TYPE_INT, OFF(probe_every), "0", NULL, 0, 2147483647.0, "N", NULL,
     "diagnostics", 0, "every N steps replay one layer's attention backward (round robin) against a more accurate "
     "recomputation (GPU: fp32 mode; CPU: fp64) and log the dQ/dK error; not given = at every --diag-every step; 0 = never"},
    {FLAG_ZERO_KEY_BIAS_GRAD, "zero-key-bias-grad", FLAG_TYPE_BOOL, OFF(zero_key_bias_grad), "0", NULL, 0, 1, "0|1",
     "1", "diagnostics", 0, "gauge arm: zero the key-bias gradient (exactly zero in exact arithmetic) before "
     "the optimizer"},
    {FLAG_WARN_RHO, "warn-rho", FLAG_TYPE_FLOAT, OFF(warn_rho), "20", NULL, 0, 1e30, "X", NULL, "diagnostics", 0,
     "warn (console + attn_warning log event) when a layer's key offset rho crosses X at a --diag-every step, "
     "once per layer and crossing; fp32/gproj runs stayed under 9, bf16 runs reached 80-190 before breaking; "
     "0 = off"},
    {FLAG_WARN_DQ_ERR, "warn-dq-err", FLAG_TYPE_FLOAT, OFF(warn_dq_err), "0.05", NULL, 0, 1e30, "X", NULL,
     "diagnostics", 0, "warn likewise when the in-run probe's median dQ error (--probe-every) crosses X "
     "(0.05 = 5%; gproj reads 0.2-0.3%); 0 = off"},
    {FLAG_CHECKPOINT_ON_WARNING, "checkpoint-on-warning", FLAG_TYPE_BOOL, OFF(checkpoint_on_warning), "1", NULL, 0,
     1, "0|1", "1", "diagnostics", 0, "after the run's first attention warning, write a checkpoint that is kept, "
     "to continue from under gproj (--resume STATE --attn gproj); 0 = off"},
    {FLAG_RECOMPUTE, "recompute", FLAG_TYPE_INT, OFF(recompute), "0", NULL, 0, 2, "0|1|2", NULL, "GPU trainer only",
     1, "activation recomputation in backward: 0 none, 1 GELU, 2 GELU + layernorm"},
    {FLAG_ATTN_KERNELS, "attn-kernels", FLAG_TYPE_CHOICE, OFF(attn_kernels), "auto", "auto|portable", 0, 0, NULL,
     NULL, "GPU trainer only", 1, "auto: the Hopper (wgmma) attention kernels on H100/H200, the mma.sync ones "
     "elsewhere; portable: always the mma.sync ones. Same numerics contract, different sum order"},
    {FLAG_ZERO_STAGE, "zero-stage", FLAG_TYPE_INT, OFF(zero_stage), "0", NULL, 0, 1, "0|1", NULL,
     "GPU trainer only", 1, "1 = shard the optimizer state across processes (ZeRO-1)"},
    {FLAG_NCCL_ID_FILE, "nccl-id-file", FLAG_TYPE_STRING, OFF(nccl_id_file), "", NULL, 0, 0, "PATH", NULL,
     "GPU trainer only", 1, "multi-GPU launch through RANK/WORLD_SIZE/LOCAL_RANK: a path all ranks share, where "
     "rank 0 writes the NCCL id (not needed under mpirun)"},
    {FLAG_CUDA_GRAPH, "cuda-graph", FLAG_TYPE_INT, OFF(cuda_graph), "0", NULL, 0, 1, "0|1", NULL, "GPU trainer only",
     1, "1: capture each micro-step's forward (with loss) + backward kernels once, after the first step, as one "
     "CUDA graph and replay it (the token upload and the embedding backward stay plain launches); eager launches "
     "on multi-GPU runs (NCCL hooks in backward) and on --probe-every/--capture steps, and for evaluation and "
     "sampling. Same bits as 0"},
    {FLAG_MATMUL_TUNE, "matmul-tune", FLAG_TYPE_INT, OFF(matmul_tune), "0", NULL, 0, 64, "N", NULL,
     "GPU trainer only", 1, "N > 0: before the first step, time the cuBLASLt heuristic's first N algorithms of each "
     "GEMM of the training step on one throw-away micro-step and keep the fastest (saved with each checkpoint: "
     "--resume runs the same ones; two fresh runs can choose differently, so not with --deterministic 1). 0 = the "
     "heuristic's first, as llm.c. On an H200 it made the GEMMs 2-4% faster and the attention after them slower, "
     "for no step-time gain at d12, d24 or 450m. docs/gpu_trainer.md"},
};

/* Defaults as text; flags_set_default may replace them. */
static const char* g_defaults[NUM_FLAGS];
static int g_defaults_ready = 0;

static void defaults_ready(void) {
    if (g_defaults_ready) return;
    for (int i = 0; i < NUM_FLAGS; i++) {
        if ((int)g_rows[i].id != i) { /* rows must follow the FlagId order: a bug in this file */
            fprintf(stderr, "error: flag table row %d (--%s) is out of FlagId order\n", i, g_rows[i].name);
            abort();
        }
        g_defaults[i] = g_rows[i].def;
    }
    g_defaults_ready = 1;
}

FlagInfo flags_info(FlagId id) {
    defaults_ready();
    FlagInfo fi = {g_rows[id].name, g_rows[id].type, g_defaults[id], g_rows[id].choices, g_rows[id].help,
                   g_rows[id].gpu_only};
    return fi;
}

static void describe_allowed(const FlagRow* r, char* buf, size_t n) {
    switch (r->type) {
        case FLAG_TYPE_INT:
        case FLAG_TYPE_INT64:
            if (r->max >= 2147483647.0) snprintf(buf, n, "an integer >= %.0f", r->min);
            else snprintf(buf, n, "an integer from %.0f to %.0f", r->min, r->max);
            break;
        case FLAG_TYPE_FLOAT:
            if (r->max >= 1e6) snprintf(buf, n, "a number >= %g", r->min);
            else snprintf(buf, n, "a number from %g to %g", r->min, r->max);
            break;
        case FLAG_TYPE_BOOL: snprintf(buf, n, "0 or 1 (or true/false)"); break;
        case FLAG_TYPE_CHOICE: snprintf(buf, n, "one of %s", r->choices); break;
        case FLAG_TYPE_STRING: snprintf(buf, n, "a %s", r->metavar ? r->metavar : "string"); break;
    }
}

static int parse_bool_text(const char* v, int* out) {
    if (strcmp(v, "1") == 0 || strcmp(v, "true") == 0) { *out = 1; return 0; }
    if (strcmp(v, "0") == 0 || strcmp(v, "false") == 0) { *out = 0; return 0; }
    return -1;
}

/* Is `v` one of the '|'-separated words of `choices`? */
static int choice_ok(const char* choices, const char* v) {
    size_t n = strlen(v);
    const char* p = choices;
    while (*p) {
        const char* bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0) return 1;
        if (!bar) break;
        p = bar + 1;
    }
    return 0;
}

/* Parses text v for row r into f. 0, or -1 with "--name: ..." in err. */
static int set_value(TrainFlags* f, const FlagRow* r, const char* v, char* err, size_t errlen) {
    char* base = (char*)f + r->offset;
    char allowed[160];
    describe_allowed(r, allowed, sizeof(allowed));
    switch (r->type) {
        case FLAG_TYPE_INT:
        case FLAG_TYPE_INT64: {
            char* end = NULL;
            errno = 0;
            long long x = strtoll(v, &end, 10);
            if (*v == '\0' || *end != '\0' || errno != 0) {
                snprintf(err, errlen, "--%s: '%s' is not an integer; allowed: %s", r->name, v, allowed);
                return -1;
            }
            if ((double)x < r->min || (double)x > r->max) {
                snprintf(err, errlen, "--%s: %s is out of range; allowed: %s", r->name, v, allowed);
                return -1;
            }
            if (r->type == FLAG_TYPE_INT) *(int*)base = (int)x;
            else *(int64_t*)base = (int64_t)x;
            return 0;
        }
        case FLAG_TYPE_FLOAT: {
            char* end = NULL;
            errno = 0;
            double x = strtod(v, &end);
            if (*v == '\0' || *end != '\0' || errno != 0 || !isfinite(x)) {
                snprintf(err, errlen, "--%s: '%s' is not a finite number; allowed: %s", r->name, v, allowed);
                return -1;
            }
            if (x < r->min || x > r->max) {
                snprintf(err, errlen, "--%s: %s is out of range; allowed: %s", r->name, v, allowed);
                return -1;
            }
            *(float*)base = (float)x;
            return 0;
        }
        case FLAG_TYPE_BOOL: {
            int b;
            if (parse_bool_text(v, &b) != 0) {
                snprintf(err, errlen, "--%s: '%s' is not allowed; allowed: %s", r->name, v, allowed);
                return -1;
            }
            *(int*)base = b;
            return 0;
        }
        case FLAG_TYPE_CHOICE:
            if (!choice_ok(r->choices, v)) {
                snprintf(err, errlen, "--%s: '%s' is not allowed; allowed: %s", r->name, v, allowed);
                return -1;
            }
            *(const char**)base = v;
            return 0;
        case FLAG_TYPE_STRING:
            *(const char**)base = v;
            return 0;
    }
    return -1;
}

int flags_set_default(FlagId id, const char* value, char* err, size_t errlen) {
    defaults_ready();
    if ((int)id < 0 || id >= NUM_FLAGS) {
        snprintf(err, errlen, "flags_set_default: no flag with id %d", (int)id);
        return -1;
    }
    TrainFlags scratch;
    memset(&scratch, 0, sizeof(scratch));
    if (set_value(&scratch, &g_rows[id], value, err, errlen) != 0) return -1;
    g_defaults[id] = value;
    return 0;
}

void flags_init(TrainFlags* f) {
    defaults_ready();
    memset(f, 0, sizeof(*f));
    char err[256];
    for (int i = 0; i < NUM_FLAGS; i++) {
        /* Defaults were checked when set; a failure here is a bug in the table. */
        if (set_value(f, &g_rows[i], g_defaults[i], err, sizeof(err)) != 0) {
            fprintf(stderr, "error: bad default in the flag table: %s\n", err);
            abort();
        }
    }
}

static int edit_distance(const char* a, const char* b) {
    int la = (int)strlen(a), lb = (int)strlen(b);
    if (la > 64 || lb > 64) return 99;
    int prev[65], cur[65];
    for (int j = 0; j <= lb; j++) prev[j] = j;
    for (int i = 1; i <= la; i++) {
        cur[0] = i;
        for (int j = 1; j <= lb; j++) {
            int sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            int del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof(int) * (size_t)(lb + 1));
    }
    return prev[lb];
}

static const FlagRow* find_row(const char* name, size_t len) {
    for (int i = 0; i < NUM_FLAGS; i++) {
        if (strlen(g_rows[i].name) == len && strncmp(g_rows[i].name, name, len) == 0) return &g_rows[i];
    }
    return NULL;
}

int flags_parse(TrainFlags* f, int argc, char** argv, char* err, size_t errlen) {
    defaults_ready();
    const FlagRow* bare_bool = NULL; /* the flag before arg: a boolean given without a value */
    for (int i = 1; i < argc; i++) {
        const char* arg = argv[i];
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) return 1;
        if (strncmp(arg, "--", 2) != 0 || arg[2] == '\0') {
            if (bare_bool != NULL)
                snprintf(err, errlen, "--%s: '%s' is not 0|1|true|false (a bare --%s means 1)", bare_bool->name, arg,
                         bare_bool->name);
            else
                snprintf(err, errlen, "unexpected argument '%s': every setting is a --flag (see --help)", arg);
            return -1;
        }
        bare_bool = NULL;
        const char* name = arg + 2;
        const char* eq = strchr(name, '=');
        size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
        const FlagRow* r = find_row(name, name_len);
        if (r == NULL) {
            char given[96];
            snprintf(given, sizeof(given), "%.*s", (int)(name_len < 80 ? name_len : 80), name);
            int best = 99;
            const char* best_name = NULL;
            for (int k = 0; k < NUM_FLAGS; k++) {
                int d = edit_distance(given, g_rows[k].name);
                if (d < best) { best = d; best_name = g_rows[k].name; }
            }
            if (best_name != NULL && best <= 3)
                snprintf(err, errlen, "unknown flag '--%s'; did you mean --%s? (see --help)", given, best_name);
            else
                snprintf(err, errlen, "unknown flag '--%s' (see --help for the list)", given);
            return -1;
        }
        const char* value = NULL;
        if (eq) {
            value = eq + 1;
        } else if (r->implicit != NULL) {
            /* Optional value: take the next word only if it is one this flag can use. */
            const char* next = (i + 1 < argc) ? argv[i + 1] : NULL;
            int b;
            if (next != NULL && r->type == FLAG_TYPE_BOOL && parse_bool_text(next, &b) == 0) {
                value = next;
                i++;
            } else if (next != NULL && r->type != FLAG_TYPE_BOOL && strncmp(next, "--", 2) != 0) {
                value = next;
                i++;
            } else {
                value = r->implicit;
                if (r->type == FLAG_TYPE_BOOL) bare_bool = r;
            }
        } else {
            if (i + 1 >= argc) {
                char allowed[160];
                describe_allowed(r, allowed, sizeof(allowed));
                snprintf(err, errlen, "--%s needs a value (%s)", r->name, allowed);
                return -1;
            }
            value = argv[++i];
        }
        if (set_value(f, r, value, err, errlen) != 0) return -1;
        f->was_set[r->id] = 1;
    }
    return 0;
}

int flags_was_set(const TrainFlags* f, FlagId id) { return f->was_set[id] != 0; }

static void value_text(const TrainFlags* f, const FlagRow* r, char* buf, size_t n) {
    const char* base = (const char*)f + r->offset;
    switch (r->type) {
        case FLAG_TYPE_INT:
        case FLAG_TYPE_BOOL: snprintf(buf, n, "%d", *(const int*)base); break;
        case FLAG_TYPE_INT64: snprintf(buf, n, "%lld", (long long)*(const int64_t*)base); break;
        case FLAG_TYPE_FLOAT: {
            /* The shortest text that reads back as the same float (0.1, not 0.100000001). */
            const float x = *(const float*)base;
            for (int digits = 1; digits <= 9; digits++) {
                snprintf(buf, n, "%.*g", digits, (double)x);
                if (strtof(buf, NULL) == x) break;
            }
            break;
        }
        case FLAG_TYPE_CHOICE:
        case FLAG_TYPE_STRING: snprintf(buf, n, "%s", *(const char* const*)base); break;
    }
}

int flags_reject_gpu_only(const TrainFlags* f, const char* program, char* err, size_t errlen) {
    TrainFlags defaults;
    flags_init(&defaults);
    for (int i = 0; i < NUM_FLAGS; i++) {
        const FlagRow* r = &g_rows[i];
        if (!r->gpu_only || !f->was_set[i]) continue;
        char got[256], def[256];
        value_text(f, r, got, sizeof(got));
        value_text(&defaults, r, def, sizeof(def));
        if (strcmp(got, def) != 0) {
            snprintf(err, errlen, "--%s is implemented by the GPU trainer only (build/train_gpt); %s accepts "
                     "only its default (%s), got '%s'", r->name, program, def, got);
            return -1;
        }
    }
    /* one value of a shared flag is GPU only: cuDNN's kernel has no CPU emulation */
    if (f->was_set[FLAG_ATTN] && strcmp(f->attn, "cudnn") == 0) {
        snprintf(err, errlen, "--attn cudnn is implemented by the GPU trainer only (build/train_gpt: cuDNN's own "
                 "kernel, with no CPU emulation); %s takes --attn %s", program, attn_emulated_mode_choices());
        return -1;
    }
    return 0;
}

void flags_print_help(FILE* out, const char* program, const char* summary, int show_gpu_only) {
    defaults_ready();
    fprintf(out, "usage: %s [--flag value | --flag=value ...]\n", program);
    if (summary != NULL && *summary) fprintf(out, "%s\n", summary);
    const char* group = NULL;
    for (int i = 0; i < NUM_FLAGS; i++) {
        const FlagRow* r = &g_rows[i];
        if (r->gpu_only && !show_gpu_only) continue;
        if (group == NULL || strcmp(group, r->group) != 0) {
            group = r->group;
            fprintf(out, "\n%s:\n", group);
        }
        char left[96];
        const char* meta = r->type == FLAG_TYPE_CHOICE ? r->choices : r->metavar;
        if (r->implicit != NULL) snprintf(left, sizeof(left), "--%s [%s]", r->name, meta);
        else snprintf(left, sizeof(left), "--%s %s", r->name, meta);
        const char* d = g_defaults[i];
        fprintf(out, "  %-34s %s (default: %s)\n", left, r->help, *d ? d : "\"\"");
    }
    if (!show_gpu_only) {
        fprintf(out, "\nThe GPU trainer's own flags (");
        int first = 1;
        for (int i = 0; i < NUM_FLAGS; i++) {
            if (!g_rows[i].gpu_only) continue;
            fprintf(out, "%s--%s", first ? "" : ", ", g_rows[i].name);
            first = 0;
        }
        fprintf(out, ") are accepted only at their defaults here.\n");
    }
}

void flags_print_settings(FILE* out, const TrainFlags* f, int show_gpu_only) {
    for (int i = 0; i < NUM_FLAGS; i++) {
        const FlagRow* r = &g_rows[i];
        if (r->gpu_only && !show_gpu_only) continue;
        char v[512];
        value_text(f, r, v, sizeof(v));
        fprintf(out, "  --%-22s %s%s\n", r->name, *v ? v : "\"\"", f->was_set[i] ? "   (set)" : "");
    }
}

void json_write_string(FILE* out, const char* s) {
    fputc('"', out);
    for (const unsigned char* p = (const unsigned char*)s; *p; p++) {
        switch (*p) {
            case '"': fputs("\\\"", out); break;
            case '\\': fputs("\\\\", out); break;
            case '\n': fputs("\\n", out); break;
            case '\r': fputs("\\r", out); break;
            case '\t': fputs("\\t", out); break;
            default:
                if (*p < 0x20) fprintf(out, "\\u%04x", *p);
                else fputc(*p, out);
        }
    }
    fputc('"', out);
}

void flags_write_json(FILE* out, const TrainFlags* f) {
    for (int i = 0; i < NUM_FLAGS; i++) {
        const FlagRow* r = &g_rows[i];
        char v[512];
        value_text(f, r, v, sizeof(v));
        fprintf(out, "%s", i ? ", " : "");
        json_write_string(out, r->name);
        fputs(": ", out);
        if (r->type == FLAG_TYPE_STRING || r->type == FLAG_TYPE_CHOICE) json_write_string(out, v);
        else fputs(v, out);
    }
}
