/*
 * dev/bench_matmul.cu - how much a timed choice of cuBLASLt algorithm would buy over the heuristic's first, per
 * GEMM of a GPT-2 training step (a GPU tool).
 *
 * Why: the step's GEMMs are about 60% of its time (dev/results/), and model/matmul.cuh runs the algorithm the
 * cuBLASLt heuristic lists first. Whether picking by timing is worth its cost (a tuning pass at start-up, the
 * choice kept in the resume state so a resumed run repeats its bits) depends on what the faster algorithms
 * buy at the shapes a step really runs: this tool measures exactly that, with matmul.cuh's own plans.
 *
 * For every GEMM of one training step of --model at --batch x --seq (the forward's four per layer with their
 * epilogues, the head, the backward's input and weight gradients), it times the heuristic's first algorithm
 * and each of its first --candidates (median of --repeats launches on random data, after a warm-up), and
 * prints per GEMM: the first's time, the fastest and its rank, and, weighted by how often the step runs the
 * GEMM, the step's GEMM time under both choices.
 *
 * Usage: build/dev/bench_matmul [--model d12] [--batch 32] [--seq 1024] [--candidates 16] [--repeats 20]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <vector>
#include "model/gpt_config.h"
#include "model/matmul.cuh"

namespace {

struct Gemm {
    const char* name;
    MatmulKey key;
    int per_step; /* launches per training step */
};

/* The GEMMs of one training step, in matmul.cuh's column-major terms (see its wrappers). */
std::vector<Gemm> step_gemms(const GPTConfig& cfg, int N) {
    const int C = cfg.channels, L = cfg.num_layers, Vp = cfg.padded_vocab_size, H = cfg.mlp_hidden;
    std::vector<Gemm> g;
    /* forward: out[N, OC] = inp[N, K] W^T: m = OC, n = N, k = K, A transposed */
    g.push_back({"qkv fwd (bias)", matmul_key(3 * C, N, C, 1, 0, 0, MATMUL_EPILOGUE_BIAS), L});
    g.push_back({"attproj fwd (bias)", matmul_key(C, N, C, 1, 0, 0, MATMUL_EPILOGUE_BIAS), L});
    g.push_back({"fc fwd (gelu_aux_bias)", matmul_key(H, N, C, 1, 0, 0, MATMUL_EPILOGUE_GELU_AUX_BIAS), L});
    g.push_back({"fcproj fwd (bias)", matmul_key(C, N, H, 1, 0, 0, MATMUL_EPILOGUE_BIAS), L});
    g.push_back({"head fwd", matmul_key(Vp, N, C, 1, 0, 0, MATMUL_EPILOGUE_NONE), 1});
    /* input gradients: dinp[N, K] = dout[N, OC] W: m = K, n = N, k = OC */
    g.push_back({"head dinp", matmul_key(C, N, Vp, 0, 0, 0, MATMUL_EPILOGUE_NONE), 1});
    g.push_back({"fcproj dinp (dgelu)", matmul_key(H, N, C, 0, 0, 0, MATMUL_EPILOGUE_DGELU), L});
    g.push_back({"fc dinp", matmul_key(C, N, H, 0, 0, 0, MATMUL_EPILOGUE_NONE), L});
    g.push_back({"attproj dinp", matmul_key(C, N, C, 0, 0, 0, MATMUL_EPILOGUE_NONE), L});
    g.push_back({"qkv dinp", matmul_key(C, N, 3 * C, 0, 0, 0, MATMUL_EPILOGUE_NONE), L});
    /* weight gradients: dW[OC, K] += dout^T inp: m = K, n = OC, k = N, B transposed, accumulating */
    g.push_back({"head dW", matmul_key(C, Vp, N, 0, 1, 1, MATMUL_EPILOGUE_NONE), 1});
    g.push_back({"fcproj dW", matmul_key(H, C, N, 0, 1, 1, MATMUL_EPILOGUE_NONE), L});
    g.push_back({"fc dW", matmul_key(C, H, N, 0, 1, 1, MATMUL_EPILOGUE_NONE), L});
    g.push_back({"attproj dW", matmul_key(C, C, N, 0, 1, 1, MATMUL_EPILOGUE_NONE), L});
    g.push_back({"qkv dW", matmul_key(C, 3 * C, N, 0, 1, 1, MATMUL_EPILOGUE_NONE), L});
    return g;
}

__global__ void fill_random(floatX* x, size_t n, unsigned seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        x[i] = from_float(((float)(h & 0xffffff) / 16777216.0f - 0.5f) * scale);
    }
}

floatX* random_buffer(size_t n, unsigned seed, float scale) {
    floatX* p;
    cudaCheck(cudaMalloc(&p, n * sizeof(floatX)));
    fill_random<<<1024, 256>>>(p, n, seed, scale);
    cudaCheckLastError();
    return p;
}

/* Median ms of `repeats` launches of the plan with `algo` (after 3 warm-ups), each timed by its own events. */
float time_algo(MatmulContext* ctx, MatmulPlan* plan, const cublasLtMatmulAlgo_t* algo, floatX* d, const floatX* a,
                const floatX* b, MatmulEpilogueArgs args, int repeats) {
    for (int i = 0; i < 3; i++) matmul_plan_run(ctx, plan, algo, d, a, b, args, 0);
    std::vector<float> ms(repeats);
    cudaEvent_t e0, e1;
    cudaCheck(cudaEventCreate(&e0));
    cudaCheck(cudaEventCreate(&e1));
    for (int i = 0; i < repeats; i++) {
        cudaCheck(cudaEventRecord(e0));
        matmul_plan_run(ctx, plan, algo, d, a, b, args, 0);
        cudaCheck(cudaEventRecord(e1));
        cudaCheck(cudaEventSynchronize(e1));
        cudaCheck(cudaEventElapsedTime(&ms[i], e0, e1));
    }
    cudaCheck(cudaEventDestroy(e0));
    cudaCheck(cudaEventDestroy(e1));
    std::sort(ms.begin(), ms.end());
    return ms[repeats / 2];
}

}  // namespace

int main(int argc, char** argv) {
    const char* model = "d12";
    int B = 32, T = 1024, candidates = 16, repeats = 20;
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        const char* v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) die("bench_matmul: %s needs a value (usage: see the file comment)", a);
        if (!strcmp(a, "--model")) model = v;
        else if (!strcmp(a, "--batch")) B = atoi(v);
        else if (!strcmp(a, "--seq")) T = atoi(v);
        else if (!strcmp(a, "--candidates")) candidates = atoi(v);
        else if (!strcmp(a, "--repeats")) repeats = atoi(v);
        else die("bench_matmul: unknown flag %s (flags: --model --batch --seq --candidates --repeats)", a);
        i++;
    }
    if (B < 1 || T < 1 || candidates < 1 || repeats < 1) die("bench_matmul: batch, seq, candidates, repeats >= 1");
    GPTConfig cfg;
    char err[256];
    if (gpt_config_from_descriptor(model, &cfg, err, sizeof(err)) != 0) die("bench_matmul: %s", err);
    const int N = B * T;
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    printf("bench_matmul: %s, model %s B%d T%d (N %d, C %d, H %d, Vp %d, L %d), first %d candidates, median of %d\n",
           prop.name, model, B, T, N, cfg.channels, cfg.mlp_hidden, cfg.padded_vocab_size, cfg.num_layers,
           candidates, repeats);
    MatmulContext ctx;
    matmul_context_init(&ctx);
    std::vector<Gemm> gemms = step_gemms(cfg, N);
    printf("%-24s %6s %6s %6s %4s %9s %9s %6s %7s %7s\n", "gemm", "m", "n", "k", "algs", "first ms", "best ms",
           "rank", "TFLOP/s", "x/step");
    double step_first = 0, step_best = 0;
    std::vector<cublasLtMatmulHeuristicResult_t> results(candidates);
    for (const Gemm& g : gemms) {
        const MatmulKey& k = g.key;
        MatmulPlan plan;
        matmul_plan_make(&ctx, k, &plan);
        floatX* a = random_buffer((size_t)k.m * k.k, 1u, 1.0f);
        floatX* b = random_buffer((size_t)k.n * k.k, 2u, 1.0f);
        floatX* d = random_buffer((size_t)k.m * k.n, 3u, 0.01f);
        floatX* bias = matmul_key_needs_bias(k.epilogue) ? random_buffer(k.m, 4u, 0.1f) : nullptr;
        floatX* aux = matmul_key_needs_aux(k.epilogue) ? random_buffer((size_t)k.m * k.n, 5u, 2.0f) : nullptr;
        const MatmulEpilogueArgs args = {bias, aux};
        const int found = matmul_plan_candidates(&ctx, &plan, results.data(), candidates);
        float first = 0, best = 1e30f;
        int best_rank = 0;
        for (int r = 0; r < found; r++) {
            if (results[r].state != CUBLAS_STATUS_SUCCESS) continue;
            const float ms = time_algo(&ctx, &plan, &results[r].algo, d, a, b, args, repeats);
            if (r == 0) first = ms;
            if (ms < best) best = ms, best_rank = r;
        }
        const double flops = 2.0 * k.m * (double)k.n * k.k;
        printf("%-24s %6d %6d %6d %4d %9.4f %9.4f %6d %7.0f %7d\n", g.name, k.m, k.n, k.k, found, first, best,
               best_rank, flops / (best * 1e-3) / 1e12, g.per_step);
        step_first += (double)first * g.per_step;
        step_best += (double)best * g.per_step;
        matmul_plan_destroy(&plan);
        for (floatX* p : {a, b, d, bias, aux})
            if (p) cudaCheck(cudaFree(p));
    }
    printf("step GEMM time: heuristic's first %.3f ms, fastest of the first %d %.3f ms (%.2f%% less)\n", step_first,
           candidates, step_best, 100.0 * (step_first - step_best) / step_first);
    matmul_context_free(&ctx);
    return 0;
}
