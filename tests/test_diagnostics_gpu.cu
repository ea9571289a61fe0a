/*
 * tests/test_diagnostics_gpu.cu - the GPU diagnostics (model/diagnostics.cuh)
 * against the CPU diagnostics (model/diagnostics_cpu.c, itself tested against
 * hand-computed values in tests/test_diagnostics.c) on the same BF16 inputs.
 *
 * Tolerances: both sides read exactly the same BF16 values; the CPU sums in
 * double, the GPU in FP32 partial sums combined in double, so rho, logits,
 * entropies and norms agree to ~1e-5 relative (checked at 1e-4); max |q|,
 * max |k| are exact. The probe compares different references (CPU: fp64
 * exact; GPU: fp32 attention mode, BF16 outputs), so its large bf16-mode
 * errors must agree within 20% relative and gproj must stay under 0.6% on both.
 * Needs an NVIDIA GPU (make gputest); ends with "N passed, N failed".
 *
 * `test_diagnostics_gpu --bench` times the diagnostics at the 450m shape
 * (B16 T1024, 20 heads of 64, 459M parameters): the cost figure for
 * docs/diagnostics.md.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attention/support/attn_cases.h"
#include "model/diagnostics.cuh"
#include "tests/testing.h"

static floatX* upload_bf16(const float* x, size_t n) {
    uint16_t* bits = (uint16_t*)mallocCheck(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) bits[i] = float_to_bf16_bits(x[i]);
    floatX* d;
    cudaCheck(cudaMalloc((void**)&d, n * sizeof(floatX)));
    cudaCheck(cudaMemcpy(d, bits, n * sizeof(uint16_t), cudaMemcpyHostToDevice));
    free(bits);
    return d;
}

static void download_bf16(float* x, const floatX* d, size_t n) {
    uint16_t* bits = (uint16_t*)mallocCheck(n * sizeof(uint16_t));
    cudaCheck(cudaMemcpy(bits, d, n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) x[i] = bf16_bits_to_float(bits[i]);
    free(bits);
}

static GPTConfig config_for(int L, int C, int NH, int T) {
    GPTConfig cfg;
    char err[256];
    if (gpt_config_from_descriptor("tiny", &cfg, err, sizeof err) != 0) die("%s", err);
    cfg.num_layers = L;
    cfg.channels = C;
    cfg.num_heads = NH;
    cfg.max_seq_len = T;
    gpt_config_set_gpt2_options(&cfg); /* the MLP width follows C */
    if (gpt_config_validate(&cfg, err, sizeof err) != 0) die("%s", err);
    return cfg;
}

static void compare_attention(const char* label, const LayerDiag* g, const LayerDiag* c) {
    char name[160];
#define CMP(FIELD, RTOL, ATOL)                                          \
    snprintf(name, sizeof name, "%s: " #FIELD " GPU vs CPU", label);    \
    CHECK_CLOSE(name, g->FIELD, c->FIELD, RTOL, ATOL);
    CMP(rho_max, 1e-4, 1e-6)
    CMP(rho_median, 1e-4, 1e-6)
    CMP(q_absmax, 0, 0)
    CMP(k_absmax, 0, 0)
    CMP(logit_max, 1e-4, 1e-5)
    CMP(entropy_mean, 1e-4, 1e-5)
#undef CMP
}

static void test_attention(void) {
    test_section("attention diagnostics: GPU vs CPU on the same BF16 qkv");
    const int B = 3, T = 200, NH = 4, HS = 64;
    const AttnShape s = {B, NH, T, HS};
    const GPTConfig cfg = config_for(2, NH * HS, NH, T);
    const size_t n = attn_qkv_count(s);
    float* qkv = (float*)mallocCheck(n * sizeof(float));
    const AttnCase cases[3] = {attn_case_random(1.0, 1), attn_case_key_offset(16.0, 4.0, 2),
                               attn_case_key_offset(256.0, 8.0, 3)};
    const int rows[2] = {32, 0};
    for (int ri = 0; ri < 2; ri++) {
        DiagCuda d;
        diag_cuda_init(&d, &cfg, B, T, rows[ri]);
        for (int ci = 0; ci < 3; ci++) {
            attn_case_fill(&cases[ci], s, qkv, NULL);
            floatX* d_qkv = upload_bf16(qkv, n);
            diag_cuda_clear(&d, 0);
            diag_attention_cuda(&d, 1, d_qkv, B, T, 0);
            LayerDiag got[2], want;
            diag_cuda_fetch(&d, got, NULL, NULL, 0);
            diag_attention_cpu(qkv, B, T, NH, HS, rows[ri], &want);
            char label[96], cname[64];
            snprintf(label, sizeof label, "%s, rows %d", attn_case_name(&cases[ci], cname, sizeof cname), rows[ri]);
            printf("  %-28s rho max %.4g median %.4g | |q| %.4g |k| %.4g | logit %.4g | entropy %.4f\n", label,
                   got[1].rho_max, got[1].rho_median, got[1].q_absmax, got[1].k_absmax, got[1].logit_max,
                   got[1].entropy_mean);
            compare_attention(label, &got[1], &want);
            CHECK(isnan(got[0].rho_max) && isnan(got[1].grad_norm), "untouched fields stay NaN");
            cudaCheck(cudaFree(d_qkv));
        }
        diag_cuda_free(&d);
    }
    /* a NaN in q is reported, not hidden */
    DiagCuda d;
    diag_cuda_init(&d, &cfg, B, T, 16);
    attn_case_fill(&cases[0], s, qkv, NULL);
    qkv[5] = NAN;
    floatX* d_qkv = upload_bf16(qkv, n);
    diag_attention_cuda(&d, 0, d_qkv, B, T, 0);
    LayerDiag got[2];
    diag_cuda_fetch(&d, got, NULL, NULL, 0);
    CHECK(isnan(got[0].q_absmax), "a NaN in Q makes q_absmax NaN (got %g)", got[0].q_absmax);
    cudaCheck(cudaFree(d_qkv));
    diag_cuda_free(&d);
    free(qkv);
}

/* Keys that grow along the sequence (and queries that lean the same way): the
   logits of every row rise with the key index, so the row kernel's running max
   is overtaken key after key and its rescaling is exercised on every step. */
static void add_rising_logits(float* qkv, AttnShape s) {
    for (int b = 0; b < s.B; b++)
        for (int t = 0; t < s.T; t++)
            for (int h = 0; h < s.NH; h++)
                for (int d = 0; d < s.HS; d++) {
                    const size_t q = ((((size_t)b * s.T + t) * 3 + 0) * s.NH + h) * s.HS + d;
                    const size_t k = q + (size_t)s.NH * s.HS;
                    qkv[q] += 0.5f;
                    qkv[k] += 3.0f * (float)t / (float)s.T;
                }
}

/* The row kernel's blocking against the CPU on shapes that stress it: the
   450m rows (T 1024, 16 heads, 32 rows = one row block, 16 key tiles), every
   row of T 1024 (32 row blocks), odd T with a partial last row block and a
   partial last key tile at HS 128, rows_per_head > T, T shorter than a tile,
   T = 1, HS 256 (DIAG_MAX_HS: shared memory above the 48 KB default), and
   small head sizes (8: one vector per row; 24: threads left idle in the key passes). */
static void test_attention_shapes(void) {
    test_section("attention diagnostics: GPU vs CPU across the row kernel's blocking");
    const struct { int B, T, NH, HS, rows; } shapes[] = {
        {2, 1024, 16, 64, 32}, {2, 1024, 16, 64, 0}, {2, 333, 2, 128, 50}, {1, 333, 2, 128, 0},
        {3, 45, 3, 64, 1000},  {2, 1, 2, 64, 32},    {1, 130, 1, 256, 0},  {1, 97, 2, 8, 7},
        {2, 70, 1, 24, 0},
    };
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const int B = shapes[si].B, T = shapes[si].T, NH = shapes[si].NH, HS = shapes[si].HS, rows = shapes[si].rows;
        const AttnShape s = {B, NH, T, HS};
        const GPTConfig cfg = config_for(1, NH * HS, NH, T);
        const size_t n = attn_qkv_count(s);
        float* qkv = (float*)mallocCheck(n * sizeof(float));
        DiagCuda d;
        diag_cuda_init(&d, &cfg, B, T, rows);
        for (int ci = 0; ci < 3; ci++) {
            const AttnCase c = ci == 1 ? attn_case_key_offset(16.0, 4.0, 20 + si) : attn_case_random(1.0, 40 + si);
            attn_case_fill(&c, s, qkv, NULL);
            if (ci == 2) add_rising_logits(qkv, s);
            for (size_t i = 0; i < n; i++) qkv[i] = bf16_round(qkv[i]); /* the CPU sees the GPU's BF16 values */
            floatX* d_qkv = upload_bf16(qkv, n);
            diag_cuda_clear(&d, 0);
            diag_attention_cuda(&d, 0, d_qkv, B, T, 0);
            LayerDiag got, want;
            diag_cuda_fetch(&d, &got, NULL, NULL, 0);
            diag_attention_cpu(qkv, B, T, NH, HS, rows, &want);
            char label[160], cname[64];
            snprintf(label, sizeof label, "B%d T%d NH%d HS%d rows %d, %s%s", B, T, NH, HS, rows,
                     attn_case_name(&c, cname, sizeof cname), ci == 2 ? " + rising logits" : "");
            printf("  %-52s logit %.5g | entropy %.6f\n", label, got.logit_max, got.entropy_mean);
            compare_attention(label, &got, &want);
            cudaCheck(cudaFree(d_qkv));
        }
        diag_cuda_free(&d);
        free(qkv);
    }
}

static void test_params(void) {
    test_section("gradient and key-bias norms, zeroing the key-bias gradient: GPU vs CPU");
    const GPTConfig cfg = config_for(3, 128, 2, 64);
    ParamTensorInfo table[NUM_PARAM_TENSORS];
    const size_t np = gpt_param_table(&cfg, table);
    float* params = (float*)mallocCheck(np * sizeof(float));
    float* grads = (float*)mallocCheck(np * sizeof(float));
    AttnRng rng;
    attn_rng_init(&rng, 9);
    for (size_t i = 0; i < np; i++) {
        params[i] = bf16_round((float)(0.05 * attn_rng_normal(&rng)));
        grads[i] = bf16_round((float)(1e-3 * attn_rng_normal(&rng)));
    }
    floatX* d_params = upload_bf16(params, np);
    floatX* d_grads = upload_bf16(grads, np);
    DiagCuda d;
    diag_cuda_init(&d, &cfg, 1, 64, 0);
    diag_cuda_clear(&d, 0);
    diag_params_cuda(&d, d_params, d_grads, 0);
    LayerDiag got[3], want[3];
    double g_global = 0, c_global = 0;
    diag_cuda_fetch(&d, got, NULL, &g_global, 0);
    diag_params_cpu(&cfg, table, params, grads, want, &c_global);
    for (int l = 0; l < 3; l++) {
        char name[96];
        snprintf(name, sizeof name, "layer %d grad_norm", l);
        CHECK_CLOSE(name, got[l].grad_norm, want[l].grad_norm, 1e-4, 0);
        snprintf(name, sizeof name, "layer %d key_bias_norm", l);
        CHECK_CLOSE(name, got[l].key_bias_norm, want[l].key_bias_norm, 1e-4, 0);
        snprintf(name, sizeof name, "layer %d key_bias_grad_norm", l);
        CHECK_CLOSE(name, got[l].key_bias_grad_norm, want[l].key_bias_grad_norm, 1e-4, 0);
    }
    CHECK_CLOSE("global gradient norm", g_global, c_global, 1e-4, 0);

    diag_zero_key_bias_grad_cuda(&cfg, table, d_grads, 0);
    diag_zero_key_bias_grad_cpu(&cfg, table, grads);
    float* back = (float*)mallocCheck(np * sizeof(float));
    download_bf16(back, d_grads, np);
    CHECK(memcmp(back, grads, np * sizeof(float)) == 0, "GPU zeroing changes exactly what the CPU zeroing changes");
    diag_params_cuda(&d, d_params, d_grads, 0);
    diag_cuda_fetch(&d, got, NULL, NULL, 0);
    CHECK(got[0].key_bias_grad_norm == 0 && got[2].key_bias_grad_norm == 0, "key_bias_grad_norm 0 after zeroing");
    free(back);
    free(params);
    free(grads);
    cudaCheck(cudaFree(d_params));
    cudaCheck(cudaFree(d_grads));
    diag_cuda_free(&d);
}

static void test_probe(void) {
    test_section("in-run probe: GPU (vs fp32 mode) against CPU (vs fp64)");
    const int B = 1, T = 256, NH = 4, HS = 64;
    const AttnShape s = {B, NH, T, HS};
    const GPTConfig cfg = config_for(2, NH * HS, NH, T);
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nst = attn_stats_count(s);
    float* qkv = (float*)mallocCheck(nqkv * sizeof(float));
    float* dout = (float*)mallocCheck(nout * sizeof(float));
    float* out = (float*)mallocCheck(nout * sizeof(float));
    float* stats = (float*)mallocCheck(nst * sizeof(float));
    AttnCase c = attn_case_key_offset(64.0, 8.0, 77);
    attn_case_fill(&c, s, qkv, dout);
    floatX* d_qkv = upload_bf16(qkv, nqkv);
    floatX* d_dout = upload_bf16(dout, nout);
    floatX* d_out;
    float* d_stats;
    void* d_ws;
    cudaCheck(cudaMalloc((void**)&d_out, nout * sizeof(floatX)));
    cudaCheck(cudaMalloc((void**)&d_stats, nst * sizeof(float)));
    size_t ws = 16;
    for (int m = 0; m < ATTN_NUM_EMULATED_MODES; m++) {
        size_t w = attention_cuda_workspace_bytes(s, (AttnMode)m);
        ws = w > ws ? w : ws;
    }
    cudaCheck(cudaMalloc(&d_ws, ws));
    DiagCuda d;
    diag_cuda_init(&d, &cfg, B, T, 0);
    const AttnMode modes[2] = {ATTN_BF16, ATTN_GPROJ};
    AttnOptions opt = {0};
    for (int mi = 0; mi < 2; mi++) {
        attention_forward_cuda(modes[mi], opt, s, d_qkv, d_out, d_stats, d_ws, 0);
        diag_cuda_clear(&d, 0);
        diag_probe_cuda(&d, modes[mi], opt, 1, d_qkv, d_out, d_stats, d_dout, B, T, 0);
        LayerDiag layers[2];
        DiagProbe gp, cp;
        diag_cuda_fetch(&d, layers, &gp, NULL, 0);
        attention_forward_cpu(modes[mi], opt, ATTN_IO_BF16, s, qkv, out, stats);
        diag_probe_cpu(modes[mi], opt, ATTN_IO_BF16, s, 1, qkv, out, stats, dout, NULL, NULL, &cp);
        printf("  %-6s GPU dQ %.4f%% dK %.4f%% | CPU dQ %.4f%% dK %.4f%%\n", attn_mode_name(modes[mi]),
               100 * gp.dq_err_median, 100 * gp.dk_err_median, 100 * cp.dq_err_median, 100 * cp.dk_err_median);
        CHECK(gp.layer == 1 && gp.mode == modes[mi] && gp.reference == DIAG_PROBE_REF_FP32 && gp.heads == B * NH,
              "GPU probe labels");
        if (modes[mi] == ATTN_BF16) {
            CHECK_CLOSE("bf16 dQ error, GPU vs CPU", gp.dq_err_median, cp.dq_err_median, 0.2, 0);
            CHECK(gp.dq_err_median > 0.05, "bf16 at rho 64 leaks on the GPU too (%.2f%%)", 100 * gp.dq_err_median);
        } else {
            CHECK(gp.dq_err_median < 0.006 && gp.dk_err_median < 0.006 && cp.dq_err_median < 0.006,
                  "gproj stays at the output floor on both (GPU dQ %.3g dK %.3g, CPU dQ %.3g)", gp.dq_err_median,
                  gp.dk_err_median, cp.dq_err_median);
        }
    }
    /* capture from device buffers reads back as the same BF16 values */
    char dir[] = "/tmp/test_diag_gpu_XXXXXX";
    if (mkdtemp(dir) == NULL) die("mkdtemp failed");
    diag_capture_layer_cuda(dir, 5, 1, ATTN_GPROJ, s, d_qkv, d_out, d_stats, d_dout, 0);
    char path[512];
    diag_capture_path(path, sizeof path, dir, 5, 1);
    AttnCapture cap;
    char err[512];
    int rc = attn_capture_read(path, &cap, err, sizeof err);
    CHECK(rc == 0, "GPU capture reads back (%s)", rc ? err : "ok");
    if (rc == 0) {
        float* q_module = (float*)mallocCheck(nqkv * sizeof(float));
        float* dout_module = (float*)mallocCheck(nout * sizeof(float));
        attn_capture_to_module(&cap, q_module, NULL, dout_module);
        CHECK(memcmp(q_module, qkv, nqkv * sizeof(float)) == 0 && memcmp(dout_module, dout, nout * sizeof(float)) == 0,
              "Q, K, V, dO in the capture equal the BF16 inputs");
        CHECK(cap.info.step == 5 && cap.info.layer == 1 && cap.out != NULL && cap.stats != NULL, "capture header");
        free(q_module);
        free(dout_module);
        attn_capture_free(&cap);
    }
    unlink(path);
    rmdir(dir);
    diag_cuda_free(&d);
    cudaCheck(cudaFree(d_qkv));
    cudaCheck(cudaFree(d_dout));
    cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_stats));
    cudaCheck(cudaFree(d_ws));
    free(qkv);
    free(dout);
    free(out);
    free(stats);
}

/* The 450m shape: time one layer's attention diagnostics, the parameter norms
   and one probe, and the attention forward + backward of one layer for scale. */
static void bench(void) {
    GPTConfig cfg;
    char err[256];
    if (gpt_config_from_descriptor("450m", &cfg, err, sizeof err) != 0) die("%s", err);
    const int B = 16, T = cfg.max_seq_len, NH = cfg.num_heads, HS = cfg.channels / NH, L = cfg.num_layers;
    const AttnShape s = {B, NH, T, HS};
    ParamTensorInfo table[NUM_PARAM_TENSORS];
    const size_t np = gpt_param_table(&cfg, table);
    floatX *d_params, *d_grads, *d_qkv, *d_out, *d_dout, *d_dqkv;
    float* d_stats;
    void* d_ws;
    cudaCheck(cudaMalloc((void**)&d_params, np * sizeof(floatX)));
    cudaCheck(cudaMalloc((void**)&d_grads, np * sizeof(floatX)));
    cudaCheck(cudaMemset(d_params, 0, np * sizeof(floatX)));
    cudaCheck(cudaMemset(d_grads, 0, np * sizeof(floatX)));
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s);
    float* h = (float*)mallocCheck(nqkv * sizeof(float));
    float* hd = (float*)mallocCheck(nout * sizeof(float));
    AttnCase c = attn_case_key_offset(16.0, 1.0, 1);
    attn_case_fill(&c, s, h, hd);
    d_qkv = upload_bf16(h, nqkv);
    d_dout = upload_bf16(hd, nout);
    cudaCheck(cudaMalloc((void**)&d_out, nout * sizeof(floatX)));
    cudaCheck(cudaMalloc((void**)&d_dqkv, nqkv * sizeof(floatX)));
    cudaCheck(cudaMalloc((void**)&d_stats, attn_stats_count(s) * sizeof(float)));
    const size_t ws = attention_cuda_workspace_bytes(s, ATTN_GPROJ);
    cudaCheck(cudaMalloc(&d_ws, ws > 16 ? ws : 16));
    DiagCuda d;
    diag_cuda_init(&d, &cfg, B, T, DIAG_DEFAULT_ROWS_PER_HEAD);
    cudaEvent_t e0, e1;
    cudaCheck(cudaEventCreate(&e0));
    cudaCheck(cudaEventCreate(&e1));
    float ms_attn = 0, ms_params = 0, ms_probe = 0, ms_fwdbwd = 0;
    const int reps = 10;
    for (int pass = 0; pass < 2; pass++) { /* pass 0 warms up (and allocates the probe scratch) */
        cudaCheck(cudaEventRecord(e0));
        for (int r = 0; r < reps; r++) diag_attention_cuda(&d, r % L, d_qkv, B, T, 0);
        cudaCheck(cudaEventRecord(e1));
        cudaCheck(cudaEventSynchronize(e1));
        cudaCheck(cudaEventElapsedTime(&ms_attn, e0, e1));
        cudaCheck(cudaEventRecord(e0));
        for (int r = 0; r < reps; r++) diag_params_cuda(&d, d_params, d_grads, 0);
        cudaCheck(cudaEventRecord(e1));
        cudaCheck(cudaEventSynchronize(e1));
        cudaCheck(cudaEventElapsedTime(&ms_params, e0, e1));
        attention_forward_cuda(ATTN_GPROJ, AttnOptions{0}, s, d_qkv, d_out, d_stats, d_ws, 0);
        cudaCheck(cudaEventRecord(e0));
        for (int r = 0; r < reps; r++)
            diag_probe_cuda(&d, ATTN_GPROJ, AttnOptions{0}, 0, d_qkv, d_out, d_stats, d_dout, B, T, 0);
        cudaCheck(cudaEventRecord(e1));
        cudaCheck(cudaEventSynchronize(e1));
        cudaCheck(cudaEventElapsedTime(&ms_probe, e0, e1));
        cudaCheck(cudaEventRecord(e0));
        for (int r = 0; r < reps; r++) {
            attention_forward_cuda(ATTN_GPROJ, AttnOptions{0}, s, d_qkv, d_out, d_stats, d_ws, 0);
            attention_backward_cuda(ATTN_GPROJ, AttnOptions{0}, s, d_qkv, d_out, d_stats, d_dout, d_dqkv, d_ws, 0);
        }
        cudaCheck(cudaEventRecord(e1));
        cudaCheck(cudaEventSynchronize(e1));
        cudaCheck(cudaEventElapsedTime(&ms_fwdbwd, e0, e1));
    }
    printf("bench (450m shape B%d T%d NH%d HS%d, %d layers, %zu parameters, %d rows per head):\n", B, T, NH, HS, L, np,
           DIAG_DEFAULT_ROWS_PER_HEAD);
    printf("  attention diagnostics, one layer: %.3f ms (all %d layers: %.2f ms)\n", ms_attn / reps, L,
           ms_attn / reps * L);
    printf("  parameter and gradient norms:     %.3f ms\n", ms_params / reps);
    printf("  probe of one layer:               %.3f ms\n", ms_probe / reps);
    printf("  for scale: gproj attention fwd+bwd of one layer %.3f ms\n", ms_fwdbwd / reps);
    diag_cuda_free(&d);
    free(h);
    free(hd);
    cudaCheck(cudaFree(d_params));
    cudaCheck(cudaFree(d_grads));
    cudaCheck(cudaFree(d_qkv));
    cudaCheck(cudaFree(d_out));
    cudaCheck(cudaFree(d_dout));
    cudaCheck(cudaFree(d_dqkv));
    cudaCheck(cudaFree(d_stats));
    cudaCheck(cudaFree(d_ws));
}

int main(int argc, char** argv) {
    if (argc > 1 && strcmp(argv[1], "--bench") == 0) {
        bench();
        return 0;
    }
    test_attention();
    test_attention_shapes();
    test_params();
    test_probe();
    return test_summary();
}
