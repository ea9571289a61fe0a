/*
 * tests/test_gpt_grad.c - the CPU model's gradients against central finite
 * differences, for every parameter tensor.
 *
 * Why: backward is hand-written layer by layer; a finite difference of the
 * forward loss is an independent check of every one of those layers at once.
 * To make the check sharp this program is linked with the DOUBLE build of
 * model/gpt_cpu.c (the same source compiled with -DGPT_CPU_REAL=double; fp32
 * attention mode, which that build serves with the attention module's fp64
 * reference). In double, central differences with step h = 1e-5 have
 * truncation error ~h^2 * f''' ~ 1e-10 and cancellation error
 * ~eps * loss / h ~ 1e-16 * 5 / 1e-5 = 5e-11. Each sampled element must match
 * to 1e-7 of its tensor's largest gradient (measured worst: ~2e-9, so a
 * margin of ~50x), while any real mistake (a missing term, a wrong index)
 * shows up as an error of order the gradient itself. Scale-relative, because
 * some exact gradients are ~0 (the key bias: see below).
 *
 * Also checked: gradients accumulate (two backwards = twice one), rows that
 * cannot influence the loss (padded wte rows, wpe rows past T) get exactly
 * zero, and the loss at GPT-2 initialisation is close to ln(V).
 *
 * The same finite-difference check runs for every architecture option alone
 * (RoPE, RMSNorm, SwiGLU, QK-norm, no biases, an untied head) and for
 * llama-small's combination with and without QK-norm, on the same tiny
 * shape: every tensor the config has, its initialisation (gains 1, lm_head
 * like wte with zero padding rows) included.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "common/utils.h"
#include "model/gpt_config.h"
#include "model/gpt_cpu.h"
#include "tests/testing.h"

enum { TEST_B = 2, TEST_T = 8, SAMPLES_PER_TENSOR = 10 };

static uint64_t rng_state = 0x2545F4914F6CDD1DULL;
static uint64_t rng_next(void) {  /* xorshift64*: the test's own data, independent of the model's init */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}
static double rng_uniform(void) { return (double)(rng_next() >> 11) * 0x1.0p-53; }

static GPTConfig tiny_config(void) {
    GPTConfig c;
    c.max_seq_len = 10;   /* > T: wpe rows 8, 9 are never used and must get zero gradient */
    c.vocab_size = 90;
    c.padded_vocab_size = 96;  /* 6 padded rows: masked out of the softmax */
    c.num_layers = 2;
    c.num_heads = 4;
    c.channels = 32;
    gpt_config_set_gpt2_options(&c);
    return c;
}

static double loss_at(GPTCpu* m, const int* in, const int* tg) {
    gpt_cpu_forward(m, in, tg, TEST_B, TEST_T);
    /* mean_loss is a float field; recompute the mean in double from the per-position losses */
    const gpt_real* losses = gpt_act_ptr(m, m->acts, A_LOSSES, 0);
    double s = 0.0;
    for (int i = 0; i < TEST_B * TEST_T; i++) s += losses[i];
    return s / (TEST_B * TEST_T);
}


/* The central-difference check of every tensor the config has (count > 0), SAMPLES_PER_TENSOR
   elements each (the largest-magnitude gradient plus random live ones), on params already set.
   Fills grads with the analytic gradient. */
static void check_all_tensors(GPTCpu* m, const char* label, const int* inputs, const int* targets, gpt_real* grads) {
    const GPTConfig cfg = m->config;
    gpt_cpu_zero_grad(m);
    gpt_cpu_forward(m, inputs, targets, TEST_B, TEST_T);
    gpt_cpu_backward(m);
    memcpy(grads, m->grads, m->num_params * sizeof(gpt_real));
    const double h = 1e-5, tol_vs_scale = 1e-7;
    for (int id = 0; id < NUM_PARAM_TENSORS; id++) {
        const ParamTensorInfo* p = &m->params_info[id];
        if (p->count == 0) continue; /* not in this config */
        size_t live = p->count;
        if (id == P_WTE || id == P_LMHEADW) live = (size_t)cfg.vocab_size * cfg.channels;
        if (id == P_WPE) live = (size_t)TEST_T * cfg.channels;
        size_t idx[SAMPLES_PER_TENSOR];
        size_t argmax = 0;
        for (size_t i = 1; i < live; i++) {
            if (fabs(grads[p->offset + i]) > fabs(grads[p->offset + argmax])) argmax = i;
        }
        idx[0] = argmax;
        for (int s = 1; s < SAMPLES_PER_TENSOR; s++) idx[s] = (size_t)(rng_next() % live);
        int fails = 0;
        double worst = 0.0;
        for (int s = 0; s < SAMPLES_PER_TENSOR; s++) {
            gpt_real* w = &m->params[p->offset + idx[s]];
            const gpt_real saved = *w;
            *w = saved + h;
            const double lp = loss_at(m, inputs, targets);
            *w = saved - h;
            const double lm = loss_at(m, inputs, targets);
            *w = saved;
            const double fd = (lp - lm) / (2 * h);
            const double an = grads[p->offset + idx[s]];
            const double err = fabs(fd - an);
            if (err > tol_vs_scale * fabs(grads[p->offset + argmax])) {
                fails++;
                printf("    %s[%zu]: analytic %.12g finite-difference %.12g\n", p->name, idx[s], an, fd);
            }
            const double rel = err / fabs(grads[p->offset + argmax]);  /* relative to the tensor's scale */
            if (rel > worst) worst = rel;
        }
        printf("  %-9s worst |fd - analytic| / max|g| = %.2e over %d samples (max |g| %.3e)\n", p->name, worst,
               SAMPLES_PER_TENSOR, fabs(grads[p->offset + argmax]));
        CHECK(fails == 0, "%s: %-9s %d sampled elements match finite differences (worst rel err %.2e, max |g| %.3e)",
              label, p->name, SAMPLES_PER_TENSOR, worst, fabs(grads[p->offset + argmax]));
        CHECK(fabs(grads[p->offset + argmax]) > 1e-6, "%s: %-9s has a non-trivial gradient", label, p->name);
    }
}

/* Moves the weights away from the near-linear regime of a fresh init so every nonlinearity
   (GELU/SwiGLU curvature, norm scales, sharp softmaxes) contributes to the gradient; padded
   rows of wte and lm_head stay 0 as in a real model, so their zero gradient is meaningful. */
static void perturb(GPTCpu* m) {
    const GPTConfig cfg = m->config;
    for (size_t i = 0; i < m->num_params; i++) m->params[i] += 0.15 * (2.0 * rng_uniform() - 1.0);
    const ParamId padded[2] = {P_WTE, P_LMHEADW};
    for (int k = 0; k < 2; k++) {
        const ParamTensorInfo* t = &m->params_info[padded[k]];
        for (size_t i = (size_t)cfg.vocab_size * cfg.channels; i < t->count; i++) m->params[t->offset + i] = 0;
    }
}

/* One architecture option (or a combination) on the tiny shape: its initialisation and the
   finite-difference check of every tensor it has. */
static void check_option_config(const char* label, GPTConfig cfg, const int* inputs, const int* targets) {
    char section[160];
    snprintf(section, sizeof(section), "finite differences: %s", label);
    test_section(section);
    GPTCpu m;
    gpt_cpu_init(&m, &cfg, TEST_B, TEST_T, ATTN_FP32);
    gpt_cpu_init_weights(&m, 1337);
    const double loss0 = loss_at(&m, inputs, targets);
    CHECK(fabs(loss0 - log((double)cfg.vocab_size)) < 0.1, "%s: initial loss %.4f within 0.1 of ln(V)", label, loss0);
    int gains_one = 1;
    const ParamId gains[5] = {P_LN1W, P_LN2W, P_LNFW, P_QNORMW, P_KNORMW};
    for (int k = 0; k < 5; k++) {
        const ParamTensorInfo* t = &m.params_info[gains[k]];
        for (size_t i = 0; i < t->count; i++) gains_one &= m.params[t->offset + i] == 1;
    }
    CHECK(gains_one, "%s: norm weights and gains initialised to 1", label);
    if (!cfg.tie_embeddings) {
        const ParamTensorInfo* t = &m.params_info[P_LMHEADW];
        const size_t live = (size_t)cfg.vocab_size * cfg.channels;
        int pad_zero = 1;
        double ss = 0.0;
        for (size_t i = 0; i < t->count; i++) {
            if (i >= live) pad_zero &= m.params[t->offset + i] == 0;
            else ss += m.params[t->offset + i] * m.params[t->offset + i];
        }
        const double std = sqrt(ss / (double)live);
        CHECK(pad_zero && fabs(std - 0.02) < 0.002, "%s: lm_head initialised like wte (std %.4f, padding 0)", label, std);
    }
    perturb(&m);
    gpt_real* grads = (gpt_real*)mallocCheck(m.num_params * sizeof(gpt_real));
    check_all_tensors(&m, label, inputs, targets, grads);
    free(grads);
    gpt_cpu_free(&m);
}

int main(void) {
    const GPTConfig cfg = tiny_config();
    GPTCpu m;
    gpt_cpu_init(&m, &cfg, TEST_B, TEST_T, ATTN_FP32);
    CHECK(sizeof(gpt_real) == sizeof(double), "this test is linked with the double build of the model");

    int inputs[TEST_B * TEST_T], targets[TEST_B * TEST_T];
    for (int i = 0; i < TEST_B * TEST_T; i++) {
        inputs[i] = (int)(rng_next() % (uint64_t)cfg.vocab_size);
        targets[i] = (int)(rng_next() % (uint64_t)cfg.vocab_size);
    }

    test_section("loss at GPT-2 initialisation");
    gpt_cpu_init_weights(&m, 1337);
    const double loss0 = loss_at(&m, inputs, targets);
    CHECK(fabs(loss0 - log((double)cfg.vocab_size)) < 0.1, "initial loss %.4f within 0.1 of ln(V) = %.4f", loss0,
          log((double)cfg.vocab_size));
    CHECK(fabs(m.mean_loss - loss0) < 1e-6, "mean_loss field %.7f equals the mean of per-position losses", m.mean_loss);
    {
        const ParamTensorInfo* wte = &m.params_info[P_WTE];
        int pad_zero = 1;
        for (size_t i = (size_t)cfg.vocab_size * cfg.channels; i < wte->count; i++) pad_zero &= m.params[wte->offset + i] == 0;
        CHECK(pad_zero, "padded wte rows initialised to 0");
    }
    perturb(&m);

    test_section("analytic gradients vs central finite differences (double build, fp32 attention)");
    gpt_real* grads = (gpt_real*)mallocCheck(m.num_params * sizeof(gpt_real));
    check_all_tensors(&m, "GPT-2", inputs, targets, grads);

    test_section("rows that cannot influence the loss get exactly zero gradient");
    {
        const ParamTensorInfo* wte = &m.params_info[P_WTE];
        const ParamTensorInfo* wpe = &m.params_info[P_WPE];
        int zero_pad = 1, zero_pos = 1;
        for (size_t i = (size_t)cfg.vocab_size * cfg.channels; i < wte->count; i++) zero_pad &= grads[wte->offset + i] == 0;
        for (size_t i = (size_t)TEST_T * cfg.channels; i < wpe->count; i++) zero_pos &= grads[wpe->offset + i] == 0;
        CHECK(zero_pad, "wte padding rows (>= V) have zero gradient");
        CHECK(zero_pos, "wpe rows >= T have zero gradient");
    }

    test_section("key-bias gradient vanishes (softmax shift invariance)");
    {   /* adding a vector to every key of a head leaves the loss unchanged, so
           d loss / d key bias = sum_j dK_j = 0 exactly (docs/attention_numerics.md) */
        const ParamTensorInfo* qkvb = &m.params_info[P_QKVB];
        double key_max = 0.0, query_max = 0.0;
        for (int l = 0; l < cfg.num_layers; l++) {
            for (int c = 0; c < cfg.channels; c++) {
                const size_t base = qkvb->offset + (size_t)l * 3 * cfg.channels;
                query_max = fmax(query_max, fabs(grads[base + c]));
                key_max = fmax(key_max, fabs(grads[base + cfg.channels + c]));
            }
        }
        CHECK(key_max < 1e-12 * query_max + 1e-15, "max |d key bias| = %.2e vs max |d query bias| = %.2e",
              key_max, query_max);
    }

    test_section("backward accumulates");
    {
        gpt_cpu_forward(&m, inputs, targets, TEST_B, TEST_T);
        gpt_cpu_backward(&m);  /* m.grads already holds one backward */
        double max_err = 0.0;
        for (size_t i = 0; i < m.num_params; i++) {
            const double e = fabs(m.grads[i] - 2.0 * grads[i]);
            if (e > max_err) max_err = e;
        }
        CHECK(max_err < 1e-12, "second backward doubles the gradients (max deviation %.2e)", max_err);
        gpt_cpu_zero_grad(&m);
        int all_zero = 1;
        for (size_t i = 0; i < m.num_params; i++) all_zero &= m.grads[i] == 0;
        CHECK(all_zero, "gpt_cpu_zero_grad clears every gradient");
    }

    test_section("forward without targets");
    gpt_cpu_forward(&m, inputs, NULL, TEST_B, TEST_T);
    CHECK(m.mean_loss == -1.0f, "mean_loss is -1 without targets (got %g)", m.mean_loss);
    {
        double row_sum = 0.0;
        for (int v = 0; v < cfg.padded_vocab_size; v++) row_sum += m.probs[v];
        CHECK(fabs(row_sum - 1.0) < 1e-12 && m.probs[cfg.vocab_size] == 0,
              "probabilities of a row sum to 1 over V and are 0 on padding (sum %.15f)", row_sum);
    }

    free(grads);
    gpt_cpu_free(&m);

    /* every option alone, then llama-small's combination (+ qk-norm), on the same tiny shape (HS 8) */
    GPTConfig c = cfg;
    c.pos = GPT_POS_ROPE;
    check_option_config("--pos rope", c, inputs, targets);
    c = cfg;
    c.pos = GPT_POS_ROPE;
    c.rope_base = 37.0f; /* fast rotations: every pair's angle matters at T 8 */
    check_option_config("--pos rope --rope-base 37", c, inputs, targets);
    c = cfg;
    c.norm = GPT_NORM_RMSNORM;
    check_option_config("--norm rmsnorm", c, inputs, targets);
    c = cfg;
    c.mlp = GPT_MLP_SWIGLU;
    c.mlp_hidden = gpt_config_default_mlp_hidden(GPT_MLP_SWIGLU, c.channels);
    check_option_config("--mlp swiglu", c, inputs, targets);
    c = cfg;
    c.mlp_hidden = 40;
    check_option_config("--mlp gelu --mlp-hidden 40", c, inputs, targets);
    c = cfg;
    c.qk_norm = 1;
    check_option_config("--qk-norm 1", c, inputs, targets);
    c = cfg;
    c.bias = 0;
    check_option_config("--bias 0", c, inputs, targets);
    c = cfg;
    c.tie_embeddings = 0;
    check_option_config("--tie-embeddings 0", c, inputs, targets);
    c = cfg;
    c.pos = GPT_POS_ROPE;
    c.norm = GPT_NORM_RMSNORM;
    c.mlp = GPT_MLP_SWIGLU;
    c.mlp_hidden = gpt_config_default_mlp_hidden(GPT_MLP_SWIGLU, c.channels);
    c.bias = 0;
    check_option_config("llama-small's options", c, inputs, targets);
    c.qk_norm = 1;
    check_option_config("llama-small's options + --qk-norm 1", c, inputs, targets);
    c.tie_embeddings = 0;
    c.rope_base = 37.0f;
    check_option_config("llama-small's options + --qk-norm 1 --tie-embeddings 0 --rope-base 37", c, inputs, targets);
    return test_summary();
}
