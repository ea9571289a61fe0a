/*
 * dev/bench_modern_layers.cu - time of each modern-stack kernel (RMSNorm,
 * RoPE, QK-norm, SwiGLU; forward and backward) at one model shape, with the
 * memory bandwidth it reaches.
 *
 * Why: issue 19 reports the cost of each option per step. This gives the
 * kernels' share directly, and the bandwidth figure says how far each one is
 * from the memory bound that docs/modern_stacks_gpu_kernels.md estimates. It
 * is not a test: it checks nothing numerically (test_modern_layers_gpu does).
 *
 * Usage: build/bench_modern_layers [B T C NH H [reps]]   (default d12: 32 1024 768 12 2048 50)
 * Prints one line per kernel: microseconds per call (median of reps, after 3
 * warm-up calls) and GB/s over the minimum bytes it moves (the table in the
 * doc). Inputs are random BF16 (unit normal). The backward calls accumulate
 * into or overwrite their gradient buffers call after call, so those values
 * drift; the kernels have no data-dependent branches and the build flushes
 * denormals (--use_fast_math), so the times do not depend on them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <algorithm>
#include <vector>

#include "model/kernel_common.cuh"
#include "model/rmsnorm.cuh"
#include "model/rope.cuh"
#include "model/qknorm.cuh"
#include "model/swiglu.cuh"

/* A device BF16 buffer of n random values (unit normal; a fixed-seed host generator). */
static floatX* random_bf16(size_t n, unsigned seed) {
    std::vector<floatX> h(n);
    srand(seed);
    for (size_t i = 0; i < n; i++) {
        const float u1 = (rand() + 1.0f) / ((float)RAND_MAX + 2.0f), u2 = rand() / (float)RAND_MAX;
        h[i] = __float2bfloat16(sqrtf(-2.0f * logf(u1)) * cosf(6.2831853f * u2));
    }
    floatX* d;
    cudaCheck(cudaMalloc(&d, n * sizeof(floatX)));
    cudaCheck(cudaMemcpy(d, h.data(), n * sizeof(floatX), cudaMemcpyHostToDevice));
    return d;
}

template <typename F>
static void bench(const char* name, double bytes, int reps, F launch) {
    cudaEvent_t a, b;
    cudaCheck(cudaEventCreate(&a));
    cudaCheck(cudaEventCreate(&b));
    for (int i = 0; i < 3; i++) launch();
    std::vector<float> ms(reps);
    for (int i = 0; i < reps; i++) {
        cudaCheck(cudaEventRecord(a));
        launch();
        cudaCheck(cudaEventRecord(b));
        cudaCheck(cudaEventSynchronize(b));
        cudaCheck(cudaEventElapsedTime(&ms[i], a, b));
    }
    std::sort(ms.begin(), ms.end());
    const double us = ms[reps / 2] * 1e3;
    printf("%-34s %9.1f us  %7.0f GB/s  (%.1f MB moved)\n", name, us, bytes / (us * 1e-6) / 1e9, bytes / 1e6);
    cudaCheck(cudaEventDestroy(a));
    cudaCheck(cudaEventDestroy(b));
}

int main(int argc, char** argv) {
    int B = 32, T = 1024, C = 768, NH = 12, H = 2048, reps = 50;
    if (argc != 1 && argc != 6 && argc != 7) die("usage: %s [B T C NH H [reps]]", argv[0]);
    if (argc >= 6) { B = atoi(argv[1]); T = atoi(argv[2]); C = atoi(argv[3]); NH = atoi(argv[4]); H = atoi(argv[5]); }
    if (argc == 7) reps = atoi(argv[6]);
    if (B < 1 || T < 1 || C % 8 || NH < 1 || C % NH || H % 8 || reps < 1)
        die("bench_modern_layers: need B, T >= 1, C % 8 == 0, C % NH == 0, H % 8 == 0, reps >= 1");
    const int N = B * T, HS = C / NH;
    const size_t NC = (size_t)N * C, QKV = 3 * NC;
    printf("bench_modern_layers: B %d T %d C %d NH %d HS %d H %d, median of %d calls\n", B, T, C, NH, HS, H, reps);

    floatX *x = random_bf16(NC, 1), *y = random_bf16(NC, 2), *out = random_bf16(NC, 3), *res = random_bf16(NC, 4);
    floatX *w = random_bf16(C, 5), *dw = random_bf16(C, 6), *dx = random_bf16(NC, 7);
    float *rstd, *scratch;
    const size_t scratch_floats = std::max(rownorm_backward_scratch_floats(N, C), qknorm_scratch_floats(N, NH, HS));
    cudaCheck(cudaMalloc(&rstd, (size_t)N * 2 * NH * sizeof(float)));
    cudaCheck(cudaMalloc(&scratch, scratch_floats * sizeof(float)));
    bench("rmsnorm forward", 4.0 * NC, reps, [&] { rmsnorm_forward(out, rstd, x, w, N, C, 0); });
    bench("rmsnorm forward, fused residual", 8.0 * NC, reps,
          [&] { fused_residual_rmsnorm_forward(res, out, rstd, x, y, w, N, C, 0); });
    bench("rmsnorm backward (dinp, dweight)", 12.0 * NC, reps,
          [&] { rmsnorm_backward(dx, dw, nullptr, scratch, y, res, w, rstd, N, C, 0); });

    floatX *qkv = random_bf16(QKV, 8), *qkv_out = random_bf16(QKV, 9), *gq = random_bf16(HS, 10);
    floatX *gk = random_bf16(HS, 11), *dgq = random_bf16(HS, 12), *dgk = random_bf16(HS, 13);
    if (HS % 16 == 0) {
        RopeCosSin* table = rope_table_upload(T, HS, 10000.0);
        bench("rope forward (in place)", 4.0 * 2 * NC, reps, [&] { rope_forward(qkv, table, T, B, T, NH, HS, 0); });
        bench("rope backward (in place)", 4.0 * 2 * NC, reps, [&] { rope_backward(qkv, table, T, B, T, NH, HS, 0); });
        cudaCheck(cudaFree(table));
    } else {
        printf("rope: skipped (HS %d is not a multiple of 16)\n", HS);
    }
    bench("qk-norm forward", 4.0 * QKV, reps, [&] { qknorm_forward(qkv_out, rstd, qkv, gq, gk, N, NH, HS, 0); });
    bench("qk-norm backward (in place, gains)", 10.0 * 2 * NC, reps,
          [&] { qknorm_backward(qkv_out, dgq, dgk, scratch, qkv, rstd, gq, gk, N, NH, HS, 0); });

    const size_t NHid = (size_t)N * H;
    floatX *u = random_bf16(2 * NHid, 14), *hbuf = random_bf16(NHid, 15), *du = random_bf16(2 * NHid, 16);
    bench("swiglu forward", 6.0 * NHid, reps, [&] { swiglu_forward(hbuf, u, N, H, 0); });
    bench("swiglu backward", 10.0 * NHid, reps, [&] { swiglu_backward(du, hbuf, u, N, H, 0); });
    for (floatX* p : {x, y, out, res, w, dw, dx, qkv, qkv_out, gq, gk, dgq, dgk, u, hbuf, du}) cudaCheck(cudaFree(p));
    cudaCheck(cudaFree(rstd));
    cudaCheck(cudaFree(scratch));
    return 0;
}
