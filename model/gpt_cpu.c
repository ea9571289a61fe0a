/*
 * model/gpt_cpu.c - the GPT model on the CPU (see gpt_cpu.h for the contract).
 *
 * Why: the reference everything else is checked against, so every layer is a
 * plain loop that reads like the math, parallel over independent rows with
 * OpenMP - except the two places where the time goes (for the tiny preset,
 * nearly all of it is the tied classifier: three B*T x C x Vp products and a
 * softmax over 50257 columns per token): the matmuls are register-blocked
 * vector kernels and the softmax exp is a vectorised polynomial (see those
 * sections). Results stay independent of the thread count. Forward stores
 * what backward needs (norm mean/rstd, the activation's input, the q and k
 * attention reads with qk-norm's rstd, the attention output and its softmax
 * statistics); backward recomputes nothing except inside attention, whose
 * saved state is the attention module's. No T x T matrix exists outside
 * attention. The architecture options (gpt_config.h) switch layers, never
 * GPT-2's arithmetic: with GPT-2's options every operation is GPT-2's.
 *
 * The element type is gpt_real (float by default). This one file is compiled
 * a second time with -DGPT_CPU_REAL=double for the finite-difference test;
 * <tgmath.h> picks exp/log/tanh/sqrt of the right precision, and the
 * precision-dependent choices (which attention entry point to call; the
 * softmax's float polynomial exp or the library's double exp) are made by
 * _Generic on the element type, not by a preprocessor fork.
 */
#include "model/gpt_cpu.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <tgmath.h>

#include "common/utils.h"
#include "model/rope_table.h"

#define LAYERNORM_EPS GPT_NORM_EPS

/* ------------------------------------------------------------------------ */
/* tables and allocation                                                     */

size_t gpt_act_table(const GPTConfig* cfg, int B, int T, ActTensorInfo t[NUM_ACT_TENSORS]) {
    const size_t L = (size_t)cfg->num_layers, C = (size_t)cfg->channels, NH = (size_t)cfg->num_heads;
    const size_t Vp = (size_t)cfg->padded_vocab_size, BT = (size_t)B * (size_t)T;
    const size_t F = (size_t)gpt_config_fc_rows(cfg), H = (size_t)cfg->mlp_hidden;
    const size_t qk_att = (cfg->qk_norm || cfg->pos == GPT_POS_ROPE) ? 1 : 0, qk_norm = cfg->qk_norm ? 1 : 0;
    const struct { ActId id; const char* name; size_t layers, per_layer; } spec[NUM_ACT_TENSORS] = {
        {A_ENCODED, "encoded", 1, BT * C},
        {A_LN1, "ln1", L, BT * C},
        {A_LN1_MEAN, "ln1_mean", L, BT},
        {A_LN1_RSTD, "ln1_rstd", L, BT},
        {A_QKV, "qkv", L, BT * 3 * C},
        {A_QKV_ATT, "qkv_att", L, qk_att * BT * 3 * C},
        {A_QK_RSTD, "qk_rstd", L, qk_norm * BT * 2 * NH},
        {A_ATTY, "atty", L, BT * C},
        {A_ATT_STATS, "att_stats", L, BT * NH * 2},
        {A_RESIDUAL2, "residual2", L, BT * C},
        {A_LN2, "ln2", L, BT * C},
        {A_LN2_MEAN, "ln2_mean", L, BT},
        {A_LN2_RSTD, "ln2_rstd", L, BT},
        {A_FCH, "fch", L, BT * F},
        {A_FCH_GELU, "fch_gelu", L, BT * H},
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
    attn_mode_require_emulated(mode, "the CPU model"); /* cudnn runs only in the GPU trainer */
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
    if (cfg->pos == GPT_POS_ROPE) {
        const int HS = cfg->channels / cfg->num_heads;
        const size_t n = rope_table_entries(T, HS);
        RopeCosSin* table = (RopeCosSin*)mallocCheck(n * sizeof(RopeCosSin));
        rope_table_fill(table, T, HS, (double)cfg->rope_base);
        m->rope_cos = (gpt_real*)mallocCheck(n * sizeof(gpt_real));
        m->rope_sin = (gpt_real*)mallocCheck(n * sizeof(gpt_real));
        for (size_t i = 0; i < n; i++) {
            m->rope_cos[i] = table[i].cos;
            m->rope_sin[i] = table[i].sin;
        }
        free(table);
    }
}

const gpt_real* gpt_cpu_attn_qkv(const GPTCpu* m, int layer) {
    const ActId id = m->acts_info[A_QKV_ATT].count ? A_QKV_ATT : A_QKV;
    return gpt_act_ptr(m, m->acts, id, layer);
}

void gpt_cpu_free(GPTCpu* m) {
    free(m->params);
    free(m->grads);
    free(m->acts);
    free(m->grads_acts);
    free(m->inputs);
    free(m->targets);
    free(m->rope_cos);
    free(m->rope_sin);
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
        const int is_layernorm_weight =
            (id == P_LN1W || id == P_LN2W || id == P_LNFW || id == P_QNORMW || id == P_KNORMW);
        if (p->cols == 0) {  /* vectors: biases 0, norm weights and gains 1 */
            const gpt_real value = is_layernorm_weight ? 1 : 0;
            for (size_t i = 0; i < p->count; i++) dst[i] = value;
            continue;
        }
        const double std = (id == P_ATTPROJW || id == P_FCPROJW) ? residual_std : base_std;
        /* wte and lm_head rows >= V are padding: never embedded, masked out of the softmax; keep them 0 */
        const size_t live = (id == P_WTE || id == P_LMHEADW) ? (size_t)cfg->vocab_size * (size_t)p->cols : p->count;
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < p->count; i++) {
            dst[i] = (i < live) ? (gpt_real)(float)(std * normal_from_counter(seed, p->offset + i)) : 0;
        }
    }
}

void gpt_cpu_init_weights(GPTCpu* m, uint64_t seed) { gpt_init_params(&m->config, m->params, seed); }

/* ------------------------------------------------------------------------ */
/* layers: forward                                                           */

/* out = wte[token] + wpe[t]; wpe NULL (RoPE): wte[token] alone. */
static void encoder_forward(gpt_real* out, const int* inputs, const gpt_real* wte, const gpt_real* wpe,
                            int B, int T, int C) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++) {
        for (int t = 0; t < T; t++) {
            gpt_real* o = out + ((size_t)b * T + t) * C;
            const gpt_real* tok = wte + (size_t)inputs[b * T + t] * C;
            if (wpe == NULL) { /* RoPE: positions enter in attention */
                for (int c = 0; c < C; c++) o[c] = tok[c];
                continue;
            }
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
 * Matmuls. All three products of a linear layer (out = inp W^T, dinp = dout W,
 * dW = dout^T inp) run through small register-blocked kernels: a block of
 * MM_ROWS x MM_COLS results lives in vector registers (GNU C vector types,
 * 32 bytes = one AVX2 register; with narrower hardware the compiler splits
 * them) while the reduction runs, so every value loaded from memory feeds
 * several multiply-adds. For the tied classifier (Vp x C: 12.9 MB for tiny)
 * this is most of the model's work.
 *
 * Determinism: every output element is owned by one thread and summed in a
 * fixed order (the reduction index ascending, starting from the value already
 * there or 0) whatever the thread count, so results are bit-identical with 1
 * or N threads. Rows past the last full register block go through the same
 * vector operations one row at a time, so a forward on the first n rows gives
 * those rows bit for bit (tests/test_gpt_cpu_kernels.c checks both).
 */
typedef gpt_real mm_vec __attribute__((vector_size(32)));
#define MM_LANES ((int)(sizeof(mm_vec) / sizeof(gpt_real)))
#define MM_ROWS 4                    /* rows per register block (one weight load serves MM_ROWS rows) */
#define MM_VECS 2                    /* vectors per row of a register block */
#define MM_COLS (MM_VECS * MM_LANES) /* output features per register block (16 floats) */
/* dinp streams the weight in blocks of about this many bytes, which stay in the
   core's L2 cache while every row block of the thread is multiplied by them */
#define MM_WEIGHT_BLOCK_BYTES (64 * 1024)

/* unaligned vector load and store (macros: a function taking or returning a
   vector would change its ABI with the -march level, which gcc warns about) */
#define mm_load(vec, ptr) memcpy(&(vec), (ptr), sizeof(mm_vec))
#define mm_store(ptr, vec) memcpy((ptr), &(vec), sizeof(mm_vec))

/* out (N, OC) = inp (N, IC) @ weight (OC, IC)^T + bias (OC) (bias may be NULL).
   Parallel over chunks of MM_COLS output features: a chunk's weight rows are
   transposed into wt (IC x MM_COLS, in L1/L2), then every input row is run
   against it, so the weight is read from memory once per call. */
static void matmul_forward(gpt_real* out, const gpt_real* inp, const gpt_real* weight, const gpt_real* bias,
                           size_t N, int IC, int OC) {
    const int chunks = (OC + MM_COLS - 1) / MM_COLS;
#pragma omp parallel
    {
        gpt_real* wt = (gpt_real*)mallocCheck((size_t)IC * MM_COLS * sizeof(gpt_real));
#pragma omp for schedule(static)
        for (int chunk = 0; chunk < chunks; chunk++) {
            const int oc0 = chunk * MM_COLS;
            const int width = OC - oc0 < MM_COLS ? OC - oc0 : MM_COLS;
            for (int j = 0; j < MM_COLS; j++) {
                const gpt_real* w = weight + (size_t)(oc0 + j) * IC;
                for (int i = 0; i < IC; i++) wt[(size_t)i * MM_COLS + j] = j < width ? w[i] : 0;
            }
            gpt_real b[MM_COLS];
            for (int j = 0; j < MM_COLS; j++) b[j] = (bias && j < width) ? bias[oc0 + j] : 0;
            size_t n = 0;
            for (; n + MM_ROWS <= N; n += MM_ROWS) {
                const gpt_real* x = inp + n * IC;
                mm_vec acc[MM_ROWS][MM_VECS] = {{{0}}};
                for (int i = 0; i < IC; i++) {
                    mm_vec w[MM_VECS];
#pragma GCC unroll 8
                    for (int k = 0; k < MM_VECS; k++) mm_load(w[k], wt + (size_t)i * MM_COLS + k * MM_LANES);
#pragma GCC unroll 8
                    for (int r = 0; r < MM_ROWS; r++) {
                        const gpt_real a = x[(size_t)r * IC + i];
#pragma GCC unroll 8
                        for (int k = 0; k < MM_VECS; k++) acc[r][k] += a * w[k];
                    }
                }
#pragma GCC unroll 8
                for (int r = 0; r < MM_ROWS; r++) {
                    gpt_real res[MM_COLS];
#pragma GCC unroll 8
                    for (int k = 0; k < MM_VECS; k++) mm_store(res + k * MM_LANES, acc[r][k]);
                    gpt_real* o = out + (n + r) * OC + oc0;
                    for (int j = 0; j < width; j++) o[j] = res[j] + b[j];
                }
            }
            for (; n < N; n++) {  /* row tail: the same vector operations, one row at a time */
                const gpt_real* x = inp + n * IC;
                mm_vec acc[MM_VECS] = {{0}};
                for (int i = 0; i < IC; i++) {
                    mm_vec w[MM_VECS];
#pragma GCC unroll 8
                    for (int k = 0; k < MM_VECS; k++) mm_load(w[k], wt + (size_t)i * MM_COLS + k * MM_LANES);
#pragma GCC unroll 8
                    for (int k = 0; k < MM_VECS; k++) acc[k] += x[i] * w[k];
                }
                gpt_real res[MM_COLS];
                for (int k = 0; k < MM_VECS; k++) mm_store(res + k * MM_LANES, acc[k]);
                for (int j = 0; j < width; j++) out[n * OC + oc0 + j] = res[j] + b[j];
            }
        }
        free(wt);
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

/* e^x for the softmax, whose arguments z - max(z) are <= 0. In float it is
   written out (Cody-Waite reduction x = k ln2 + r with |r| <= ln2/2, then a
   degree-7 Taylor polynomial; about 1 ulp from the exact value, 3e-7 relative
   at most) on 8-lane GNU C vectors, because glibc's expf is a call the compiler
   cannot vectorise and the softmax over the vocabulary needs 50257 of them per
   token. Arguments below -87 are taken as -87 (e^-87 = 1.6e-38 instead of a
   smaller number or 0), which keeps 2^k a normal float. The double build keeps
   the library exp: it exists for the finite-difference test. */
typedef float exp_vec __attribute__((vector_size(32)));
typedef int32_t exp_ivec __attribute__((vector_size(32)));
#define EXP_LANES ((int)(sizeof(exp_vec) / sizeof(float)))

/* out[0..EXP_LANES) = e^(in[i] - shift) */
static inline void exp_lanes_nonpositive(float* out, const float* in, float shift) {
    const float log2e = 1.44269504088896341f;
    const float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;  /* ln2_hi + ln2_lo = ln 2; k * ln2_hi is exact */
    const float round_magic = 0x1.8p23f;                            /* adding it rounds to an integer */
    exp_vec x;
    memcpy(&x, in, sizeof(x));
    x -= shift;
    const exp_vec lowest = x * 0 - 87.0f;
    const exp_ivec below = x < lowest;                              /* lanes of -1 where x < -87 */
    x = (exp_vec)(((exp_ivec)x & ~below) | ((exp_ivec)lowest & below));
    const exp_vec k = (x * log2e + round_magic) - round_magic;
    const exp_vec r = (x - k * ln2_hi) - k * ln2_lo;
    exp_vec p = r * (1.0f / 5040) + 1.0f / 720;
    p = p * r + 1.0f / 120;
    p = p * r + 1.0f / 24;
    p = p * r + 1.0f / 6;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    const exp_ivec scale_bits = (__builtin_convertvector(k, exp_ivec) + 127) << 23;  /* 2^k */
    p *= (exp_vec)scale_bits;
    memcpy(out, &p, sizeof(p));
}

/* p[v] = e^(z[v] - shift) for v < n: whole vectors, then the tail through one padded vector. */
static void softmax_exp_row_float(float* p, const float* z, float shift, int n) {
    int v = 0;
    for (; v + EXP_LANES <= n; v += EXP_LANES) exp_lanes_nonpositive(p + v, z + v, shift);
    if (v < n) {
        float tail[EXP_LANES] = {0};
        memcpy(tail, z + v, (size_t)(n - v) * sizeof(float));
        exp_lanes_nonpositive(tail, tail, shift);
        memcpy(p + v, tail, (size_t)(n - v) * sizeof(float));
    }
}
static void softmax_exp_row_double(double* p, const double* z, double shift, int n) {
    for (int v = 0; v < n; v++) p[v] = exp(z[v] - shift);
}
#define softmax_exp_row(p, z, shift, n) \
    _Generic((p), float*: softmax_exp_row_float, double*: softmax_exp_row_double)(p, z, shift, n)

/* Softmax over the first V of Vp logits per row and cross-entropy against targets
   (NULL: probabilities only). Columns >= V get probability 0. Four vectorised
   passes over the row, which stays in L2: max; exp; sum (in double); scale. */
static void softmax_crossentropy_forward(gpt_real* probs, gpt_real* losses, const gpt_real* logits,
                                         const int* targets, size_t N, int V, int Vp) {
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) {
        const gpt_real* z = logits + n * Vp;
        gpt_real* p = probs + n * Vp;
        gpt_real maxz = z[0];
#pragma omp simd reduction(max : maxz)
        for (int v = 1; v < V; v++) maxz = z[v] > maxz ? z[v] : maxz;
        softmax_exp_row(p, z, maxz, V);
        double sum = 0.0;
#pragma omp simd reduction(+ : sum)
        for (int v = 0; v < V; v++) sum += p[v];
        const gpt_real inv = (gpt_real)(1.0 / sum);
#pragma omp simd
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
                if (dwpe) dwpe[(size_t)t * C + c] += g;
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

/* dw rows [0, width) (each IC long) += g^T @ inp, with g (N x MM_COLS) a chunk of
   dout's columns (zero beyond width): MM_ROWS weight rows x MM_COLS input features
   at a time, summed over n ascending; the input features past the last full
   MM_COLS block one at a time, in the same order. */
static void accumulate_weight_chunk(gpt_real* dw, const gpt_real* g, const gpt_real* inp, size_t N, int IC,
                                    int width) {
    const int full_cols = IC - IC % MM_COLS;
    /* input-feature blocks outermost: one block of inp (N x MM_COLS) stays in L1 while
       every group of MM_ROWS weight rows of the chunk runs over it */
    for (int c0 = 0; c0 < full_cols; c0 += MM_COLS) {
        for (int j0 = 0; j0 < width; j0 += MM_ROWS) {
            const int rows = width - j0 < MM_ROWS ? width - j0 : MM_ROWS;
            mm_vec acc[MM_ROWS][MM_VECS] = {{{0}}};
            for (int r = 0; r < rows; r++) {
#pragma GCC unroll 8
                for (int k = 0; k < MM_VECS; k++) mm_load(acc[r][k], dw + (size_t)(j0 + r) * IC + c0 + k * MM_LANES);
            }
            for (size_t n = 0; n < N; n++) {
                mm_vec x[MM_VECS];
#pragma GCC unroll 8
                for (int k = 0; k < MM_VECS; k++) mm_load(x[k], inp + n * IC + c0 + k * MM_LANES);
                const gpt_real* gn = g + n * MM_COLS + j0;
#pragma GCC unroll 8
                for (int r = 0; r < MM_ROWS; r++) {
#pragma GCC unroll 8
                    for (int k = 0; k < MM_VECS; k++) acc[r][k] += gn[r] * x[k];
                }
            }
            for (int r = 0; r < rows; r++) {
#pragma GCC unroll 8
                for (int k = 0; k < MM_VECS; k++) mm_store(dw + (size_t)(j0 + r) * IC + c0 + k * MM_LANES, acc[r][k]);
            }
        }
    }
    for (int j = 0; j < width; j++) {
        for (int c = full_cols; c < IC; c++) {
            gpt_real s = dw[(size_t)j * IC + c];
            for (size_t n = 0; n < N; n++) s += g[n * MM_COLS + j] * inp[n * IC + c];
            dw[(size_t)j * IC + c] = s;
        }
    }
}

/* dinp (N, IC) += dout (N, OC) @ weight (OC, IC). Parallel over blocks of
   MM_ROWS rows (a thread owns whole rows); each thread walks the weight in
   L2-sized blocks of output features, and for each block updates all its rows
   MM_ROWS x MM_COLS at a time. */
static void matmul_backward_inputs(gpt_real* dinp, const gpt_real* dout, const gpt_real* weight, size_t N, int IC,
                                   int OC) {
    const size_t row_blocks = (N + MM_ROWS - 1) / MM_ROWS;
    int ocb = (int)(MM_WEIGHT_BLOCK_BYTES / (sizeof(gpt_real) * (size_t)IC));
    ocb = ocb < MM_COLS ? MM_COLS : ocb;
    const int full_cols = IC - IC % MM_COLS;
#pragma omp parallel
    {
        const size_t threads = (size_t)omp_get_num_threads(), tid = (size_t)omp_get_thread_num();
        const size_t rb0 = row_blocks * tid / threads, rb1 = row_blocks * (tid + 1) / threads;
        for (int ob0 = 0; ob0 < OC; ob0 += ocb) {
            const int ob1 = ob0 + ocb < OC ? ob0 + ocb : OC;
            for (size_t rb = rb0; rb < rb1; rb++) {
                const size_t n = rb * MM_ROWS;
                const int full_rows = n + MM_ROWS <= N;
                if (full_rows) {
                    const gpt_real* g = dout + n * OC;
                    for (int c0 = 0; c0 < full_cols; c0 += MM_COLS) {
                        mm_vec acc[MM_ROWS][MM_VECS];
#pragma GCC unroll 8
                        for (int r = 0; r < MM_ROWS; r++) {
#pragma GCC unroll 8
                            for (int k = 0; k < MM_VECS; k++) mm_load(acc[r][k], dinp + (n + r) * IC + c0 + k * MM_LANES);
                        }
                        for (int oc = ob0; oc < ob1; oc++) {
                            mm_vec w[MM_VECS];
#pragma GCC unroll 8
                            for (int k = 0; k < MM_VECS; k++) mm_load(w[k], weight + (size_t)oc * IC + c0 + k * MM_LANES);
#pragma GCC unroll 8
                            for (int r = 0; r < MM_ROWS; r++) {
                                const gpt_real a = g[(size_t)r * OC + oc];
#pragma GCC unroll 8
                                for (int k = 0; k < MM_VECS; k++) acc[r][k] += a * w[k];
                            }
                        }
#pragma GCC unroll 8
                        for (int r = 0; r < MM_ROWS; r++) {
#pragma GCC unroll 8
                            for (int k = 0; k < MM_VECS; k++) mm_store(dinp + (n + r) * IC + c0 + k * MM_LANES, acc[r][k]);
                        }
                    }
                }
                const size_t n_end = full_rows ? n + MM_ROWS : N;
                /* a last partial block: the same vector operations, row by row */
                for (size_t row = n; !full_rows && row < n_end; row++) {
                    for (int c0 = 0; c0 < full_cols; c0 += MM_COLS) {
                        mm_vec acc[MM_VECS];
#pragma GCC unroll 8
                        for (int k = 0; k < MM_VECS; k++) mm_load(acc[k], dinp + row * IC + c0 + k * MM_LANES);
                        for (int oc = ob0; oc < ob1; oc++) {
                            mm_vec w[MM_VECS];
#pragma GCC unroll 8
                            for (int k = 0; k < MM_VECS; k++) mm_load(w[k], weight + (size_t)oc * IC + c0 + k * MM_LANES);
                            const gpt_real a = dout[row * OC + oc];
#pragma GCC unroll 8
                            for (int k = 0; k < MM_VECS; k++) acc[k] += a * w[k];
                        }
#pragma GCC unroll 8
                        for (int k = 0; k < MM_VECS; k++) mm_store(dinp + row * IC + c0 + k * MM_LANES, acc[k]);
                    }
                }
                /* input features past the last full block: one element at a time, in the same order */
                for (size_t row = n; row < n_end; row++) {
                    for (int c = full_cols; c < IC; c++) {
                        gpt_real s = dinp[row * IC + c];
                        for (int oc = ob0; oc < ob1; oc++) s += dout[row * OC + oc] * weight[(size_t)oc * IC + c];
                        dinp[row * IC + c] = s;
                    }
                }
            }
        }
    }
}

/* dweight (OC, IC) += dout^T @ inp and dbias (OC) += column sums of dout (dbias may be NULL).
   Parallel over chunks of MM_COLS output features (a thread owns whole weight rows):
   a chunk's dout columns are packed into g (N x MM_COLS), then accumulate_weight_chunk. */
static void matmul_backward_weights(gpt_real* dweight, gpt_real* dbias, const gpt_real* dout, const gpt_real* inp,
                                    size_t N, int IC, int OC) {
    const int chunks = (OC + MM_COLS - 1) / MM_COLS;
#pragma omp parallel
    {
        gpt_real* g = (gpt_real*)mallocCheck(N * MM_COLS * sizeof(gpt_real));
#pragma omp for schedule(static)
        for (int chunk = 0; chunk < chunks; chunk++) {
            const int oc0 = chunk * MM_COLS;
            const int width = OC - oc0 < MM_COLS ? OC - oc0 : MM_COLS;
            for (size_t n = 0; n < N; n++) {
                for (int j = 0; j < MM_COLS; j++) g[n * MM_COLS + j] = j < width ? dout[n * OC + oc0 + j] : 0;
            }
            if (dbias) {
                for (int j = 0; j < width; j++) {
                    gpt_real s = dbias[oc0 + j];
                    for (size_t n = 0; n < N; n++) s += g[n * MM_COLS + j];
                    dbias[oc0 + j] = s;
                }
            }
            accumulate_weight_chunk(dweight + (size_t)oc0 * IC, g, inp, N, IC, width);
        }
        free(g);
    }
}

/* Backward of matmul_forward: dinp += dout @ weight (skipped when dinp is NULL);
   dweight += dout^T @ inp; dbias += sum over rows of dout (when dbias is not NULL). */
static void matmul_backward(gpt_real* dinp, gpt_real* dweight, gpt_real* dbias, const gpt_real* dout,
                            const gpt_real* inp, const gpt_real* weight, size_t N, int IC, int OC) {
    if (dinp) matmul_backward_inputs(dinp, dout, weight, N, IC, OC);
    matmul_backward_weights(dweight, dbias, dout, inp, N, IC, OC);
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

/* Backward of the tied classifier and the cross-entropy in one pass over the
   vocabulary. d(mean loss)/d(logits) = (probs - onehot(target)) / N on the first
   V columns, 0 beyond: each chunk of MM_COLS columns of it is computed from
   probs straight into the packed buffer matmul_backward_weights would have
   made (and also written to dlogits, which backward does not need to clear),
   then dwte += dlogits^T lnf for the chunk; finally dlnf += dlogits @ wte.
   This saves a separate pass that reads probs and writes dlogits. */
static void classifier_backward(gpt_real* dlnf, gpt_real* dwte, gpt_real* dlogits, const gpt_real* probs,
                                const int* targets, const gpt_real* lnf, const gpt_real* wte, size_t N, int C,
                                int V, int Vp) {
    const gpt_real inv_n = (gpt_real)(1.0 / (double)N);
    const int chunks = (Vp + MM_COLS - 1) / MM_COLS;
#pragma omp parallel
    {
        gpt_real* g = (gpt_real*)mallocCheck(N * MM_COLS * sizeof(gpt_real));
#pragma omp for schedule(static)
        for (int chunk = 0; chunk < chunks; chunk++) {
            const int v0 = chunk * MM_COLS;
            const int width = Vp - v0 < MM_COLS ? Vp - v0 : MM_COLS;
            const int live = V - v0 < 0 ? 0 : (V - v0 < width ? V - v0 : width);  /* columns < V */
            for (size_t n = 0; n < N; n++) {
                const gpt_real* p = probs + n * Vp + v0;
                gpt_real* gn = g + n * MM_COLS;
                for (int j = 0; j < MM_COLS; j++) gn[j] = j < live ? p[j] * inv_n : 0;
                const int t = targets[n] - v0;
                if (t >= 0 && t < live) gn[t] = (p[t] - 1) * inv_n;
                memcpy(dlogits + n * Vp + v0, gn, (size_t)width * sizeof(gpt_real));
            }
            accumulate_weight_chunk(dwte + (size_t)v0 * C, g, lnf, N, C, width);
        }
        free(g);
    }
    matmul_backward_inputs(dlnf, dlogits, wte, N, C, Vp);
}

/* ------------------------------------------------------------------------ */
/* the options' layers: RMSNorm, QK-norm + RoPE, SwiGLU                      */

/* N rows of C: out = x * rsqrt(mean(x^2) + eps) * g (gain only); saves rstd per row. */
static void rmsnorm_forward(gpt_real* out, gpt_real* rstd, const gpt_real* inp, const gpt_real* g, size_t N, int C) {
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) {
        const gpt_real* x = inp + n * C;
        double ss = 0.0;
        for (int c = 0; c < C; c++) ss += (double)x[c] * (double)x[c];
        const gpt_real rs = (gpt_real)(1.0 / sqrt(ss / C + GPT_NORM_EPS));
        gpt_real* o = out + n * C;
        for (int c = 0; c < C; c++) o[c] = (x[c] * rs) * g[c];
        rstd[n] = rs;
    }
}

/* One row of the RMSNorm backward: dx (+)= rs * u - rs^3 * x * mean(u * x), u = dy * g
   (d/dx of x * rs * g with rs = (mean(x^2) + eps)^-1/2). accumulate 0 overwrites dx. */
static inline void rms_row_backward(gpt_real* dx, const gpt_real* dy, const gpt_real* x, const gpt_real* g,
                                    gpt_real rs, int n, int accumulate) {
    double dot = 0.0;
    for (int i = 0; i < n; i++) dot += (double)(dy[i] * g[i]) * (double)x[i];
    const gpt_real coef = (gpt_real)(dot / n) * rs * rs * rs;
    for (int i = 0; i < n; i++) {
        const gpt_real d = rs * (dy[i] * g[i]) - coef * x[i];
        dx[i] = accumulate ? dx[i] + d : d;
    }
}

/* Backward of rmsnorm_forward: dinp += ..., dg += sum over rows of dout * x * rstd. */
static void rmsnorm_backward(gpt_real* dinp, gpt_real* dg, const gpt_real* dout, const gpt_real* inp,
                             const gpt_real* g, const gpt_real* rstd, size_t N, int C) {
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) rms_row_backward(dinp + n * C, dout + n * C, inp + n * C, g, rstd[n], C, 1);
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        gpt_real s = 0;
        for (size_t n = 0; n < N; n++) s += dout[n * C + c] * (inp[n * C + c] * rstd[n]);
        dg[c] += s;
    }
}

/* The two norms behind one call: LayerNorm (w, b; saves mean and rstd) or RMSNorm (gain w; saves rstd). */
static void norm_forward(int norm, gpt_real* out, gpt_real* mean, gpt_real* rstd, const gpt_real* inp,
                         const gpt_real* w, const gpt_real* b, size_t N, int C) {
    if (norm == GPT_NORM_RMSNORM) rmsnorm_forward(out, rstd, inp, w, N, C);
    else layernorm_forward(out, mean, rstd, inp, w, b, N, C);
}
static void norm_backward(int norm, gpt_real* dinp, gpt_real* dw, gpt_real* db, const gpt_real* dout,
                          const gpt_real* inp, const gpt_real* w, const gpt_real* mean, const gpt_real* rstd,
                          size_t N, int C) {
    if (norm == GPT_NORM_RMSNORM) rmsnorm_backward(dinp, dw, dout, inp, w, rstd, N, C);
    else layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, N, C);
}

/* Rotate-half RoPE of one head vector x (HS) at position row (cos_t, sin_t of that t):
   (x_i, x_{i+HS/2}) -> (x_i c - x_{i+HS/2} s, x_{i+HS/2} c + x_i s). inverse != 0 rotates
   by -angle (the transpose, for the backward). */
static inline void rope_rotate(gpt_real* x, const gpt_real* cs, const gpt_real* sn, int half, int inverse) {
    for (int i = 0; i < half; i++) {
        const gpt_real a = x[i], b = x[i + half], c = cs[i], s = inverse ? -sn[i] : sn[i];
        x[i] = a * c - b * s;
        x[i + half] = b * c + a * s;
    }
}

/* What attention reads: per (token, q|k, head) the optional qk-norm (RMSNorm over HS with the
   layer's gain gq or gk, shared by the heads; rstd saved) then the optional RoPE at the token's
   position; v copied. qkv and out: (B, T, 3C). */
static void qk_transform_forward(const GPTCpu* m, gpt_real* out, gpt_real* rstd, const gpt_real* qkv,
                                 const gpt_real* gq, const gpt_real* gk, int B, int T) {
    const GPTConfig* cfg = &m->config;
    const int C = cfg->channels, NH = cfg->num_heads, HS = C / NH, half = HS / 2;
    const int rope = cfg->pos == GPT_POS_ROPE, qkn = cfg->qk_norm;
    const size_t N = (size_t)B * T;
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) {
        const int t = (int)(n % (size_t)T);
        const gpt_real* in = qkv + n * 3 * C;
        gpt_real* o = out + n * 3 * C;
        for (int part = 0; part < 2; part++) {
            const gpt_real* g = part == 0 ? gq : gk;
            for (int h = 0; h < NH; h++) {
                const gpt_real* x = in + part * C + h * HS;
                gpt_real* y = o + part * C + h * HS;
                if (qkn) {
                    double ss = 0.0;
                    for (int i = 0; i < HS; i++) ss += (double)x[i] * (double)x[i];
                    const gpt_real rs = (gpt_real)(1.0 / sqrt(ss / HS + GPT_NORM_EPS));
                    rstd[n * 2 * NH + part * NH + h] = rs;
                    for (int i = 0; i < HS; i++) y[i] = (x[i] * rs) * g[i];
                } else {
                    for (int i = 0; i < HS; i++) y[i] = x[i];
                }
                if (rope) rope_rotate(y, m->rope_cos + (size_t)t * half, m->rope_sin + (size_t)t * half, half, 0);
            }
        }
        memcpy(o + 2 * C, in + 2 * C, (size_t)C * sizeof(gpt_real));
    }
}

/* Backward of qk_transform_forward: dqkv (the qkv matmul output's gradient) = the inverse
   RoPE of d(att) for q and k, then through qk-norm; dv copied; dgq, dgk += the gains' gradients. */
static void qk_transform_backward(const GPTCpu* m, gpt_real* dqkv, gpt_real* dgq, gpt_real* dgk,
                                  const gpt_real* datt, const gpt_real* qkv, const gpt_real* rstd,
                                  const gpt_real* gq, const gpt_real* gk, int B, int T) {
    const GPTConfig* cfg = &m->config;
    const int C = cfg->channels, NH = cfg->num_heads, HS = C / NH, half = HS / 2;
    const int rope = cfg->pos == GPT_POS_ROPE, qkn = cfg->qk_norm;
    const size_t N = (size_t)B * T;
    /* 1: dy = R^T d(att) (the gradient of the normed, gained q and k), written into dqkv */
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) {
        const int t = (int)(n % (size_t)T);
        memcpy(dqkv + n * 3 * C, datt + n * 3 * C, (size_t)3 * C * sizeof(gpt_real));
        for (int part = 0; part < 2 && rope; part++) {
            for (int h = 0; h < NH; h++) {
                rope_rotate(dqkv + n * 3 * C + part * C + h * HS, m->rope_cos + (size_t)t * half,
                            m->rope_sin + (size_t)t * half, half, 1);
            }
        }
    }
    if (!qkn) return;
    /* 2: the gains' gradients, sum over tokens and heads of dy * x * rstd (one thread per element i) */
#pragma omp parallel for schedule(static)
    for (int i = 0; i < 2 * HS; i++) {
        const int part = i / HS, e = i % HS;
        gpt_real s = 0;
        for (size_t n = 0; n < N; n++) {
            for (int h = 0; h < NH; h++) {
                const size_t at = n * 3 * C + (size_t)part * C + (size_t)h * HS + e;
                s += dqkv[at] * (qkv[at] * rstd[n * 2 * NH + part * NH + h]);
            }
        }
        (part == 0 ? dgq : dgk)[e] += s;
    }
    /* 3: dx through the per-head RMSNorm, in place of dy */
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) {
        for (int part = 0; part < 2; part++) {
            for (int h = 0; h < NH; h++) {
                const size_t at = n * 3 * C + (size_t)part * C + (size_t)h * HS;
                rms_row_backward(dqkv + at, dqkv + at, qkv + at, part == 0 ? gq : gk,
                                 rstd[n * 2 * NH + part * NH + h], HS, 0);
            }
        }
    }
}

/* SwiGLU: fch rows (N, 2H) hold the gate a in [0, H) and the up b in [H, 2H);
   out (N, H) = a * sigmoid(a) * b. */
static void swiglu_forward(gpt_real* out, const gpt_real* fch, size_t N, int H) {
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) {
        const gpt_real* a = fch + n * 2 * H;
        const gpt_real* b = a + H;
        gpt_real* o = out + n * H;
        for (int j = 0; j < H; j++) {
            const gpt_real s = 1 / (1 + exp(-a[j]));
            o[j] = a[j] * s * b[j];
        }
    }
}

/* dfch += d/d(a, b) of a * sigmoid(a) * b: da = dout * b * s (1 + a (1 - s)), db = dout * a * s. */
static void swiglu_backward(gpt_real* dfch, const gpt_real* fch, const gpt_real* dout, size_t N, int H) {
#pragma omp parallel for schedule(static)
    for (size_t n = 0; n < N; n++) {
        const gpt_real* a = fch + n * 2 * H;
        const gpt_real* b = a + H;
        gpt_real* da = dfch + n * 2 * H;
        gpt_real* db = da + H;
        const gpt_real* d = dout + n * H;
        for (int j = 0; j < H; j++) {
            const gpt_real s = 1 / (1 + exp(-a[j]));
            da[j] += d[j] * b[j] * (s * (1 + a[j] * (1 - s)));
            db[j] += d[j] * (a[j] * s);
        }
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

/* Layer l of parameter tensor id inside a parameter-shaped buffer; NULL when the config has no
   such tensor (a bias with bias 0, a LayerNorm bias with RMSNorm, ...). */
static gpt_real* layer_param(const GPTCpu* m, gpt_real* buf, ParamId id, int l) {
    const ParamTensorInfo* p = &m->params_info[id];
    if (p->count == 0) return NULL;
    return buf + p->offset + (size_t)l * (p->count / (size_t)p->layers);
}

/* The output head: wte when tied, else lm_head. */
static ParamId head_id(const GPTCpu* m) { return m->config.tie_embeddings ? P_WTE : P_LMHEADW; }

void gpt_cpu_forward(GPTCpu* m, const int* inputs, const int* targets, int B, int T) {
    const GPTConfig* cfg = &m->config;
    const int L = cfg->num_layers, C = cfg->channels, NH = cfg->num_heads;
    const int V = cfg->vocab_size, Vp = cfg->padded_vocab_size, H = cfg->mlp_hidden, F = gpt_config_fc_rows(cfg);
    const int norm = cfg->norm, qk_att = m->acts_info[A_QKV_ATT].count != 0;
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

    encoder_forward(gpt_act_ptr(m, A, A_ENCODED, 0), inputs, gpt_param_ptr(m, P, P_WTE), layer_param(m, P, P_WPE, 0),
                    B, T, C);
    for (int l = 0; l < L; l++) {
        const gpt_real* residual = l == 0 ? gpt_act_ptr(m, A, A_ENCODED, 0) : gpt_act_ptr(m, A, A_RESIDUAL3, l - 1);
        gpt_real* ln1 = gpt_act_ptr(m, A, A_LN1, l);
        gpt_real* qkv = gpt_act_ptr(m, A, A_QKV, l);
        gpt_real* qkv_att = qk_att ? gpt_act_ptr(m, A, A_QKV_ATT, l) : qkv;
        gpt_real* atty = gpt_act_ptr(m, A, A_ATTY, l);
        gpt_real* residual2 = gpt_act_ptr(m, A, A_RESIDUAL2, l);
        gpt_real* ln2 = gpt_act_ptr(m, A, A_LN2, l);
        gpt_real* fch = gpt_act_ptr(m, A, A_FCH, l);
        gpt_real* fch_gelu = gpt_act_ptr(m, A, A_FCH_GELU, l);
        gpt_real* residual3 = gpt_act_ptr(m, A, A_RESIDUAL3, l);

        norm_forward(norm, ln1, gpt_act_ptr(m, A, A_LN1_MEAN, l), gpt_act_ptr(m, A, A_LN1_RSTD, l), residual,
                     layer_param(m, P, P_LN1W, l), layer_param(m, P, P_LN1B, l), N, C);
        matmul_forward(qkv, ln1, layer_param(m, P, P_QKVW, l), layer_param(m, P, P_QKVB, l), N, C, 3 * C);
        if (qk_att) {
            qk_transform_forward(m, qkv_att, gpt_act_ptr(m, A, A_QK_RSTD, l), qkv, layer_param(m, P, P_QNORMW, l),
                                 layer_param(m, P, P_KNORMW, l), B, T);
        }
        attention_forward_real(m, shape, qkv_att, atty, gpt_act_ptr(m, A, A_ATT_STATS, l));
        matmul_forward(residual2, atty, layer_param(m, P, P_ATTPROJW, l), layer_param(m, P, P_ATTPROJB, l), N, C, C);
        residual_add(residual2, residual, N * C);
        norm_forward(norm, ln2, gpt_act_ptr(m, A, A_LN2_MEAN, l), gpt_act_ptr(m, A, A_LN2_RSTD, l), residual2,
                     layer_param(m, P, P_LN2W, l), layer_param(m, P, P_LN2B, l), N, C);
        matmul_forward(fch, ln2, layer_param(m, P, P_FCW, l), layer_param(m, P, P_FCB, l), N, C, F);
        if (cfg->mlp == GPT_MLP_SWIGLU) swiglu_forward(fch_gelu, fch, N, H);
        else gelu_forward(fch_gelu, fch, N * H);
        matmul_forward(residual3, fch_gelu, layer_param(m, P, P_FCPROJW, l), layer_param(m, P, P_FCPROJB, l), N, H, C);
        residual_add(residual3, residual2, N * C);
    }
    gpt_real* lnf = gpt_act_ptr(m, A, A_LNF, 0);
    norm_forward(norm, lnf, gpt_act_ptr(m, A, A_LNF_MEAN, 0), gpt_act_ptr(m, A, A_LNF_RSTD, 0),
                 gpt_act_ptr(m, A, A_RESIDUAL3, L - 1), layer_param(m, P, P_LNFW, 0), layer_param(m, P, P_LNFB, 0),
                 N, C);
    matmul_forward(m->logits, lnf, gpt_param_ptr(m, P, head_id(m)), NULL, N, C, Vp);
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
    const int V = cfg->vocab_size, Vp = cfg->padded_vocab_size, H = cfg->mlp_hidden, F = gpt_config_fc_rows(cfg);
    const int norm = cfg->norm, qk_att = m->acts_info[A_QKV_ATT].count != 0;
    const int B = m->cur_B, T = m->cur_T;
    const size_t N = (size_t)B * T;
    const AttnShape shape = {.B = B, .NH = NH, .T = T, .HS = C / NH};
    gpt_real* P = m->params;
    gpt_real* G = m->grads;
    gpt_real* A = m->acts;
    gpt_real* dA = m->grads_acts;
    /* layer backwards accumulate, except the last one (dlogits), which writes all of its rows */
    memset(dA, 0, m->acts_info[A_LOGITS].offset * sizeof(gpt_real));

    gpt_real* dlogits = gpt_act_ptr(m, dA, A_LOGITS, 0);
    gpt_real* dlnf = gpt_act_ptr(m, dA, A_LNF, 0);
    classifier_backward(dlnf, gpt_param_ptr(m, G, head_id(m)), dlogits, m->probs, m->targets,
                        gpt_act_ptr(m, A, A_LNF, 0), gpt_param_ptr(m, P, head_id(m)), N, C, V, Vp);
    norm_backward(norm, gpt_act_ptr(m, dA, A_RESIDUAL3, L - 1), layer_param(m, G, P_LNFW, 0),
                  layer_param(m, G, P_LNFB, 0), dlnf, gpt_act_ptr(m, A, A_RESIDUAL3, L - 1),
                  layer_param(m, P, P_LNFW, 0), gpt_act_ptr(m, A, A_LNF_MEAN, 0), gpt_act_ptr(m, A, A_LNF_RSTD, 0),
                  N, C);

    for (int l = L - 1; l >= 0; l--) {
        const gpt_real* residual = l == 0 ? gpt_act_ptr(m, A, A_ENCODED, 0) : gpt_act_ptr(m, A, A_RESIDUAL3, l - 1);
        gpt_real* dresidual = l == 0 ? gpt_act_ptr(m, dA, A_ENCODED, 0) : gpt_act_ptr(m, dA, A_RESIDUAL3, l - 1);
        gpt_real* dresidual3 = gpt_act_ptr(m, dA, A_RESIDUAL3, l);
        gpt_real* dresidual2 = gpt_act_ptr(m, dA, A_RESIDUAL2, l);
        gpt_real* dfch_gelu = gpt_act_ptr(m, dA, A_FCH_GELU, l);
        gpt_real* dfch = gpt_act_ptr(m, dA, A_FCH, l);
        gpt_real* dln2 = gpt_act_ptr(m, dA, A_LN2, l);
        gpt_real* datty = gpt_act_ptr(m, dA, A_ATTY, l);
        gpt_real* dqkv = gpt_act_ptr(m, dA, A_QKV, l);
        gpt_real* dqkv_att = qk_att ? gpt_act_ptr(m, dA, A_QKV_ATT, l) : dqkv;
        gpt_real* dln1 = gpt_act_ptr(m, dA, A_LN1, l);
        const gpt_real* qkv = gpt_act_ptr(m, A, A_QKV, l);

        /* MLP block: residual3 = residual2 + fcproj(act(fc(norm2(residual2)))) */
        matmul_backward(dfch_gelu, layer_param(m, G, P_FCPROJW, l), layer_param(m, G, P_FCPROJB, l), dresidual3,
                        gpt_act_ptr(m, A, A_FCH_GELU, l), layer_param(m, P, P_FCPROJW, l), N, H, C);
        if (cfg->mlp == GPT_MLP_SWIGLU) swiglu_backward(dfch, gpt_act_ptr(m, A, A_FCH, l), dfch_gelu, N, H);
        else gelu_backward(dfch, gpt_act_ptr(m, A, A_FCH, l), dfch_gelu, N * H);
        matmul_backward(dln2, layer_param(m, G, P_FCW, l), layer_param(m, G, P_FCB, l), dfch,
                        gpt_act_ptr(m, A, A_LN2, l), layer_param(m, P, P_FCW, l), N, C, F);
        norm_backward(norm, dresidual2, layer_param(m, G, P_LN2W, l), layer_param(m, G, P_LN2B, l), dln2,
                      gpt_act_ptr(m, A, A_RESIDUAL2, l), layer_param(m, P, P_LN2W, l),
                      gpt_act_ptr(m, A, A_LN2_MEAN, l), gpt_act_ptr(m, A, A_LN2_RSTD, l), N, C);
        residual_add(dresidual2, dresidual3, N * C);

        /* attention block: residual2 = residual + attproj(attention(rope(qknorm(qkv(norm1(residual)))))) */
        matmul_backward(datty, layer_param(m, G, P_ATTPROJW, l), layer_param(m, G, P_ATTPROJB, l), dresidual2,
                        gpt_act_ptr(m, A, A_ATTY, l), layer_param(m, P, P_ATTPROJW, l), N, C, C);
        attention_backward_real(m, shape, qk_att ? gpt_act_ptr(m, A, A_QKV_ATT, l) : qkv,
                                gpt_act_ptr(m, A, A_ATTY, l), gpt_act_ptr(m, A, A_ATT_STATS, l), datty, dqkv_att);
        if (qk_att) {
            qk_transform_backward(m, dqkv, layer_param(m, G, P_QNORMW, l), layer_param(m, G, P_KNORMW, l), dqkv_att,
                                  qkv, gpt_act_ptr(m, A, A_QK_RSTD, l), layer_param(m, P, P_QNORMW, l),
                                  layer_param(m, P, P_KNORMW, l), B, T);
        }
        matmul_backward(dln1, layer_param(m, G, P_QKVW, l), layer_param(m, G, P_QKVB, l), dqkv,
                        gpt_act_ptr(m, A, A_LN1, l), layer_param(m, P, P_QKVW, l), N, C, 3 * C);
        norm_backward(norm, dresidual, layer_param(m, G, P_LN1W, l), layer_param(m, G, P_LN1B, l), dln1, residual,
                      layer_param(m, P, P_LN1W, l), gpt_act_ptr(m, A, A_LN1_MEAN, l),
                      gpt_act_ptr(m, A, A_LN1_RSTD, l), N, C);
        residual_add(dresidual, dresidual2, N * C);
    }
    encoder_backward(gpt_param_ptr(m, G, P_WTE), layer_param(m, G, P_WPE, 0), gpt_act_ptr(m, dA, A_ENCODED, 0),
                     m->inputs, B, T, C);
}
