/*
 * dev/gproj_variants.c - the emulation of the cheaper gproj variants declared
 * in dev/gproj_variants.h (the engine of the study tool
 * dev/gproj_variants_main.c and of tests/test_gproj_variants.c).
 *
 * Why: see the header. In short: which cheaper formulation of the gproj
 * backward keeps gproj's accuracy, measured with the rounding points a GPU
 * kernel for it would have, before any CUDA is written.
 *
 * How: per (b, h), one row loop computes what every variant shares (the
 * backward's P from repair's stats, bf(P), dP, the three D values and the
 * three bf(dS) rows) with the emulation's own building blocks
 * (attention/cpu/attention_cpu_rows.h), then feeds each variant's fp32
 * accumulators in the same order as attention_backward_cpu, so that the
 * engine's "repair" and "gproj" rows equal the library's bit for bit (the test
 * checks it); the other variants differ from those only where they must.
 * Post-passes (uniform corrections, deferred dK) run after the row loop, on
 * the fp32 accumulators, as a separate kernel would.
 * Compiled with the emulation's flags (-ffp-contract=off: no fused
 * multiply-add the contract does not name; see dev/module.mk).
 */
#include <math.h>
#include <string.h>
#include "attention/cpu/attention_cpu_rows.h"
#include "attention/support/attn_cases.h"
#include "common/utils.h"
#include "dev/gproj_variants.h"

const GvVariant gv_variants[GV_NUM_VARIANTS] = {
    [GV_REPAIR] = {"repair", GV_D_STORED_O, GV_DQ_NONE, GV_DK_NONE,
                   "no extra GEMM (repair's softmax): 5 bwd GEMMs", "none"},
    [GV_GPROJ] = {"gproj", GV_D_STORED_O, GV_DQ_PWEIGHTED, GV_DK_PWEIGHTED,
                  "row pre-pass (S, dP: 2 GEMMs) + 2 GEMMs in the main kernel (bf(-lambda P)^T Q, bf(P) K): 9 bwd GEMMs",
                  "none"},
    [GV_A_PDQ] = {"a:pdq", GV_D_STORED_O, GV_DQ_PWEIGHTED, GV_DK_NONE,
                  "+1 GEMM bf(P) K into a 2nd fp32 dQ accumulator (dQ atomics x2), r_i, p_i atomics; "
                  "lambda applied in the dQ post-process: 6 bwd GEMMs",
                  "none"},
    [GV_B_PDQ_D32] = {"b:pdq+D32", GV_D_FP32, GV_DQ_PWEIGHTED, GV_DK_NONE,
                      "(a) + FP32 D, i.e. the row pre-pass (2 GEMMs): 8 bwd GEMMs", "none"},
    [GV_B_PDQ_DRES] = {"b':pdq+Dres", GV_D_O_RESIDUAL, GV_DQ_PWEIGHTED, GV_DK_NONE,
                       "(a) + the forward writes O_lo, the D prep kernel reads it: 6 bwd GEMMs", "O_lo [B,T,NH,HS] BF16 (1x O)"},
    [GV_C_UNIF_D32] = {"c:unif+D32", GV_D_FP32, GV_DQ_UNIFORM, GV_DK_UNIFORM,
                       "r_i atomics, two O(T d) post-passes (prefix / suffix sums), fp32 dK workspace; "
                       "FP32 D = the row pre-pass (2 GEMMs): 7 bwd GEMMs",
                       "none"},
    [GV_C_UNIF] = {"c':unif", GV_D_STORED_O, GV_DQ_UNIFORM, GV_DK_UNIFORM,
                   "r_i atomics, two O(T d) post-passes, fp32 dK workspace: 5 bwd GEMMs", "none"},
    [GV_D_DEFER] = {"d:deferred", GV_D_STORED_O, GV_DQ_PWEIGHTED, GV_DK_DEFERRED,
                    "(a) + key-major post-pass recomputing S (1 GEMM) and adding bf(-lambda P)^T Q (1 GEMM) "
                    "to an fp32 dK workspace: 8 bwd GEMMs",
                    "none"},
    [GV_D_DEFER_BF16] = {"d':deferred/bf16", GV_D_STORED_O, GV_DQ_PWEIGHTED, GV_DK_DEFERRED_ON_BF16,
                         "as (d), the post-pass adds to the BF16 dK (no fp32 dK workspace): 8 bwd GEMMs", "none"},
    [GV_E_PDQ_UDK] = {"e1:pdq+udk", GV_D_STORED_O, GV_DQ_PWEIGHTED, GV_DK_UNIFORM,
                      "(a) + suffix-sum post-pass on an fp32 dK workspace: 6 bwd GEMMs", "none"},
    [GV_E_PDQ_DRES_UDK] = {"e2:pdq+Dres+udk", GV_D_O_RESIDUAL, GV_DQ_PWEIGHTED, GV_DK_UNIFORM,
                           "(e1) + the forward writes O_lo, the D prep kernel reads it: 6 bwd GEMMs", "O_lo [B,T,NH,HS] BF16 (1x O)"},
    [GV_E_FPK_DRES_UDK] = {"e3:fpk+Dres+udk", GV_D_O_RESIDUAL, GV_DQ_FORWARD_PK, GV_DK_UNIFORM,
                           "fwd +1 GEMM bf(e) K (K tile already in smem) + row sum of bf(e); bwd: r_i atomics, "
                           "two O(T d) post-passes, fp32 dK workspace: 5 bwd GEMMs",
                           "PK [B,NH,T,HS] fp32 (2x O) + O_lo BF16 (1x O)"},
    [GV_E_FPKB_DRES_UDK] = {"e4:fpkb+Dres+udk", GV_D_O_RESIDUAL, GV_DQ_FORWARD_PK_BF16, GV_DK_UNIFORM,
                            "as (e3) + a prefix-sum pass over K before the forward (O(T d)): 5 bwd GEMMs",
                            "bf(PK - prefix mean K) [B,NH,T,HS] BF16 (1x O) + O_lo BF16 (1x O)"},
    [GV_E_PDQ_D32F_UDK] = {"e5:pdq+D32f+udk", GV_D_FP32P_FORWARD, GV_DQ_PWEIGHTED, GV_DK_UNIFORM,
                           "(e2) + fwd P V on hi + lo parts of e (+1 fwd GEMM): 6 bwd GEMMs, 3 fwd",
                           "O_lo BF16 (1x O)"},
    [GV_E_PDQ_DSUM_UDK] = {"e6:pdq+Dsum+udk", GV_D_SUMBE_FORWARD, GV_DQ_PWEIGHTED, GV_DK_UNIFORM,
                           "(e2) + the forward sums bf(e) per row and divides by it instead of l: 6 bwd GEMMs",
                           "O_lo BF16 (1x O)"},
    [GV_E_PDQ_DSUMO_UDK] = {"e7:pdq+DsumO+udk", GV_D_SUMBE_NO_LO, GV_DQ_PWEIGHTED, GV_DK_UNIFORM,
                            "(e6) without O_lo: 6 bwd GEMMs", "none"},
    [GV_E_PDQ_DSUM] = {"e6':pdq+Dsum", GV_D_SUMBE_FORWARD, GV_DQ_PWEIGHTED, GV_DK_NONE,
                       "(e6) with dK rounded in the main kernel (no fp32 dK workspace, no suffix-sum pass): "
                       "6 bwd GEMMs",
                       "O_lo BF16 (1x O)"},
    [GV_F_FPKB_DSUM_UDK] = {"f1:fpkb+Dsum+udk", GV_D_SUMBE_FORWARD, GV_DQ_FORWARD_PK_BF16, GV_DK_UNIFORM,
                            "fwd +1 GEMM bf(e) K (K tile already in smem), sums bf(e) and divides by it, a "
                            "prefix-sum pass over K; bwd: bf16 mode's 5 GEMMs, r_i sums, r_i PK_i in the dQ "
                            "post-pass, suffix-sum pass on an fp32 dK workspace",
                            "bf(PK - prefix mean K) + O_lo, BF16 (2x O)"},
    [GV_F_FPKI_DSUM_UDK] = {"f2:fpki+Dsum+udk", GV_D_SUMBE_FORWARD, GV_DQ_FORWARD_PK_OWNKEY, GV_DK_UNIFORM,
                            "(f1) with the key mean saved relative to K_i (no prefix-sum pass): 5 bwd GEMMs, 3 fwd",
                            "bf(PK - K_i) + O_lo, BF16 (2x O)"},
    [GV_F_FPKI_DSUM] = {"f3:fpki+Dsum", GV_D_SUMBE_FORWARD, GV_DQ_FORWARD_PK_OWNKEY, GV_DK_NONE,
                        "(f2) without the dK post-pass: bf16 mode's backward + r_i sums, D from O + O_lo, "
                        "r_i PK_i in the dQ post-pass: 5 bwd GEMMs, 3 fwd",
                        "bf(PK - K_i) + O_lo, BF16 (2x O)"},
    [GV_F_FPKI_DSUM8] = {"f4:fpki+Dsum8", GV_D_SUMBE_LO8, GV_DQ_FORWARD_PK_OWNKEY, GV_DK_NONE,
                         "(f3) with O_lo saved in 8 bits: 5 bwd GEMMs, 3 fwd",
                         "bf(PK - K_i) BF16 (1x O) + O_lo int8 (0.5x O)"},
};

/* Largest head size the row scratch of the engine takes (the module runs 64 and 128). */
#define GV_MAX_HS 1024

static size_t qkv_at(AttnShape s, int b, int t, int part, int h) {
    return ((((size_t)b * s.T + t) * 3 + part) * s.NH + h) * s.HS;
}

/* O_lo = x - hi (hi = bf(x)) as an int8 count of 1/256 of hi's BF16 ulp, decoded back to fp32: |x - hi| is
   at most half an ulp, so the count lies in [-128, 128] and is clamped to int8. 0 when hi is 0 or not finite. */
static float residual_int8(float x, float hi) {
    if (hi == 0.0f || !isfinite(hi)) return 0.0f;
    int ex;
    frexpf(hi, &ex);                       /* |hi| in [2^(ex-1), 2^ex): BF16 ulp 2^(ex-8) */
    const float unit = ldexpf(1.0f, ex - 16); /* 1/256 of the ulp */
    float q = rintf((x - hi) / unit);
    q = q > 127.0f ? 127.0f : (q < -128.0f ? -128.0f : q);
    return q * unit;
}

/* One variant's fp32 accumulators for one head. */
typedef struct {
    float* dK;       /* [T, HS] sum_i bf(dS') Q_i (plus gproj's inline correction) */
    float* dK_corr;  /* [T, HS] deferred correction sum_i bf(-lambda P) Q_i (deferred only) */
    float* acc_dq;   /* [HS] */
    float* r;        /* [T] row sums r_i = sum_j bf(dS_ij) (uniform dK post-pass) */
} VariantAcc;

void gv_backward_variants(AttnShape s, const float* qkv, const float* dout, float* const dqkv[GV_NUM_VARIANTS],
                          float* const row_residual[GV_NUM_VARIANTS], float* const out_v[GV_NUM_VARIANTS]) {
    attn_shape_check(s, "gv_backward_variants");
    if (s.HS > GV_MAX_HS)
        die("gv_backward_variants: head size %d over %d\n  hint: the module runs head sizes 64 and 128", s.HS,
            GV_MAX_HS);
    const AttnOptions no_opts = {0};
    const int T = s.T, HS = s.HS;
    const float scale = attn_softmax_scale(HS);
    /* the repair forward: stored BF16 O and stats {m, l}; and its fp32 O (the
       inputs are BF16-representable, so ATTN_IO_FP32 only skips the output
       rounding) for the residual O_lo = bf(O_f32 - bf(O_f32)) */
    size_t nout = attn_out_count(s);
    float* out = (float*)mallocCheck(sizeof(float) * nout);
    float* out_f32 = (float*)mallocCheck(sizeof(float) * nout);
    float* out_lo = (float*)mallocCheck(sizeof(float) * nout);
    float* stats = (float*)mallocCheck(sizeof(float) * attn_stats_count(s));
    /* an fp32-P forward (fp32 mode's: same exponent and stats {m, l} as repair,
       O = sum_j e_j V_j / l with fp32 e): its O and O_lo for variant (e5) */
    float* outp = (float*)mallocCheck(sizeof(float) * nout);
    float* outp_lo = (float*)mallocCheck(sizeof(float) * nout);
    attention_forward_cpu(ATTN_FP32, no_opts, ATTN_IO_FP32, s, qkv, outp, stats);
    for (size_t k = 0; k < nout; k++) {
        float hi = bf16_round(outp[k]);
        outp_lo[k] = bf16_round(outp[k] - hi);
        outp[k] = hi;
    }
    attention_forward_cpu(ATTN_REPAIR, no_opts, ATTN_IO_FP32, s, qkv, out_f32, stats);
    attention_forward_cpu(ATTN_REPAIR, no_opts, ATTN_IO_BF16, s, qkv, out, stats);
    for (size_t k = 0; k < nout; k++) {
        if (bf16_round(out_f32[k]) != out[k] && !(isnan(out[k]) && isnan(out_f32[k])))
            die("gv_backward_variants: the BF16 forward's O is not bf(fp32 forward's O) at element %zu\n"
                "  hint: the inputs must be BF16-representable (attn_case_fill makes them so)", k);
        out_lo[k] = bf16_round(out_f32[k] - out[k]);
    }

#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.NH; h++) {
            size_t head = (size_t)T * HS;
            float* Q = (float*)mallocCheck(sizeof(float) * head);
            float* K = (float*)mallocCheck(sizeof(float) * head);
            float* V = (float*)mallocCheck(sizeof(float) * head);
            float* O = (float*)mallocCheck(sizeof(float) * head);
            float* Olo = (float*)mallocCheck(sizeof(float) * head);
            float* Op = (float*)mallocCheck(sizeof(float) * head);
            float* Oplo = (float*)mallocCheck(sizeof(float) * head);
            float* Osum = (float*)mallocCheck(sizeof(float) * (size_t)HS); /* row i, sum-bf(e) forward, fp32 */
            float* dO = (float*)mallocCheck(sizeof(float) * head);
            float* dV = (float*)callocCheck(head, sizeof(float));
            float* S = (float*)mallocCheck(sizeof(float) * (size_t)T);
            float* P = (float*)mallocCheck(sizeof(float) * (size_t)T);
            float* Pb = (float*)mallocCheck(sizeof(float) * (size_t)T);
            float* e = (float*)mallocCheck(sizeof(float) * (size_t)T);
            float* dP = (float*)mallocCheck(sizeof(float) * (size_t)T);
            float* dS[GV_NUM_D];
            for (int k = 0; k < GV_NUM_D; k++) dS[k] = (float*)mallocCheck(sizeof(float) * (size_t)T);
            float* acc_pk = (float*)mallocCheck(sizeof(float) * (size_t)HS);  /* sum_j bf(P_ij) K_j */
            float* fwd_pk = (float*)mallocCheck(sizeof(float) * (size_t)HS);  /* forward's weighted key mean */
            float* fwd_pk_bf = (float*)mallocCheck(sizeof(float) * (size_t)HS); /* as saved in BF16 */
            float* fwd_pk_own = (float*)mallocCheck(sizeof(float) * (size_t)HS); /* saved relative to K_i */
            float* sum_k = (float*)callocCheck((size_t)HS, sizeof(float));    /* prefix sum of K */
            float* suffix = (float*)mallocCheck(sizeof(float) * (size_t)HS);
            VariantAcc acc[GV_NUM_VARIANTS];
            for (int v = 0; v < GV_NUM_VARIANTS; v++) {
                acc[v].dK = (float*)callocCheck(head, sizeof(float));
                acc[v].dK_corr = (float*)callocCheck(head, sizeof(float));
                acc[v].acc_dq = (float*)mallocCheck(sizeof(float) * (size_t)HS);
                acc[v].r = (float*)mallocCheck(sizeof(float) * (size_t)T);
            }
            attn_cpu_load_head(ATTN_IO_BF16, s, qkv, ATTN_HEAD_Q, b, h, Q);
            attn_cpu_load_head(ATTN_IO_BF16, s, qkv, ATTN_HEAD_K, b, h, K);
            attn_cpu_load_head(ATTN_IO_BF16, s, qkv, ATTN_HEAD_V, b, h, V);
            attn_cpu_load_head(ATTN_IO_BF16, s, out, ATTN_HEAD_OUT, b, h, O);
            attn_cpu_load_head(ATTN_IO_FP32, s, out_lo, ATTN_HEAD_OUT, b, h, Olo);
            attn_cpu_load_head(ATTN_IO_FP32, s, outp, ATTN_HEAD_OUT, b, h, Op);
            attn_cpu_load_head(ATTN_IO_FP32, s, outp_lo, ATTN_HEAD_OUT, b, h, Oplo);
            attn_cpu_load_head(ATTN_IO_BF16, s, dout, ATTN_HEAD_OUT, b, h, dO);

            for (int i = 0; i < T; i++) {
                const int n = i + 1;
                const float* Qi = Q + (size_t)i * HS;
                const float* dOi = dO + (size_t)i * HS;
                /* forward quantities of row i (they depend on Q, K, V only): the forward's weighted
                   key mean sum_j bf(e_j) K_j / sum_j bf(e_j) (forward-PK, saved in fp32 by the
                   forward), and the O of a forward normalising by sum_j bf(e_j) */
                float l_unused, sum_be = 0.0f;
                attn_cpu_forward_numerators_row(ATTN_REPAIR, s, Q, K, i, S, e, &l_unused);
                memset(fwd_pk, 0, sizeof(float) * (size_t)HS);
                memset(Osum, 0, sizeof(float) * (size_t)HS);
                for (int j = 0; j < n; j++) {
                    float be = bf16_round(e[j]);
                    sum_be += be;
                    attn_cpu_axpy(be, K + (size_t)j * HS, fwd_pk, HS);
                    attn_cpu_axpy(be, V + (size_t)j * HS, Osum, HS);
                }
                for (int d = 0; d < HS; d++) {
                    fwd_pk[d] /= sum_be;
                    Osum[d] /= sum_be;
                }
                attn_cpu_backward_probs_row(ATTN_REPAIR, s, Q, K, stats, b, h, i, S, P);
                for (int j = 0; j < n; j++) {
                    dP[j] = attn_cpu_dot(dOi, V + (size_t)j * HS, HS);
                    Pb[j] = bf16_round(P[j]);
                }
                /* the three D values, each giving its own bf(dS) row */
                const float c = attn_cpu_dot(dOi, O + (size_t)i * HS, HS); /* stored BF16 O */
                const float D_minus_c = attn_cpu_pivoted_D_minus_c(P, dP, c, n);
                const float D_res = c + attn_cpu_dot(dOi, Olo + (size_t)i * HS, HS);
                const float D_res_p = attn_cpu_dot(dOi, Op + (size_t)i * HS, HS) +
                                      attn_cpu_dot(dOi, Oplo + (size_t)i * HS, HS);
                float D_res_sum = 0.0f; /* dO . O + dO . O_lo of the sum-bf(e) forward, as two dots */
                float D_sum_hi = 0.0f;  /* dO . O of that forward's BF16 O alone */
                float D_res_sum8 = 0.0f; /* dO . O + dO . O_lo with O_lo in 8 bits */
                {
                    float hi[GV_MAX_HS], lo[GV_MAX_HS], lo8[GV_MAX_HS];
                    for (int d = 0; d < HS; d++) {
                        hi[d] = bf16_round(Osum[d]);
                        lo[d] = bf16_round(Osum[d] - hi[d]);
                        lo8[d] = residual_int8(Osum[d], hi[d]);
                    }
                    D_sum_hi = attn_cpu_dot(dOi, hi, HS);
                    D_res_sum = D_sum_hi + attn_cpu_dot(dOi, lo, HS);
                    D_res_sum8 = D_sum_hi + attn_cpu_dot(dOi, lo8, HS);
                    for (int v = 0; v < GV_NUM_VARIANTS; v++) {
                        if (out_v == NULL || out_v[v] == NULL) continue;
                        const GvDSource src = gv_variants[v].D;
                        const float* o = (src == GV_D_SUMBE_FORWARD || src == GV_D_SUMBE_NO_LO ||
                                          src == GV_D_SUMBE_LO8) ? hi
                                         : src == GV_D_FP32P_FORWARD ? Op + (size_t)i * HS : O + (size_t)i * HS;
                        memcpy(out_v[v] + (((size_t)b * T + i) * s.NH + h) * HS, o, sizeof(float) * (size_t)HS);
                    }
                }
                for (int j = 0; j < n; j++) {
                    dS[GV_D_STORED_O][j] = bf16_round(P[j] * (dP[j] - c));
                    dS[GV_D_FP32][j] = bf16_round(P[j] * ((dP[j] - c) - D_minus_c));
                    dS[GV_D_O_RESIDUAL][j] = bf16_round(P[j] * (dP[j] - D_res));
                    dS[GV_D_FP32P_FORWARD][j] = bf16_round(P[j] * (dP[j] - D_res_p));
                    dS[GV_D_SUMBE_FORWARD][j] = bf16_round(P[j] * (dP[j] - D_res_sum));
                    dS[GV_D_SUMBE_NO_LO][j] = bf16_round(P[j] * (dP[j] - D_sum_hi));
                    dS[GV_D_SUMBE_LO8][j] = bf16_round(P[j] * (dP[j] - D_res_sum8));
                }
                float r[GV_NUM_D];
                float p = 0.0f;
                for (int k = 0; k < GV_NUM_D; k++) r[k] = 0.0f;
                for (int j = 0; j < n; j++) {
                    for (int k = 0; k < GV_NUM_D; k++) r[k] += dS[k][j];
                    p += Pb[j];
                }
                /* prefix mean of the keys (uniform dQ correction); the forward's key mean
                   as saved in BF16 relative to it (both sides recompute the same prefix mean) */
                attn_cpu_axpy(1.0f, K + (size_t)i * HS, sum_k, HS);
                for (int d = 0; d < HS; d++) {
                    float mean_k = sum_k[d] / (float)n;
                    fwd_pk_bf[d] = mean_k + bf16_round(fwd_pk[d] - mean_k);
                    float own_k = K[(size_t)i * HS + d];
                    fwd_pk_own[d] = own_k + bf16_round(fwd_pk[d] - own_k);
                }

                float lambda[GV_NUM_VARIANTS];
                double res_sum[GV_NUM_VARIANTS], res_abs[GV_NUM_VARIANTS];
                for (int v = 0; v < GV_NUM_VARIANTS; v++) {
                    const float rv = r[gv_variants[v].D];
                    lambda[v] = (p != 0.0f) ? rv / p : 0.0f;
                    acc[v].r[i] = rv;
                    memset(acc[v].acc_dq, 0, sizeof(float) * (size_t)HS);
                    res_sum[v] = res_abs[v] = 0.0;
                }
                memset(acc_pk, 0, sizeof(float) * (size_t)HS);
                /* the main kernel's accumulations, in attention_backward_cpu's order per accumulator */
                for (int j = 0; j < n; j++) {
                    const float* Kj = K + (size_t)j * HS;
                    attn_cpu_axpy(Pb[j], dOi, dV + (size_t)j * HS, HS);
                    attn_cpu_axpy(Pb[j], Kj, acc_pk, HS);
                    for (int v = 0; v < GV_NUM_VARIANTS; v++) {
                        const GvVariant* var = &gv_variants[v];
                        const float ds = dS[var->D][j];
                        float* dKj = acc[v].dK + (size_t)j * HS;
                        attn_cpu_axpy(ds, Kj, acc[v].acc_dq, HS);
                        attn_cpu_axpy(ds, Qi, dKj, HS);
                        if (var->dk == GV_DK_PWEIGHTED)
                            attn_cpu_axpy(bf16_round(-lambda[v] * P[j]), Qi, dKj, HS);
                        else if (var->dk == GV_DK_DEFERRED || var->dk == GV_DK_DEFERRED_ON_BF16)
                            attn_cpu_axpy(bf16_round(-lambda[v] * P[j]), Qi, acc[v].dK_corr + (size_t)j * HS, HS);
                        /* the effective dQ operand dS'_ij */
                        double eff = ds;
                        if (var->dq == GV_DQ_PWEIGHTED) eff -= (double)lambda[v] * Pb[j];
                        else if (var->dq == GV_DQ_UNIFORM) eff -= (double)acc[v].r[i] / n;
                        else if (var->dq == GV_DQ_FORWARD_PK || var->dq == GV_DQ_FORWARD_PK_BF16 ||
                                 var->dq == GV_DQ_FORWARD_PK_OWNKEY)
                            eff -= (double)acc[v].r[i] * bf16_round(e[j]) / sum_be;
                        res_sum[v] += eff;
                        res_abs[v] += fabs(eff);
                    }
                }
                /* dQ post-process: the correction on the fp32 accumulator, then s, then BF16 */
                for (int v = 0; v < GV_NUM_VARIANTS; v++) {
                    const GvVariant* var = &gv_variants[v];
                    float* dq = dqkv[v] + qkv_at(s, b, i, 0, h);
                    const float rv = acc[v].r[i];
                    for (int d = 0; d < HS; d++) {
                        float g = acc[v].acc_dq[d];
                        if (var->dq == GV_DQ_PWEIGHTED) g = g - lambda[v] * acc_pk[d];
                        else if (var->dq == GV_DQ_UNIFORM) g = g - rv * (sum_k[d] / (float)n);
                        else if (var->dq == GV_DQ_FORWARD_PK) g = g - rv * fwd_pk[d];
                        else if (var->dq == GV_DQ_FORWARD_PK_BF16) g = g - rv * fwd_pk_bf[d];
                        else if (var->dq == GV_DQ_FORWARD_PK_OWNKEY) g = g - rv * fwd_pk_own[d];
                        dq[d] = bf16_round(scale * g);
                    }
                    if (row_residual != NULL && row_residual[v] != NULL)
                        row_residual[v][((size_t)b * s.NH + h) * T + i] =
                            res_abs[v] > 0 ? (float)(fabs(res_sum[v]) / res_abs[v]) : 0.0f;
                }
            }
            /* dK: uniform post-pass (suffix sums of r_i / n_i Q_i), deferred post-pass, output rounding */
            for (int v = 0; v < GV_NUM_VARIANTS; v++) {
                const GvVariant* var = &gv_variants[v];
                memset(suffix, 0, sizeof(float) * (size_t)HS);
                for (int j = T - 1; j >= 0; j--) {
                    const float* dKj = acc[v].dK + (size_t)j * HS;
                    const float* corr = acc[v].dK_corr + (size_t)j * HS;
                    float* dk = dqkv[v] + qkv_at(s, b, j, 1, h);
                    float* dv = dqkv[v] + qkv_at(s, b, j, 2, h);
                    if (var->dk == GV_DK_UNIFORM)
                        attn_cpu_axpy(acc[v].r[j] / (float)(j + 1), Q + (size_t)j * HS, suffix, HS);
                    for (int d = 0; d < HS; d++) {
                        float g;
                        if (var->dk == GV_DK_UNIFORM) g = scale * (dKj[d] - suffix[d]);
                        else if (var->dk == GV_DK_DEFERRED) g = scale * dKj[d] + scale * corr[d];
                        else if (var->dk == GV_DK_DEFERRED_ON_BF16) g = bf16_round(scale * dKj[d]) + scale * corr[d];
                        else g = scale * dKj[d];
                        dk[d] = bf16_round(g);
                        dv[d] = bf16_round(dV[(size_t)j * HS + d]);
                    }
                }
            }
            for (int v = 0; v < GV_NUM_VARIANTS; v++) {
                free(acc[v].dK); free(acc[v].dK_corr); free(acc[v].acc_dq); free(acc[v].r);
            }
            for (int k = 0; k < GV_NUM_D; k++) free(dS[k]);
            free(Q); free(K); free(V); free(O); free(Olo); free(Op); free(Oplo); free(Osum); free(dO); free(dV);
            free(S); free(P); free(Pb); free(e); free(dP);
            free(acc_pk); free(fwd_pk); free(fwd_pk_bf); free(fwd_pk_own); free(sum_k); free(suffix);
        }
    }
    free(out); free(out_f32); free(out_lo); free(outp); free(outp_lo); free(stats);
}

/* V += rho_v * sqrt(HS) * u_h per head (u_h a random unit vector shared by the
   batch), rounded to BF16: a common value vector rho_v times the spread. */
void gv_add_value_offset(AttnShape s, float* qkv, double rho_v, uint64_t seed) {
    AttnRng rng;
    attn_rng_init(&rng, seed ^ 0x76616c75656f6666ull); /* "valueoff" */
    double* u = (double*)mallocCheck(sizeof(double) * (size_t)s.HS);
    for (int h = 0; h < s.NH; h++) {
        double norm2 = 0;
        for (int d = 0; d < s.HS; d++) {
            u[d] = attn_rng_normal(&rng);
            norm2 += u[d] * u[d];
        }
        double scale = rho_v * sqrt((double)s.HS) / sqrt(norm2);
        for (int b = 0; b < s.B; b++)
            for (int t = 0; t < s.T; t++) {
                float* v = qkv + ((((size_t)b * s.T + t) * 3 + 2) * s.NH + h) * s.HS;
                for (int d = 0; d < s.HS; d++) v[d] = bf16_round((float)((double)v[d] + scale * u[d]));
            }
    }
    free(u);
}
