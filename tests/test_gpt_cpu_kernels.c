/*
 * tests/test_gpt_cpu_kernels.c - the CPU model's matmul and softmax kernels
 * against fp64 references, on awkward shapes.
 *
 * Why: the model tests (test_gpt_grad, test_gpt_cpu, the twin parity) use
 * shapes whose sizes are multiples of the kernels' register blocks, so the
 * scalar tails (rows past the last block of MM_ROWS, output features past the
 * last MM_COLS chunk, input features past the last MM_COLS block) would go
 * untested. This program includes model/gpt_cpu.c to reach its static kernels
 * and checks, for sizes from 1 up and not multiples of anything:
 *   - matmul_forward / matmul_backward against fp64 sums, with the backward's
 *     accumulate-into semantics (buffers start non-zero);
 *   - bit-identical results with 1 and 3 threads, and a forward (and dinp) on
 *     the first n rows equal bit for bit to those rows computed with all rows
 *     (a row's result does not depend on which kernel path its block took);
 *   - the vectorised exp against exp() in double over [-87, 0];
 *   - softmax + cross-entropy against fp64, columns past V exactly 0, rows
 *     with huge logit spreads finite and normalised.
 */
#include "model/gpt_cpu.c"

#include <stdio.h>

#include "tests/testing.h"
#include "train/adamw_cpu.h"

static uint32_t rng_state = 2463534242u;
static float uniform_pm1(void) {  /* xorshift32 -> [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 17;
    rng_state ^= rng_state << 5;
    return (float)((double)rng_state / 2147483648.0 - 1.0);
}
static float* random_buffer(size_t n) {
    float* p = (float*)mallocCheck((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) p[i] = uniform_pm1();
    return p;
}
static float* copy_buffer(const float* src, size_t n) {
    float* p = (float*)mallocCheck((n ? n : 1) * sizeof(float));
    memcpy(p, src, n * sizeof(float));
    return p;
}

/* max over elements of |got - want| / (sum of |terms| of that element), given the fp64 value and its scale */
typedef struct { double worst; } ErrTracker;
static void track(ErrTracker* e, double got, double want, double scale) {
    const double err = fabs(got - want) / (scale > 0 ? scale : 1.0);
    if (err > e->worst || isnan(err)) e->worst = isnan(err) ? INFINITY : err;
}

typedef struct { size_t N; int IC, OC; } MatShape;

static void check_matmul(MatShape s, int with_bias) {
    const size_t N = s.N;
    const int IC = s.IC, OC = s.OC;
    float* inp = random_buffer(N * IC);
    float* weight = random_buffer((size_t)OC * IC);
    float* bias = with_bias ? random_buffer(OC) : NULL;
    float* dout = random_buffer(N * OC);
    float* out = random_buffer(N * OC);  /* garbage: forward must overwrite every element */
    matmul_forward(out, inp, weight, bias, N, IC, OC);
    ErrTracker fe = {0};
    for (size_t n = 0; n < N; n++) {
        for (int o = 0; o < OC; o++) {
            double sum = bias ? bias[o] : 0.0, scale = bias ? fabs(bias[o]) : 0.0;
            for (int i = 0; i < IC; i++) {
                sum += (double)inp[n * IC + i] * weight[(size_t)o * IC + i];
                scale += fabs((double)inp[n * IC + i] * weight[(size_t)o * IC + i]);
            }
            track(&fe, out[n * OC + o], sum, scale);
        }
    }
    CHECK(fe.worst < 1e-6, "forward N=%zu IC=%d OC=%d%s: worst error %.2e of the sum of |terms| (< 1e-6)", N, IC,
          OC, with_bias ? " +bias" : "", fe.worst);

    /* backward accumulates into non-zero buffers */
    float* dinp0 = random_buffer(N * IC);
    float* dweight0 = random_buffer((size_t)OC * IC);
    float* dbias0 = random_buffer(OC);
    float* dinp = copy_buffer(dinp0, N * IC);
    float* dweight = copy_buffer(dweight0, (size_t)OC * IC);
    float* dbias = copy_buffer(dbias0, OC);
    matmul_backward(dinp, dweight, with_bias ? dbias : NULL, dout, inp, weight, N, IC, OC);
    ErrTracker ie = {0}, we = {0}, be = {0};
    for (size_t n = 0; n < N; n++) {
        for (int i = 0; i < IC; i++) {
            double sum = dinp0[n * IC + i], scale = fabs(dinp0[n * IC + i]);
            for (int o = 0; o < OC; o++) {
                sum += (double)dout[n * OC + o] * weight[(size_t)o * IC + i];
                scale += fabs((double)dout[n * OC + o] * weight[(size_t)o * IC + i]);
            }
            track(&ie, dinp[n * IC + i], sum, scale);
        }
    }
    for (int o = 0; o < OC; o++) {
        for (int i = 0; i < IC; i++) {
            double sum = dweight0[(size_t)o * IC + i], scale = fabs(dweight0[(size_t)o * IC + i]);
            for (size_t n = 0; n < N; n++) {
                sum += (double)dout[n * OC + o] * inp[n * IC + i];
                scale += fabs((double)dout[n * OC + o] * inp[n * IC + i]);
            }
            track(&we, dweight[(size_t)o * IC + i], sum, scale);
        }
        double bsum = dbias0[o], bscale = fabs(dbias0[o]);
        for (size_t n = 0; n < N; n++) {
            bsum += dout[n * OC + o];
            bscale += fabs(dout[n * OC + o]);
        }
        track(&be, dbias[o], with_bias ? bsum : dbias0[o], bscale);
    }
    CHECK(ie.worst < 1e-6 && we.worst < 1e-6 && be.worst < 1e-6,
          "backward N=%zu IC=%d OC=%d%s accumulates: worst errors dinp %.2e dweight %.2e dbias %.2e (< 1e-6)", N, IC,
          OC, with_bias ? " +bias" : " (dbias untouched)", ie.worst, we.worst, be.worst);

    /* the same results with 1 thread, and a forward on fewer rows gives the same rows */
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    float* out1 = random_buffer(N * OC);
    matmul_forward(out1, inp, weight, bias, N, IC, OC);
    float* dinp1 = copy_buffer(dinp0, N * IC);
    float* dweight1 = copy_buffer(dweight0, (size_t)OC * IC);
    float* dbias1 = copy_buffer(dbias0, OC);
    matmul_backward(dinp1, dweight1, with_bias ? dbias1 : NULL, dout, inp, weight, N, IC, OC);
    omp_set_num_threads(threads);
    CHECK(memcmp(out, out1, N * OC * sizeof(float)) == 0 && memcmp(dinp, dinp1, N * IC * sizeof(float)) == 0 &&
              memcmp(dweight, dweight1, (size_t)OC * IC * sizeof(float)) == 0 &&
              memcmp(dbias, dbias1, OC * sizeof(float)) == 0,
          "N=%zu IC=%d OC=%d: forward and backward bit-identical with %d threads and with 1", N, IC, OC, threads);
    if (N > 1) {
        const size_t fewer = N - 1 - (N - 1) / 2;  /* cuts through a register block for most N */
        float* part = random_buffer(fewer * OC);
        matmul_forward(part, inp, weight, bias, fewer, IC, OC);
        float* dinp_part = copy_buffer(dinp0, fewer * IC);
        float* dweight_part = copy_buffer(dweight0, (size_t)OC * IC);
        matmul_backward(dinp_part, dweight_part, NULL, dout, inp, weight, fewer, IC, OC);
        CHECK(memcmp(part, out, fewer * OC * sizeof(float)) == 0 &&
                  memcmp(dinp_part, dinp, fewer * IC * sizeof(float)) == 0,
              "forward and dinp on the first %zu of %zu rows give those rows bit for bit", fewer, N);
        free(part);
        free(dinp_part);
        free(dweight_part);
    }
    free(out1);
    free(dinp1);
    free(dweight1);
    free(dbias1);
    free(inp);
    free(weight);
    free(bias);
    free(dout);
    free(out);
    free(dinp0);
    free(dweight0);
    free(dbias0);
    free(dinp);
    free(dweight);
    free(dbias);
}

/* The global gradient norm feeds clipping, so it must not depend on the thread count either. */
static void check_grad_norm_threads(void) {
    test_section("global gradient norm: fp64 value, same bits for 1 and N threads");
    const size_t n = 1000003;  /* several fixed chunks plus a tail */
    float* g = (float*)mallocCheck(n * sizeof(float));
    double ref = 0.0;
    for (size_t i = 0; i < n; i++) {
        g[i] = (float)(((i * 2654435761u) % 2001) - 1000) * 1e-3f;
        ref += (double)g[i] * (double)g[i];
    }
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    const float one = grad_global_norm_cpu(g, n);
    omp_set_num_threads(threads);
    const float many = grad_global_norm_cpu(g, n);
    CHECK_CLOSE("norm vs fp64", one, sqrt(ref), 1e-6, 0.0);
    CHECK(memcmp(&one, &many, sizeof one) == 0, "1 thread %.9g vs %d threads %.9g: identical bits", one, threads, many);
    free(g);
}

int main(void) {
    /* at least 3 threads, so the thread-count check means something on any machine */
    if (omp_get_max_threads() < 3) omp_set_num_threads(3);
    check_grad_norm_threads();

    test_section("matmuls against fp64, on sizes that are not multiples of the register blocks");
    printf("  (MM_ROWS %d rows x MM_COLS %d features per register block)\n", MM_ROWS, MM_COLS);
    const MatShape shapes[] = {
        {1, 1, 1},     /* a single element: only tails */
        {3, 5, 7},     /* smaller than one block everywhere */
        {7, 37, 29},   /* a block plus a tail in every dimension */
        {9, 16, 17},   /* full feature blocks, one extra output feature */
        {8, 64, 48},   /* exact multiples: only the blocked kernels */
        {13, 70, 100}, /* several blocks plus tails */
        {4, 200, 3},   /* long reduction for the forward and dweight, tiny OC */
        {61, 33, 40},  /* long reduction over rows for dweight, odd input features */
    };
    for (size_t k = 0; k < sizeof(shapes) / sizeof(shapes[0]); k++) {
        check_matmul(shapes[k], 1);
        check_matmul(shapes[k], 0);
    }

    test_section("vectorised exp (softmax_exp_row) against exp() in double");
    {
        const int n = 87001;  /* x from -87 to 0 in steps of 0.001, and a tail that is not a whole vector */
        float* x = (float*)mallocCheck(n * sizeof(float));
        float* e = (float*)mallocCheck(n * sizeof(float));
        for (int i = 0; i < n; i++) x[i] = -87.0f + 0.001f * (float)i;
        x[n - 1] = 0.0f;
        softmax_exp_row(e, x, 0.0f, n);
        double worst = 0.0;
        for (int i = 0; i < n; i++) {
            const double want = exp((double)x[i]);
            const double err = fabs(e[i] - want) / want;
            if (err > worst || isnan(err)) worst = isnan(err) ? INFINITY : err;
        }
        CHECK(worst < 4e-7, "max relative error over [-87, 0]: %.2e (< 4e-7, about 3 float ulp)", worst);
        CHECK(e[n - 1] == 1.0f, "e^0 = 1 exactly (got %.9g)", e[n - 1]);
        float low[3] = {-87.5f, -1000.0f, -3.0e38f}, low_e[3];
        softmax_exp_row(low_e, low, 0.0f, 3);
        CHECK(low_e[0] == low_e[1] && low_e[1] == low_e[2] && low_e[0] > 0 && low_e[0] < 2e-38f,
              "arguments below -87 give e^-87 (%.3g), finite and tiny, never NaN", low_e[0]);
        free(x);
        free(e);
    }

    test_section("softmax + cross-entropy against fp64");
    {
        const size_t N = 5;
        const int V = 1003, Vp = 1024;
        float* logits = random_buffer(N * Vp);
        for (size_t i = 0; i < N * Vp; i++) logits[i] *= 8.0f;
        for (int v = 0; v < Vp; v++) logits[3 * Vp + v] = v == 17 ? 1.0e4f : -1.0e4f * (float)(v % 3);  /* huge spread */
        for (size_t n = 0; n < N; n++) logits[n * Vp + V + 5] = 1.0e6f;  /* padding columns must not count */
        const int targets[5] = {0, V - 1, 500, 17, 3};
        float* probs = random_buffer(N * Vp);
        float losses[5];
        softmax_crossentropy_forward(probs, losses, logits, targets, N, V, Vp);
        double worst_p = 0.0, worst_loss = 0.0, worst_sum = 0.0;
        int padding_zero = 1;
        for (size_t n = 0; n < N; n++) {
            const float* z = logits + n * Vp;
            double maxz = z[0];
            for (int v = 1; v < V; v++) maxz = fmax(maxz, z[v]);
            double sum = 0.0;
            for (int v = 0; v < V; v++) sum += exp((double)z[v] - maxz);
            double psum = 0.0;
            for (int v = 0; v < V; v++) {
                const double want = exp((double)z[v] - maxz) / sum;
                worst_p = fmax(worst_p, fabs(probs[n * Vp + v] - want) / fmax(want, 1e-30));
                if (want < 1e-30) worst_p = fmax(worst_p, probs[n * Vp + v] > 1e-30 ? 1.0 : 0.0);
                psum += probs[n * Vp + v];
            }
            for (int v = V; v < Vp; v++) padding_zero &= probs[n * Vp + v] == 0.0f;
            worst_sum = fmax(worst_sum, fabs(psum - 1.0));
            const double loss = log(sum) + maxz - z[targets[n]];
            worst_loss = fmax(worst_loss, fabs(losses[n] - loss) / fmax(fabs(loss), 1.0));
        }
        CHECK(worst_p < 1e-6, "probabilities: worst relative error %.2e (< 1e-6)", worst_p);
        CHECK(worst_sum < 1e-5, "rows sum to 1 within %.2e (< 1e-5)", worst_sum);
        CHECK(worst_loss < 1e-6, "losses: worst relative error %.2e (< 1e-6)", worst_loss);
        CHECK(padding_zero, "columns >= V have probability exactly 0 (even with a huge padding logit)");
        CHECK(probs[3 * Vp + 17] == 1.0f && losses[3] == 0.0f,
              "a row with a 1e4 logit gap: p = %.9g, loss = %.3g (1 and 0)", probs[3 * Vp + 17], losses[3]);
        free(logits);
        free(probs);
    }
    return test_summary();
}
