/*
 * attention/cpu/attention_cpu.c - exact CPU emulation of the four attention modes
 * (fp32, bf16, repair, gproj): forward, backward, and the softmax numerators
 * for inspection.
 *
 * Why: the GPU kernels, the FP32 CPU model and the probe all need a precise,
 * readable statement of what each mode computes, and the tests need to show
 * the BF16 leak (and its repair) without a GPU. This file rounds exactly
 * where docs/attention_numerics.md says and nowhere else:
 *   - bf(x) is bf16_round (round to nearest even, NaN kept, overflow to Inf);
 *   - bf16 mode: exponent fmaf(S, c, -fl(m*c)) as ONE fused multiply-add
 *     (fmaf, never a separate multiply and add), P_max != 1; stats {LSE, 0};
 *     backward P = exp2(fmaf(S, c, -fl(LSE*log2 e))), D = dO . O (stored O);
 *   - repair / gproj: exponent fl(fl(S - m) * c), P_max == 1 exactly; stats
 *     {m, l}; the backward recomputes e with the identical expression and
 *     normalises by multiplying with fl(1/l), so backward e equals forward e
 *     bit for bit (attention_probs_cpu shows it);
 *   - gproj: lambda_i = r_i / p_i from whole-row sums, dQ gets
 *     -lambda_i sum_j bf(P_ij) K_j, dK gets bf(-lambda_i P_ij) Q_i as its own
 *     BF16 operand (rounding dS - lambda P together would lose it);
 *   - fp32: nothing rounded inside; D = sum_j P_ij dP_ij from fp32 P and dP,
 *     evaluated around the pivot c_i = dO_i . O_i (stored O) as
 *     D_i = c_i + sum_j P_ij (dP_ij - c_i): the same value in exact arithmetic
 *     (sum_j P_ij = 1), but the fp32 sum only carries the small difference,
 *     so a large common part of dP (large or offset V) does not cancel
 *     catastrophically in dP - D. Same cost on a GPU (one pass over dP).
 * All dot products and sums are fp32; GEMM-like sums are fp32 accumulations
 * of BF16 (or fp32) operands, the scale s applied to the fp32 accumulator.
 * With ATTN_IO_BF16 the inputs (q, k, v, dO, and the stored O read by the
 * backward) are rounded on entry and O, dQ, dK, dV on exit; ATTN_IO_FP32 keeps
 * only the internal rounding (see attention.h).
 *
 * Full-row softmax instead of the GPU's online softmax: the forward here
 * computes each row's max over all its visible keys first, then the
 * exponentials once. A flash kernel visits key tiles with a running max and
 * rescales its fp32 accumulators when the max grows; its bf(e) for early
 * tiles is taken relative to an older max, and its sums run in another order.
 * The contract fixes the rounding points (which quantities are BF16, the FMA,
 * subtract-then-scale, what is stored), not the accumulation order, so the
 * two agree to fp32 accumulation noise while both keep every rounding effect
 * this project studies. The saved state is the same: the final max m_i and
 * l_i (or LSE_i), and the backward recomputes P from it identically on CPU
 * and GPU. The tile-max shift arm needs tiles, and uses them: key tiles of
 * ATTN_SHIFT_TILE_KEYS columns, the row max being the largest (possibly
 * shifted) tile max, which is what a running max over tiles ends at.
 *
 * Parallelism: OpenMP over (b, h); each head is independent and owns its
 * slices of out, stats and dqkv, so results do not depend on thread count.
 *
 * The per-row building blocks (head gather, forward numerators, backward P,
 * pivoted D, dot/axpy) are also exposed, as thin wrappers at the end of this
 * file, through attention_cpu_rows.h, for tools that emulate variants of a
 * mode with the same rounding (dev/gproj_variants.c).
 */
#include <math.h>
#include <string.h>
#include "attention/attention.h"
#include "attention/cpu/attention_cpu_rows.h"
#include "common/utils.h"

enum { PART_Q = 0, PART_K = 1, PART_V = 2 };
#define LOG2E_F 1.44269504088896340736f

typedef struct {
    AttnMode mode;
    int tile_max_shift; /* repair only */
    int io_bf16;
    int T, HS;
    float s; /* 1/sqrt(HS) */
    float c; /* s * log2(e) */
} ModeCtx;

static ModeCtx make_ctx(AttnMode mode, AttnOptions opt, AttnIO io, AttnShape s, const char* who) {
    attn_shape_check(s, who);
    attn_mode_require_emulated(mode, who); /* cudnn has no CPU emulation */
    if (io != ATTN_IO_FP32 && io != ATTN_IO_BF16) {
        die("%s: invalid AttnIO value %d\n  hint: pass ATTN_IO_FP32 or ATTN_IO_BF16", who, (int)io);
    }
    ModeCtx ctx;
    ctx.mode = mode;
    ctx.tile_max_shift = (mode == ATTN_REPAIR) && opt.tile_max_shift;
    ctx.io_bf16 = (io == ATTN_IO_BF16);
    ctx.T = s.T;
    ctx.HS = s.HS;
    ctx.s = attn_softmax_scale(s.HS);
    ctx.c = attn_exp2_scale(s.HS);
    return ctx;
}

/* Does the mode round the probabilities and dS to BF16 as GEMM operands? */
static int rounds_operands(const ModeCtx* ctx) { return ctx->mode != ATTN_FP32; }

static size_t qkv_part(AttnShape s, int b, int t, int part, int h) {
    return ((((size_t)b * s.T + t) * 3 + part) * s.NH + h) * s.HS;
}
static size_t out_at(AttnShape s, int b, int t, int h) { return (((size_t)b * s.T + t) * s.NH + h) * s.HS; }
static size_t stats_row(AttnShape s, int b, int h, int t) { return (((size_t)b * s.NH + h) * s.T + t) * 2; }

/* Copies one head of a strided tensor into a contiguous [T, HS] buffer,
   rounding to BF16 when the module boundary is BF16. */
static void gather_head(const ModeCtx* ctx, const float* src, size_t (*offset)(AttnShape, int, int, int, int),
                        AttnShape s, int b, int part, int h, float* dst) {
    for (int t = 0; t < s.T; t++) {
        const float* row = src + offset(s, b, t, part, h);
        float* d = dst + (size_t)t * s.HS;
        if (ctx->io_bf16)
            for (int i = 0; i < s.HS; i++) d[i] = bf16_round(row[i]);
        else
            memcpy(d, row, sizeof(float) * (size_t)s.HS);
    }
}
static size_t out_offset(AttnShape s, int b, int t, int part, int h) { (void)part; return out_at(s, b, t, h); }

static float out_value(const ModeCtx* ctx, float x) { return ctx->io_bf16 ? bf16_round(x) : x; }

/* fp32 dot product; the order of the fp32 sum is free (as on tensor cores). */
static float dot_f32(const float* a, const float* b, int n) {
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int i = 0; i < n; i++) acc += a[i] * b[i];
    return acc;
}

/* y += w * x (fp32) */
static void axpy_f32(float w, const float* x, float* y, int n) {
#pragma omp simd
    for (int i = 0; i < n; i++) y[i] += w * x[i];
}

/* Scores S[j] = q_i . k_j for the visible keys j = 0..i. */
static void score_row(const ModeCtx* ctx, const float* Q, const float* K, int i, float* S) {
    const float* q = Q + (size_t)i * ctx->HS;
    for (int j = 0; j <= i; j++) S[j] = dot_f32(q, K + (size_t)j * ctx->HS, ctx->HS);
}

/* The max the softmax subtracts: the row max, or with repair's tile-max
   shift arm the largest of the per-tile maxima, where a tile whose max m~ is
   tied (within ATTN_SHIFT_TIE_TOL in scaled units) by at least one other of
   its scores uses 2*m~ (m~ > 0) or 0 (m~ <= 0) instead. */
static float softmax_max(const ModeCtx* ctx, const float* S, int n) {
    float m = -INFINITY;
    if (!ctx->tile_max_shift) {
        for (int j = 0; j < n; j++) m = fmaxf(m, S[j]);
        return m;
    }
    for (int t0 = 0; t0 < n; t0 += ATTN_SHIFT_TILE_KEYS) {
        int t1 = t0 + ATTN_SHIFT_TILE_KEYS < n ? t0 + ATTN_SHIFT_TILE_KEYS : n;
        float tile_max = -INFINITY;
        for (int j = t0; j < t1; j++) tile_max = fmaxf(tile_max, S[j]);
        int ties = 0;
        for (int j = t0; j < t1; j++) ties += (tile_max - S[j]) * ctx->s <= ATTN_SHIFT_TIE_TOL;
        if (ties >= 2) tile_max = tile_max > 0.0f ? 2.0f * tile_max : 0.0f;
        m = fmaxf(m, tile_max);
    }
    return m;
}

/* Forward softmax numerators of one row: e[j] from S[j] and the row max.
   Returns m; *l gets sum_j e[j] (fp32). */
static float forward_numerators(const ModeCtx* ctx, const float* S, int n, float* e, float* l) {
    float m = softmax_max(ctx, S, n);
    if (ctx->mode == ATTN_BF16) {
        float mc = m * ctx->c; /* fl(m*c), then ONE fused multiply-add */
        for (int j = 0; j < n; j++) e[j] = exp2f(fmaf(S[j], ctx->c, -mc));
    } else {
        for (int j = 0; j < n; j++) e[j] = exp2f((S[j] - m) * ctx->c); /* subtract first, then scale */
    }
    float sum = 0.0f;
    for (int j = 0; j < n; j++) sum += e[j];
    *l = sum;
    return m;
}

/* What the backward recomputes from the stored stats before normalising:
   bf16 mode: P[j] itself (from LSE); other modes: e[j] from the stored m. */
static void backward_numerators(const ModeCtx* ctx, const float* S, int n, const float* st, float* e) {
    if (ctx->mode == ATTN_BF16) {
        float lse2 = st[0] * LOG2E_F; /* fl(LSE * log2 e) */
        for (int j = 0; j < n; j++) e[j] = exp2f(fmaf(S[j], ctx->c, -lse2));
    } else {
        float m = st[0];
        for (int j = 0; j < n; j++) e[j] = exp2f((S[j] - m) * ctx->c);
    }
}

/* The backward's normalised P of one row: bf16 mode recomputes P from the
   LSE directly; the other modes recompute e from the stored m and multiply by
   fl(1/l). */
static void backward_probs(const ModeCtx* ctx, const float* S, int n, const float* st, float* P) {
    backward_numerators(ctx, S, n, st, P);
    if (ctx->mode != ATTN_BF16) {
        float inv_l = 1.0f / st[1];
        for (int j = 0; j < n; j++) P[j] *= inv_l;
    }
}

/* fp32 mode's D around the pivot c = dO . O (stored O): returns D - c =
   sum_j P_j (dP_j - c), so that dP - D = (dP - c) - (D - c). */
static float pivoted_D_minus_c(const float* P, const float* dP, float c, int n) {
    float D_minus_c = 0.0f;
    for (int j = 0; j < n; j++) D_minus_c += P[j] * (dP[j] - c);
    return D_minus_c;
}

/* ---- forward ---- */

void attention_forward_cpu(AttnMode mode, AttnOptions opt, AttnIO io, AttnShape s, const float* qkv, float* out,
                           float* stats) {
    ModeCtx ctx = make_ctx(mode, opt, io, s, "attention_forward_cpu");
    const int T = s.T, HS = s.HS;
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.NH; h++) {
            float* Q = (float*)mallocCheck(sizeof(float) * (size_t)T * HS);
            float* K = (float*)mallocCheck(sizeof(float) * (size_t)T * HS);
            float* V = (float*)mallocCheck(sizeof(float) * (size_t)T * HS);
            float* S = (float*)mallocCheck(sizeof(float) * (size_t)T);
            float* e = (float*)mallocCheck(sizeof(float) * (size_t)T);
            float* acc = (float*)mallocCheck(sizeof(float) * (size_t)HS);
            gather_head(&ctx, qkv, qkv_part, s, b, PART_Q, h, Q);
            gather_head(&ctx, qkv, qkv_part, s, b, PART_K, h, K);
            gather_head(&ctx, qkv, qkv_part, s, b, PART_V, h, V);
            for (int i = 0; i < T; i++) {
                score_row(&ctx, Q, K, i, S);
                float l;
                float m = forward_numerators(&ctx, S, i + 1, e, &l);
                memset(acc, 0, sizeof(float) * (size_t)HS);
                for (int j = 0; j <= i; j++) {
                    float w = rounds_operands(&ctx) ? bf16_round(e[j]) : e[j];
                    axpy_f32(w, V + (size_t)j * HS, acc, HS);
                }
                float* o = out + out_at(s, b, i, h);
                for (int d = 0; d < HS; d++) o[d] = out_value(&ctx, acc[d] / l);
                float* st = stats + stats_row(s, b, h, i);
                if (mode == ATTN_BF16) {
                    st[0] = m * ctx.s + logf(l); /* LSE in natural log, scaled units */
                    st[1] = 0.0f;
                } else {
                    st[0] = m;
                    st[1] = l;
                }
            }
            free(Q); free(K); free(V); free(S); free(e); free(acc);
        }
    }
}

/* ---- backward ---- */

void attention_backward_cpu_diag(AttnMode mode, AttnOptions opt, AttnIO io, AttnShape s, const float* qkv,
                                 const float* out, const float* stats, const float* dout, float* dqkv,
                                 float* row_residual) {
    ModeCtx ctx = make_ctx(mode, opt, io, s, "attention_backward_cpu");
    const int T = s.T, HS = s.HS;
    const int bf_ops = rounds_operands(&ctx);
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.NH; h++) {
            size_t head = sizeof(float) * (size_t)T * HS;
            float* Q = (float*)mallocCheck(head);
            float* K = (float*)mallocCheck(head);
            float* V = (float*)mallocCheck(head);
            float* O = (float*)mallocCheck(head);
            float* dO = (float*)mallocCheck(head);
            float* dK = (float*)callocCheck((size_t)T * HS, sizeof(float)); /* fp32 accumulators */
            float* dV = (float*)callocCheck((size_t)T * HS, sizeof(float));
            float* S = (float*)mallocCheck(sizeof(float) * (size_t)T);
            float* P = (float*)mallocCheck(sizeof(float) * (size_t)T);
            float* dS = (float*)mallocCheck(sizeof(float) * (size_t)T);
            float* acc_dq = (float*)mallocCheck(sizeof(float) * (size_t)HS);
            float* acc_pk = (float*)mallocCheck(sizeof(float) * (size_t)HS);
            gather_head(&ctx, qkv, qkv_part, s, b, PART_Q, h, Q);
            gather_head(&ctx, qkv, qkv_part, s, b, PART_K, h, K);
            gather_head(&ctx, qkv, qkv_part, s, b, PART_V, h, V);
            gather_head(&ctx, out, out_offset, s, b, 0, h, O);
            gather_head(&ctx, dout, out_offset, s, b, 0, h, dO);
            for (int i = 0; i < T; i++) {
                const int n = i + 1;
                const float* st = stats + stats_row(s, b, h, i);
                const float* dOi = dO + (size_t)i * HS;
                const float* Qi = Q + (size_t)i * HS;
                score_row(&ctx, Q, K, i, S);
                backward_probs(&ctx, S, n, st, P);
                /* dP_ij = dO_i . V_j (held in dS until dS replaces it) */
                for (int j = 0; j < n; j++) dS[j] = dot_f32(dOi, V + (size_t)j * HS, HS);
                const float dO_dot_O = dot_f32(dOi, O + (size_t)i * HS, HS);
                if (mode == ATTN_FP32) {
                    /* D - c with the pivot c = dO . O; dP - D = (dP - c) - (D - c) */
                    const float D_minus_c = pivoted_D_minus_c(P, dS, dO_dot_O, n);
                    for (int j = 0; j < n; j++) dS[j] = P[j] * ((dS[j] - dO_dot_O) - D_minus_c);
                } else {
                    /* D = dO . O with the stored O; dS = P o (dP - D), operand bf(dS) */
                    for (int j = 0; j < n; j++) dS[j] = bf16_round(P[j] * (dS[j] - dO_dot_O));
                }
                /* gproj: lambda_i = r_i / p_i over the whole row, before any dK use */
                float lambda = 0.0f;
                if (mode == ATTN_GPROJ) {
                    float r = 0.0f, p = 0.0f;
                    for (int j = 0; j < n; j++) {
                        r += dS[j];
                        p += bf16_round(P[j]);
                    }
                    lambda = (p != 0.0f) ? r / p : 0.0f;
                }
                memset(acc_dq, 0, sizeof(float) * (size_t)HS);
                memset(acc_pk, 0, sizeof(float) * (size_t)HS);
                double res_sum = 0.0, res_abs = 0.0;
                for (int j = 0; j < n; j++) {
                    const float* Kj = K + (size_t)j * HS;
                    float p_op = bf_ops ? bf16_round(P[j]) : P[j];
                    axpy_f32(dS[j], Kj, acc_dq, HS);
                    axpy_f32(dS[j], Qi, dK + (size_t)j * HS, HS);
                    axpy_f32(p_op, dOi, dV + (size_t)j * HS, HS);
                    double eff = dS[j];
                    if (mode == ATTN_GPROJ) {
                        axpy_f32(p_op, Kj, acc_pk, HS);
                        /* the correction as its own BF16 operand of the dK GEMM */
                        axpy_f32(bf16_round(-lambda * P[j]), Qi, dK + (size_t)j * HS, HS);
                        eff -= (double)lambda * p_op;
                    }
                    res_sum += eff;
                    res_abs += fabs(eff);
                }
                float* dq = dqkv + qkv_part(s, b, i, PART_Q, h);
                for (int d = 0; d < HS; d++) {
                    float g = (mode == ATTN_GPROJ) ? acc_dq[d] - lambda * acc_pk[d] : acc_dq[d];
                    dq[d] = out_value(&ctx, ctx.s * g);
                }
                if (row_residual != NULL) {
                    row_residual[((size_t)b * s.NH + h) * T + i] =
                        res_abs > 0 ? (float)(fabs(res_sum) / res_abs) : 0.0f;
                }
            }
            for (int j = 0; j < T; j++) {
                float* dk = dqkv + qkv_part(s, b, j, PART_K, h);
                float* dv = dqkv + qkv_part(s, b, j, PART_V, h);
                for (int d = 0; d < HS; d++) {
                    dk[d] = out_value(&ctx, ctx.s * dK[(size_t)j * HS + d]);
                    dv[d] = out_value(&ctx, dV[(size_t)j * HS + d]);
                }
            }
            free(Q); free(K); free(V); free(O); free(dO); free(dK); free(dV);
            free(S); free(P); free(dS); free(acc_dq); free(acc_pk);
        }
    }
}

void attention_backward_cpu(AttnMode mode, AttnOptions opt, AttnIO io, AttnShape s, const float* qkv,
                            const float* out, const float* stats, const float* dout, float* dqkv) {
    attention_backward_cpu_diag(mode, opt, io, s, qkv, out, stats, dout, dqkv, NULL);
}

/* ---- softmax numerators for inspection ---- */

void attention_probs_cpu(AttnMode mode, AttnOptions opt, AttnIO io, AttnShape s, const float* qkv,
                         const float* stats, int from_stats, float* probs) {
    ModeCtx ctx = make_ctx(mode, opt, io, s, "attention_probs_cpu");
    const int T = s.T, HS = s.HS;
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.NH; h++) {
            float* Q = (float*)mallocCheck(sizeof(float) * (size_t)T * HS);
            float* K = (float*)mallocCheck(sizeof(float) * (size_t)T * HS);
            float* S = (float*)mallocCheck(sizeof(float) * (size_t)T);
            gather_head(&ctx, qkv, qkv_part, s, b, PART_Q, h, Q);
            gather_head(&ctx, qkv, qkv_part, s, b, PART_K, h, K);
            for (int i = 0; i < T; i++) {
                float* row = probs + (((size_t)b * s.NH + h) * T + i) * T;
                score_row(&ctx, Q, K, i, S);
                if (from_stats) {
                    backward_numerators(&ctx, S, i + 1, stats + stats_row(s, b, h, i), row);
                } else {
                    float l;
                    forward_numerators(&ctx, S, i + 1, row, &l);
                }
                for (int j = i + 1; j < T; j++) row[j] = 0.0f;
            }
            free(Q); free(K); free(S);
        }
    }
}

/* ---- per-row building blocks (attention_cpu_rows.h) ---- */

void attn_cpu_load_head(AttnIO io, AttnShape s, const float* src, AttnHeadPart part, int b, int h, float* dst) {
    ModeCtx ctx = make_ctx(ATTN_REPAIR, (AttnOptions){0}, io, s, "attn_cpu_load_head");
    if (part == ATTN_HEAD_OUT)
        gather_head(&ctx, src, out_offset, s, b, 0, h, dst);
    else
        gather_head(&ctx, src, qkv_part, s, b, (int)part, h, dst);
}

float attn_cpu_forward_numerators_row(AttnMode mode, AttnShape s, const float* Q, const float* K, int i, float* S,
                                      float* e, float* l) {
    ModeCtx ctx = make_ctx(mode, (AttnOptions){0}, ATTN_IO_FP32, s, "attn_cpu_forward_numerators_row");
    score_row(&ctx, Q, K, i, S);
    return forward_numerators(&ctx, S, i + 1, e, l);
}

void attn_cpu_backward_probs_row(AttnMode mode, AttnShape s, const float* Q, const float* K, const float* stats,
                                 int b, int h, int i, float* S, float* P) {
    ModeCtx ctx = make_ctx(mode, (AttnOptions){0}, ATTN_IO_FP32, s, "attn_cpu_backward_probs_row");
    score_row(&ctx, Q, K, i, S);
    backward_probs(&ctx, S, i + 1, stats + stats_row(s, b, h, i), P);
}

float attn_cpu_pivoted_D_minus_c(const float* P, const float* dP, float c, int n) {
    return pivoted_D_minus_c(P, dP, c, n);
}

float attn_cpu_dot(const float* a, const float* b, int n) { return dot_f32(a, b, n); }

void attn_cpu_axpy(float w, const float* x, float* y, int n) { axpy_f32(w, x, y, n); }
