/*
 * model/gpt_cpu.h - the GPT model on the CPU: forward, backward, weight init.
 *
 * Why: this is the project's reference model. The CPU trainer runs it, the
 * CUDA model is checked against it, and the PyTorch twin (dev/gpt_twin.py) is
 * checked against it. It is plain, readable FP32 C with OpenMP; attention goes
 * through the switchable attention module (attention/attention.h) in the
 * run-time mode the model was created with, so the training effect of each
 * mode's internal rounding is visible on the CPU too.
 *
 * Model (GPT-2 with its options): token (+ learned position) embedding; L
 * pre-norm blocks
 *   x += attproj(attention(rope(qknorm(qkv(N1(x))))));  x += fcproj(act(fc(N2(x))));
 * final norm; output head (logits = NF(x) W^T over Vp columns, W = wte when
 * tied, else lm_head; columns >= V are computed but excluded from the softmax
 * and get zero gradient); loss = mean over B*T of the cross-entropy.
 * The options (model/gpt_config.h, docs/modern_stacks.md): N = LayerNorm or
 * RMSNorm; act = GELU-tanh, or SwiGLU on fc's gate|up halves; qknorm (per
 * head RMSNorm of q and k with gains) and rope (rotate-half) only when on;
 * linear biases only with bias 1. Attention reads the transformed q and k
 * (gpt_cpu_attn_qkv): that is the tensor diagnostics and captures look at.
 *
 * Memory: parameters, gradients, activations and activation gradients each
 * live in ONE contiguous buffer; parameters are addressed through the named
 * table of model/gpt_config.h, activations through the ActId table below.
 *
 * Precision: the element type is gpt_real, float unless the file is compiled
 * with -DGPT_CPU_REAL=double. The double build exists only for the
 * finite-difference test (tests/test_gpt_grad.c); it requires ATTN_FP32 and
 * uses the attention module's fp64 reference. Everyone else uses float.
 */
#ifndef MODEL_GPT_CPU_H
#define MODEL_GPT_CPU_H

#include <stddef.h>
#include <stdint.h>

#include "attention/attention.h"
#include "model/gpt_config.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifndef GPT_CPU_REAL
#define GPT_CPU_REAL float
#endif
typedef GPT_CPU_REAL gpt_real;

/* Activation tensors (all layers of one kind are stacked: L first). Shapes for (B, T). */
typedef enum {
    A_ENCODED = 0,  /* (B, T, C)       wte[token] + wpe[t] */
    A_LN1,          /* (L, B, T, C) */
    A_LN1_MEAN,     /* (L, B, T)       LayerNorm only (unused with RMSNorm) */
    A_LN1_RSTD,     /* (L, B, T) */
    A_QKV,          /* (L, B, T, 3C)   qkv matmul output, attention/attention.h qkv layout */
    A_QKV_ATT,      /* (L, B, T, 3C)   what attention reads: q, k after qk-norm and RoPE, v copied
                       (count 0 without qk-norm and RoPE: attention reads A_QKV) */
    A_QK_RSTD,      /* (L, B, T, 2NH)  qk-norm's 1/rms per (token, q|k, head) (count 0 without qk-norm) */
    A_ATTY,         /* (L, B, T, C)    attention output */
    A_ATT_STATS,    /* (L, B, NH, T, 2) saved softmax state (attention.h) */
    A_RESIDUAL2,    /* (L, B, T, C)    x after the attention block */
    A_LN2,          /* (L, B, T, C) */
    A_LN2_MEAN,     /* (L, B, T) */
    A_LN2_RSTD,     /* (L, B, T) */
    A_FCH,          /* (L, B, T, F)    fc output: F = H (GELU) or 2H (SwiGLU gate | up) */
    A_FCH_GELU,     /* (L, B, T, H)    the activation: gelu(fch) or silu(gate) * up */
    A_RESIDUAL3,    /* (L, B, T, C)    x after the MLP block (block output) */
    A_LNF,          /* (B, T, C) */
    A_LNF_MEAN,     /* (B, T) */
    A_LNF_RSTD,     /* (B, T) */
    A_LOGITS,       /* (B, T, Vp)      raw logits (columns >= V: computed, never in the softmax) */
    /* the entries below have no gradient buffer: keep them last */
    A_PROBS,        /* (B, T, Vp)      softmax over the first V columns; 0 beyond */
    A_LOSSES,       /* (B, T)          per-position cross-entropy (when targets were given) */
    NUM_ACT_TENSORS
} ActId;

typedef struct {
    const char* name;  /* "encoded", "ln1", ... */
    size_t count;      /* elements */
    size_t offset;     /* elements from the start of the activation buffer */
    int layers;        /* L for per-layer tensors (layer l starts at offset + l*count/L), else 1 */
} ActTensorInfo;

/* Fills table[NUM_ACT_TENSORS] for (cfg, B, T); returns the total element count. */
size_t gpt_act_table(const GPTConfig* cfg, int B, int T, ActTensorInfo table[NUM_ACT_TENSORS]);

typedef struct {
    GPTConfig config;
    ParamTensorInfo params_info[NUM_PARAM_TENSORS];
    gpt_real* params;      /* num_params, table order (llm.c checkpoint order) */
    gpt_real* grads;       /* same layout as params */
    size_t num_params;
    ActTensorInfo acts_info[NUM_ACT_TENSORS];
    gpt_real* acts;        /* num_acts, ActId table */
    gpt_real* grads_acts;  /* gradients w.r.t. activations (scratch for backward), same layout as acts
                              but only num_grads_acts long: the last entries (A_PROBS, A_LOSSES)
                              need no gradient buffer */
    size_t num_acts;
    size_t num_grads_acts;
    int B, T;              /* sizes the activations were allocated for (a forward may use smaller) */
    AttnMode attn_mode;
    AttnOptions attn_opt;  /* zero-initialised by gpt_cpu_init; set fields before forward */
    gpt_real* logits;      /* (B, T, Vp) RAW logits after forward = acts + A_LOGITS offset;
                              row stride Vp; only columns < V are meaningful for sampling */
    gpt_real* probs;       /* (B, T, Vp) softmax probabilities (first V columns) after forward */
    float mean_loss;       /* mean cross-entropy after a forward with targets, else -1 */
    /* state of the last forward: */
    int cur_B, cur_T;      /* batch shape of the last forward */
    int* inputs;           /* (B, T) copy of the last forward's inputs */
    int* targets;          /* (B, T) copy of its targets */
    int has_targets;       /* 1 if the last forward had targets (backward allowed) */
    gpt_real* rope_cos;    /* (T, HS/2) RoPE tables from model/rope_table.h (shared with the GPU), NULL without RoPE */
    gpt_real* rope_sin;
} GPTCpu;

/* Allocates parameters, gradients (zeroed) and activations for batches up to (B, T).
   Does not set weights (see gpt_cpu_init_weights or load a checkpoint into m->params).
   Dies with a message on invalid config, T > max_seq_len, or (double build) mode != fp32. */
void gpt_cpu_init(GPTCpu* m, const GPTConfig* cfg, int B, int T, AttnMode mode);

/* GPT-2 initialisation, written into a parameter buffer laid out by gpt_param_table:
   weights N(0, 0.02); residual projections (attprojw, fcprojw) N(0, 0.02/sqrt(2L));
   biases 0; norm weights and gains (LayerNorm, RMSNorm, QK-norm) 1, LayerNorm biases 0;
   an untied lm_head like wte; rows >= V (padding) of wte and lm_head 0.
   Counter-based and portable: element i of the buffer is a pure function of (seed, i)
   (splitmix64 hash -> Box-Muller in double -> rounded to float), so it is identical
   across builds, thread counts and machines, and the CUDA trainer can reproduce it
   by calling this on a host buffer. */
void gpt_init_params(const GPTConfig* cfg, gpt_real* params, uint64_t seed);
/* gpt_init_params on m->params. */
void gpt_cpu_init_weights(GPTCpu* m, uint64_t seed);

/* inputs, targets: (B, T) token ids in [0, V) (checked; dies naming the bad id).
   targets may be NULL (then mean_loss = -1 and backward is not allowed).
   B <= m->B, T <= m->T. */
void gpt_cpu_forward(GPTCpu* m, const int* inputs, const int* targets, int B, int T);
void gpt_cpu_zero_grad(GPTCpu* m);
/* After a forward with targets: ACCUMULATES d(mean_loss)/d(params) into m->grads. */
void gpt_cpu_backward(GPTCpu* m);
void gpt_cpu_free(GPTCpu* m);

/* What attention reads in layer `layer` after the last forward, (cur_B, cur_T, 3C)
   in attention.h's qkv layout: q and k after qk-norm and RoPE (A_QKV_ATT) when
   either is on, else the qkv matmul output (A_QKV). */
const gpt_real* gpt_cpu_attn_qkv(const GPTCpu* m, int layer);

/* Pointer to parameter tensor `id` (layer 0) inside a parameter-shaped buffer. */
static inline gpt_real* gpt_param_ptr(const GPTCpu* m, gpt_real* buffer, ParamId id) {
    return buffer + m->params_info[id].offset;
}
/* Pointer to layer `layer` of activation tensor `id` inside an activation-shaped buffer
   (layer 0 for tensors that are not per layer). Within a layer the last forward's
   (cur_B, cur_T) rows are contiguous from this pointer. */
static inline gpt_real* gpt_act_ptr(const GPTCpu* m, gpt_real* buffer, ActId id, int layer) {
    const ActTensorInfo* a = &m->acts_info[id];
    return buffer + a->offset + (size_t)layer * (a->count / (size_t)a->layers);
}

#ifdef __cplusplus
}
#endif

#endif /* MODEL_GPT_CPU_H */
