/*
 * dev/gproj_variants_main.c - the study tool build/gproj_variants: errors of
 * the cheaper gproj variants (dev/gproj_variants.h) on the hard cases of
 * docs/ATTENTION_NUMERICS.md, next to the fp32, bf16, repair and exact gproj
 * modes of the CPU emulation, all against the fp64 reference on the same
 * BF16 inputs. docs/gproj_variants.md holds its output and what it means.
 *
 * Usage: build/gproj_variants [--T 1024] [--NH 4] [--HS 64] [--seed 1234]
 *                             [--cases all|short] [--costs]
 * Prints, per case, one row per method: median and max over heads of the
 * relative Frobenius error of dQ and dK (%), the median ||sum_j dK_j||/||dK||
 * and the median row residual |sum_j dS'_ij| / sum_j |dS'_ij|; then a summary
 * (worst median over the cases, and whether the method meets the target
 * <= 0.35% median dQ AND dK on every case, finite on the extreme input).
 * The engine's own repair and gproj are checked bit for bit against the
 * library's modes on every case (a mismatch is printed and fails the run).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "attention/attention.h"
#include "attention/attn_cases.h"
#include "attention/attn_metrics.h"
#include "common/utils.h"
#include "dev/gproj_variants.h"

#define TARGET_PCT 0.35

/* The methods of the table: the four library modes, then the variants (a)..(e). */
enum { NUM_LIB_MODES = ATTN_NUM_MODES, FIRST_VARIANT = GV_A_PDQ };
#define NUM_METHODS (NUM_LIB_MODES + GV_NUM_VARIANTS - FIRST_VARIANT)

typedef struct {
    double dq_med, dq_max, dk_med, dk_max, dksum_med, res_med;
    long nonfinite;
    int zero_ref; /* extreme case: absolute norms */
} Row;

typedef struct {
    double worst_dq, worst_dk, worst_dksum;
    char worst_dq_case[48], worst_dk_case[48];
    int fails;      /* cases over the target */
    int nonfinite;  /* cases with NaN/Inf */
} Summary;

static const char* method_name(int m) {
    static char buf[NUM_METHODS][48];
    if (m < NUM_LIB_MODES) {
        snprintf(buf[m], sizeof buf[m], "%s (mode)", attn_mode_name((AttnMode)m));
        return buf[m];
    }
    return gv_variants[m - NUM_LIB_MODES + FIRST_VARIANT].name;
}

static Row row_of(AttnShape s, const float* dqkv, const double* dqkv_ref, const float* res) {
    Row r;
    memset(&r, 0, sizeof r);
    int nh = s.B * s.NH;
    double* per = (double*)mallocCheck(sizeof(double) * (size_t)nh);
    r.zero_ref = attn_rel_errors_per_head(s, ATTN_T_DQ, dqkv, dqkv_ref, per);
    AttnErrStat st = attn_err_stat_of(per, nh);
    r.dq_med = st.median; r.dq_max = st.max;
    attn_rel_errors_per_head(s, ATTN_T_DK, dqkv, dqkv_ref, per);
    st = attn_err_stat_of(per, nh);
    r.dk_med = st.median; r.dk_max = st.max;
    attn_dk_sum_residuals(s, dqkv, per);
    r.dksum_med = attn_err_stat_of(per, nh).median;
    free(per);
    int nrows = s.B * s.NH * s.T;
    double* rr = (double*)mallocCheck(sizeof(double) * (size_t)nrows);
    for (int k = 0; k < nrows; k++) rr[k] = res[k];
    r.res_med = attn_err_stat_of(rr, nrows).median;
    free(rr);
    size_t n = attn_qkv_count(s);
    for (size_t k = 0; k < n; k++) r.nonfinite += !isfinite(dqkv[k]);
    return r;
}

/* Compares the dQ and dK parts of two dqkv buffers bit for bit; returns the number of differing elements. */
static long count_grad_mismatch(AttnShape s, const float* a, const float* b) {
    long diff = 0;
    for (int bb = 0; bb < s.B; bb++)
        for (int t = 0; t < s.T; t++)
            for (int part = 0; part < 2; part++)
                for (int h = 0; h < s.NH; h++) {
                    size_t off = ((((size_t)bb * s.T + t) * 3 + part) * s.NH + h) * s.HS;
                    diff += memcmp(a + off, b + off, sizeof(float) * (size_t)s.HS) != 0;
                }
    return diff;
}

static void usage_die(const char* msg) {
    die("gproj_variants: %s\n  usage: gproj_variants [--T N] [--NH N] [--HS 64|128] [--seed N] "
        "[--cases all|short] [--costs]", msg);
}

static int parse_int(const char* flag, const char* v) {
    char* end;
    long x = strtol(v, &end, 10);
    if (*v == '\0' || *end != '\0' || x < 1 || x > 1000000) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s needs a positive integer, got '%s'", flag, v);
        usage_die(msg);
    }
    return (int)x;
}

int main(int argc, char** argv) {
    AttnShape s = {1, 4, 1024, 64};
    uint64_t seed = 1234;
    int short_cases = 0, costs_only = 0;
    for (int a = 1; a < argc; a++) {
        const char* f = argv[a];
        if (!strcmp(f, "--costs")) { costs_only = 1; continue; }
        if (a + 1 >= argc) usage_die("every flag but --costs takes a value");
        const char* v = argv[++a];
        if (!strcmp(f, "--T")) s.T = parse_int(f, v);
        else if (!strcmp(f, "--NH")) s.NH = parse_int(f, v);
        else if (!strcmp(f, "--HS")) s.HS = parse_int(f, v);
        else if (!strcmp(f, "--seed")) seed = (uint64_t)parse_int(f, v);
        else if (!strcmp(f, "--cases")) {
            if (!strcmp(v, "all")) short_cases = 0;
            else if (!strcmp(v, "short")) short_cases = 1;
            else usage_die("--cases takes all or short");
        } else {
            char msg[160];
            snprintf(msg, sizeof msg, "unknown flag '%s'", f);
            usage_die(msg);
        }
    }

    printf("| variant | D from | extra work vs bf16 mode | extra saved state |\n|---|---|---|---|\n");
    static const char* d_names[GV_NUM_D] = {"BF16 O", "FP32 (P dP)", "O + O_lo", "O + O_lo, fp32-P fwd"};
    for (int v = 0; v < GV_NUM_VARIANTS; v++)
        printf("| %s | %s | %s | %s |\n", gv_variants[v].name, d_names[gv_variants[v].D], gv_variants[v].extra_work,
               gv_variants[v].extra_state);
    if (costs_only) return 0;

    AttnCase cases[32];
    int ncases = 0;
    const double rhos[] = {0, 4, 16, 64, 256, 1024};
    const double qscales[] = {1, 4, 8};
    for (int qi = 0; qi < 3; qi++)
        for (int ri = 0; ri < 6; ri++) {
            if (short_cases && !(ri == 0 || ri == 2 || ri == 5)) continue;
            cases[ncases++] = attn_case_key_offset(rhos[ri], qscales[qi], seed);
        }
    cases[ncases++] = attn_case_sharp(1e2, seed);
    cases[ncases++] = attn_case_sharp(1e3, seed);
    cases[ncases++] = attn_case_sharp(1e4, seed);
    const int first_info_case = ncases; /* beyond the targets: informational */
    cases[ncases++] = attn_case_sharp(1e5, seed);
    cases[ncases++] = attn_case_extreme(seed);

    size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s);
    float* qkv = (float*)mallocCheck(sizeof(float) * nqkv);
    float* dout = (float*)mallocCheck(sizeof(float) * nout);
    double* qkv_d = (double*)mallocCheck(sizeof(double) * nqkv);
    double* dout_d = (double*)mallocCheck(sizeof(double) * nout);
    double* dqkv_ref = (double*)mallocCheck(sizeof(double) * nqkv);
    float* out = (float*)mallocCheck(sizeof(float) * nout);
    float* stats = (float*)mallocCheck(sizeof(float) * attn_stats_count(s));
    float* lib_dqkv[NUM_LIB_MODES];
    float* lib_res[NUM_LIB_MODES];
    float* var_dqkv[GV_NUM_VARIANTS];
    float* var_res[GV_NUM_VARIANTS];
    size_t nrows = (size_t)s.B * s.NH * s.T;
    for (int m = 0; m < NUM_LIB_MODES; m++) {
        lib_dqkv[m] = (float*)mallocCheck(sizeof(float) * nqkv);
        lib_res[m] = (float*)mallocCheck(sizeof(float) * nrows);
    }
    for (int v = 0; v < GV_NUM_VARIANTS; v++) {
        var_dqkv[v] = (float*)mallocCheck(sizeof(float) * nqkv);
        var_res[v] = (float*)mallocCheck(sizeof(float) * nrows);
    }
    Summary sum[NUM_METHODS];
    memset(sum, 0, sizeof sum);
    int engine_mismatch = 0;
    const AttnOptions no_opts = {0};

    printf("\nB%d NH%d T%d HS%d seed %llu; errors vs fp64 on the same BF16 inputs, %% (median / max over heads)\n",
           s.B, s.NH, s.T, s.HS, (unsigned long long)seed);
    for (int ci = 0; ci < ncases; ci++) {
        char cname[48];
        attn_case_name(&cases[ci], cname, sizeof cname);
        attn_case_fill(&cases[ci], s, qkv, dout);
        attn_float_to_double(qkv, qkv_d, nqkv);
        attn_float_to_double(dout, dout_d, nout);
        attention_backward_ref(s, qkv_d, dout_d, dqkv_ref);
        for (int m = 0; m < NUM_LIB_MODES; m++) {
            attention_forward_cpu((AttnMode)m, no_opts, ATTN_IO_BF16, s, qkv, out, stats);
            attention_backward_cpu_diag((AttnMode)m, no_opts, ATTN_IO_BF16, s, qkv, out, stats, dout, lib_dqkv[m],
                                        lib_res[m]);
        }
        gv_backward_variants(s, qkv, dout, var_dqkv, var_res);
        long mis_r = count_grad_mismatch(s, var_dqkv[GV_REPAIR], lib_dqkv[ATTN_REPAIR]);
        long mis_g = count_grad_mismatch(s, var_dqkv[GV_GPROJ], lib_dqkv[ATTN_GPROJ]);
        if (mis_r || mis_g) engine_mismatch = 1;

        int extreme = cases[ci].kind == ATTN_CASE_EXTREME;
        printf("\n### %s%s\n", cname, ci >= first_info_case && !extreme ? " (beyond the targets; informational)" : "");
        if (extreme)
            printf("exact dQ = dK = 0: entries are absolute ||X||_F per head (median / max)\n");
        printf("| method | dQ med | dQ max | dK med | dK max | sum dK/|dK| | row res | non-finite |\n"
               "|---|---|---|---|---|---|---|---|\n");
        for (int m = 0; m < NUM_METHODS; m++) {
            const float* x = m < NUM_LIB_MODES ? lib_dqkv[m] : var_dqkv[m - NUM_LIB_MODES + FIRST_VARIANT];
            const float* rs = m < NUM_LIB_MODES ? lib_res[m] : var_res[m - NUM_LIB_MODES + FIRST_VARIANT];
            Row r = row_of(s, x, dqkv_ref, rs);
            double f = r.zero_ref ? 1.0 : 100.0;
            printf("| %s | %.3g | %.3g | %.3g | %.3g | %.2e | %.2e | %ld |\n", method_name(m), f * r.dq_med,
                   f * r.dq_max, f * r.dk_med, f * r.dk_max, r.dksum_med, r.res_med, r.nonfinite);
            Summary* sm = &sum[m];
            if (r.nonfinite) sm->nonfinite++;
            if (extreme || ci >= first_info_case) continue;
            if (100 * r.dq_med > sm->worst_dq) {
                sm->worst_dq = 100 * r.dq_med;
                snprintf(sm->worst_dq_case, sizeof sm->worst_dq_case, "%s", cname);
            }
            if (100 * r.dk_med > sm->worst_dk) {
                sm->worst_dk = 100 * r.dk_med;
                snprintf(sm->worst_dk_case, sizeof sm->worst_dk_case, "%s", cname);
            }
            if (r.dksum_med > sm->worst_dksum) sm->worst_dksum = r.dksum_med;
            sm->fails += (100 * r.dq_med > TARGET_PCT || 100 * r.dk_med > TARGET_PCT);
        }
        printf("engine vs library, dQ/dK rows differing bit-wise: repair %ld, gproj %ld\n", mis_r, mis_g);
        fflush(stdout);
    }

    printf("\n### Summary over the %d target cases (key offset, sharp 1e2..1e4; extreme for finiteness)\n",
           first_info_case);
    printf("| method | worst median dQ %% (case) | worst median dK %% (case) | worst median sum dK/|dK| | "
           "cases over 0.35%% | non-finite cases | meets target |\n|---|---|---|---|---|---|---|\n");
    for (int m = 0; m < NUM_METHODS; m++) {
        const Summary* sm = &sum[m];
        printf("| %s | %.3g (%s) | %.3g (%s) | %.2e | %d | %d | %s |\n", method_name(m), sm->worst_dq,
               sm->worst_dq_case, sm->worst_dk, sm->worst_dk_case, sm->worst_dksum, sm->fails, sm->nonfinite,
               (sm->fails == 0 && sm->nonfinite == 0) ? "yes" : "no");
    }
    printf("\nengine repair/gproj == library modes bit for bit on every case: %s\n", engine_mismatch ? "NO" : "yes");

    free(qkv); free(dout); free(qkv_d); free(dout_d); free(dqkv_ref); free(out); free(stats);
    for (int m = 0; m < NUM_LIB_MODES; m++) { free(lib_dqkv[m]); free(lib_res[m]); }
    for (int v = 0; v < GV_NUM_VARIANTS; v++) { free(var_dqkv[v]); free(var_res[v]); }
    return engine_mismatch ? 1 : 0;
}
