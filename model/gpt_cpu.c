/*
 * model/gpt_cpu.c - the GPT-2 model on the CPU (see gpt_cpu.h for the contract).
 *
 * Why: the reference everything else is checked against, so every layer is a
 * plain loop that reads like the math, parallel over independent rows with
 * OpenMP. Forward stores what backward needs (LayerNorm mean/rstd, the GELU
 * input, the attention output and its softmax statistics); backward
 * recomputes nothing except inside attention, whose saved state is the
 * attention module's. No T x T matrix exists outside attention.
 *
 * The element type is gpt_real (float by default). This one file is compiled
 * a second time with -DGPT_CPU_REAL=double for the finite-difference test;
 * <tgmath.h> picks exp/log/tanh/sqrt of the right precision, and the only
 * precision-dependent choice (which attention entry point to call) is made by
 * _Generic on the element type, not by a preprocessor fork.
 */
#include "model/gpt_cpu.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <tgmath.h>

#include "common/utils.h"

#define LAYERNORM_EPS 1e-5

/* ------------------------------------------------------------------------ */
/* tables and allocation                                                     */

size_t gpt_act_table(const GPTConfig* cfg, int B, int T, ActTensorInfo t[NUM_ACT_TENSORS]) {
    const size_t L = (size_t)cfg->num_layers, C = (size_t)cfg->channels, NH = (size_t)cfg->num_heads;
    const size_t Vp = (size_t)cfg->padded_vocab_size, BT = (size_t)B * (size_t)T;
    const struct { ActId id; const char* name; size_t layers, per_layer; } spec[NUM_ACT_TENSORS] = {
        {A_ENCODED, "encoded", 1, BT * C},
        {A_LN1, "ln1", L, BT * C},
        {A_LN1_MEAN, "ln1_mean", L, BT},
        {A_LN1_RSTD, "ln1_rstd", L, BT},
        {A_QKV, "qkv", L, BT * 3 * C},
        {A_ATTY, "atty", L, BT * C},
        {A_ATT_STATS, "att_stats", L, BT * NH * 2},
        {A_RESIDUAL2, "residual2", L, BT * C},
        {A_LN2, "ln2", L, BT * C},
        {A_LN2_MEAN, "ln2_mean", L, BT},
        {A_LN2_RSTD, "ln2_rstd", L, BT},
        {A_FCH, "fch", L, BT * 4 * C},
        {A_FCH_GELU, "fch_gelu", L, BT * 4 * C},
        {A_RESIDUAL3, "residual3", L, BT * C},
        {A_LNF, "lnf", 1, BT * C},
        {A_LNF_MEAN, "lnf_mean", 1, BT},
        {A_LNF_RSTD, "lnf_rstd", 1, BT},
        {A_LOGITS, "logits", 1, BT * Vp},
        {A_PROBS, "probs", 1, BT * Vp},
        {A_LOSSES, "losses", 1, BT},
    };
    size_t offset = 0;
    for (int i = 0; i < NUM_ACT_TENSORS; i++) {
        ActTensorInfo* a = &t[spec[i].id];
        a->name = spec[i].name;
        a->layers = (int)spec[i].layers;
        a->count = spec[i].layers * spec[i].per_layer;
        a->offset = offset;
        offset += a->count;
    }
    return offset;
}

_Static_assert(A_PROBS == NUM_ACT_TENSORS - 2 && A_LOSSES == NUM_ACT_TENSORS - 1,
               "probs and losses must be the last activations: grads_acts stops before them");

void gpt_cpu_init(GPTCpu* m, const GPTConfig* cfg, int B, int T, AttnMode mode) {
    char err[256];
    if (gpt_config_validate(cfg, err, sizeof(err)) != 0) die("invalid model config: %s", err);
    if (B < 1 || T < 1) die("batch size (%d) and sequence length (%d) must be positive", B, T);
    if (T > cfg->max_seq_len) {
        die("sequence length %d exceeds the model's maximum %d\n"
            "  hint: use a shorter sequence length or a model with a longer context", T, cfg->max_seq_len);
    }
    if ((int)mode < 0 || mode >= ATTN_NUM_MODES) die("attention mode %d is not a valid AttnMode", (int)mode);
    if (sizeof(gpt_real) != sizeof(float) && mode != ATTN_FP32) {
        die("the double-precision model build supports only fp32 attention (it uses the fp64 reference)");
    }
    memset(m, 0, sizeof(*m));
    m->config = *cfg;
    m->B = B;
    m->T = T;
    m->attn_mode = mode;
    m->num_params = gpt_param_table(cfg, m->params_info);
    m->num_acts = gpt_act_table(cfg, B, T, m->acts_info);
    m->params = (gpt_real*)callocCheck(m->num_params, sizeof(gpt_real));
    m->grads = (gpt_real*)callocCheck(m->num_params, sizeof(gpt_real));
    m->acts = (gpt_real*)callocCheck(m->num_acts, sizeof(gpt_real));
    /* probs and losses come last in the table and have no gradient: leave them out */
    m->num_grads_acts = m->acts_info[A_PROBS].offset;
    m->grads_acts = (gpt_real*)callocCheck(m->num_grads_acts, sizeof(gpt_real));
    m->inputs = (int*)mallocCheck((size_t)B * T * sizeof(int));
    m->targets = (int*)mallocCheck((size_t)B * T * sizeof(int));
    m->logits = gpt_act_ptr(m, m->acts, A_LOGITS, 0);
    m->probs = gpt_act_ptr(m, m->acts, A_PROBS, 0);
    m->mean_loss = -1.0f;
}

void gpt_cpu_free(GPTCpu* m) {
    free(m->params);
    free(m->grads);
    free(m->acts);
    free(m->grads_acts);
    free(m->inputs);
    free(m->targets);
    memset(m, 0, sizeof(*m));
}

void gpt_cpu_zero_grad(GPTCpu* m) { memset(m->grads, 0, m->num_params * sizeof(gpt_real)); }

/* ------------------------------------------------------------------------ */
/* initialisation: counter-based normal numbers                             */

static uint64_t splitmix64_mix(uint64_t z) {
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* Standard normal number number `index` of stream `seed` (Box-Muller on two hashed uniforms). */
static double normal_from_counter(uint64_t seed, uint64_t index) {
    const uint64_t key = splitmix64_mix(seed);
    const uint64_t h1 = splitmix64_mix(key ^ (2 * index));
    const uint64_t h2 = splitmix64_mix(key ^ (2 * index + 1));
    const double u1 = ((double)(h1 >> 11) + 1.0) * 0x1.0p-53;  /* (0, 1]: log is finite */
    const double u2 = (double)(h2 >> 11) * 0x1.0p-53;          /* [0, 1) */
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

void gpt_init_params(const GPTConfig* cfg, gpt_real* params, uint64_t seed) {
    ParamTensorInfo table[NUM_PARAM_TENSORS];
    gpt_param_table(cfg, table);
    const double base_std = 0.02;
    const double residual_std = base_std / sqrt(2.0 * cfg->num_layers);
    for (int id = 0; id < NUM_PARAM_TENSORS; id++) {
        const ParamTensorInfo* p = &table[id];
        gpt_real* dst = params + p->offset;
        const int is_layernorm_weight = (id == P_LN1W || id == P_LN2W || id == P_LNFW);
        if (p->cols == 0) {  /* vectors: biases 0, LayerNorm weights 1 */
            const gpt_real value = is_layernorm_weight ? 1 : 0;
            for (size_t i = 0; i < p->count; i++) dst[i] = value;
            continue;
        }
        const double std = (id == P_ATTPROJW || id == P_FCPROJW) ? residual_std : base_std;
        /* wte rows >= V are padding: never embedded, masked out of the softmax; keep them 0 */
        const size_t live = (id == P_WTE) ? (size_t)cfg->vocab_size * (size_t)p->cols : p->count;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < p->count; i++) {
            dst[i] = (i < live) ? (gpt_real)(float)(std * normal_from_counter(seed, p->offset + i)) : 0;
        }
    }
}

void gpt_cpu_init_weights(GPTCpu* m, uint64_t seed) { gpt_init_params(&m->config, m->params, seed); }

/* ------------------------------------------------------------------------ */
/* layers: forward                                                           */

static void encoder_forward(gpt_real* out, const int* inputs, const gpt_real* wte, const gpt_real* wpe,
                            int B, int T, int C) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            gpt_real* o = out + ((size_t)b * T + t) * C;
            const gpt_real* tok = wte + (size_t)inputs[b * T + t] * C;
            const gpt_real* pos = wpe + (size_t)t * C;
            for (int c = 0; c < C; c++) o[c] = tok[c] + pos[c];
        }
    }
}

/* N rows of C: out = (x - mean) * rstd * w + b; saves mean and rstd per row. */
static void layernorm_forward(gpt_real* out, gpt_real* mean, gpt_real* rstd, const gpt_real* inp,
                              const gpt_real* w, const gpt_real* b, size_t N, int C) {
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) {
        const gpt_real* x = inp + n * C;
        double sum = 0.0;
        for (int c = 0; c < C; c++) sum += x[c];
        const double mu = sum / C;
        double var = 0.0;
        for (int c = 0; c < C; c++) var += ((double)x[c] - mu) * ((double)x[c] - mu);
        const double rs = 1.0 / sqrt(var / C + LAYERNORM_EPS);
        gpt_real* o = out + n * C;
        for (int c = 0; c < C; c++) o[c] = (gpt_real)(((double)x[c] - mu) * rs) * w[c] + b[c];
        mean[n] = (gpt_real)mu;
        rstd[n] = (gpt_real)rs;
    }
}

/*
 * Matmuls. Rows of inp are processed in tiles of MATMUL_ROW_TILE: a weight row,
 * once loaded, is used against the whole tile of inputs (held in cache), so the
 * weights stream from memory once per tile instead of once per row - the tied
 * classifier's weight is Vp x C, tens of MB. Inside a tile, four rows share
 * each weight load (register blocking). Work is split over output features,
 * so no two threads ever write the same element.
 */
#define MATMUL_ROW_TILE 64
#define MATMUL_BLOCK 4

static inline size_t tile_end(size_t n0, size_t N) { return n0 + MATMUL_ROW_TILE < N ? n0 + MATMUL_ROW_TILE : N; }

/* out (N, OC) = inp (N, IC) @ weight (OC, IC)^T + bias (OC) (bias may be NULL). */
static void matmul_forward(gpt_real* out, const gpt_real* inp, const gpt_real* weight, const gpt_real* bias,
                           size_t N, int IC, int OC) {
    for (size_t n0 = 0; n0 < N; n0 += MATMUL_ROW_TILE) {
        const size_t n1 = tile_end(n0, N);
#pragma omp parallel for schedule(static)
        for (int oc = 0; oc < OC; oc++) {
            const gpt_real* w = weight + (size_t)oc * IC;
            const gpt_real b = bias ? bias[oc] : 0;
            size_t n = n0;
            for (; n + MATMUL_BLOCK <= n1; n += MATMUL_BLOCK) {
                const gpt_real* x0 = inp + n * IC;
                const gpt_real *x1 = x0 + IC, *x2 = x1 + IC, *x3 = x2 + IC;
                gpt_real a0 = 0, a1 = 0, a2 = 0, a3 = 0;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
                for (int i = 0; i < IC; i++) {
                    a0 += x0[i] * w[i];
                    a1 += x1[i] * w[i];
                    a2 += x2[i] * w[i];
                    a3 += x3[i] * w[i];
                }
                out[n * OC + oc] = a0 + b;
                out[(n + 1) * OC + oc] = a1 + b;
                out[(n + 2) * OC + oc] = a2 + b;
                out[(n + 3) * OC + oc] = a3 + b;
            }
            for (; n < n1; n++) {
                const gpt_real* x = inp + n * IC;
                gpt_real a = 0;
#pragma omp simd reduction(+ : a)
                for (int i = 0; i < IC; i++) a += x[i] * w[i];
                out[n * OC + oc] = a + b;
            }
        }
    }
}

static void residual_add(gpt_real* out, const gpt_real* a, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] += a[i];
}

/* GPT-2's GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). */
#define GELU_SCALE 0.7978845608028654  /* sqrt(2/pi) */
#define GELU_CUBIC 0.044715

static void gelu_forward(gpt_real* out, const gpt_real* inp, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        const gpt_real x = inp[i];
        const gpt_real inner = (gpt_real)GELU_SCALE * (x + (gpt_real)GELU_CUBIC * x * x * x);
        out[i] = (gpt_real)0.5 * x * (1 + tanh(inner));
    }
}

/* Softmax over the first V of Vp logits per row and cross-entropy against targets
   (NULL: probabilities only). Columns >= V get probability 0. */
static void softmax_crossentropy_forward(gpt_real* probs, gpt_real* losses, const gpt_real* logits,
                                         const int* targets, size_t N, int V, int Vp) {
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) {
        const gpt_real* z = logits + n * Vp;
        gpt_real* p = probs + n * Vp;
        gpt_real maxz = z[0];
        for (int v = 1; v < V; v++) maxz = z[v] > maxz ? z[v] : maxz;
        double sum = 0.0;
        for (int v = 0; v < V; v++) {
            p[v] = exp(z[v] - maxz);
            sum += p[v];
        }
        const gpt_real inv = (gpt_real)(1.0 / sum);
        for (int v = 0; v < V; v++) p[v] *= inv;
        for (int v = V; v < Vp; v++) p[v] = 0;
        /* loss = logsumexp - z[target], computed without the rounded probability */
        if (targets) losses[n] = (gpt_real)(log(sum) + (double)maxz - (double)z[targets[n]]);
    }
}

/* ------------------------------------------------------------------------ */
/* layers: backward (all ACCUMULATE into their outputs)                     */

static void encoder_backward(gpt_real* dwte, gpt_real* dwpe, const gpt_real* dout, const int* inputs,
                             int B, int T, int C) {
    /* rows of dwte repeat across tokens: parallel over channels keeps writes disjoint */
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        for (int b = 0; b < B; b++) {
            for (int t = 0; t < T; t++) {
                const gpt_real g = dout[((size_t)b * T + t) * C + c];
                dwte[(size_t)inputs[b * T + t] * C + c] += g;
                dwpe[(size_t)t * C + c] += g;
            }
        }
    }
}

static void layernorm_backward(gpt_real* dinp, gpt_real* dw, gpt_real* db, const gpt_real* dout,
                               const gpt_real* inp, const gpt_real* w, const gpt_real* mean,
                               const gpt_real* rstd, size_t N, int C) {
    /* dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dout * w */
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) {
        const gpt_real* x = inp + n * C;
        const gpt_real* dy = dout + n * C;
        const gpt_real mu = mean[n], rs = rstd[n];
        double dxhat_mean = 0.0, dxhat_xhat_mean = 0.0;
        for (int c = 0; c < C; c++) {
            const gpt_real xhat = (x[c] - mu) * rs;
            const gpt_real dxhat = dy[c] * w[c];
            dxhat_mean += dxhat;
            dxhat_xhat_mean += dxhat * xhat;
        }
        dxhat_mean /= C;
        dxhat_xhat_mean /= C;
        gpt_real* dx = dinp + n * C;
        for (int c = 0; c < C; c++) {
            const gpt_real xhat = (x[c] - mu) * rs;
            const gpt_real dxhat = dy[c] * w[c];
            dx[c] += rs * (gpt_real)(dxhat - dxhat_mean - xhat * dxhat_xhat_mean);
        }
    }
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        gpt_real sw = 0, sb = 0;
        for (size_t n = 0; n < N; n++) {
            const gpt_real xhat = (inp[n * C + c] - mean[n]) * rstd[n];
            sw += dout[n * C + c] * xhat;
            sb += dout[n * C + c];
        }
        dw[c] += sw;
        db[c] += sb;
    }
}

/* Backward of matmul_forward: dinp += dout @ weight; dweight += dout^T @ inp; dbias += sum dout.
   dinp may be NULL (not needed), dbias NULL when there is no bias. Same row tiling as forward. */
static void matmul_backward(gpt_real* dinp, gpt_real* dweight, gpt_real* dbias, const gpt_real* dout,
                            const gpt_real* inp, const gpt_real* weight, size_t N, int IC, int OC) {
    for (size_t n0 = 0; n0 < N; n0 += MATMUL_ROW_TILE) {
        const size_t n1 = tile_end(n0, N);
        if (dinp) {
            /* each thread owns a slice of input columns of the tile's dinp rows */
#pragma omp parallel
            {
                const int threads = omp_get_num_threads(), tid = omp_get_thread_num();
                const int c0 = (int)((long)IC * tid / threads), c1 = (int)((long)IC * (tid + 1) / threads);
                int oc = 0;
                for (; oc + MATMUL_BLOCK <= OC; oc += MATMUL_BLOCK) {
                    const gpt_real* w0 = weight + (size_t)oc * IC;
                    const gpt_real *w1 = w0 + IC, *w2 = w1 + IC, *w3 = w2 + IC;
                    for (size_t n = n0; n < n1; n++) {
                        const gpt_real* g = dout + n * OC + oc;
                        const gpt_real g0 = g[0], g1 = g[1], g2 = g[2], g3 = g[3];
                        gpt_real* dx = dinp + n * IC;
#pragma omp simd
                        for (int c = c0; c < c1; c++) dx[c] += g0 * w0[c] + g1 * w1[c] + g2 * w2[c] + g3 * w3[c];
                    }
                }
                for (; oc < OC; oc++) {
                    const gpt_real* w = weight + (size_t)oc * IC;
                    for (size_t n = n0; n < n1; n++) {
                        const gpt_real g = dout[n * OC + oc];
                        gpt_real* dx = dinp + n * IC;
#pragma omp simd
                        for (int c = c0; c < c1; c++) dx[c] += g * w[c];
                    }
                }
            }
        }
#pragma omp parallel for schedule(static)
        for (int oc = 0; oc < OC; oc++) {
            gpt_real* dw = dweight + (size_t)oc * IC;
            gpt_real bias_sum = 0;
            size_t n = n0;
            for (; n + MATMUL_BLOCK <= n1; n += MATMUL_BLOCK) {
                const gpt_real g0 = dout[n * OC + oc], g1 = dout[(n + 1) * OC + oc];
                const gpt_real g2 = dout[(n + 2) * OC + oc], g3 = dout[(n + 3) * OC + oc];
                const gpt_real* x0 = inp + n * IC;
                const gpt_real *x1 = x0 + IC, *x2 = x1 + IC, *x3 = x2 + IC;
                bias_sum += g0 + g1 + g2 + g3;
#pragma omp simd
                for (int i = 0; i < IC; i++) dw[i] += g0 * x0[i] + g1 * x1[i] + g2 * x2[i] + g3 * x3[i];
            }
            for (; n < n1; n++) {
                const gpt_real g = dout[n * OC + oc];
                const gpt_real* x = inp + n * IC;
                bias_sum += g;
#pragma omp simd
                for (int i = 0; i < IC; i++) dw[i] += g * x[i];
            }
            if (dbias) dbias[oc] += bias_sum;
        }
    }
}

static void gelu_backward(gpt_real* dinp, const gpt_real* inp, const gpt_real* dout, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        const gpt_real x = inp[i];
        const gpt_real inner = (gpt_real)GELU_SCALE * (x + (gpt_real)GELU_CUBIC * x * x * x);
        const gpt_real th = tanh(inner);
        const gpt_real sech2 = 1 - th * th;
        const gpt_real dinner = (gpt_real)GELU_SCALE * (1 + 3 * (gpt_real)GELU_CUBIC * x * x);
        const gpt_real grad = (gpt_real)0.5 * (1 + th) + (gpt_real)0.5 * x * sech2 * dinner;
        dinp[i] += grad * dout[i];
    }
}

/* d(mean loss)/d(logits) = (probs - onehot(target)) / N on the first V columns, 0 beyond. */
static void crossentropy_softmax_backward(gpt_real* dlogits, const gpt_real* probs, const int* targets,
                                          size_t N, int V, int Vp) {
    const gpt_real inv_n = (gpt_real)(1.0 / (double)N);
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) {
        const gpt_real* p = probs + n * Vp;
        gpt_real* d = dlogits + n * Vp;
        for (int v = 0; v < V; v++) d[v] += (p[v] - (v == targets[n] ? 1 : 0)) * inv_n;
    }
}

/* ------------------------------------------------------------------------ */
/* attention: the module's CPU emulation (float) or its fp64 reference (double) */

static inline void attention_forward_float(const GPTCpu* m, AttnShape s, const float* qkv, float* out,
                                           float* stats) {
    attention_forward_cpu(m->attn_mode, m->attn_opt, ATTN_IO_FP32, s, qkv, out, stats);
}
static inline void attention_forward_double(const GPTCpu* m, AttnShape s, const double* qkv, double* out,
                                            double* stats) {
    (void)m;
    (void)stats;  /* the reference keeps no softmax state: its backward recomputes */
    attention_forward_ref(s, qkv, out);
}
static inline void attention_backward_float(const GPTCpu* m, AttnShape s, const float* qkv, const float* out,
                                            const float* stats, const float* dout, float* dqkv) {
    attention_backward_cpu(m->attn_mode, m->attn_opt, ATTN_IO_FP32, s, qkv, out, stats, dout, dqkv);
}
static inline void attention_backward_double(const GPTCpu* m, AttnShape s, const double* qkv,
                                             const double* out, const double* stats, const double* dout,
                                             double* dqkv) {
    (void)m;
    (void)out;
    (void)stats;
    attention_backward_ref(s, qkv, dout, dqkv);
}
#define attention_forward_real(m, s, qkv, out, stats) \
    _Generic((out), float*: attention_forward_float, double*: attention_forward_double)(m, s, qkv, out, stats)
#define attention_backward_real(m, s, qkv, out, stats, dout, dqkv)                                \
    _Generic((dqkv), float*: attention_backward_float, double*: attention_backward_double)(m, s, qkv, \
                                                                                            out, stats, dout, dqkv)

/* ------------------------------------------------------------------------ */
/* the model                                                                 */

static void check_tokens(const int* ids, size_t n, int V, const char* what) {
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= V) {
            die("%s[%zu] = %d is not a token id in [0, %d)\n"
                "  hint: the data was tokenized with a different vocabulary than the model's",
                what, i, ids[i], V);
        }
    }
}

void gpt_cpu_forward(GPTCpu* m, const int* inputs, const int* targets, int B, int T) {
    const GPTConfig* cfg = &m->config;
    const int L = cfg->num_layers, C = cfg->channels, NH = cfg->num_heads;
    const int V = cfg->vocab_size, Vp = cfg->padded_vocab_size;
    if (B < 1 || T < 1 || B > m->B || T > m->T) {
        die("forward with batch %dx%d, but the model was allocated for at most %dx%d", B, T, m->B, m->T);
    }
    const size_t N = (size_t)B * T;
    check_tokens(inputs, N, V, "inputs");
    if (targets) check_tokens(targets, N, V, "targets");
    memcpy(m->inputs, inputs, N * sizeof(int));
    if (targets) memcpy(m->targets, targets, N * sizeof(int));
    m->cur_B = B;
    m->cur_T = T;
    m->has_targets = targets != NULL;

    gpt_real* P = m->params;
    gpt_real* A = m->acts;
    const AttnShape shape = {.B = B, .NH = NH, .T = T, .HS = C / NH};

    encoder_forward(gpt_act_ptr(m, A, A_ENCODED, 0), inputs, gpt_param_ptr(m, P, P_WTE),
                    gpt_param_ptr(m, P, P_WPE), B, T, C);
    for (int l = 0; l < L; l++) {
        const gpt_real* residual = l == 0 ? gpt_act_ptr(m, A, A_ENCODED, 0) : gpt_act_ptr(m, A, A_RESIDUAL3, l - 1);
        const size_t pC = (size_t)l * C, pCC = (size_t)l * C * C;  /* per-layer parameter strides */
        gpt_real* ln1 = gpt_act_ptr(m, A, A_LN1, l);
        gpt_real* qkv = gpt_act_ptr(m, A, A_QKV, l);
        gpt_real* atty = gpt_act_ptr(m, A, A_ATTY, l);
        gpt_real* residual2 = gpt_act_ptr(m, A, A_RESIDUAL2, l);
        gpt_real* ln2 = gpt_act_ptr(m, A, A_LN2, l);
        gpt_real* fch = gpt_act_ptr(m, A, A_FCH, l);
        gpt_real* fch_gelu = gpt_act_ptr(m, A, A_FCH_GELU, l);
        gpt_real* residual3 = gpt_act_ptr(m, A, A_RESIDUAL3, l);

        layernorm_forward(ln1, gpt_act_ptr(m, A, A_LN1_MEAN, l), gpt_act_ptr(m, A, A_LN1_RSTD, l), residual,
                          gpt_param_ptr(m, P, P_LN1W) + pC, gpt_param_ptr(m, P, P_LN1B) + pC, N, C);
        matmul_forward(qkv, ln1, gpt_param_ptr(m, P, P_QKVW) + 3 * pCC, gpt_param_ptr(m, P, P_QKVB) + 3 * pC,
                       N, C, 3 * C);
        attention_forward_real(m, shape, qkv, atty, gpt_act_ptr(m, A, A_ATT_STATS, l));
        matmul_forward(residual2, atty, gpt_param_ptr(m, P, P_ATTPROJW) + pCC,
                       gpt_param_ptr(m, P, P_ATTPROJB) + pC, N, C, C);
        residual_add(residual2, residual, N * C);
        layernorm_forward(ln2, gpt_act_ptr(m, A, A_LN2_MEAN, l), gpt_act_ptr(m, A, A_LN2_RSTD, l), residual2,
                          gpt_param_ptr(m, P, P_LN2W) + pC, gpt_param_ptr(m, P, P_LN2B) + pC, N, C);
        matmul_forward(fch, ln2, gpt_param_ptr(m, P, P_FCW) + 4 * pCC, gpt_param_ptr(m, P, P_FCB) + 4 * pC,
                       N, C, 4 * C);
        gelu_forward(fch_gelu, fch, N * 4 * C);
        matmul_forward(residual3, fch_gelu, gpt_param_ptr(m, P, P_FCPROJW) + 4 * pCC,
                       gpt_param_ptr(m, P, P_FCPROJB) + pC, N, 4 * C, C);
        residual_add(residual3, residual2, N * C);
    }
    gpt_real* lnf = gpt_act_ptr(m, A, A_LNF, 0);
    layernorm_forward(lnf, gpt_act_ptr(m, A, A_LNF_MEAN, 0), gpt_act_ptr(m, A, A_LNF_RSTD, 0),
                      gpt_act_ptr(m, A, A_RESIDUAL3, L - 1), gpt_param_ptr(m, P, P_LNFW),
                      gpt_param_ptr(m, P, P_LNFB), N, C);
    matmul_forward(m->logits, lnf, gpt_param_ptr(m, P, P_WTE), NULL, N, C, Vp);
    gpt_real* losses = gpt_act_ptr(m, A, A_LOSSES, 0);
    softmax_crossentropy_forward(m->probs, losses, m->logits, targets, N, V, Vp);
    if (targets) {
        double sum = 0.0;
        for (size_t n = 0; n < N; n++) sum += losses[n];
        m->mean_loss = (float)(sum / (double)N);
    } else {
        m->mean_loss = -1.0f;
    }
}

void gpt_cpu_backward(GPTCpu* m) {
    if (!m->has_targets) die("gpt_cpu_backward needs a forward with targets first");
    const GPTConfig* cfg = &m->config;
    const int L = cfg->num_layers, C = cfg->channels, NH = cfg->num_heads;
    const int V = cfg->vocab_size, Vp = cfg->padded_vocab_size;
    const int B = m->cur_B, T = m->cur_T;
    const size_t N = (size_t)B * T;
    const AttnShape shape = {.B = B, .NH = NH, .T = T, .HS = C / NH};
    gpt_real* P = m->params;
    gpt_real* G = m->grads;
    gpt_real* A = m->acts;
    gpt_real* dA = m->grads_acts;
    memset(dA, 0, m->num_grads_acts * sizeof(gpt_real));  /* layer backwards accumulate */

    gpt_real* dlogits = gpt_act_ptr(m, dA, A_LOGITS, 0);
    crossentropy_softmax_backward(dlogits, m->probs, m->targets, N, V, Vp);
    gpt_real* dlnf = gpt_act_ptr(m, dA, A_LNF, 0);
    matmul_backward(dlnf, gpt_param_ptr(m, G, P_WTE), NULL, dlogits, gpt_act_ptr(m, A, A_LNF, 0),
                    gpt_param_ptr(m, P, P_WTE), N, C, Vp);
    layernorm_backward(gpt_act_ptr(m, dA, A_RESIDUAL3, L - 1), gpt_param_ptr(m, G, P_LNFW),
                       gpt_param_ptr(m, G, P_LNFB), dlnf, gpt_act_ptr(m, A, A_RESIDUAL3, L - 1),
                       gpt_param_ptr(m, P, P_LNFW), gpt_act_ptr(m, A, A_LNF_MEAN, 0),
                       gpt_act_ptr(m, A, A_LNF_RSTD, 0), N, C);

    for (int l = L - 1; l >= 0; l--) {
        const size_t pC = (size_t)l * C, pCC = (size_t)l * C * C;
        const gpt_real* residual = l == 0 ? gpt_act_ptr(m, A, A_ENCODED, 0) : gpt_act_ptr(m, A, A_RESIDUAL3, l - 1);
        gpt_real* dresidual = l == 0 ? gpt_act_ptr(m, dA, A_ENCODED, 0) : gpt_act_ptr(m, dA, A_RESIDUAL3, l - 1);
        gpt_real* dresidual3 = gpt_act_ptr(m, dA, A_RESIDUAL3, l);
        gpt_real* dresidual2 = gpt_act_ptr(m, dA, A_RESIDUAL2, l);
        gpt_real* dfch_gelu = gpt_act_ptr(m, dA, A_FCH_GELU, l);
        gpt_real* dfch = gpt_act_ptr(m, dA, A_FCH, l);
        gpt_real* dln2 = gpt_act_ptr(m, dA, A_LN2, l);
        gpt_real* datty = gpt_act_ptr(m, dA, A_ATTY, l);
        gpt_real* dqkv = gpt_act_ptr(m, dA, A_QKV, l);
        gpt_real* dln1 = gpt_act_ptr(m, dA, A_LN1, l);

        /* MLP block: residual3 = residual2 + fcproj(gelu(fc(ln2(residual2)))) */
        matmul_backward(dfch_gelu, gpt_param_ptr(m, G, P_FCPROJW) + 4 * pCC, gpt_param_ptr(m, G, P_FCPROJB) + pC,
                        dresidual3, gpt_act_ptr(m, A, A_FCH_GELU, l), gpt_param_ptr(m, P, P_FCPROJW) + 4 * pCC,
                        N, 4 * C, C);
        gelu_backward(dfch, gpt_act_ptr(m, A, A_FCH, l), dfch_gelu, N * 4 * C);
        matmul_backward(dln2, gpt_param_ptr(m, G, P_FCW) + 4 * pCC, gpt_param_ptr(m, G, P_FCB) + 4 * pC, dfch,
                        gpt_act_ptr(m, A, A_LN2, l), gpt_param_ptr(m, P, P_FCW) + 4 * pCC, N, C, 4 * C);
        layernorm_backward(dresidual2, gpt_param_ptr(m, G, P_LN2W) + pC, gpt_param_ptr(m, G, P_LN2B) + pC, dln2,
                           gpt_act_ptr(m, A, A_RESIDUAL2, l), gpt_param_ptr(m, P, P_LN2W) + pC,
                           gpt_act_ptr(m, A, A_LN2_MEAN, l), gpt_act_ptr(m, A, A_LN2_RSTD, l), N, C);
        residual_add(dresidual2, dresidual3, N * C);

        /* attention block: residual2 = residual + attproj(attention(qkv(ln1(residual)))) */
        matmul_backward(datty, gpt_param_ptr(m, G, P_ATTPROJW) + pCC, gpt_param_ptr(m, G, P_ATTPROJB) + pC,
                        dresidual2, gpt_act_ptr(m, A, A_ATTY, l), gpt_param_ptr(m, P, P_ATTPROJW) + pCC, N, C, C);
        attention_backward_real(m, shape, gpt_act_ptr(m, A, A_QKV, l), gpt_act_ptr(m, A, A_ATTY, l),
                                gpt_act_ptr(m, A, A_ATT_STATS, l), datty, dqkv);
        matmul_backward(dln1, gpt_param_ptr(m, G, P_QKVW) + 3 * pCC, gpt_param_ptr(m, G, P_QKVB) + 3 * pC, dqkv,
                        gpt_act_ptr(m, A, A_LN1, l), gpt_param_ptr(m, P, P_QKVW) + 3 * pCC, N, C, 3 * C);
        layernorm_backward(dresidual, gpt_param_ptr(m, G, P_LN1W) + pC, gpt_param_ptr(m, G, P_LN1B) + pC, dln1,
                           residual, gpt_param_ptr(m, P, P_LN1W) + pC, gpt_act_ptr(m, A, A_LN1_MEAN, l),
                           gpt_act_ptr(m, A, A_LN1_RSTD, l), N, C);
        residual_add(dresidual, dresidual2, N * C);
    }
    encoder_backward(gpt_param_ptr(m, G, P_WTE), gpt_param_ptr(m, G, P_WPE), gpt_act_ptr(m, dA, A_ENCODED, 0),
                     m->inputs, B, T, C);
}
