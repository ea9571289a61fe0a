/*
 * attention/support/attn_metrics.h - error metrics of attention outputs against the
 * fp64 reference, shared by the CPU tests, the GPU tests and the probe.
 *
 * Why: "median dQ error 219% -> 0.34%" is only comparable across programs if
 * they all measure the same way. The metric of docs/attention_numerics.md is
 * per (batch, head) the relative Frobenius error ||X - X_ref||_F / ||X_ref||_F
 * of each of O, dQ, dK, dV (the test outputs as float, already BF16 where the
 * mode returns BF16; the reference in double on the same inputs), summarised
 * by median and max over the B*NH heads; plus the symmetry identities
 * ||sum_j dK_j|| / ||dK|| per head and the row residual of dS, and counts of
 * NaN/Inf.
 *
 * Conventions: a NaN error counts as +Inf in medians and maxima (a broken
 * head is never hidden). A head whose reference tensor is exactly zero (the
 * extreme case has dQ = dK = 0 exactly) has no relative error; its entry is
 * the absolute ||X||_F instead, and zero_ref_heads counts such heads.
 *
 * Offers: attn_errors_compute (everything at once), attn_rel_errors_per_head,
 * attn_dk_sum_residuals, attn_err_stat_of, attn_errors_print_header/_row,
 * and float <-> double copies of the layouts.
 */
#ifndef ATTENTION_ATTN_METRICS_H
#define ATTENTION_ATTN_METRICS_H

#include <stddef.h>
#include <stdio.h>
#include "attention/attention.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { ATTN_T_O = 0, ATTN_T_DQ = 1, ATTN_T_DK = 2, ATTN_T_DV = 3, ATTN_NUM_TENSORS = 4 } AttnTensor;
/* "O", "dQ", "dK", "dV" */
const char* attn_tensor_name(AttnTensor t);

typedef struct {
    double median;
    double max;
    int count;          /* number of values summarised */
    int zero_ref_heads; /* heads whose reference was exactly zero (absolute entries) */
} AttnErrStat;

/* One tensor over all heads together: ||X - X_ref||_F and ||X_ref||_F summed over every (b, h), so a head
   with a large gradient weighs more than one whose exact gradient is near zero (a near-one-hot softmax),
   where a per-head relative error can be huge and matter little. rel = err_norm / ref_norm (the absolute
   err_norm when ref_norm is 0). */
typedef struct {
    double err_norm;
    double ref_norm;
    double rel;
} AttnWholeErr;

typedef struct {
    AttnErrStat err[ATTN_NUM_TENSORS]; /* relative Frobenius error per (b, h) */
    AttnWholeErr whole[ATTN_NUM_TENSORS]; /* the same over all heads together */
    AttnErrStat dk_sum;                /* ||sum_j dK_j|| / ||dK|| per (b, h), test output */
    AttnErrStat dk_sum_ref;            /* the same for the fp64 reference (~1e-16) */
    AttnErrStat row_residual;          /* per row |sum_j dS'_ij| / sum_j |dS'_ij| (if given) */
    long nonfinite[ATTN_NUM_TENSORS];  /* NaN/Inf elements in the test output */
    int has_backward;
    int has_row_residual;
} AttnErrors;

/* Summary of n values (NaN counted as +Inf): median and max. */
AttnErrStat attn_err_stat_of(const double* values, int n);

/* Per (b, h) relative Frobenius error of one tensor into per_head [B*NH]
   (index b*NH + h). x is out-layout for ATTN_T_O, qkv-layout otherwise; ref
   likewise in double. Returns the number of zero-reference heads. */
int attn_rel_errors_per_head(AttnShape s, AttnTensor t, const float* x, const double* ref, double* per_head);
/* The all-heads norms of one tensor (see AttnWholeErr). */
AttnWholeErr attn_whole_error(AttnShape s, AttnTensor t, const float* x, const double* ref);

/* Per (b, h) ||sum_j dK_j||_2 / ||dK||_F into per_head [B*NH] (0 if dK = 0).
   dqkv is float (test) or, with the _ref variant, double. */
void attn_dk_sum_residuals(AttnShape s, const float* dqkv, double* per_head);
void attn_dk_sum_residuals_ref(AttnShape s, const double* dqkv, double* per_head);

/* All metrics. out/out_ref are required; dqkv/dqkv_ref may be NULL (forward
   only); row_residual [B, NH, T] may be NULL (from attention_backward_cpu_diag
   or a kernel that exposes it). */
void attn_errors_compute(AttnShape s, const float* out, const double* out_ref, const float* dqkv,
                         const double* dqkv_ref, const float* row_residual, AttnErrors* e);

/* One table: header, then one row per (label, errors): medians and maxima in
   percent, the dK-sum identity, NaN/Inf counts. */
void attn_errors_print_header(FILE* f);
void attn_errors_print_row(FILE* f, const char* label, const AttnErrors* e);

/* Copies between float and double buffers of n elements. */
void attn_float_to_double(const float* x, double* y, size_t n);
void attn_double_to_float(const double* x, float* y, size_t n);
/* A freshly allocated double copy (free with free()). */
double* attn_double_copy(const float* x, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* ATTENTION_ATTN_METRICS_H */
