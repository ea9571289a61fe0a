/*
 * model/gpt_cuda.cuh - the GPT model on one GPU: buffers, forward, backward,
 * optimizer step. The GPU twin of model/gpt_cpu.h, built from the layer
 * kernels (model/ *.cuh) and the switchable attention module.
 *
 * Architecture options (GPTConfig; the contract is docs/modern_stacks.md):
 * --norm rmsnorm (rmsnorm.cuh in place of layernorm.cuh, the fused residual
 * add included), --pos rope (no wpe; rope.cuh rotates q and k in place, from
 * a cos/sin table built once at init), --qk-norm 1 (qknorm.cuh writes the
 * normalised q, k and the copied v into qkv from the matmul's qkv_raw), --mlp
 * swiglu (a plain fc matmul into [N, 2H], swiglu.cuh, fcproj), --bias 0 (the
 * count-0 biases are NULL: no bias epilogue, no bias gradient),
 * --tie-embeddings 0 (the head reads and trains lm_head; wte gets only the
 * embedding gradient). qkv is always what attention reads (after QK-norm and
 * RoPE), so the diagnostics, the probe and the captures see those keys. A
 * GPT-2 configuration takes exactly the GPT-2 calls: the options' branches
 * are host-side, and every size they change equals GPT-2's at its values
 * (F = H = 4C, the new activation entries empty and last in the tables).
 *
 * Why: train_gpt.cu (and dev/parity_gpu.cu, which checks this model against
 * the CPU reference) need one object that owns every device buffer and runs
 * a training step; the trainer stays thin wiring. The attention mode is a
 * plain field (m->attn_mode) read at every call, so --attn and a mode switch
 * from a checkpoint change nothing else: all modes share the activation
 * layout and the saved state (out + stats) per layer.
 *
 * Precision: BF16 parameters, gradients and activations; FP32 master weights,
 * Adam moments, LayerNorm statistics, softmax statistics and losses.
 * Memory (each role ONE contiguous buffer, addressed through named tables):
 *   params/grads (BF16) and master/m/v (FP32) laid out by gpt_param_table;
 *   activations: BF16 tensors by GpuActId (gpu_act_table), FP32 ones by
 *   GpuStatId; backward scratch (three BF16 buffers, an FP32 reduction
 *   scratch) and the attention workspace (the largest over all modes).
 * GELU lives in cuBLASLt epilogues (model/matmul.cuh): the fc matmul writes
 * fch (pre-activation) and gelu(fch) in one pass (GELU_AUX_BIAS, GELU_AUX
 * without a bias), and the
 * fcproj input-gradient matmul applies gelu'(fch) (DGELU). Bias gradients are
 * column sums (bias_backward; matmul.cuh says why not an epilogue); those of
 * attproj and fcproj, whose outputs join the residual stream, are summed by
 * the following norm's backward, which reads that gradient anyway.
 * --recompute: 0 stores everything; 1 keeps gelu(fch) for one layer only and
 * rebuilds it in backward with gelu.cuh's kernel (one [N,H] buffer instead
 * of L; SwiGLU's output is rebuilt by the forward's own kernel, so with
 * SwiGLU level 1 is bit-identical to 0); 2 also recomputes the ln1/ln2
 * outputs from the stored residual stream (same kernel, same inputs:
 * bit-identical). Levels 1 and 2 give
 * bit-identical gradients. They differ from level 0 only in the rebuilt
 * gelu(fch), which feeds the fcproj weight gradient alone: the epilogue took
 * GELU of the FP32 pre-activation, the rebuild takes it of the stored BF16
 * fch, so elements differ in the last bit where that rounding moved the input
 * (on the same input the two GELUs agree bit for bit: tests/test_layers_gpu).
 * gpt_cuda_memory_plan() adds all of this up BEFORE anything is allocated,
 * so the trainer can refuse sizes that do not fit, with what to lower.
 *
 * Determinism: no atomics anywhere (encoder backward by token buckets, column
 * sums in fixed chunks, norms in fixed order); cuBLASLt with a fixed algorithm
 * per shape is run-to-run reproducible, which bit-exact resume relies on (a
 * resumed run restores the algorithms its state records).
 *
 * Data parallelism (train_gpt.cu drives it): the params/grads buffers may be
 * allocated longer than the parameter count (padded to the ZeRO-1 shard
 * multiple), and the FP32 optimizer state (master, m, v) may cover only one
 * contiguous range of the flat buffer, [opt_offset, opt_offset + opt_count):
 * the whole buffer for one GPU or --zero-stage 0, this rank's shard for
 * ZeRO-1. Two hooks let the trainer act in the middle of backward without
 * this file knowing about NCCL: grad_hook(layer) fires as soon as a layer's
 * gradients are final (the trainer starts reducing them on its own stream,
 * overlapped with the rest of backward), and attn_hook fires right after each
 * attention backward while that layer's dO is still in the scratch buffer
 * (the in-run probe and attention captures). Both NULL = plain training.
 *
 * Offers: GPTCuda, gpt_cuda_memory_plan, gpt_cuda_memory_check, gpt_cuda_init/free,
 * gpt_cuda_set_params (from FP32 host weights), gpt_cuda_get_params,
 * gpt_cuda_forward, gpt_cuda_backward, gpt_cuda_zero_grad, gpt_cuda_update,
 * gpt_cuda_loss_reset/gpt_cuda_loss_read, gpt_cuda_logits_row, and the
 * optimizer-state copies for resume (gpt_cuda_get/set_optimizer_state);
 * for data parallelism gpt_cuda_init_dist, gpt_cuda_memory_plan_dist,
 * gpt_cuda_grad_norm_sq_enqueue (a range's squared norm, left on the device)
 * and gpt_cuda_update_with_norm (AdamW on the optimizer range, given the
 * global norm); the forward/backward halves gpt_cuda_forward_upload /
 * gpt_cuda_forward_kernels and gpt_cuda_backward_layers /
 * gpt_cuda_backward_embeddings, and GpuStepGraph with
 * gpt_cuda_graph_micro_step / gpt_cuda_graph_free (a training micro-step
 * replayed from a captured CUDA graph); gpt_cuda_choose_matmul_algos (the
 * GEMM algorithms of the training step: restored from a resume state's
 * records, or timed on one throw-away micro-step).
 */
#ifndef MODEL_GPT_CUDA_CUH
#define MODEL_GPT_CUDA_CUH

#include <math.h>
#include <time.h>
#include "model/gpt_config.h"
#include "model/param_ranges.h"
#include "attention/attention.h"
#include "attention/attention_cuda.cuh"
#include "model/kernel_common.cuh"
#include "model/encoder.cuh"
#include "model/layernorm.cuh"
#include "model/matmul.cuh"
#include "model/gelu.cuh"
#include "model/rmsnorm.cuh"
#include "model/rope.cuh"
#include "model/qknorm.cuh"
#include "model/swiglu.cuh"
#include "model/fused_classifier.cuh"
#include "model/adamw.cuh"
#include "model/global_norm.cuh"

/* BF16 activations. Per-layer tensors are stacked, layer 0 first, except
   those that --recompute keeps for one layer only. Shapes with N = B*T. */
typedef enum {
    GA_ENCODED = 0, /* (N, C) */
    GA_LN1,         /* (L, N, C), or (N, C) with recompute >= 2 */
    GA_QKV,         /* (L, N, 3C)  attention.h qkv layout: attention's input (after QK-norm and RoPE) */
    GA_ATTY,        /* (L, N, C)   attention output */
    GA_RESIDUAL2,   /* (L, N, C) */
    GA_LN2,         /* (L, N, C), or (N, C) with recompute >= 2 */
    GA_FCH,         /* (L, N, F)   fc output, F = fcw rows: pre-GELU (the epilogue's aux), or SwiGLU's [a | b] */
    GA_FCH_GELU,    /* (L, N, H), or (N, H) with recompute >= 1: gelu(fch), or swiglu(fch) */
    GA_RESIDUAL3,   /* (L, N, C)   block outputs */
    GA_LNF,         /* (N, C) */
    GA_LOGITS,      /* (N, Vp)     logits; dlogits after a training forward */
    GA_PROJ_OUT,    /* (N, C)      attproj / fcproj output before the residual add */
    GA_DRESIDUAL,   /* (N, C)      backward: gradient of the residual stream */
    GA_DBUF_C,      /* (N, C)      backward scratch */
    GA_DBUF_4C,     /* (N, max(3C, F)) backward scratch (dfch, dqkv) */
    GA_QKV_RAW,     /* (L, N, 3C)  the qkv matmul's output, QK-norm's input (count 0 without --qk-norm) */
    GA_DBUF_H,      /* (N, H)      backward: SwiGLU's dh (count 0 with GELU) */
    NUM_GPU_ACTS
} GpuActId;

/* FP32 activations. */
typedef enum {
    GS_LN1_MEAN = 0, GS_LN1_RSTD, /* (L, N); the means have count 0 with RMSNorm */
    GS_LN2_MEAN, GS_LN2_RSTD,     /* (L, N) */
    GS_LNF_MEAN, GS_LNF_RSTD,     /* (N) */
    GS_ATT_STATS,                 /* (L, B, NH, T, 2) */
    GS_LOSSES,                    /* (N) */
    GS_REDUCE_SCRATCH,            /* column-sum partials: gpu_reduce_scratch_floats */
    GS_NORM_SCRATCH,              /* GLOBAL_NORM_BLOCKS */
    GS_QKNORM_RSTD,               /* (L, N * 2 * NH)  QK-norm's rstd per (row, q|k, head); count 0 without it */
    NUM_GPU_STATS
} GpuStatId;

typedef struct {
    size_t count[NUM_GPU_ACTS], offset[NUM_GPU_ACTS], per_layer[NUM_GPU_ACTS];
    size_t stat_count[NUM_GPU_STATS], stat_offset[NUM_GPU_STATS], stat_per_layer[NUM_GPU_STATS];
    size_t total_acts, total_stats;
} GpuActTable;

static const char* const gpu_act_names[NUM_GPU_ACTS] = {
    "encoded", "ln1", "qkv", "atty", "residual2", "ln2", "fch", "fch_gelu", "residual3", "lnf", "logits",
    "proj_out", "dresidual", "dbuf_c", "dbuf_4c", "qkv_raw", "dbuf_h"};

static inline size_t size_max(size_t a, size_t b) { return a > b ? a : b; }

/* FP32 floats of the backward's column-sum scratch: the norm backward's partials, the widest matmul bias
   summed on its own (3C qkvb, F fcb) and QK-norm's gain partials. */
static size_t gpu_reduce_scratch_floats(const GPTConfig* cfg, size_t N) {
    const size_t C = cfg->channels, F = gpt_config_fc_rows(cfg);
    size_t widest = 3 * C;
    if (cfg->bias) widest = size_max(widest, F);
    size_t floats = size_max(colreduce_scratch_floats((long long)N, (long long)widest),
                             rownorm_backward_scratch_floats((long long)N, (long long)C));
    if (cfg->qk_norm)
        floats = size_max(floats, qknorm_scratch_floats((long long)N, cfg->num_heads, cfg->channels / cfg->num_heads));
    return floats;
}

/* Element counts and offsets for batch (B, T). Offsets are multiples of 8
   elements (16 bytes) so every tensor can be read with 16-byte vectors. */
static void gpu_act_table(const GPTConfig* cfg, int B, int T, int recompute, GpuActTable* t) {
    const size_t N = (size_t)B * T, C = cfg->channels, L = cfg->num_layers, Vp = cfg->padded_vocab_size;
    const size_t NH = cfg->num_heads, H = cfg->mlp_hidden, F = gpt_config_fc_rows(cfg);
    const size_t ln_layers = recompute >= 2 ? 1 : L, gelu_layers = recompute >= 1 ? 1 : L;
    const size_t qk = cfg->qk_norm ? 1 : 0, swiglu = cfg->mlp == GPT_MLP_SWIGLU ? 1 : 0;
    const size_t sizes[NUM_GPU_ACTS][2] = {
        /* {layers, per layer}; GPT-2: F = H = 4C, and the last two are empty */
        {1, N * C}, {ln_layers, N * C}, {L, N * 3 * C}, {L, N * C}, {L, N * C}, {ln_layers, N * C},
        {L, N * F}, {gelu_layers, N * H}, {L, N * C}, {1, N * C}, {1, N * Vp}, {1, N * C},
        {1, N * C}, {1, N * C}, {1, N * size_max(3 * C, F)}, {L, qk * N * 3 * C}, {1, swiglu * N * H}};
    size_t off = 0;
    for (int i = 0; i < NUM_GPU_ACTS; i++) {
        t->per_layer[i] = sizes[i][0] > 1 ? sizes[i][1] : 0;
        t->count[i] = sizes[i][0] * sizes[i][1];
        t->offset[i] = off;
        off += (t->count[i] + 7) / 8 * 8;
    }
    t->total_acts = off;
    const size_t mean = cfg->norm == GPT_NORM_LAYERNORM ? N : 0; /* RMSNorm keeps no mean */
    const size_t stat_sizes[NUM_GPU_STATS][2] = {
        {L, mean}, {L, N}, {L, mean}, {L, N}, {1, mean}, {1, N}, {L, (size_t)B * NH * T * 2}, {1, N},
        {1, gpu_reduce_scratch_floats(cfg, N)}, {1, GLOBAL_NORM_BLOCKS}, {L, qk * N * 2 * NH}};
    off = 0;
    for (int i = 0; i < NUM_GPU_STATS; i++) {
        t->stat_per_layer[i] = stat_sizes[i][0] > 1 ? stat_sizes[i][1] : 0;
        t->stat_count[i] = stat_sizes[i][0] * stat_sizes[i][1];
        t->stat_offset[i] = off;
        off += (t->stat_count[i] + 7) / 8 * 8;
    }
    t->total_stats = off;
}

/* The RoPE cos/sin table (model/rope_table.h) for the model's context; 0 without RoPE. */
static size_t gpu_rope_table_bytes(const GPTConfig* cfg) {
    if (cfg->pos != GPT_POS_ROPE) return 0;
    return rope_table_entries(cfg->max_seq_len, cfg->channels / cfg->num_heads) * sizeof(RopeCosSin);
}

typedef struct {
    size_t params_bytes;    /* params + grads (BF16) */
    size_t optimizer_bytes; /* master + m + v (FP32) */
    size_t acts_bytes;      /* BF16 activations and backward scratch */
    size_t stats_bytes;     /* FP32 activations and scratch */
    size_t workspace_bytes; /* attention (largest mode) + cuBLASLt */
    size_t total_bytes;
} GpuMemoryPlan;

/* The attention workspace of the most demanding mode under these options (a run may switch modes on
   resume, and opt.deterministic multiplies bf16's, repair's and fp32's dQ scratch). */
static size_t attention_workspace_all_modes(const GPTConfig* cfg, int B, int T, AttnOptions opt) {
    const AttnShape s = {B, cfg->num_heads, T, cfg->channels / cfg->num_heads};
    size_t most = 0;
    for (int mode = 0; mode < ATTN_NUM_EMULATED_MODES; mode++) {
        const size_t b = attention_cuda_workspace_bytes(s, (AttnMode)mode, opt);
        if (b > most) most = b;
    }
    return most;
}

/* Every byte gpt_cuda_init_dist will allocate, computed without allocating:
   params/grads of padded_params elements (>= the parameter count), optimizer
   state of opt_count elements, plus extra_workspace_bytes the caller needs
   besides (e.g. data parallelism's checkpoint gather buffer); the attention
   workspace for attn_opt (the options the model will run with). */
static GpuMemoryPlan gpt_cuda_memory_plan_dist(const GPTConfig* cfg, int B, int T, int recompute, size_t padded_params,
                                               size_t opt_count, size_t extra_workspace_bytes, AttnOptions attn_opt) {
    GpuMemoryPlan p;
    GpuActTable t;
    gpu_act_table(cfg, B, T, recompute, &t);
    p.params_bytes = 2 * padded_params * sizeof(floatX);
    p.optimizer_bytes = 3 * opt_count * sizeof(float);
    p.acts_bytes = t.total_acts * sizeof(floatX);
    p.stats_bytes = t.total_stats * sizeof(float);
    p.workspace_bytes = attention_workspace_all_modes(cfg, B, T, attn_opt) + MATMUL_WORKSPACE_BYTES +
                        gpu_rope_table_bytes(cfg) + extra_workspace_bytes;
    p.total_bytes = p.params_bytes + p.optimizer_bytes + p.acts_bytes + p.stats_bytes + p.workspace_bytes;
    return p;
}
/* One GPU, whole optimizer state. */
static GpuMemoryPlan gpt_cuda_memory_plan(const GPTConfig* cfg, int B, int T, int recompute) {
    const size_t P = gpt_num_parameters(cfg);
    const AttnOptions defaults = {};
    return gpt_cuda_memory_plan_dist(cfg, B, T, recompute, P, P, 0, defaults);
}

/* Optional per-kernel-kind timing (dev/profile_gpu_step.cu): CUDA events
   recorded on the stream between kernel groups; each interval is charged to
   the phase that started it. Off (NULL) in training: then nothing is recorded. */
typedef enum {
    PH_ENCODER = 0, PH_LAYERNORM, PH_MATMUL, PH_ATTENTION, PH_GELU, PH_CLASSIFIER, PH_BIAS_GRAD, PH_OPTIMIZER,
    PH_OTHER, NUM_PHASES
} GpuPhase;
static const char* const gpu_phase_names[NUM_PHASES] = {
    "encoder", "layernorm / rmsnorm", "matmul (cuBLASLt)", "attention (+ qk-norm, rope)", "gelu / swiglu",
    "classifier", "bias grads", "optimizer+norm", "other (memsets, loss sum)"};
#define PROFILER_MAX_MARKS 4096
typedef struct {
    cudaEvent_t events[PROFILER_MAX_MARKS];
    int phase[PROFILER_MAX_MARKS];
    int count;
    double ms[NUM_PHASES];
} GpuProfiler;

/* Does the plan fit in free_bytes (less a fixed headroom for the CUDA context
   and cuBLAS)? 0 if it does; else 1 with a message that says what to lower. */
#define GPU_MEMORY_HEADROOM_BYTES (512ull << 20)
static int gpt_cuda_memory_check(const GpuMemoryPlan* plan, size_t free_bytes, int B, int T, int recompute,
                                 const char* device_name, char* msg, size_t n) {
    const double GiB = 1024.0 * 1024.0 * 1024.0;
    if (plan->total_bytes + GPU_MEMORY_HEADROOM_BYTES <= free_bytes) return 0;
    snprintf(msg, n,
             "this run needs %.2f GiB on the GPU (weights+grads %.2f, optimizer %.2f, activations %.2f + %.2f, "
             "workspaces %.2f, headroom 0.50) but only %.2f GiB are free on %s\n"
             "  hint: lower --batch-size (now %d; --total-batch-tokens keeps the batch through accumulation), "
             "--seq-len (now %d)%s",
             (plan->total_bytes + GPU_MEMORY_HEADROOM_BYTES) / GiB, plan->params_bytes / GiB,
             plan->optimizer_bytes / GiB, plan->acts_bytes / GiB, plan->stats_bytes / GiB,
             plan->workspace_bytes / GiB, free_bytes / GiB, device_name, B, T,
             recompute < 2 ? ", or raise --recompute (max 2)" : "");
    return 1;
}

/* Called by gpt_cuda_backward on its stream as soon as gradients are final:
   layer = l after layer l's tensors (param_bucket_ranges(l): the per-layer
   tensors' slices of layer l), GRAD_HOOK_REST after the last kernel (wte,
   wpe, lnf: param_bucket_ranges(PARAM_BUCKET_REST)). */
#define GRAD_HOOK_REST PARAM_BUCKET_REST
typedef void (*GradReadyHook)(void* ctx, int layer, cudaStream_t stream);
/* Called right after layer `layer`'s attention backward, with that call's
   inputs: dout is the gradient w.r.t. the attention output, valid only
   until the backward goes on (the probe and captures read it here). */
typedef void (*AttnBackwardHook)(void* ctx, int layer, AttnShape s, const floatX* qkv, const floatX* out,
                                 const float* stats, const floatX* dout, cudaStream_t stream);

typedef struct {
    GPTConfig config;
    ParamTensorInfo params_info[NUM_PARAM_TENSORS];
    size_t num_params;
    size_t alloc_params; /* elements allocated for params and grads (>= num_params; the tail stays zero) */
    size_t opt_offset;   /* the optimizer range: master/adam_m/adam_v element i is flat element */
    size_t opt_count;    /*   opt_offset + i; the whole buffer unless ZeRO-1 shards it */
    floatX* params;  /* BF16 weights the forward reads */
    floatX* grads;   /* BF16 gradients, accumulated over micro-steps */
    float* master;   /* FP32 master weights (the optimizer's truth), opt_count */
    float* adam_m;   /* FP32 first moments, opt_count */
    float* adam_v;   /* FP32 second moments, opt_count */
    GpuActTable acts_info;
    floatX* acts;    /* all BF16 activations */
    float* stats;    /* all FP32 activations and scratch */
    void* attn_workspace;
    RopeCosSin* rope_table; /* [max_seq_len, HS/2] cos/sin for --pos rope (NULL otherwise); never moves */
    double* scalars_dev; /* [0] loss sum, [1] gradient norm squared */
    int* tokens_dev;     /* [2][B*T] inputs, targets */
    int B, T;            /* allocated batch size (a forward may use smaller) */
    int cur_B, cur_T;    /* of the last forward */
    int recompute;
    AttnMode attn_mode;
    AttnOptions attn_opt;
    MatmulContext matmul;
    EncoderBuckets buckets;
    cudaStream_t stream;
    GpuProfiler* profiler; /* NULL unless profiling */
    GradReadyHook grad_hook; void* grad_hook_ctx;     /* NULL: none */
    AttnBackwardHook attn_hook; void* attn_hook_ctx;  /* NULL: none */
} GPTCuda;

/* A tensor the configuration does not have (count 0 in the parameter table: the biases with --bias 0, ...)
   is NULL, which the kernels read as "absent". */
static inline floatX* gpu_param(const GPTCuda* m, floatX* buffer, ParamId id, int layer) {
    const ParamTensorInfo* p = &m->params_info[id];
    if (p->count == 0) return nullptr;
    return buffer + p->offset + (size_t)layer * (p->count / (size_t)p->layers);
}
static inline floatX* gpu_act(const GPTCuda* m, GpuActId id, int layer) {
    return m->acts + m->acts_info.offset[id] + (size_t)layer * m->acts_info.per_layer[id];
}
static inline float* gpu_stat(const GPTCuda* m, GpuStatId id, int layer) {
    return m->stats + m->acts_info.stat_offset[id] + (size_t)layer * m->acts_info.stat_per_layer[id];
}

/* One layer's activations as forward writes them and backward reads them. With --recompute, the
   norm (level 2) and GELU/SwiGLU (level 1) outputs live in one buffer shared by all layers. */
typedef struct {
    const floatX* residual; /* the layer's input: the embeddings, or the previous layer's residual3 */
    floatX *ln1, *qkv, *atty, *residual2, *ln2, *fch, *fch_gelu, *residual3;
    floatX* qkv_raw; /* the qkv matmul's output before QK-norm (with --qk-norm 1; else qkv itself) */
} GpuLayerActs;
static inline int gpu_ln_layer_stride(const GPTCuda* m) { return m->recompute >= 2 ? 0 : 1; }
static inline GpuLayerActs gpu_layer_acts(const GPTCuda* m, int l, const floatX* encoded) {
    const int ln_stride = gpu_ln_layer_stride(m), gelu_stride = m->recompute >= 1 ? 0 : 1;
    GpuLayerActs a;
    a.residual = l == 0 ? encoded : gpu_act(m, GA_RESIDUAL3, l - 1);
    a.ln1 = gpu_act(m, GA_LN1, l * ln_stride);
    a.qkv = gpu_act(m, GA_QKV, l);
    a.atty = gpu_act(m, GA_ATTY, l);
    a.residual2 = gpu_act(m, GA_RESIDUAL2, l);
    a.ln2 = gpu_act(m, GA_LN2, l * ln_stride);
    a.fch = gpu_act(m, GA_FCH, l);
    a.fch_gelu = gpu_act(m, GA_FCH_GELU, l * gelu_stride);
    a.residual3 = gpu_act(m, GA_RESIDUAL3, l);
    a.qkv_raw = m->config.qk_norm ? gpu_act(m, GA_QKV_RAW, l) : a.qkv;
    return a;
}

/* The block's normalisation (--norm): LayerNorm (weight w, bias b, mean and rstd saved) or RMSNorm (gain w,
   rstd saved; b and mean are unused). GPT-2 configurations call layernorm.cuh exactly as written here. */
static inline void gpu_norm_forward(const GPTCuda* m, floatX* out, float* mean, float* rstd, const floatX* inp,
                                    const floatX* w, const floatX* b, int N, int C, cudaStream_t st) {
    if (m->config.norm == GPT_NORM_RMSNORM) rmsnorm_forward(out, rstd, inp, w, N, C, st);
    else layernorm_forward(out, mean, rstd, inp, w, b, N, C, st);
}
/* residual = bf16(x + y), out = norm(residual). */
static inline void gpu_fused_residual_norm_forward(const GPTCuda* m, floatX* residual, floatX* out, float* mean,
                                                   float* rstd, const floatX* x, const floatX* y, const floatX* w,
                                                   const floatX* b, int N, int C, cudaStream_t st) {
    if (m->config.norm == GPT_NORM_RMSNORM) fused_residual_rmsnorm_forward(residual, out, rstd, x, y, w, N, C, st);
    else fused_residual_layernorm_forward(residual, out, mean, rstd, x, y, w, b, N, C, st);
}
/* dinp += d norm / d inp; dw += (and db += for LayerNorm); dresid_bias += the column sums of dinp as passed in
   (the bias gradient of the matmul whose output joined the residual stream before this norm; NULL for none). */
static inline void gpu_norm_backward(const GPTCuda* m, floatX* dinp, floatX* dw, floatX* db, floatX* dresid_bias,
                                     float* scratch, const floatX* dout, const floatX* inp, const floatX* w,
                                     const float* mean, const float* rstd, int N, int C, cudaStream_t st) {
    if (m->config.norm == GPT_NORM_RMSNORM)
        rmsnorm_backward(dinp, dw, dresid_bias, scratch, dout, inp, w, rstd, N, C, st);
    else layernorm_backward(dinp, dw, db, dresid_bias, scratch, dout, inp, w, mean, rstd, N, C, st);
}
/* The output head's weight: wte when tied, lm_head otherwise. */
static inline ParamId gpu_head_param(const GPTCuda* m) { return m->config.tie_embeddings ? P_WTE : P_LMHEADW; }

static inline void prof_mark(GPTCuda* m, GpuPhase phase) {
    GpuProfiler* pr = m->profiler;
    if (pr == NULL) return;
    if (pr->count >= PROFILER_MAX_MARKS) die("profiler: more than %d marks in one step", PROFILER_MAX_MARKS);
    cudaCheck(cudaEventRecord(pr->events[pr->count], m->stream));
    pr->phase[pr->count++] = (int)phase;
}
/* Closes the step: waits, charges each interval to its phase, restarts. */
static void prof_flush(GPTCuda* m) {
    GpuProfiler* pr = m->profiler;
    if (pr == NULL || pr->count == 0) return;
    prof_mark(m, PH_OTHER);
    cudaCheck(cudaEventSynchronize(pr->events[pr->count - 1]));
    for (int i = 0; i + 1 < pr->count; i++) {
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, pr->events[i], pr->events[i + 1]));
        pr->ms[pr->phase[i]] += ms;
    }
    pr->count = 0;
}

/* The shapes the GPU kernels need beyond gpt_config_validate (16-byte vectors: every row stride and
   parameter offset a multiple of 8 elements): 0 if the config has them, else 1 with one message in msg
   naming the flag to change. gpt_cuda_check_options dies with it. */
static int gpt_cuda_options_error(const GPTConfig* cfg, char* msg, size_t n) {
    const int HS = cfg->channels / cfg->num_heads;
    if (cfg->channels % 8 != 0 || cfg->padded_vocab_size % 8 != 0)
        snprintf(msg, n, "GPU model: channels (%d) and padded vocab (%d) must be multiples of 8 (16-byte vector "
                 "loads)", cfg->channels, cfg->padded_vocab_size);
    else if (cfg->mlp_hidden % 8 != 0)
        snprintf(msg, n, "GPU model: --mlp-hidden %d must be a multiple of 8 (16-byte vector loads); e.g. "
                 "--mlp-hidden %d", cfg->mlp_hidden, (cfg->mlp_hidden + 7) / 8 * 8);
    else if (cfg->pos == GPT_POS_ROPE && HS % 16 != 0)
        snprintf(msg, n, "GPU model: --pos rope needs a head size that is a multiple of 16 (the kernel rotates 8 "
                 "pairs per thread); C %d / NH %d = %d: change the channels or heads", cfg->channels,
                 cfg->num_heads, HS);
    else if (cfg->qk_norm && (HS % 8 != 0 || HS > 1024))
        snprintf(msg, n, "GPU model: --qk-norm 1 needs a head size that is a multiple of 8 and at most 1024; "
                 "C %d / NH %d = %d: change the channels or heads", cfg->channels, cfg->num_heads, HS);
    else
        return 0;
    return 1;
}
static void gpt_cuda_check_options(const GPTConfig* cfg) {
    char msg[320];
    if (gpt_cuda_options_error(cfg, msg, sizeof(msg))) die("%s", msg);
}

/* Allocates everything for batches up to (B, T): params/grads of
   padded_params elements, the optimizer state for [opt_offset, opt_offset +
   opt_count) of the flat buffer. Weights are not set (see
   gpt_cuda_set_params). attn_opt becomes m->attn_opt; the attention
   workspace is sized for it (a later change of attn_opt.deterministic from 0
   to 1 would need a larger one). Dies with a message on bad shapes. The caller
   checks gpt_cuda_memory_plan_dist against free memory first. */
static void gpt_cuda_init_dist(GPTCuda* m, const GPTConfig* cfg, int B, int T, int recompute, AttnMode mode,
                               AttnOptions attn_opt, cudaStream_t stream, size_t padded_params, size_t opt_offset,
                               size_t opt_count) {
    char err[256];
    memset(m, 0, sizeof(*m));
    if (gpt_config_validate(cfg, err, sizeof(err)) != 0) die("model config: %s", err);
    gpt_cuda_check_options(cfg);
    if (T > cfg->max_seq_len) die("sequence length %d exceeds the model's context %d", T, cfg->max_seq_len);
    const AttnShape shape = {B, cfg->num_heads, T, cfg->channels / cfg->num_heads};
    for (int md = 0; md < ATTN_NUM_EMULATED_MODES; md++) attention_cuda_check_shape(shape, (AttnMode)md);
    m->config = *cfg;
    m->num_params = gpt_param_table(cfg, m->params_info);
    if (padded_params < m->num_params || opt_offset + opt_count > padded_params)
        die("GPU model: buffer of %zu elements / optimizer range [%zu, %zu) do not fit %zu parameters", padded_params,
            opt_offset, opt_offset + opt_count, m->num_params);
    m->alloc_params = padded_params;
    m->opt_offset = opt_offset;
    m->opt_count = opt_count;
    m->B = B; m->T = T;
    m->recompute = recompute;
    m->attn_mode = mode;
    m->attn_opt = attn_opt;
    m->stream = stream;
    const size_t PA = m->alloc_params, O = opt_count > 0 ? opt_count : 1;
    cudaCheck(cudaMalloc((void**)&m->params, PA * sizeof(floatX)));
    cudaCheck(cudaMalloc((void**)&m->grads, PA * sizeof(floatX)));
    cudaCheck(cudaMalloc((void**)&m->master, O * sizeof(float)));
    cudaCheck(cudaMalloc((void**)&m->adam_m, O * sizeof(float)));
    cudaCheck(cudaMalloc((void**)&m->adam_v, O * sizeof(float)));
    cudaCheck(cudaMemset(m->params, 0, PA * sizeof(floatX)));
    cudaCheck(cudaMemset(m->grads, 0, PA * sizeof(floatX)));
    cudaCheck(cudaMemset(m->master, 0, O * sizeof(float)));
    cudaCheck(cudaMemset(m->adam_m, 0, O * sizeof(float)));
    cudaCheck(cudaMemset(m->adam_v, 0, O * sizeof(float)));
    gpu_act_table(cfg, B, T, recompute, &m->acts_info);
    cudaCheck(cudaMalloc((void**)&m->acts, m->acts_info.total_acts * sizeof(floatX)));
    cudaCheck(cudaMalloc((void**)&m->stats, m->acts_info.total_stats * sizeof(float)));
    cudaCheck(cudaMemset(m->acts, 0, m->acts_info.total_acts * sizeof(floatX)));
    cudaCheck(cudaMemset(m->stats, 0, m->acts_info.total_stats * sizeof(float)));
    const size_t ws = attention_workspace_all_modes(cfg, B, T, attn_opt);
    cudaCheck(cudaMalloc(&m->attn_workspace, ws > 0 ? ws : 16));
    cudaCheck(cudaMalloc((void**)&m->scalars_dev, 2 * sizeof(double)));
    cudaCheck(cudaMalloc((void**)&m->tokens_dev, 2 * (size_t)B * T * sizeof(int)));
    if (cfg->pos == GPT_POS_ROPE) m->rope_table = rope_table_upload(cfg->max_seq_len, shape.HS, cfg->rope_base);
    matmul_context_init(&m->matmul);
    encoder_buckets_init(&m->buckets, B * T, cfg->padded_vocab_size);
}
/* One GPU: the whole optimizer state. */
static void gpt_cuda_init(GPTCuda* m, const GPTConfig* cfg, int B, int T, int recompute, AttnMode mode,
                          cudaStream_t stream) {
    const size_t P = gpt_num_parameters(cfg);
    const AttnOptions defaults = {};
    gpt_cuda_init_dist(m, cfg, B, T, recompute, mode, defaults, stream, P, 0, P);
}

/* Elements of the optimizer range that are real parameters (the rest of a
   ZeRO-1 shard past num_params is padding, never updated). */
static inline size_t gpt_cuda_opt_valid(const GPTCuda* m) {
    if (m->opt_offset >= m->num_params) return 0;
    const size_t left = m->num_params - m->opt_offset;
    return left < m->opt_count ? left : m->opt_count;
}
static inline int gpt_cuda_opt_is_whole(const GPTCuda* m) {
    return m->opt_offset == 0 && m->opt_count >= m->num_params;
}

static void gpt_cuda_free(GPTCuda* m) {
    cudaCheck(cudaFree(m->params)); cudaCheck(cudaFree(m->grads)); cudaCheck(cudaFree(m->master));
    cudaCheck(cudaFree(m->adam_m)); cudaCheck(cudaFree(m->adam_v)); cudaCheck(cudaFree(m->acts));
    cudaCheck(cudaFree(m->stats)); cudaCheck(cudaFree(m->attn_workspace)); cudaCheck(cudaFree(m->scalars_dev));
    cudaCheck(cudaFree(m->tokens_dev));
    cudaCheck(cudaFree(m->rope_table));
    matmul_context_free(&m->matmul);
    encoder_buckets_free(&m->buckets);
}

/* FP32 host weights (all num_params, gpt_param_table layout) -> the master
   weights of the optimizer range (exact) and ALL BF16 params (every rank
   holds every parameter). The BF16 conversion runs on the device, staged in
   chunks through the grads buffer's bytes when the master range does not
   cover everything (grads are zeroed again afterwards). */
static void gpt_cuda_set_params(GPTCuda* m, const float* host_params) {
    const size_t P = m->num_params, valid = gpt_cuda_opt_valid(m);
    if (gpt_cuda_opt_is_whole(m)) {
        cudaCheck(cudaMemcpy(m->master, host_params, P * sizeof(float), cudaMemcpyHostToDevice));
        float_to_bf16_kernel<<<ceil_div((long long)P, 512), 512, 0, m->stream>>>(m->params, m->master, (long long)P);
        cudaCheckLastError();
    } else {
        if (valid > 0)
            cudaCheck(cudaMemcpy(m->master, host_params + m->opt_offset, valid * sizeof(float), cudaMemcpyHostToDevice));
        /* the grads buffer (alloc_params BF16 = alloc_params/2 floats) stages the FP32 values chunk by chunk */
        float* stage = (float*)m->grads;
        const size_t chunk = m->alloc_params / 2;
        for (size_t at = 0; at < P; at += chunk) {
            const size_t n = P - at < chunk ? P - at : chunk;
            cudaCheck(cudaMemcpy(stage, host_params + at, n * sizeof(float), cudaMemcpyHostToDevice));
            float_to_bf16_kernel<<<ceil_div((long long)n, 512), 512, 0, m->stream>>>(m->params + at, stage,
                                                                                      (long long)n);
            cudaCheckLastError();
            cudaCheck(cudaStreamSynchronize(m->stream));
        }
        cudaCheck(cudaMemset(m->grads, 0, m->alloc_params * sizeof(floatX)));
    }
    cudaCheck(cudaStreamSynchronize(m->stream));
}

/* Master weights (FP32) -> host (for checkpoints). Needs the whole optimizer
   range (the ZeRO-1 trainer gathers the shards itself). */
static void gpt_cuda_get_params(GPTCuda* m, float* host_params) {
    if (!gpt_cuda_opt_is_whole(m)) die("gpt_cuda_get_params: this process holds one ZeRO-1 shard only; gather first");
    cudaCheck(cudaStreamSynchronize(m->stream));
    cudaCheck(cudaMemcpy(host_params, m->master, m->num_params * sizeof(float), cudaMemcpyDeviceToHost));
}

/* Optimizer moments <-> host (resume state): m then v, num_params floats
   each, full table order. get needs the whole range; set copies the
   optimizer range's part of the full host arrays. */
static void gpt_cuda_get_optimizer_state(GPTCuda* m, float* host_m, float* host_v) {
    if (!gpt_cuda_opt_is_whole(m)) die("gpt_cuda_get_optimizer_state: this process holds one ZeRO-1 shard only");
    cudaCheck(cudaStreamSynchronize(m->stream));
    cudaCheck(cudaMemcpy(host_m, m->adam_m, m->num_params * sizeof(float), cudaMemcpyDeviceToHost));
    cudaCheck(cudaMemcpy(host_v, m->adam_v, m->num_params * sizeof(float), cudaMemcpyDeviceToHost));
}
static void gpt_cuda_set_optimizer_state(GPTCuda* m, const float* host_m, const float* host_v) {
    const size_t valid = gpt_cuda_opt_valid(m);
    if (valid == 0) return;
    cudaCheck(cudaMemcpy(m->adam_m, host_m + m->opt_offset, valid * sizeof(float), cudaMemcpyHostToDevice));
    cudaCheck(cudaMemcpy(m->adam_v, host_v + m->opt_offset, valid * sizeof(float), cudaMemcpyHostToDevice));
}

/* loss_sum += sum(losses[0..n)) in a fixed order (one block). */
__global__ void loss_accumulate_kernel(double* loss_sum, const float* losses, int n) {
    double acc = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += (double)losses[i];
    __shared__ double partial[1024];
    partial[threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x == 0) {
        double s = 0.0;
        for (int i = 0; i < (int)blockDim.x; i++) s += partial[i];
        *loss_sum += s;
    }
}

static void gpt_cuda_loss_reset(GPTCuda* m) { cudaCheck(cudaMemsetAsync(m->scalars_dev, 0, sizeof(double), m->stream)); }
/* Sum of per-position losses since the last reset (synchronizes). */
static double gpt_cuda_loss_read(GPTCuda* m) {
    double s;
    cudaCheck(cudaMemcpyAsync(&s, m->scalars_dev, sizeof(double), cudaMemcpyDeviceToHost, m->stream));
    cudaCheck(cudaStreamSynchronize(m->stream));
    return s;
}

/*
 * Forward over (B, T) tokens (host arrays, row-major). With targets, the
 * per-position losses are added to the loss sum (gpt_cuda_loss_read); when
 * dloss > 0 the logits are replaced by dlogits = (softmax - onehot) * dloss,
 * ready for gpt_cuda_backward (dloss = 1 / (B*T*grad_accum_steps) for a
 * mean over the whole batch). dloss = 0 keeps the logits (eval, sampling).
 */
/* The forward's host half: checks the token ids, uploads them into the fixed device buffer tokens_dev and,
   for training (dloss > 0), builds and uploads the embedding backward's token buckets. Only copies from host
   memory, so it stays outside a captured graph (gpt_cuda_graph_micro_step runs it before each replay). */
static void gpt_cuda_forward_upload(GPTCuda* m, const int* inputs, const int* targets, int B, int T, float dloss) {
    const GPTConfig* cfg = &m->config;
    if (B > m->B || T > m->T || B < 1 || T < 1) die("forward: batch %dx%d exceeds the allocated %dx%d", B, T, m->B, m->T);
    const int N = B * T;
    for (int i = 0; i < N; i++)
        if (inputs[i] < 0 || inputs[i] >= cfg->vocab_size || (targets && (targets[i] < 0 || targets[i] >= cfg->vocab_size)))
            die("forward: token id out of range [0, %d) at position %d (input %d, target %d)", cfg->vocab_size, i,
                inputs[i], targets ? targets[i] : 0);
    if (dloss > 0 && targets == NULL) die("forward: a training forward (dloss > 0) needs targets");
    m->cur_B = B; m->cur_T = T;
    cudaStream_t st = m->stream;
    int* inputs_dev = m->tokens_dev;
    int* targets_dev = m->tokens_dev + (size_t)m->B * m->T;
    cudaCheck(cudaMemcpyAsync(inputs_dev, inputs, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, st));
    if (targets) cudaCheck(cudaMemcpyAsync(targets_dev, targets, (size_t)N * sizeof(int), cudaMemcpyHostToDevice, st));
    if (dloss > 0) encoder_buckets_build(&m->buckets, inputs, N, st);
}

/* The forward's device half: kernels only, reading the tokens from tokens_dev (with_targets: the loss too).
   Every argument is fixed for a given (B, T, dloss), so a capture of it replays exactly. */
static void gpt_cuda_forward_kernels(GPTCuda* m, int B, int T, int with_targets, float dloss) {
    const GPTConfig* cfg = &m->config;
    const int N = B * T, C = cfg->channels, L = cfg->num_layers, Vp = cfg->padded_vocab_size;
    const int NH = cfg->num_heads, HS = C / NH, H = cfg->mlp_hidden, F = gpt_config_fc_rows(cfg);
    cudaStream_t st = m->stream;
    int* inputs_dev = m->tokens_dev;
    int* targets_dev = m->tokens_dev + (size_t)m->B * m->T;
    const AttnShape shape = {B, NH, T, HS};
    floatX* p = m->params;
    floatX* encoded = gpu_act(m, GA_ENCODED, 0);
    floatX* proj_out = gpu_act(m, GA_PROJ_OUT, 0);
    prof_mark(m, PH_ENCODER);
    encoder_forward(encoded, inputs_dev, gpu_param(m, p, P_WTE, 0), gpu_param(m, p, P_WPE, 0), B, T, C, st);
    const int ln_layer_stride = gpu_ln_layer_stride(m);
    prof_mark(m, PH_LAYERNORM);
    gpu_norm_forward(m, gpu_act(m, GA_LN1, 0), gpu_stat(m, GS_LN1_MEAN, 0), gpu_stat(m, GS_LN1_RSTD, 0), encoded,
                     gpu_param(m, p, P_LN1W, 0), gpu_param(m, p, P_LN1B, 0), N, C, st);
    for (int l = 0; l < L; l++) {
        const GpuLayerActs la = gpu_layer_acts(m, l, encoded);
        prof_mark(m, PH_MATMUL);
        matmul_forward(&m->matmul, la.qkv_raw, la.ln1, gpu_param(m, p, P_QKVW, l), gpu_param(m, p, P_QKVB, l),
                       nullptr, N, C, 3 * C, st);
        /* the q and k attention reads (and the diagnostics and captures with it): QK-norm into qkv, then
           RoPE in place on qkv */
        if (cfg->qk_norm) {
            prof_mark(m, PH_ATTENTION);
            qknorm_forward(la.qkv, gpu_stat(m, GS_QKNORM_RSTD, l), la.qkv_raw, gpu_param(m, p, P_QNORMW, l),
                           gpu_param(m, p, P_KNORMW, l), N, NH, HS, st);
        }
        if (cfg->pos == GPT_POS_ROPE) {
            prof_mark(m, PH_ATTENTION);
            rope_forward(la.qkv, m->rope_table, cfg->max_seq_len, B, T, NH, HS, st);
        }
        prof_mark(m, PH_ATTENTION);
        attention_forward_cuda(m->attn_mode, m->attn_opt, shape, la.qkv, la.atty, gpu_stat(m, GS_ATT_STATS, l),
                               m->attn_workspace, st);
        prof_mark(m, PH_MATMUL);
        matmul_forward(&m->matmul, proj_out, la.atty, gpu_param(m, p, P_ATTPROJW, l), gpu_param(m, p, P_ATTPROJB, l),
                       nullptr, N, C, C, st);
        prof_mark(m, PH_LAYERNORM);
        gpu_fused_residual_norm_forward(m, la.residual2, la.ln2, gpu_stat(m, GS_LN2_MEAN, l),
                                        gpu_stat(m, GS_LN2_RSTD, l), la.residual, proj_out,
                                        gpu_param(m, p, P_LN2W, l), gpu_param(m, p, P_LN2B, l), N, C, st);
        prof_mark(m, PH_MATMUL);
        if (cfg->mlp == GPT_MLP_SWIGLU) {
            /* fch = [a | b] = ln2 Wfc^T (+ bfc), then fch_gelu = silu(a) * b (rebuilt the same way by --recompute) */
            matmul_forward(&m->matmul, la.fch, la.ln2, gpu_param(m, p, P_FCW, l), gpu_param(m, p, P_FCB, l), nullptr,
                           N, C, F, st);
            prof_mark(m, PH_GELU);
            swiglu_forward(la.fch_gelu, la.fch, N, H, st);
        } else {
            /* fch = ln2 Wfc^T (+ bfc) and fch_gelu = gelu(fch) from one GEMM (GELU_AUX_BIAS, or GELU_AUX without
               a bias); with --recompute, fch_gelu is one layer's buffer that backward rebuilds from fch */
            matmul_forward(&m->matmul, la.fch_gelu, la.ln2, gpu_param(m, p, P_FCW, l), gpu_param(m, p, P_FCB, l),
                           la.fch, N, C, H, st);
        }
        prof_mark(m, PH_MATMUL);
        matmul_forward(&m->matmul, proj_out, la.fch_gelu, gpu_param(m, p, P_FCPROJW, l), gpu_param(m, p, P_FCPROJB, l),
                       nullptr, N, H, C, st);
        if (l + 1 < L) {
            prof_mark(m, PH_LAYERNORM);
            gpu_fused_residual_norm_forward(m, la.residual3, gpu_act(m, GA_LN1, (l + 1) * ln_layer_stride),
                                            gpu_stat(m, GS_LN1_MEAN, l + 1), gpu_stat(m, GS_LN1_RSTD, l + 1),
                                            la.residual2, proj_out, gpu_param(m, p, P_LN1W, l + 1),
                                            gpu_param(m, p, P_LN1B, l + 1), N, C, st);
        } else {
            prof_mark(m, PH_LAYERNORM);
            gpu_fused_residual_norm_forward(m, la.residual3, gpu_act(m, GA_LNF, 0), gpu_stat(m, GS_LNF_MEAN, 0),
                                            gpu_stat(m, GS_LNF_RSTD, 0), la.residual2, proj_out,
                                            gpu_param(m, p, P_LNFW, 0), gpu_param(m, p, P_LNFB, 0), N, C, st);
        }
    }
    floatX* logits = gpu_act(m, GA_LOGITS, 0);
    prof_mark(m, PH_MATMUL);
    matmul_forward(&m->matmul, logits, gpu_act(m, GA_LNF, 0), gpu_param(m, p, gpu_head_param(m), 0), nullptr,
                   nullptr, N, C, Vp, st);
    if (with_targets) {
        float* losses = gpu_stat(m, GS_LOSSES, 0);
        prof_mark(m, PH_CLASSIFIER);
        fused_classifier(logits, losses, targets_dev, dloss, N, cfg->vocab_size, Vp, dloss > 0, st);
        prof_mark(m, PH_OTHER);
        loss_accumulate_kernel<<<1, 1024, 0, st>>>(m->scalars_dev, losses, N);
        cudaCheckLastError();
    }
}

static void gpt_cuda_forward(GPTCuda* m, const int* inputs, const int* targets, int B, int T, float dloss) {
    gpt_cuda_forward_upload(m, inputs, targets, B, T, dloss);
    gpt_cuda_forward_kernels(m, B, T, targets != NULL, dloss);
}

static void gpt_cuda_zero_grad(GPTCuda* m) {
    prof_mark(m, PH_OTHER);
    cudaCheck(cudaMemsetAsync(m->grads, 0, m->alloc_params * sizeof(floatX), m->stream));
}

/* The backward up to and including layer 0 (everything but the embeddings). Every kernel argument is fixed
   for a given (B, T); the hooks are host callbacks (a captured graph must run with both NULL). */
static void gpt_cuda_backward_layers(GPTCuda* m) {
    const GPTConfig* cfg = &m->config;
    const int B = m->cur_B, T = m->cur_T, N = B * T, C = cfg->channels, L = cfg->num_layers;
    const int Vp = cfg->padded_vocab_size, NH = cfg->num_heads, HS = C / NH, H = cfg->mlp_hidden;
    const int F = gpt_config_fc_rows(cfg);
    const AttnShape shape = {B, NH, T, HS};
    cudaStream_t st = m->stream;
    floatX* p = m->params;
    floatX* g = m->grads;
    float* scratch = gpu_stat(m, GS_REDUCE_SCRATCH, 0);
    floatX* dres = gpu_act(m, GA_DRESIDUAL, 0);
    floatX* dbuf_c = gpu_act(m, GA_DBUF_C, 0);
    floatX* dbuf_4c = gpu_act(m, GA_DBUF_4C, 0);
    floatX* dbuf_h = gpu_act(m, GA_DBUF_H, 0);
    floatX* encoded = gpu_act(m, GA_ENCODED, 0);
    const floatX* dlogits = gpu_act(m, GA_LOGITS, 0);

    /* output head (wte when tied, else lm_head, whose gradient is then final here) and the final norm */
    const ParamId head = gpu_head_param(m);
    prof_mark(m, PH_MATMUL);
    matmul_backward_input(&m->matmul, dbuf_c, dlogits, gpu_param(m, p, head, 0), N, C, Vp, 0, st);
    prof_mark(m, PH_MATMUL);
    matmul_backward_weight(&m->matmul, gpu_param(m, g, head, 0), dlogits, gpu_act(m, GA_LNF, 0), N, C, Vp, st);
    prof_mark(m, PH_OTHER);
    cudaCheck(cudaMemsetAsync(dres, 0, (size_t)N * C * sizeof(floatX), st));
    prof_mark(m, PH_LAYERNORM);
    gpu_norm_backward(m, dres, gpu_param(m, g, P_LNFW, 0), gpu_param(m, g, P_LNFB, 0), nullptr, scratch, dbuf_c,
                      gpu_act(m, GA_RESIDUAL3, L - 1), gpu_param(m, p, P_LNFW, 0), gpu_stat(m, GS_LNF_MEAN, 0),
                      gpu_stat(m, GS_LNF_RSTD, 0), N, C, st);
    for (int l = L - 1; l >= 0; l--) {
        const GpuLayerActs la = gpu_layer_acts(m, l, encoded);
        float* ln1_mean = gpu_stat(m, GS_LN1_MEAN, l);
        float* ln1_rstd = gpu_stat(m, GS_LN1_RSTD, l);
        float* ln2_mean = gpu_stat(m, GS_LN2_MEAN, l);
        float* ln2_rstd = gpu_stat(m, GS_LN2_RSTD, l);
        /* --recompute: rebuild what the forward did not keep for this layer
           (gelu(fch): the forward's values up to the last BF16 bit, see the top
           comment; swiglu(fch) and the norm outputs: same kernel, same inputs,
           bit-identical) */
        if (m->recompute >= 1) {
            prof_mark(m, PH_GELU);
            if (cfg->mlp == GPT_MLP_SWIGLU) swiglu_forward(la.fch_gelu, la.fch, N, H, st);
            else gelu_forward(la.fch_gelu, la.fch, (long long)N * H, st);
        }
        if (m->recompute >= 2) {
            prof_mark(m, PH_LAYERNORM);
            gpu_norm_forward(m, la.ln1, ln1_mean, ln1_rstd, la.residual, gpu_param(m, p, P_LN1W, l),
                             gpu_param(m, p, P_LN1B, l), N, C, st);
            prof_mark(m, PH_LAYERNORM);
            gpu_norm_forward(m, la.ln2, ln2_mean, ln2_rstd, la.residual2, gpu_param(m, p, P_LN2W, l),
                             gpu_param(m, p, P_LN2B, l), N, C, st);
        }
        /* MLP: fcproj (its input gradient into dbuf_4c = d fch: through the GELU in the matmul's epilogue, or
           into dbuf_h = d swiglu(fch) and then through SwiGLU's backward), fc, norm2 */
        prof_mark(m, PH_MATMUL);
        if (cfg->mlp == GPT_MLP_SWIGLU) {
            matmul_backward_input(&m->matmul, dbuf_h, dres, gpu_param(m, p, P_FCPROJW, l), N, H, C, 0, st);
            prof_mark(m, PH_GELU);
            swiglu_backward(dbuf_4c, dbuf_h, la.fch, N, H, st);
        } else {
            matmul_backward_input_dgelu(&m->matmul, dbuf_4c, dres, gpu_param(m, p, P_FCPROJW, l), la.fch, N, H, C,
                                        st);
        }
        prof_mark(m, PH_MATMUL);
        matmul_backward_weight(&m->matmul, gpu_param(m, g, P_FCPROJW, l), dres, la.fch_gelu, N, H, C, st);
        prof_mark(m, PH_MATMUL);
        matmul_backward_input(&m->matmul, dbuf_c, dbuf_4c, gpu_param(m, p, P_FCW, l), N, C, F, 0, st);
        prof_mark(m, PH_MATMUL);
        matmul_backward_weight(&m->matmul, gpu_param(m, g, P_FCW, l), dbuf_4c, la.ln2, N, C, F, st);
        prof_mark(m, PH_BIAS_GRAD);
        bias_backward(gpu_param(m, g, P_FCB, l), dbuf_4c, scratch, N, F, st);
        prof_mark(m, PH_LAYERNORM);
        /* fcproj's bias gradient is the column sum of dres as it is now (before norm2 adds into it) */
        gpu_norm_backward(m, dres, gpu_param(m, g, P_LN2W, l), gpu_param(m, g, P_LN2B, l),
                          gpu_param(m, g, P_FCPROJB, l), scratch, dbuf_c,
                          la.residual2, gpu_param(m, p, P_LN2W, l), ln2_mean, ln2_rstd, N, C, st);
        /* attention: attproj, attention, qkv, LN1 */
        prof_mark(m, PH_MATMUL);
        matmul_backward_input(&m->matmul, dbuf_c, dres, gpu_param(m, p, P_ATTPROJW, l), N, C, C, 0, st);
        prof_mark(m, PH_MATMUL);
        matmul_backward_weight(&m->matmul, gpu_param(m, g, P_ATTPROJW, l), dres, la.atty, N, C, C, st);
        prof_mark(m, PH_ATTENTION);
        attention_backward_cuda(m->attn_mode, m->attn_opt, shape, la.qkv, la.atty, gpu_stat(m, GS_ATT_STATS, l), dbuf_c,
                                dbuf_4c, m->attn_workspace, st);
        if (m->attn_hook) {
            prof_mark(m, PH_OTHER);
            m->attn_hook(m->attn_hook_ctx, l, shape, la.qkv, la.atty, gpu_stat(m, GS_ATT_STATS, l), dbuf_c, st);
        }
        /* dbuf_4c holds d(attention's qkv); back through RoPE, then QK-norm (the forward's reverse order), to
           d(the qkv matmul's output) */
        if (cfg->pos == GPT_POS_ROPE) {
            prof_mark(m, PH_ATTENTION);
            rope_backward(dbuf_4c, m->rope_table, cfg->max_seq_len, B, T, NH, HS, st);
        }
        if (cfg->qk_norm) {
            prof_mark(m, PH_ATTENTION);
            qknorm_backward(dbuf_4c, gpu_param(m, g, P_QNORMW, l), gpu_param(m, g, P_KNORMW, l), scratch, la.qkv_raw,
                            gpu_stat(m, GS_QKNORM_RSTD, l), gpu_param(m, p, P_QNORMW, l),
                            gpu_param(m, p, P_KNORMW, l), N, NH, HS, st);
        }
        prof_mark(m, PH_MATMUL);
        matmul_backward_input(&m->matmul, dbuf_c, dbuf_4c, gpu_param(m, p, P_QKVW, l), N, C, 3 * C, 0, st);
        prof_mark(m, PH_MATMUL);
        matmul_backward_weight(&m->matmul, gpu_param(m, g, P_QKVW, l), dbuf_4c, la.ln1, N, C, 3 * C, st);
        prof_mark(m, PH_BIAS_GRAD);
        bias_backward(gpu_param(m, g, P_QKVB, l), dbuf_4c, scratch, N, 3 * C, st);
        prof_mark(m, PH_LAYERNORM);
        /* and attproj's the column sum of dres before norm1 adds into it */
        gpu_norm_backward(m, dres, gpu_param(m, g, P_LN1W, l), gpu_param(m, g, P_LN1B, l),
                          gpu_param(m, g, P_ATTPROJB, l), scratch, dbuf_c,
                          la.residual, gpu_param(m, p, P_LN1W, l), ln1_mean, ln1_rstd, N, C, st);
        if (m->grad_hook) m->grad_hook(m->grad_hook_ctx, l, st); /* layer l's gradients are final */
    }
}

/* The embedding backward (wte, wpe) from dresidual, then the last grad hook. Its wte kernel's grid and
   arguments hold the micro-batch's number of distinct tokens (host-built buckets), which changes every
   micro-step: never part of a captured graph. */
static void gpt_cuda_backward_embeddings(GPTCuda* m) {
    const int B = m->cur_B, T = m->cur_T, C = m->config.channels;
    floatX* g = m->grads;
    prof_mark(m, PH_ENCODER);
    encoder_backward(gpu_param(m, g, P_WTE, 0), gpu_param(m, g, P_WPE, 0), gpu_act(m, GA_DRESIDUAL, 0), &m->buckets,
                     B, T, C, m->stream);
    if (m->grad_hook) m->grad_hook(m->grad_hook_ctx, GRAD_HOOK_REST, m->stream);
}

/* After a training forward (dloss > 0): ACCUMULATES the parameter gradients. */
static void gpt_cuda_backward(GPTCuda* m) {
    gpt_cuda_backward_layers(m);
    gpt_cuda_backward_embeddings(m);
}

/*
 * The cuBLASLt algorithm of every GEMM of a training micro-step at the allocated (B, T), chosen before the first
 * step (train_gpt --matmul-tune N). saved/num_saved: the records of a run being resumed (model/matmul_record.h),
 * given back first, so its GEMMs run as they ran before; if one of them does not fit this GPU or library, none
 * is kept (returned as -1 with the reason; the caller says what that costs and goes on). Then, with
 * candidates > 0, one micro-step on synthetic tokens runs with the context tuning: every GEMM shape not
 * restored gets the fastest of the heuristic's first `candidates` algorithms, timed on that step's own operands.
 * The step's results are thrown away: the gradients are zeroed and the loss sum reset after it; the hooks are
 * off during it (no gradient is reduced, no probe runs). Before any CUDA graph is captured. *tune gets what
 * timing bought (matmul_tune_summary).
 */
static int gpt_cuda_choose_matmul_algos(GPTCuda* m, int candidates, const MatmulAlgoRecord* saved, int num_saved,
                                        MatmulTuneSummary* tune, char* err, size_t errlen) {
    int rc = 0;
    if (num_saved > 0 && (rc = matmul_records_restore(&m->matmul, saved, num_saved, err, errlen)) != 0)
        matmul_plans_clear(&m->matmul);
    if (candidates > 0) {
        const int B = m->B, T = m->T, N = B * T, V = m->config.vocab_size;
        int* tokens = (int*)mallocCheck(sizeof(int) * (size_t)N);
        for (int i = 0; i < N; i++) tokens[i] = (int)(((long long)i * 7919 + 13) % V); /* any valid ids */
        GradReadyHook grad_hook = m->grad_hook;
        AttnBackwardHook attn_hook = m->attn_hook;
        m->grad_hook = NULL;
        m->attn_hook = NULL;
        m->matmul.tune_candidates = candidates;
        gpt_cuda_forward(m, tokens, tokens, B, T, 1.0f / (float)N);
        gpt_cuda_backward_layers(m); /* the embedding backward has no GEMM */
        m->matmul.tune_candidates = 0;
        m->grad_hook = grad_hook;
        m->attn_hook = attn_hook;
        gpt_cuda_zero_grad(m);
        gpt_cuda_loss_reset(m);
        cudaCheck(cudaStreamSynchronize(m->stream));
        free(tokens);
    }
    *tune = matmul_tune_summary(&m->matmul);
    return rc;
}

/*
 * CUDA graph of one training micro-step (train_gpt --cuda-graph 1). Why: at small shapes many kernels run for
 * only a few microseconds (about 25 launches per layer plus cuBLASLt's), so each launch's host cost shows in the
 * step; a graph replays them without it.
 *
 * What is captured: gpt_cuda_forward_kernels (training forward with loss and dlogits) and
 * gpt_cuda_backward_layers, once, on m->stream. What stays outside, before and after every replay:
 * gpt_cuda_forward_upload (copies from pageable host memory: the tokens into tokens_dev, the embedding
 * buckets) and gpt_cuda_backward_embeddings (its wte grid is the micro-batch's count of distinct tokens).
 * The replay is thus the same kernels, arguments and pointers in the same stream order as gpt_cuda_forward
 * + gpt_cuda_backward: the same bits.
 *
 * Every value the captured kernels take by value is fixed by (B, T, dloss, attention mode and options,
 * recompute) and the model's buffers (allocated once; the TMA maps the attention kernels encode on the host
 * name those fixed buffers); the graph records them and each replay checks them. The hooks are host
 * callbacks, so a graph needs grad_hook and attn_hook NULL (and no profiler): steps that need them run
 * eagerly. Capture needs one eager micro-step before it (kernel modules loaded, cuBLASLt and tensor-map
 * entry points resolved, cudaFuncSetAttribute done): the caller's job.
 *
 * Mode ThreadLocal: a call made by this thread during the capture that cannot be captured (cudaMalloc, a
 * synchronous cudaMemcpy/cudaMemset, a stream or device synchronize) fails at once and the run stops with
 * the reason (Relaxed would let cudaMalloc through, and the graph would hold a buffer allocated once).
 */
typedef struct {
    cudaGraph_t graph;
    cudaGraphExec_t exec; /* NULL until captured */
    /* what the graph was captured for */
    int B, T, recompute;
    float dloss;
    AttnMode attn_mode;
    AttnOptions attn_opt;
    const void* buffers[8];
    size_t num_nodes;
    double capture_ms;    /* host time of capture + instantiate */
    long long replays;
} GpuStepGraph;

/* Non-NULL while a capture is open, so a failure inside it (any cudaCheck or die, in any file) is followed
   by what was being captured and the way around it. */
static const char* g_gpt_graph_capturing = NULL;
static void gpt_graph_exit_hook(int status, void* unused) {
    (void)unused;
    if (status == 0 || g_gpt_graph_capturing == NULL) return;
    fprintf(stderr, "error: the failure above happened while capturing %s into a CUDA graph\n"
            "  hint: --cuda-graph 0 runs every step with plain kernel launches\n", g_gpt_graph_capturing);
}

static void gpt_graph_die(const char* call, cudaError_t e, const char* why) {
    g_gpt_graph_capturing = NULL;
    die("CUDA graph: %s failed: %s (%s)%s%s\n  hint: --cuda-graph 0 runs every step with plain kernel launches",
        call, cudaGetErrorString(e), cudaGetErrorName(e), why ? "\n  " : "", why ? why : "");
}

static void gpt_graph_key(const GPTCuda* m, int B, int T, float dloss, GpuStepGraph* k) {
    k->B = B; k->T = T; k->recompute = m->recompute; k->dloss = dloss;
    k->attn_mode = m->attn_mode; k->attn_opt = m->attn_opt;
    const void* b[8] = {m->params, m->grads, m->acts, m->stats, m->attn_workspace, m->scalars_dev, m->tokens_dev,
                        m->matmul.workspace};
    memcpy(k->buffers, b, sizeof b);
}
static int gpt_graph_key_equal(const GpuStepGraph* a, const GpuStepGraph* b) {
    return a->B == b->B && a->T == b->T && a->recompute == b->recompute &&
           memcmp(&a->dloss, &b->dloss, sizeof a->dloss) == 0 && a->attn_mode == b->attn_mode &&
           a->attn_opt.tile_max_shift == b->attn_opt.tile_max_shift &&
           a->attn_opt.force_portable == b->attn_opt.force_portable &&
           a->attn_opt.deterministic == b->attn_opt.deterministic &&
           memcmp(a->buffers, b->buffers, sizeof a->buffers) == 0;
}

static void gpt_cuda_graph_capture(GPTCuda* m, GpuStepGraph* g, int B, int T, float dloss) {
    static int hook_installed = 0;
    if (!hook_installed) {
        on_exit(gpt_graph_exit_hook, NULL);
        hook_installed = 1;
    }
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaCheck(cudaStreamIsCapturing(m->stream, &cs));
    if (cs != cudaStreamCaptureStatusNone) die("CUDA graph: the model's stream is already capturing");
    cudaCheckLastError(); /* an earlier launch error is not the capture's */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    g_gpt_graph_capturing = "the training forward + backward";
    cudaError_t e = cudaStreamBeginCapture(m->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) gpt_graph_die("cudaStreamBeginCapture", e, NULL);
    gpt_cuda_forward_kernels(m, B, T, 1, dloss);
    gpt_cuda_backward_layers(m);
    cudaGraph_t graph = NULL;
    e = cudaStreamEndCapture(m->stream, &graph);
    if (e != cudaSuccess)
        gpt_graph_die("cudaStreamEndCapture", e,
                      "something in the forward/backward cannot be captured: a synchronous copy or memset, an "
                      "allocation, a synchronize, or work joined from another stream");
    g_gpt_graph_capturing = NULL;
    cudaGraphExec_t exec = NULL;
    e = cudaGraphInstantiate(&exec, graph, 0);
    if (e != cudaSuccess) gpt_graph_die("cudaGraphInstantiate", e, NULL);
    size_t nodes = 0;
    cudaCheck(cudaGraphGetNodes(graph, NULL, &nodes));
    clock_gettime(CLOCK_MONOTONIC, &t1);
    gpt_graph_key(m, B, T, dloss, g);
    g->graph = graph;
    g->exec = exec;
    g->num_nodes = nodes;
    g->capture_ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) * 1e-6;
    g->replays = 0;
}

/*
 * One training micro-step (forward with targets and dloss > 0, then backward, gradients accumulated) through
 * the graph: upload, replay (capturing first if there is no graph yet), embedding backward. Equivalent to
 * gpt_cuda_forward(m, inputs, targets, B, T, dloss) + gpt_cuda_backward(m). Returns 1 if it captured.
 */
static int gpt_cuda_graph_micro_step(GPTCuda* m, GpuStepGraph* g, const int* inputs, const int* targets, int B,
                                     int T, float dloss) {
    if (m->grad_hook || m->attn_hook || m->profiler)
        die("CUDA graph: a micro-step with a grad hook, an attention hook or the profiler must run eagerly "
            "(gpt_cuda_forward + gpt_cuda_backward): they are host work inside backward");
    if (targets == NULL || !(dloss > 0)) die("CUDA graph: only a training micro-step (targets, dloss > 0) is captured");
    gpt_cuda_forward_upload(m, inputs, targets, B, T, dloss);
    int captured = 0;
    if (g->exec == NULL) {
        gpt_cuda_graph_capture(m, g, B, T, dloss);
        captured = 1;
    } else {
        GpuStepGraph now;
        gpt_graph_key(m, B, T, dloss, &now);
        if (!gpt_graph_key_equal(g, &now))
            die("CUDA graph: captured for batch %dx%d, dloss %g, attention %s, recompute %d; this micro-step is "
                "%dx%d, dloss %g, attention %s, recompute %d (or a buffer moved): the graph would replay stale "
                "arguments\n  hint: --cuda-graph 0", g->B, g->T, g->dloss, attn_mode_name(g->attn_mode),
                g->recompute, B, T, dloss, attn_mode_name(m->attn_mode), m->recompute);
    }
    const cudaError_t e = cudaGraphLaunch(g->exec, m->stream);
    if (e != cudaSuccess) gpt_graph_die("cudaGraphLaunch", e, NULL);
    g->replays++;
    gpt_cuda_backward_embeddings(m);
    return captured;
}

static void gpt_cuda_graph_free(GpuStepGraph* g) {
    if (g->exec) cudaCheck(cudaGraphExecDestroy(g->exec));
    if (g->graph) cudaCheck(cudaGraphDestroy(g->graph));
    memset(g, 0, sizeof *g);
}

/* Enqueues the sum of squares of grads[offset, offset + count) into the
   device double scalars_dev[1] (deterministic order; no sync). A data
   parallel trainer passes its ZeRO shard of the reduced gradients and sums
   the ranks' values. */
static void gpt_cuda_grad_norm_sq_enqueue(GPTCuda* m, size_t offset, size_t count) {
    prof_mark(m, PH_OPTIMIZER);
    global_norm_squared(m->scalars_dev + 1, gpu_stat(m, GS_NORM_SCRATCH, 0), m->grads + offset, (long long)count,
                        m->stream);
}

/* ||grads|| over all parameters (deterministic; synchronizes). */
static double gpt_cuda_grad_norm(GPTCuda* m) {
    gpt_cuda_grad_norm_sq_enqueue(m, 0, m->num_params);
    double sq;
    cudaCheck(cudaMemcpyAsync(&sq, m->scalars_dev + 1, sizeof(double), cudaMemcpyDeviceToHost, m->stream));
    cudaCheck(cudaStreamSynchronize(m->stream));
    return sqrt(sq);
}

/* AdamW on the optimizer range given the global pre-clip gradient norm:
   grads scaled by min(1, grad_clip / norm) (grad_clip 0 = off); decay on the
   tensors the table marks. The BF16 params of the range are rewritten; the
   rest (other ranks' shards) is the caller's all-gather. Nothing happens
   when norm is not finite. */
static void gpt_cuda_update_with_norm(GPTCuda* m, AdamWHyper h, float grad_clip, double norm) {
    if (!isfinite(norm)) return; /* never write NaN/inf into the weights; the caller stops */
    const float scale = (grad_clip > 0.0f && norm > grad_clip) ? (float)(grad_clip / norm) : 1.0f;
    const size_t lo = m->opt_offset;
    ParamRange pieces[NUM_PARAM_TENSORS];
    const int n = param_opt_pieces(m->params_info, lo, lo + gpt_cuda_opt_valid(m), pieces);
    /* One launch for all tensors of the range: element i of the optimizer
       buffers is flat element lo + i, so params/grads are offset by lo and
       the tensor pieces become ranges relative to lo, each with its decay. */
    AdamWRange ranges[NUM_PARAM_TENSORS];
    for (int i = 0; i < n; i++) {
        ranges[i].start = (long long)(pieces[i].start - lo);
        ranges[i].end = (long long)(pieces[i].end - lo);
        ranges[i].weight_decay = m->params_info[pieces[i].tag].weight_decay ? h.weight_decay : 0.0f;
    }
    prof_mark(m, PH_OPTIMIZER);
    adamw_update_ranges(m->params + lo, m->master, m->adam_m, m->adam_v, m->grads + lo, ranges, n, h, scale,
                        m->stream);
}

/*
 * One AdamW step on one GPU (h.step is 1-based) with gradient clipping to
 * grad_clip (0 = off): grads are scaled by min(1, grad_clip / norm). Decay
 * applies to the tensors the table marks (2-D weights). Returns the pre-clip
 * norm; if it is not finite, nothing is updated (the caller reports and stops).
 */
static double gpt_cuda_update(GPTCuda* m, AdamWHyper h, float grad_clip) {
    const double norm = gpt_cuda_grad_norm(m);
    gpt_cuda_update_with_norm(m, h, grad_clip, norm);
    return norm;
}

/* Logits of position (b, t) of the last forward, first V columns, as floats
   (for sampling; valid after a forward with dloss == 0). Synchronizes. */
static void gpt_cuda_logits_row(GPTCuda* m, int b, int t, float* out) {
    const int V = m->config.vocab_size, Vp = m->config.padded_vocab_size;
    const floatX* row = gpu_act(m, GA_LOGITS, 0) + ((size_t)b * m->cur_T + t) * Vp;
    floatX* tmp = (floatX*)mallocCheck((size_t)V * sizeof(floatX));
    cudaCheck(cudaMemcpyAsync(tmp, row, (size_t)V * sizeof(floatX), cudaMemcpyDeviceToHost, m->stream));
    cudaCheck(cudaStreamSynchronize(m->stream));
    for (int i = 0; i < V; i++) out[i] = __bfloat162float(tmp[i]);
    free(tmp);
}

#endif /* MODEL_GPT_CUDA_CUH */
