/*
 * attention/support/attn_metrics.c - the error metrics declared in attn_metrics.h:
 * per-head relative Frobenius errors, the sum_j dK_j identity, dS row
 * residuals, NaN/Inf counts and the table printer.
 *
 * Norms are accumulated in double whatever the input precision, so the metric
 * itself adds nothing visible to the errors it measures.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "attention/support/attn_metrics.h"
#include "common/utils.h"

static const char* const k_tensor_names[ATTN_NUM_TENSORS] = {"O", "dQ", "dK", "dV"};

const char* attn_tensor_name(AttnTensor t) {
    if ((int)t < 0 || t >= ATTN_NUM_TENSORS) return "invalid";
    return k_tensor_names[t];
}

static int cmp_double(const void* a, const void* b) {
    double x = *(const double*)a, y = *(const double*)b;
    return (x > y) - (x < y);
}

AttnErrStat attn_err_stat_of(const double* values, int n) {
    AttnErrStat st;
    memset(&st, 0, sizeof st);
    st.count = n;
    if (n <= 0) return st;
    double* v = (double*)mallocCheck(sizeof(double) * (size_t)n);
    for (int i = 0; i < n; i++) v[i] = isnan(values[i]) ? INFINITY : values[i];
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    st.median = (n % 2) ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    st.max = v[n - 1];
    free(v);
    return st;
}

/* Offset of element (b, t, h, 0) of a tensor: out layout for O, the q/k/v
   part of the qkv layout for the gradients. */
static size_t tensor_offset(AttnShape s, AttnTensor t, int b, int tok, int h) {
    if (t == ATTN_T_O) return (((size_t)b * s.T + tok) * s.NH + h) * s.HS;
    int part = (int)t - (int)ATTN_T_DQ;
    return ((((size_t)b * s.T + tok) * 3 + part) * s.NH + h) * s.HS;
}

/* One pass over a tensor: per (b, h) the relative Frobenius error into per_head (may be NULL) and the
   all-heads norms into whole (may be NULL). Returns the number of zero-reference heads. */
static int head_errors(AttnShape s, AttnTensor t, const float* x, const double* ref, double* per_head,
                       AttnWholeErr* whole) {
    int zero_ref = 0;
    double diff2_all = 0, ref2_all = 0;
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.NH; h++) {
            double diff2 = 0, ref2 = 0, x2 = 0;
            for (int tok = 0; tok < s.T; tok++) {
                size_t off = tensor_offset(s, t, b, tok, h);
                for (int d = 0; d < s.HS; d++) {
                    double xv = (double)x[off + d], rv = ref[off + d];
                    diff2 += (xv - rv) * (xv - rv);
                    ref2 += rv * rv;
                    x2 += xv * xv;
                }
            }
            diff2_all += diff2;
            ref2_all += ref2;
            double e;
            if (ref2 > 0) {
                e = sqrt(diff2) / sqrt(ref2);
            } else {
                e = sqrt(x2); /* absolute: there is nothing to be relative to */
                zero_ref++;
            }
            if (per_head) per_head[b * s.NH + h] = e;
        }
    }
    if (whole) {
        whole->err_norm = sqrt(diff2_all);
        whole->ref_norm = sqrt(ref2_all);
        whole->rel = ref2_all > 0 ? whole->err_norm / whole->ref_norm : whole->err_norm;
    }
    return zero_ref;
}

int attn_rel_errors_per_head(AttnShape s, AttnTensor t, const float* x, const double* ref, double* per_head) {
    return head_errors(s, t, x, ref, per_head, NULL);
}

AttnWholeErr attn_whole_error(AttnShape s, AttnTensor t, const float* x, const double* ref) {
    AttnWholeErr w;
    head_errors(s, t, x, ref, NULL, &w);
    return w;
}

/* Shared body of the float and double dK-sum residuals. */
#define DK_SUM_BODY(TYPE)                                                          \
    double* colsum = (double*)callocCheck((size_t)s.HS, sizeof(double));          \
    for (int b = 0; b < s.B; b++) {                                                \
        for (int h = 0; h < s.NH; h++) {                                           \
            memset(colsum, 0, sizeof(double) * (size_t)s.HS);                     \
            double norm2 = 0;                                                      \
            for (int tok = 0; tok < s.T; tok++) {                                  \
                const TYPE* dk = dqkv + tensor_offset(s, ATTN_T_DK, b, tok, h);   \
                for (int d = 0; d < s.HS; d++) {                                   \
                    colsum[d] += (double)dk[d];                                    \
                    norm2 += (double)dk[d] * (double)dk[d];                        \
                }                                                                  \
            }                                                                      \
            double sum2 = 0;                                                       \
            for (int d = 0; d < s.HS; d++) sum2 += colsum[d] * colsum[d];          \
            per_head[b * s.NH + h] = norm2 > 0 ? sqrt(sum2) / sqrt(norm2) : (sum2 > 0 ? INFINITY : 0.0); \
        }                                                                          \
    }                                                                              \
    free(colsum);

void attn_dk_sum_residuals(AttnShape s, const float* dqkv, double* per_head) { DK_SUM_BODY(float) }
void attn_dk_sum_residuals_ref(AttnShape s, const double* dqkv, double* per_head) { DK_SUM_BODY(double) }

static long count_nonfinite(AttnShape s, AttnTensor t, const float* x) {
    long n = 0;
    for (int b = 0; b < s.B; b++)
        for (int tok = 0; tok < s.T; tok++)
            for (int h = 0; h < s.NH; h++) {
                const float* p = x + tensor_offset(s, t, b, tok, h);
                for (int d = 0; d < s.HS; d++) n += !isfinite(p[d]);
            }
    return n;
}

void attn_errors_compute(AttnShape s, const float* out, const double* out_ref, const float* dqkv,
                         const double* dqkv_ref, const float* row_residual, AttnErrors* e) {
    attn_shape_check(s, "attn_errors_compute");
    memset(e, 0, sizeof *e);
    int nheads = s.B * s.NH;
    double* per_head = (double*)mallocCheck(sizeof(double) * (size_t)nheads);
    for (int t = 0; t < ATTN_NUM_TENSORS; t++) {
        const float* x = (t == ATTN_T_O) ? out : dqkv;
        const double* ref = (t == ATTN_T_O) ? out_ref : dqkv_ref;
        if (x == NULL || ref == NULL) continue;
        int zero_ref = head_errors(s, (AttnTensor)t, x, ref, per_head, &e->whole[t]);
        e->err[t] = attn_err_stat_of(per_head, nheads);
        e->err[t].zero_ref_heads = zero_ref;
        e->nonfinite[t] = count_nonfinite(s, (AttnTensor)t, x);
    }
    if (dqkv != NULL && dqkv_ref != NULL) {
        e->has_backward = 1;
        attn_dk_sum_residuals(s, dqkv, per_head);
        e->dk_sum = attn_err_stat_of(per_head, nheads);
        attn_dk_sum_residuals_ref(s, dqkv_ref, per_head);
        e->dk_sum_ref = attn_err_stat_of(per_head, nheads);
    }
    if (row_residual != NULL) {
        e->has_row_residual = 1;
        size_t nrows = (size_t)nheads * s.T;
        double* r = (double*)mallocCheck(sizeof(double) * nrows);
        for (size_t i = 0; i < nrows; i++) r[i] = fabs((double)row_residual[i]);
        e->row_residual = attn_err_stat_of(r, (int)nrows);
        free(r);
    }
    free(per_head);
}

void attn_errors_print_header(FILE* f) {
    fprintf(f, "%-22s %17s %17s %17s %17s %19s %12s %s\n", "case / mode", "O med/max %", "dQ med/max %",
            "dK med/max %", "dV med/max %", "|sum dK|/|dK| med", "dS row res", "NaN/Inf");
}

/* "  0.213/  0.301" (percent); an absolute entry (zero reference) gets a '*'. */
static void print_pair(FILE* f, const AttnErrStat* st) {
    char buf[64];
    snprintf(buf, sizeof buf, "%7.3g/%7.3g%s", 100.0 * st->median, 100.0 * st->max, st->zero_ref_heads ? "*" : " ");
    fprintf(f, " %17s", buf);
}

void attn_errors_print_row(FILE* f, const char* label, const AttnErrors* e) {
    fprintf(f, "%-22s", label);
    for (int t = 0; t < ATTN_NUM_TENSORS; t++) {
        if (t != ATTN_T_O && !e->has_backward) fprintf(f, " %17s", "-");
        else print_pair(f, &e->err[t]);
    }
    if (e->has_backward) fprintf(f, " %19.3e", e->dk_sum.median);
    else fprintf(f, " %19s", "-");
    if (e->has_row_residual) fprintf(f, " %12.3e", e->row_residual.median);
    else fprintf(f, " %12s", "-");
    long nonfinite = 0;
    for (int t = 0; t < ATTN_NUM_TENSORS; t++) nonfinite += e->nonfinite[t];
    fprintf(f, " %ld\n", nonfinite);
}

void attn_float_to_double(const float* x, double* y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = (double)x[i];
}

void attn_double_to_float(const double* x, float* y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = (float)x[i];
}

double* attn_double_copy(const float* x, size_t n) {
    double* y = (double*)mallocCheck(sizeof(double) * (n ? n : 1));
    attn_float_to_double(x, y, n);
    return y;
}
