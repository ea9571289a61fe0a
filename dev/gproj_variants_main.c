/*
 * dev/gproj_variants_main.c - the study tool build/gproj_variants: errors of
 * the cheaper gproj variants (dev/gproj_variants.h) on the hard cases of
 * docs/attention_numerics.md, next to the fp32, bf16, repair and exact gproj
 * modes of the CPU emulation, all against the fp64 reference on the same
 * BF16 inputs. docs/gproj_variants.md holds its output and what it means.
 *
 * Usage: build/gproj_variants [--T 1024] [--NH 4] [--HS 64] [--seed 1234]
 *                             [--cases all|short] [--costs] [--capture FILE]...
 * Besides the hard cases of the contract it runs value-offset cases (the
 * hard key-offset / sharp inputs with V = V0 + rho_v sqrt(HS) u_h added, a
 * common value vector as seen in real runs, docs/diagnostics.md), reported
 * apart from the target cases; --capture replays attention captures
 * (attention/support/attn_capture.h; repeatable), e.g. from the trainer's
 * --capture-attn, instead of the generated cases.
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
#include "attention/support/attn_capture.h"
#include "attention/support/attn_cases.h"
#include "attention/support/attn_metrics.h"
#include "common/utils.h"
#include "dev/gproj_variants.h"

#define TARGET_PCT 0.35

/* The methods of the table: the four library modes, then the variants (a)..(f4). */
enum { NUM_LIB_MODES = ATTN_NUM_EMULATED_MODES, FIRST_VARIANT = GV_A_PDQ };
#define NUM_METHODS (NUM_LIB_MODES + GV_NUM_VARIANTS - FIRST_VARIANT)

typedef struct {
    double o_med, dq_med, dq_max, dk_med, dk_max, dksum_med, res_med;
    long nonfinite;
    int zero_ref; /* extreme case: absolute norms */
} Row;

typedef struct {
    double worst_dq, worst_dk, worst_dksum;
    char worst_dq_case[160], worst_dk_case[160];
    int cases;      /* cases summarised */
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

static Row row_of(AttnShape s, const float* out, const double* out_ref, const float* dqkv, const double* dqkv_ref,
                  const float* res) {
    Row r;
    memset(&r, 0, sizeof r);
    int nh = s.B * s.NH;
    double* per = (double*)mallocCheck(sizeof(double) * (size_t)nh);
    attn_rel_errors_per_head(s, ATTN_T_O, out, out_ref, per);
    r.o_med = attn_err_stat_of(per, nh).median;
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

/* One row block of the tables: a generated case (optionally with a value
   offset added) or a capture file. */
typedef struct {
    AttnCase base;
    double rho_v;         /* value offset, 0 = none */
    const char* capture;  /* capture file instead of a generated case, or NULL */
    int group;            /* GROUP_* */
} StudyCase;
enum { GROUP_TARGET = 0, GROUP_INFO = 1, GROUP_VALUE_OFFSET = 2, GROUP_CAPTURE = 3, NUM_GROUPS = 4 };
static const char* k_group_names[NUM_GROUPS] = {
    "target cases (key offset, sharp 1e2..1e4; extreme only for finiteness)",
    "beyond the targets (sharp 1e5)", "value-offset cases (not among the contract's hard cases)", "captures"};

static void usage_die(const char* msg) {
    die("gproj_variants: %s\n  usage: gproj_variants [--T N] [--NH N] [--HS 64|128] [--seed N] "
        "[--cases all|short] [--costs] [--capture FILE]...", msg);
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

/* Every method's dQ/dK on one input, printed as a table block and added to
   the group's summary. Returns 1 if the engine's repair or gproj differ from
   the library's modes. */
static int run_case(const char* cname, AttnShape s, const float* qkv, const float* dout, int extreme,
                    Summary sum[NUM_METHODS]) {
    const AttnOptions no_opts = {0};
    size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nrows = (size_t)s.B * s.NH * s.T;
    double* qkv_d = attn_double_copy(qkv, nqkv);
    double* dout_d = attn_double_copy(dout, nout);
    double* dqkv_ref = (double*)mallocCheck(sizeof(double) * nqkv);
    double* out_ref = (double*)mallocCheck(sizeof(double) * nout);
    float* stats = (float*)mallocCheck(sizeof(float) * attn_stats_count(s));
    float* dqkv[NUM_LIB_MODES + GV_NUM_VARIANTS];
    float* res[NUM_LIB_MODES + GV_NUM_VARIANTS];
    float* out[NUM_LIB_MODES + GV_NUM_VARIANTS];
    for (int k = 0; k < NUM_LIB_MODES + GV_NUM_VARIANTS; k++) {
        out[k] = (float*)mallocCheck(sizeof(float) * nout);
        dqkv[k] = (float*)mallocCheck(sizeof(float) * nqkv);
        res[k] = (float*)mallocCheck(sizeof(float) * nrows);
    }
    float** var_dqkv = dqkv + NUM_LIB_MODES;
    float** var_res = res + NUM_LIB_MODES;
    attention_forward_ref(s, qkv_d, out_ref);
    attention_backward_ref(s, qkv_d, dout_d, dqkv_ref);
    for (int m = 0; m < NUM_LIB_MODES; m++) {
        attention_forward_cpu((AttnMode)m, no_opts, ATTN_IO_BF16, s, qkv, out[m], stats);
        attention_backward_cpu_diag((AttnMode)m, no_opts, ATTN_IO_BF16, s, qkv, out[m], stats, dout, dqkv[m],
                                    res[m]);
    }
    gv_backward_variants(s, qkv, dout, var_dqkv, var_res, out + NUM_LIB_MODES);
    long mis_r = count_grad_mismatch(s, var_dqkv[GV_REPAIR], dqkv[ATTN_REPAIR]);
    long mis_g = count_grad_mismatch(s, var_dqkv[GV_GPROJ], dqkv[ATTN_GPROJ]);

    printf("\n### %s\n", cname);
    if (extreme) printf("exact dQ = dK = 0: entries are absolute ||X||_F per head (median / max)\n");
    printf("| method | O med | dQ med | dQ max | dK med | dK max | sum dK/|dK| | row res | non-finite |\n"
           "|---|---|---|---|---|---|---|---|---|\n");
    for (int m = 0; m < NUM_METHODS; m++) {
        int k = m < NUM_LIB_MODES ? m : m - NUM_LIB_MODES + FIRST_VARIANT + NUM_LIB_MODES;
        Row r = row_of(s, out[k], out_ref, dqkv[k], dqkv_ref, res[k]);
        double f = r.zero_ref ? 1.0 : 100.0;
        printf("| %s | %.3g | %.3g | %.3g | %.3g | %.3g | %.2e | %.2e | %ld |\n", method_name(m), 100 * r.o_med,
               f * r.dq_med,
               f * r.dq_max, f * r.dk_med, f * r.dk_max, r.dksum_med, r.res_med, r.nonfinite);
        Summary* sm = &sum[m];
        sm->cases++;
        if (r.nonfinite) sm->nonfinite++;
        if (extreme) continue;
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
    free(qkv_d); free(dout_d); free(dqkv_ref); free(out_ref); free(stats);
    for (int k = 0; k < NUM_LIB_MODES + GV_NUM_VARIANTS; k++) { free(out[k]); free(dqkv[k]); free(res[k]); }
    return (mis_r || mis_g) ? 1 : 0;
}

static void print_summary(int group, const Summary sum[NUM_METHODS]) {
    if (sum[0].cases == 0) return;
    printf("\n### Summary over the %s: %d\n", k_group_names[group], sum[0].cases);
    printf("| method | worst median dQ %% (case) | worst median dK %% (case) | worst median sum dK/|dK| | "
           "cases over 0.35%% | non-finite cases | meets target |\n|---|---|---|---|---|---|---|\n");
    for (int m = 0; m < NUM_METHODS; m++) {
        const Summary* sm = &sum[m];
        printf("| %s | %.3g (%s) | %.3g (%s) | %.2e | %d | %d | %s |\n", method_name(m), sm->worst_dq,
               sm->worst_dq_case, sm->worst_dk, sm->worst_dk_case, sm->worst_dksum, sm->fails, sm->nonfinite,
               (sm->fails == 0 && sm->nonfinite == 0) ? "yes" : "no");
    }
}

#define MAX_CASES 64

int main(int argc, char** argv) {
    AttnShape s = {1, 4, 1024, 64};
    uint64_t seed = 1234;
    int short_cases = 0, costs_only = 0;
    StudyCase cases[MAX_CASES];
    int ncases = 0;
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
        } else if (!strcmp(f, "--capture")) {
            if (ncases == MAX_CASES) usage_die("too many --capture files");
            memset(&cases[ncases], 0, sizeof cases[ncases]);
            cases[ncases].capture = v;
            cases[ncases++].group = GROUP_CAPTURE;
        } else {
            char msg[160];
            snprintf(msg, sizeof msg, "unknown flag '%s'", f);
            usage_die(msg);
        }
    }

    printf("| variant | D from | extra work vs bf16 mode | extra saved state |\n|---|---|---|---|\n");
    static const char* d_names[GV_NUM_D] = {"BF16 O", "FP32 (P dP)", "O + O_lo", "O + O_lo, fp32-P fwd",
                                            "O + O_lo, sum-bf(e) fwd", "O, sum-bf(e) fwd",
                                            "O + int8 O_lo, sum-bf(e) fwd"};
    for (int v = 0; v < GV_NUM_VARIANTS; v++)
        printf("| %s | %s | %s | %s |\n", gv_variants[v].name, d_names[gv_variants[v].D], gv_variants[v].extra_work,
               gv_variants[v].extra_state);
    if (costs_only) return 0;

    if (ncases == 0) { /* the generated cases */
        const double rhos[] = {0, 4, 16, 64, 256, 1024};
        const double qscales[] = {1, 4, 8};
        StudyCase c;
        memset(&c, 0, sizeof c);
        for (int qi = 0; qi < 3; qi++)
            for (int ri = 0; ri < 6; ri++) {
                if (short_cases && !(ri == 0 || ri == 2 || ri == 5)) continue;
                c.base = attn_case_key_offset(rhos[ri], qscales[qi], seed);
                cases[ncases++] = c;
            }
        const double logits[] = {1e2, 1e3, 1e4};
        for (int k = 0; k < 3; k++) {
            c.base = attn_case_sharp(logits[k], seed);
            cases[ncases++] = c;
        }
        c.base = attn_case_extreme(seed);
        cases[ncases++] = c;
        c.base = attn_case_sharp(1e5, seed);
        c.group = GROUP_INFO;
        cases[ncases++] = c;
        /* value offsets on top of a plain, an offset-key and a sharp input */
        const double rho_vs[] = {4, 16, 64};
        c.group = GROUP_VALUE_OFFSET;
        for (int k = 0; k < 3; k++) {
            c.rho_v = rho_vs[k];
            c.base = attn_case_key_offset(0, 1, seed);
            cases[ncases++] = c;
            c.base = attn_case_key_offset(256, 8, seed);
            cases[ncases++] = c;
            c.base = attn_case_sharp(1e3, seed);
            cases[ncases++] = c;
        }
    }

    Summary sum[NUM_GROUPS][NUM_METHODS];
    memset(sum, 0, sizeof sum);
    int engine_mismatch = 0;
    if (cases[0].capture == NULL)
        printf("\nB%d NH%d T%d HS%d seed %llu; errors vs fp64 on the same BF16 inputs, %% (median / max over heads)\n",
               s.B, s.NH, s.T, s.HS, (unsigned long long)seed);
    for (int ci = 0; ci < ncases; ci++) {
        const StudyCase* sc = &cases[ci];
        char cname[160];
        AttnShape cs = s;
        float *qkv, *dout;
        if (sc->capture != NULL) {
            AttnCapture cap;
            attn_capture_load(sc->capture, &cap);
            cs = cap.info.shape;
            qkv = (float*)mallocCheck(sizeof(float) * attn_qkv_count(cs));
            dout = (float*)mallocCheck(sizeof(float) * attn_out_count(cs));
            attn_capture_to_module(&cap, qkv, NULL, dout);
            /* the module boundary: the modes see BF16 inputs (exact for BF16 files) */
            for (size_t k = 0; k < attn_qkv_count(cs); k++) qkv[k] = bf16_round(qkv[k]);
            for (size_t k = 0; k < attn_out_count(cs); k++) dout[k] = bf16_round(dout[k]);
            snprintf(cname, sizeof cname, "capture %s (layer %d, step %lld, B%d NH%d T%d HS%d)", sc->capture,
                     (int)cap.info.layer, (long long)cap.info.step, cs.B, cs.NH, cs.T, cs.HS);
            attn_capture_free(&cap);
        } else {
            qkv = (float*)mallocCheck(sizeof(float) * attn_qkv_count(cs));
            dout = (float*)mallocCheck(sizeof(float) * attn_out_count(cs));
            attn_case_fill(&sc->base, cs, qkv, dout);
            attn_case_name(&sc->base, cname, sizeof cname);
            if (sc->rho_v > 0) {
                gv_add_value_offset(cs, qkv, sc->rho_v, seed);
                size_t len = strlen(cname);
                snprintf(cname + len, sizeof cname - len, ", value offset %g", sc->rho_v);
            }
        }
        int extreme = sc->capture == NULL && sc->base.kind == ATTN_CASE_EXTREME;
        engine_mismatch |= run_case(cname, cs, qkv, dout, extreme, sum[sc->group]);
        free(qkv);
        free(dout);
    }
    for (int g = 0; g < NUM_GROUPS; g++) print_summary(g, sum[g]);
    printf("\nengine repair/gproj == library modes bit for bit on every case: %s\n", engine_mismatch ? "NO" : "yes");
    return engine_mismatch ? 1 : 0;
}
