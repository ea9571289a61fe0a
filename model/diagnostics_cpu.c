/*
 * model/diagnostics_cpu.c - the CPU side of the run diagnostics
 * (API and definitions: model/diagnostics.h; what the numbers mean and cost:
 * docs/diagnostics.md).
 *
 * Why it is written this way: these numbers are compared across attention
 * modes and against the GPU kernels of model/diagnostics.cuh, so every sum is
 * taken in double and every choice (which query rows, how the median of an
 * even count is formed, NaN handling) is written down once in the header and
 * followed by both sides. The key offset uses two passes (mean first, then the
 * spread around it): one pass with E[k^2] - E[k]^2 would cancel catastrophically
 * exactly when rho is large, which is the case that matters.
 */
#include "model/diagnostics.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/support/attn_capture.h"
#include "attention/support/attn_metrics.h"
#include "common/utils.h"

/* Max that keeps a NaN once it has seen one (fmax would drop it and hide a broken layer). */
static inline double nan_max(double m, double v) { return (v > m || isnan(v)) && !isnan(m) ? v : m; }

void diag_layers_clear(LayerDiag* per_layer, int L) {
    for (int l = 0; l < L; l++) {
        per_layer[l].rho_max = per_layer[l].rho_median = NAN;
        per_layer[l].q_absmax = per_layer[l].k_absmax = NAN;
        per_layer[l].logit_max = per_layer[l].entropy_mean = NAN;
        per_layer[l].grad_norm = NAN;
        per_layer[l].key_bias_norm = per_layer[l].key_bias_grad_norm = NAN;
    }
}

static int cmp_float_nan_last(const void* a, const void* b) {
    float x = *(const float*)a, y = *(const float*)b;
    if (isnan(x) || isnan(y)) return isnan(x) - isnan(y);
    return (x > y) - (x < y);
}

float diag_median(const float* values, int n) {
    if (n <= 0) die("diag_median: called with %d values (need at least 1)", n);
    float* v = (float*)mallocCheck((size_t)n * sizeof(float));
    memcpy(v, values, (size_t)n * sizeof(float));
    qsort(v, (size_t)n, sizeof(float), cmp_float_nan_last);
    float m = (n % 2) ? v[n / 2] : 0.5f * (v[n / 2 - 1] + v[n / 2]);
    free(v);
    return m;
}

/* Element (b, t, part, h, 0) of the qkv layout [B, T, 3, NH, HS]; part 0 q, 1 k, 2 v. */
static inline size_t qkv_at(int T, int NH, int HS, int b, int t, int part, int h) {
    return ((((size_t)b * T + t) * 3 + part) * NH + h) * HS;
}

void diag_key_rho_cpu(const float* qkv, int B, int T, int NH, int HS, double* rho_per_head) {
    const double N = (double)B * T;
#pragma omp parallel for schedule(static)
    for (int h = 0; h < NH; h++) {
        double* mean = (double*)callocCheck((size_t)HS, sizeof(double));
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                const float* k = qkv + qkv_at(T, NH, HS, b, t, 1, h);
                for (int d = 0; d < HS; d++) mean[d] += k[d];
            }
        double mean_norm2 = 0;
        for (int d = 0; d < HS; d++) {
            mean[d] /= N;
            mean_norm2 += mean[d] * mean[d];
        }
        double spread2 = 0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                const float* k = qkv + qkv_at(T, NH, HS, b, t, 1, h);
                for (int d = 0; d < HS; d++) spread2 += (k[d] - mean[d]) * (k[d] - mean[d]);
            }
        spread2 /= N;
        /* all keys equal: no spread; an offset with no spread is infinitely "far" */
        rho_per_head[h] = spread2 > 0 ? sqrt(mean_norm2) / sqrt(spread2) : (mean_norm2 > 0 ? INFINITY : 0.0);
        free(mean);
    }
}

void diag_attention_cpu(const float* qkv, int B, int T, int NH, int HS, int rows_per_head, LayerDiag* out) {
    attn_shape_check((AttnShape){B, NH, T, HS}, "diag_attention_cpu");
    /* key offset */
    double* rho = (double*)mallocCheck((size_t)NH * sizeof(double));
    diag_key_rho_cpu(qkv, B, T, NH, HS, rho);
    float* rho_f = (float*)mallocCheck((size_t)NH * sizeof(float));
    double rho_max = -INFINITY;
    for (int h = 0; h < NH; h++) {
        rho_f[h] = (float)rho[h];
        rho_max = nan_max(rho_max, rho[h]);
    }
    out->rho_max = (float)rho_max;
    out->rho_median = diag_median(rho_f, NH);
    free(rho);
    free(rho_f);

    /* largest |q| and |k| element */
    double q_max = 0, k_max = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const float* q = qkv + qkv_at(T, NH, HS, b, t, 0, h);
                const float* k = qkv + qkv_at(T, NH, HS, b, t, 1, h);
                for (int d = 0; d < HS; d++) {
                    q_max = nan_max(q_max, fabs((double)q[d]));
                    k_max = nan_max(k_max, fabs((double)k[d]));
                }
            }
    out->q_absmax = (float)q_max;
    out->k_absmax = (float)k_max;

    /* logits and entropy on the sampled rows, every visible key */
    const int R = diag_rows_used(rows_per_head, T);
    const double scale = (double)attn_softmax_scale(HS);
    const int pairs = B * NH;
    double* pair_logit_max = (double*)mallocCheck((size_t)pairs * sizeof(double));
    double* pair_entropy_sum = (double*)mallocCheck((size_t)pairs * sizeof(double));
#pragma omp parallel for schedule(dynamic, 1)
    for (int p = 0; p < pairs; p++) {
        const int b = p / NH, h = p % NH;
        double* logits = (double*)mallocCheck((size_t)T * sizeof(double));
        double lmax_all = -INFINITY, ent_sum = 0;
        for (int r = 0; r < R; r++) {
            const int t = diag_sample_row(r, rows_per_head, T);
            const float* q = qkv + qkv_at(T, NH, HS, b, t, 0, h);
            double m = -INFINITY;
            for (int j = 0; j <= t; j++) {
                const float* k = qkv + qkv_at(T, NH, HS, b, j, 1, h);
                double dot = 0;
                for (int d = 0; d < HS; d++) dot += (double)q[d] * (double)k[d];
                logits[j] = scale * dot;
                m = nan_max(m, logits[j]);
            }
            /* H = -sum p ln p with p = e/l, e = exp(x - m): H = ln l - sum(e (x - m)) / l */
            double l = 0, ex = 0;
            for (int j = 0; j <= t; j++) {
                double x = logits[j] - m;
                double e = exp(x);
                l += e;
                ex += e * x;
            }
            ent_sum += log(l) - ex / l;
            lmax_all = nan_max(lmax_all, m);
        }
        pair_logit_max[p] = lmax_all;
        pair_entropy_sum[p] = ent_sum;
        free(logits);
    }
    double lmax = -INFINITY, ent = 0;
    for (int p = 0; p < pairs; p++) {
        lmax = nan_max(lmax, pair_logit_max[p]);
        ent += pair_entropy_sum[p];
    }
    out->logit_max = (float)lmax;
    out->entropy_mean = (float)(ent / ((double)pairs * R));
    free(pair_logit_max);
    free(pair_entropy_sum);
}

static double sum_squares(const float* x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
    return s;
}

void diag_params_cpu(const GPTConfig* cfg, const ParamTensorInfo table[NUM_PARAM_TENSORS], const float* params,
                     const float* grads, LayerDiag* per_layer, double* global_grad_norm) {
    const int L = cfg->num_layers, C = cfg->channels;
    const ParamTensorInfo* qkvb = &table[P_QKVB];
#pragma omp parallel for schedule(static)
    for (int l = 0; l < L; l++) {
        /* the per-layer tensors: the id range P_LN1W..P_FCPROJB and the QK-norm gains (gpt_config.h;
           a tensor the config does not have has count 0) */
        if (grads != NULL) {
            double g2 = 0;
            for (int id = P_LN1W; id < NUM_PARAM_TENSORS; id++) {
                if (id > P_FCPROJB && id != P_QNORMW && id != P_KNORMW) continue;
                const size_t per_layer_count = table[id].count / (size_t)L;
                g2 += sum_squares(grads + table[id].offset + (size_t)l * per_layer_count, per_layer_count);
            }
            per_layer[l].grad_norm = (float)sqrt(g2);
        }
        if (qkvb->count == 0) { /* --bias 0: there is no key bias */
            per_layer[l].key_bias_norm = per_layer[l].key_bias_grad_norm = NAN;
            continue;
        }
        const size_t key_bias = qkvb->offset + (size_t)l * 3 * C + (size_t)C;
        per_layer[l].key_bias_norm = (float)sqrt(sum_squares(params + key_bias, (size_t)C));
        if (grads != NULL) per_layer[l].key_bias_grad_norm = (float)sqrt(sum_squares(grads + key_bias, (size_t)C));
    }
    if (global_grad_norm != NULL) {
        double g2 = 0;
        if (grads != NULL)
            for (int id = 0; id < NUM_PARAM_TENSORS; id++) g2 += sum_squares(grads + table[id].offset, table[id].count);
        *global_grad_norm = grads != NULL ? sqrt(g2) : NAN;
    }
}

void diag_zero_key_bias_grad_cpu(const GPTConfig* cfg, const ParamTensorInfo table[NUM_PARAM_TENSORS], float* grads) {
    const int L = cfg->num_layers, C = cfg->channels;
    if (table[P_QKVB].count == 0) die("--zero-key-bias-grad: the model has no key bias (--bias 0)");
    for (int l = 0; l < L; l++)
        memset(grads + table[P_QKVB].offset + (size_t)l * 3 * C + (size_t)C, 0, (size_t)C * sizeof(float));
}

/* ---- probe ---- */

void diag_probe_clear(DiagProbe* p) {
    memset(p, 0, sizeof *p);
    p->layer = -1;
    p->dq_err_median = p->dq_err_max = p->dk_err_median = p->dk_err_max = NAN;
}

void diag_probe_cpu(AttnMode mode, AttnOptions opt, AttnIO io, AttnShape s, int layer, const float* qkv,
                    const float* out, const float* stats, const float* dout, double* dq_err, double* dk_err,
                    DiagProbe* result) {
    attn_shape_check(s, "diag_probe_cpu");
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s);
    const int heads = s.B * s.NH;
    float* dqkv = (float*)mallocCheck(nqkv * sizeof(float));
    attention_backward_cpu(mode, opt, io, s, qkv, out, stats, dout, dqkv);

    /* the reference sees what the mode saw: BF16-rounded inputs when the I/O is BF16 */
    double* qkv_ref_in = (double*)mallocCheck(nqkv * sizeof(double));
    double* dout_ref_in = (double*)mallocCheck(nout * sizeof(double));
    for (size_t i = 0; i < nqkv; i++) qkv_ref_in[i] = io == ATTN_IO_BF16 ? bf16_round(qkv[i]) : qkv[i];
    for (size_t i = 0; i < nout; i++) dout_ref_in[i] = io == ATTN_IO_BF16 ? bf16_round(dout[i]) : dout[i];
    double* dqkv_ref = (double*)mallocCheck(nqkv * sizeof(double));
    attention_backward_ref(s, qkv_ref_in, dout_ref_in, dqkv_ref);

    double* dq = dq_err ? dq_err : (double*)mallocCheck((size_t)heads * sizeof(double));
    double* dk = dk_err ? dk_err : (double*)mallocCheck((size_t)heads * sizeof(double));
    attn_rel_errors_per_head(s, ATTN_T_DQ, dqkv, dqkv_ref, dq);
    attn_rel_errors_per_head(s, ATTN_T_DK, dqkv, dqkv_ref, dk);
    AttnErrStat sq = attn_err_stat_of(dq, heads), sk = attn_err_stat_of(dk, heads);

    diag_probe_clear(result);
    result->layer = layer;
    result->mode = mode;
    result->reference = DIAG_PROBE_REF_FP64;
    result->heads = heads;
    result->dq_err_median = sq.median;
    result->dq_err_max = sq.max;
    result->dk_err_median = sk.median;
    result->dk_err_max = sk.max;

    if (!dq_err) free(dq);
    if (!dk_err) free(dk);
    free(dqkv);
    free(qkv_ref_in);
    free(dout_ref_in);
    free(dqkv_ref);
}

/* ---- JSON ---- */

typedef struct {
    char* buf;
    size_t cap, len;
} JsonOut;

static void json_put(JsonOut* o, const char* fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= o->cap - o->len)
        die("diag_write_json: buffer of %zu bytes too small (internal sizing error; report it)", o->cap);
    o->len += (size_t)n;
}

static void json_number(JsonOut* o, double x) {
    if (isfinite(x))
        json_put(o, "%.9g", x);
    else
        json_put(o, "null");
}

static void json_layer_array(JsonOut* o, const char* key, const LayerDiag* per_layer, int L, size_t field_offset) {
    json_put(o, ", \"%s\": [", key);
    for (int l = 0; l < L; l++) {
        if (l) json_put(o, ", ");
        json_number(o, *(const float*)((const char*)&per_layer[l] + field_offset));
    }
    json_put(o, "]");
}

size_t diag_json_bytes(int L) { return 1024 + (size_t)(L > 0 ? L : 0) * 9 * 20; }

int diag_write_json(char* buf, size_t cap, const LayerDiag* per_layer, int L, const DiagProbe* probe) {
    if (L < 1) die("diag_write_json: L = %d layers (need at least 1)", L);
    if (cap < diag_json_bytes(L))
        die("diag_write_json: buffer of %zu bytes is too small for %d layers; allocate diag_json_bytes(L) = %zu",
            cap, L, diag_json_bytes(L));
    JsonOut o = {buf, cap, 0};
    buf[0] = '\0';
    /* run-level summaries; a NaN (not measured) layer makes its summary null */
    double rho_max = -INFINITY, q_max = -INFINITY, k_max = -INFINITY, logit_max = -INFINITY, ent = 0;
    double kb2 = 0, kbg2 = 0;
    float* medians = (float*)mallocCheck((size_t)L * sizeof(float));
    for (int l = 0; l < L; l++) {
        const LayerDiag* d = &per_layer[l];
        rho_max = nan_max(rho_max, d->rho_max);
        q_max = nan_max(q_max, d->q_absmax);
        k_max = nan_max(k_max, d->k_absmax);
        logit_max = nan_max(logit_max, d->logit_max);
        ent += d->entropy_mean;
        kb2 += (double)d->key_bias_norm * d->key_bias_norm;
        kbg2 += (double)d->key_bias_grad_norm * d->key_bias_grad_norm;
        medians[l] = d->rho_median;
    }
    json_put(&o, "\"rho_max\": ");
    json_number(&o, rho_max);
    json_put(&o, ", \"rho_median\": ");
    json_number(&o, diag_median(medians, L));
    free(medians);
    json_put(&o, ", \"q_absmax\": ");
    json_number(&o, q_max);
    json_put(&o, ", \"k_absmax\": ");
    json_number(&o, k_max);
    json_put(&o, ", \"logit_max\": ");
    json_number(&o, logit_max);
    json_put(&o, ", \"entropy_mean\": ");
    json_number(&o, ent / L);
    json_put(&o, ", \"key_bias_norm\": ");
    json_number(&o, sqrt(kb2));
    json_put(&o, ", \"key_bias_grad_norm\": ");
    json_number(&o, sqrt(kbg2));

    json_layer_array(&o, "layer_rho_max", per_layer, L, offsetof(LayerDiag, rho_max));
    json_layer_array(&o, "layer_rho_median", per_layer, L, offsetof(LayerDiag, rho_median));
    json_layer_array(&o, "layer_q_absmax", per_layer, L, offsetof(LayerDiag, q_absmax));
    json_layer_array(&o, "layer_k_absmax", per_layer, L, offsetof(LayerDiag, k_absmax));
    json_layer_array(&o, "layer_logit_max", per_layer, L, offsetof(LayerDiag, logit_max));
    json_layer_array(&o, "layer_entropy", per_layer, L, offsetof(LayerDiag, entropy_mean));
    json_layer_array(&o, "layer_grad_norm", per_layer, L, offsetof(LayerDiag, grad_norm));
    json_layer_array(&o, "layer_key_bias_norm", per_layer, L, offsetof(LayerDiag, key_bias_norm));
    json_layer_array(&o, "layer_key_bias_grad_norm", per_layer, L, offsetof(LayerDiag, key_bias_grad_norm));

    if (probe != NULL && probe->layer >= 0) {
        json_put(&o, ", \"probe_layer\": %d, \"probe_mode\": \"%s\", \"probe_ref\": \"%s\"", probe->layer,
                 attn_mode_name(probe->mode), probe->reference == DIAG_PROBE_REF_FP64 ? "fp64" : "fp32");
        json_put(&o, ", \"probe_dq_err\": ");
        json_number(&o, probe->dq_err_median);
        json_put(&o, ", \"probe_dk_err\": ");
        json_number(&o, probe->dk_err_median);
        json_put(&o, ", \"probe_dq_err_max\": ");
        json_number(&o, probe->dq_err_max);
        json_put(&o, ", \"probe_dk_err_max\": ");
        json_number(&o, probe->dk_err_max);
    }
    return (int)o.len;
}

/* ---- capture ---- */

/* ---------------------------------------------------------------- early warning */
void diag_warn_init(DiagWarn* w, double warn_rho, double warn_dq_err, AttnMode mode) {
    memset(w, 0, sizeof(*w));
    w->threshold[DIAG_WARN_RHO] = warn_rho;
    w->threshold[DIAG_WARN_DQ_ERR] = warn_dq_err;
    w->mode = mode;
    w->trained_under = -1;
}

void diag_warn_set_trained_under(DiagWarn* w, int mode, int64_t step) {
    w->trained_under = mode;
    w->trained_until = step;
}

/* One value of one (kind, layer): fires on the way up, re-arms below DIAG_WARN_REARM x threshold. */
static void warn_one(DiagWarn* w, DiagWarnKind kind, int layer, double value) {
    const double t = w->threshold[kind];
    if (t <= 0 || layer < 0 || layer >= DIAG_WARN_MAX_LAYERS || isnan(value)) return;
    unsigned char* fired = &w->fired[kind][layer];
    if (*fired) {
        if (value < DIAG_WARN_REARM * t) *fired = 0;
    } else if (value > t) {
        *fired = 1;
        w->pending[w->num_pending++] = (DiagWarning){kind, layer, value, t};
    }
}

int diag_warn_check(DiagWarn* w, const LayerDiag* per_layer, int L, const DiagProbe* probe) {
    w->num_pending = 0;
    for (int l = 0; l < L && l < DIAG_WARN_MAX_LAYERS; l++) warn_one(w, DIAG_WARN_RHO, l, per_layer[l].rho_max);
    if (probe != NULL && probe->layer >= 0) warn_one(w, DIAG_WARN_DQ_ERR, probe->layer, probe->dq_err_median);
    return w->num_pending;
}

void diag_warning_text(const DiagWarn* w, int i, int64_t step, char* console, size_t console_cap, char* json,
                       size_t json_cap) {
    const DiagWarning* x = &w->pending[i];
    const char* mode = attn_mode_name(w->mode);
    const int leaky = w->mode == ATTN_BF16 || w->mode == ATTN_REPAIR;
    /* resumed under a mode that does not leak from a checkpoint trained under one that does */
    const int inherited = !leaky && x->kind == DIAG_WARN_RHO &&
                          (w->trained_under == ATTN_BF16 || w->trained_under == ATTN_REPAIR);
    /* the reference numbers are the measured ones of docs/reproduction.md and docs/diagnostics.md */
    if (x->kind == DIAG_WARN_RHO)
        snprintf(console, console_cap,
                 "warning: step %lld: layer %d key offset rho %.3g crossed --warn-rho %g (fp32 and gproj runs stayed "
                 "under 9 in 80k steps; the bf16 runs that broke had reached 80-190)",
                 (long long)step, x->layer, x->value, x->threshold);
    else
        snprintf(console, console_cap,
                 "warning: step %lld: layer %d in-run dQ error %.3g%% (median over heads) crossed --warn-dq-err %g%% "
                 "(gproj reads 0.2-0.3%%)",
                 (long long)step, x->layer, 100.0 * x->value, 100.0 * x->threshold);
    const size_t used = strlen(console);
    if (leaky)
        snprintf(console + used, console_cap - used,
                 "\n  hint: %s attention's backward leaks here; to continue this run under gproj, run the same "
                 "command with --resume --attn gproj (same --out-dir)", mode);
    else if (inherited)
        snprintf(console + used, console_cap - used,
                 "\n  note: this run uses %s attention now, but it was trained under %s until step %lld (the "
                 "checkpoint it resumed from), whose leak drifts the keys: the offset can date from then; under %s "
                 "it should not keep growing (docs/diagnostics.md)", mode,
                 attn_mode_name((AttnMode)w->trained_under), (long long)w->trained_until, mode);
    else
        snprintf(console + used, console_cap - used,
                 "\n  note: this run already uses %s attention, whose dQ stays exact to BF16 rounding; the "
                 "growth comes from training itself (learning rate, sharp attention: docs/diagnostics.md)", mode);
    snprintf(json, json_cap, "\"step\": %lld, \"kind\": \"%s\", \"layer\": %d, \"value\": %.9g, "
             "\"threshold\": %.9g, \"mode\": \"%s\"", (long long)step, x->kind == DIAG_WARN_RHO ? "rho" : "dq_err",
             x->layer, x->value, x->threshold, mode);
}

static int cmp_i64(const void* a, const void* b) {
    int64_t x = *(const int64_t*)a, y = *(const int64_t*)b;
    return (x > y) - (x < y);
}

int diag_parse_int_list(const char* text, const char* what, int64_t* values, int max_values, int* count,
                        char* err, size_t errlen) {
    *count = 0;
    if (text == NULL || text[0] == '\0') return 0;
    const char* p = text;
    int n = 0;
    for (;;) {
        const char* start = p;
        int64_t v = 0;
        int digits = 0;
        while (*p >= '0' && *p <= '9') {
            if (v > (INT64_MAX - 9) / 10) {
                snprintf(err, errlen, "%s: number too large in '%s'", what, text);
                return -1;
            }
            v = v * 10 + (*p - '0');
            p++;
            digits++;
        }
        if (digits == 0 || (*p != ',' && *p != '\0')) {
            const char* end = start;
            while (*end && *end != ',') end++;
            snprintf(err, errlen, "%s: '%.*s' in '%s' is not a non-negative integer (write a comma-separated list "
                     "such as 1000,2000)", what, (int)(end - start), start, text);
            return -1;
        }
        if (n == max_values) {
            snprintf(err, errlen, "%s: more than %d items in '%s'", what, max_values, text);
            return -1;
        }
        values[n++] = v;
        if (*p == '\0') break;
        p++; /* the comma; a trailing comma gives an empty item, refused above */
    }
    qsort(values, (size_t)n, sizeof(int64_t), cmp_i64);
    int unique = 0;
    for (int i = 0; i < n; i++)
        if (unique == 0 || values[unique - 1] != values[i]) values[unique++] = values[i];
    *count = unique;
    return 0;
}

int diag_capture_spec_from_flags(const char* steps, const char* layers, int num_layers, DiagCaptureSpec* spec,
                                 char* err, size_t errlen) {
    memset(spec, 0, sizeof *spec);
    if (diag_parse_int_list(steps, "--capture-steps", spec->steps, DIAG_CAPTURE_MAX_ITEMS, &spec->num_steps, err,
                            errlen) != 0)
        return -1;
    int64_t tmp[DIAG_CAPTURE_MAX_ITEMS];
    int n = 0;
    if (diag_parse_int_list(layers, "--capture-layers", tmp, DIAG_CAPTURE_MAX_ITEMS, &n, err, errlen) != 0) return -1;
    for (int i = 0; i < n; i++) {
        if (tmp[i] >= num_layers) {
            snprintf(err, errlen, "--capture-layers: layer %lld does not exist (the model has %d layers: 0..%d)",
                     (long long)tmp[i], num_layers, num_layers - 1);
            return -1;
        }
        spec->layers[i] = (int)tmp[i];
    }
    spec->num_layers = n;
    return 0;
}

int diag_capture_spec_parse(const char* text, int num_layers, DiagCaptureSpec* spec, char* err, size_t errlen) {
    memset(spec, 0, sizeof *spec);
    if (text == NULL || text[0] == '\0') return 0;
    const char* colon = strchr(text, ':');
    char steps[4096];
    size_t steps_len = colon ? (size_t)(colon - text) : strlen(text);
    if (steps_len >= sizeof steps) {
        snprintf(err, errlen, "--capture-attn: step list too long ('%.40s...')", text);
        return -1;
    }
    if (steps_len == 0) {
        snprintf(err, errlen, "--capture-attn: no steps before ':' in '%s' (write STEPS[:LAYERS], e.g. "
                 "1000,2000:0,5,11)", text);
        return -1;
    }
    memcpy(steps, text, steps_len);
    steps[steps_len] = '\0';
    return diag_capture_spec_from_flags(steps, colon ? colon + 1 : "", num_layers, spec, err, errlen);
}

int diag_capture_step_wanted(const DiagCaptureSpec* spec, int64_t step) {
    for (int i = 0; i < spec->num_steps; i++)
        if (spec->steps[i] == step) return 1;
    return 0;
}

int diag_capture_wanted(const DiagCaptureSpec* spec, int64_t step, int layer) {
    if (!diag_capture_step_wanted(spec, step)) return 0;
    if (spec->num_layers == 0) return 1;
    for (int i = 0; i < spec->num_layers; i++)
        if (spec->layers[i] == layer) return 1;
    return 0;
}

void diag_capture_path(char* buf, size_t n, const char* dir, int64_t step, int layer) {
    int w = snprintf(buf, n, "%s/attn_step%08lld_layer%02d.bin", dir, (long long)step, layer);
    if (w < 0 || (size_t)w >= n) die("diag_capture_path: path too long for a %zu-byte buffer (folder '%s')", n, dir);
}

AttnCaptureInfo diag_capture_info(AttnCaptureDtype dtype, int64_t step, int layer, AttnMode mode, AttnShape s,
                                  int has_out, int has_stats) {
    AttnCaptureInfo info;
    memset(&info, 0, sizeof info);
    info.dtype = dtype;
    info.shape = s;
    info.layer = layer;
    info.step = step;
    info.attn_mode = (uint32_t)mode;
    info.flags = (has_out ? ATTN_CAPTURE_HAS_OUT : 0u) | (has_stats ? ATTN_CAPTURE_HAS_STATS : 0u);
    return info;
}

void diag_capture_write_cpu(const char* dir, int64_t step, int layer, AttnMode mode, AttnShape s,
                            const float* qkv, const float* out, const float* stats, const float* dout) {
    const AttnCaptureInfo info = diag_capture_info(ATTN_CAPTURE_FP32, step, layer, mode, s, out != NULL, stats != NULL);
    AttnCapture cap;
    attn_capture_alloc(&cap, &info);
    attn_capture_from_module(&cap, qkv, out, dout);
    if (stats) memcpy(cap.stats, stats, attn_stats_count(s) * sizeof(float));
    char path[4096];
    diag_capture_path(path, sizeof path, dir, step, layer);
    attn_capture_write(path, &cap);
    attn_capture_free(&cap);
}
