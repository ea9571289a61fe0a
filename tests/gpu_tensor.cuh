/*
 * tests/gpu_tensor.cuh - what the GPU kernel tests share: BF16 device tensors
 * with an exact host mirror, deterministic random inputs, and the error
 * measures the tests hold kernels to.
 *
 * Why: every layer-kernel test (tests/test_layers_gpu.cu, the modern-stack
 * kernels' tests/test_modern_layers_gpu.cu) feeds a kernel the BF16 values
 * its fp64 reference reads and compares in the same way; one copy of those
 * helpers keeps the tolerances meaning the same thing in every test.
 * Tolerance REL_TOL_BF16: relative Frobenius error 1% over a tensor (a few
 * BF16 ulps of unit roundoff 2^-9; a wrong index or missing term gives errors
 * of order 100%).
 *
 * Offers: rand_uniform, rand_normal (xorshift, fixed seed), bf (round to
 * BF16), Tensor / tensor_new, download, download_f32, rel_error, check_rel,
 * same_bits, bf16_ulps, REL_TOL_BF16. One translation unit per test program.
 */
#ifndef TESTS_GPU_TENSOR_CUH
#define TESTS_GPU_TENSOR_CUH

#include <math.h>
#include <string.h>
#include <vector>
#include "tests/testing.h"
#include "model/kernel_common.cuh"

#define REL_TOL_BF16 1e-2

/* ---- host helpers: deterministic random numbers, BF16 round trips ---- */
static uint64_t g_rng = 0x243F6A8885A308D3ull;
static float rand_uniform(void) { /* [0, 1) */
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 16777216.0));
}
static float rand_normal(void) {
    const float u1 = rand_uniform() + 1e-7f, u2 = rand_uniform();
    return sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2);
}
static float bf(float x) { return __bfloat162float(__float2bfloat16(x)); }

/* A BF16 tensor with a host mirror holding exactly the device values. */
struct Tensor {
    size_t n;
    std::vector<float> host;
    floatX* dev;
};
static Tensor tensor_new(size_t n, float scale, float offset = 0.0f) {
    Tensor t;
    t.n = n;
    t.host.resize(n);
    std::vector<floatX> tmp(n);
    for (size_t i = 0; i < n; i++) {
        tmp[i] = __float2bfloat16(offset + scale * rand_normal());
        t.host[i] = __bfloat162float(tmp[i]);
    }
    cudaCheck(cudaMalloc(&t.dev, n * sizeof(floatX)));
    cudaCheck(cudaMemcpy(t.dev, tmp.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
    return t;
}
/* A new device buffer holding a copy of n BF16 values of src. */
static floatX* dev_copy(const floatX* src, size_t n) {
    floatX* d;
    cudaCheck(cudaMalloc(&d, n * sizeof(floatX)));
    cudaCheck(cudaMemcpy(d, src, n * sizeof(floatX), cudaMemcpyDeviceToDevice));
    return d;
}
static std::vector<float> download(const floatX* dev, size_t n) {
    std::vector<floatX> tmp(n);
    cudaCheck(cudaMemcpy(tmp.data(), dev, n * sizeof(floatX), cudaMemcpyDeviceToHost));
    std::vector<float> out(n);
    for (size_t i = 0; i < n; i++) out[i] = __bfloat162float(tmp[i]);
    return out;
}
static std::vector<float> download_f32(const float* dev, size_t n) {
    std::vector<float> out(n);
    cudaCheck(cudaMemcpy(out.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
}
static double rel_error(const std::vector<float>& got, const std::vector<double>& want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); i++) {
        const double d = (double)got[i] - want[i];
        num += d * d;
        den += want[i] * want[i];
        if (isnan(got[i])) return INFINITY;
    }
    return sqrt(num / (den > 0 ? den : 1e-300));
}
static void check_rel(const char* what, const std::vector<float>& got, const std::vector<double>& want, double tol) {
    const double e = rel_error(got, want);
    CHECK(e <= tol, "%s: relative error %.3e (tolerance %.1e)", what, e, tol);
}
static int same_bits(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/* Distance of got from want in BF16 ulps at want's magnitude (the spacing of
   BF16 numbers there: 8 significant bits), with magnitudes below `floor`
   counted as `floor`: where a formula cancels (GELU's negative tail, where
   1 + tanh(u) does), FP32 itself keeps only an absolute accuracy. */
static double bf16_ulps(float got, double want, double floor) {
    const double mag = fmax(fabs(want), floor);
    int e;
    frexp(mag, &e); /* mag = f * 2^e, f in [0.5, 1) */
    const double ulp = ldexp(1.0, e - 8);
    return fabs((double)got - want) / ulp;
}

#endif /* TESTS_GPU_TENSOR_CUH */
