/*
 * dev/profile_gpu_step.cu - tokens/s of the GPU training step and where its
 * time goes, per kernel kind, for each attention mode.
 *
 * Why: "is our step faster than PyTorch's, and if not, which kernels are to
 * blame" needs the same step the trainer runs (model/gpt_cuda.cuh: forward,
 * backward, norm, AdamW) timed without the data loader, and a breakdown by
 * kernel kind. Unprofiled steps give tokens/s (wall clock over the timed
 * steps, synchronized); a second set of steps records CUDA events between
 * kernel groups (GpuProfiler) and charges each interval to its kind. Random
 * tokens, like the PyTorch twin's speed baseline (dev/gpt_twin.py), so
 * scripts/bench_train.sh compares like with like.
 *
 * Usage: build/dev/profile_gpu_step [--model d12] [--batch 32] [--seq 1024]
 *        [--recompute 0] [--attn all|fp32|bf16|repair|gproj] [--steps 10] [--matmul-tune 0]
 * --matmul-tune N: the GEMM algorithms as train_gpt --matmul-tune N chooses them (gpt_cuda_choose_matmul_algos:
 * N > 0 the fastest of the heuristic's first N, timed once before the first mode's steps; 0, the default: the
 * heuristic's first).
 * Prints, per mode: "ours: ... tokens/s" and the breakdown table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "model/gpt_cuda.cuh"
extern "C" {
#include "model/gpt_cpu.h"
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static void one_step(GPTCuda* m, const int* inputs, const int* targets, int B, int T, int step) {
    gpt_cuda_zero_grad(m);
    gpt_cuda_loss_reset(m);
    gpt_cuda_forward(m, inputs, targets, B, T, 1.0f / (B * T));
    gpt_cuda_backward(m);
    AdamWHyper h = {6e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, step + 1};
    gpt_cuda_update(m, h, 1.0f);
    (void)gpt_cuda_loss_read(m);
}

int main(int argc, char** argv) {
    const char* model_name = "d12";
    const char* attn = "all";
    int B = 32, T = 1024, recompute = 0, steps = 10, tune = 0; /* recompute, tune: the trainer's defaults */
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--model")) model_name = argv[i + 1];
        else if (!strcmp(argv[i], "--batch")) B = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seq")) T = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--recompute")) recompute = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--attn")) attn = argv[i + 1];
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--matmul-tune")) tune = atoi(argv[i + 1]);
        else die("unknown argument '%s'\n  usage: profile_gpu_step [--model NAME] [--batch B] [--seq T] "
                 "[--recompute 0|1|2] [--attn all|%s] [--steps N] [--matmul-tune N]", argv[i], attn_mode_choices());
    }
    char err[256];
    GPTConfig cfg;
    if (gpt_config_from_descriptor(model_name, &cfg, err, sizeof(err)) != 0) die("--model: %s", err);
    if (T > cfg.max_seq_len) die("--seq %d exceeds the model's context %d", T, cfg.max_seq_len);
    int modes[ATTN_NUM_EMULATED_MODES], num_modes = 0;
    if (!strcmp(attn, "all")) {
        for (int i = 0; i < ATTN_NUM_EMULATED_MODES; i++) modes[num_modes++] = i;
    } else {
        AttnMode md;
        if (attn_mode_parse(attn, &md) != 0) die("--attn '%s': choose all|%s", attn, attn_mode_choices());
        modes[num_modes++] = md;
    }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    const GpuMemoryPlan plan = gpt_cuda_memory_plan(&cfg, B, T, recompute);
    size_t free_b, total_b;
    cudaCheck(cudaMemGetInfo(&free_b, &total_b));
    if (plan.total_bytes + (512ull << 20) > free_b)
        die("needs %.2f GiB, %.2f GiB free: lower --batch or raise --recompute", plan.total_bytes / 1073741824.0,
            free_b / 1073741824.0);
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    GPTCuda m;
    gpt_cuda_init(&m, &cfg, B, T, recompute, (AttnMode)modes[0], stream);
    float* w = (float*)mallocCheck(m.num_params * sizeof(float));
    gpt_init_params(&cfg, w, 1337);
    gpt_cuda_set_params(&m, w);
    free(w);
    const int N = B * T;
    int* inputs = (int*)mallocCheck(sizeof(int) * N);
    int* targets = (int*)mallocCheck(sizeof(int) * N);
    uint64_t r = 1234567;
    for (int i = 0; i < N; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        inputs[i] = (int)((r >> 33) % cfg.vocab_size);
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        targets[i] = (int)((r >> 33) % cfg.vocab_size);
    }
    {
        MatmulTuneSummary t;
        char terr[256];
        gpt_cuda_choose_matmul_algos(&m, tune, NULL, 0, &t, terr, sizeof(terr));
        printf("gemm algorithms: %s (%d shapes timed, %d changed: %.2f -> %.2f ms per micro-step by the timings)\n",
               tune > 0 ? "timed" : "the heuristic's first", t.timed, t.changed, t.first_ms, t.chosen_ms);
    }
    GpuProfiler* prof = (GpuProfiler*)callocCheck(1, sizeof(GpuProfiler));
    for (int i = 0; i < PROFILER_MAX_MARKS; i++) cudaCheck(cudaEventCreate(&prof->events[i]));
    const double C = cfg.channels, L = cfg.num_layers, Vp = cfg.padded_vocab_size;
    const double flops_per_token = 6.0 * (L * 12.0 * C * C + Vp * C) + 3.0 * L * 2.0 * C * T;
    printf("profile_gpu_step: %s, model %s (%zu params) B%d T%d recompute %d, %d timed steps per mode\n", prop.name,
           model_name, m.num_params, B, T, recompute, steps);
    int step = 0;
    for (int k = 0; k < num_modes; k++) {
        m.attn_mode = (AttnMode)modes[k];
        m.profiler = NULL;
        for (int i = 0; i < 3; i++) one_step(&m, inputs, targets, B, T, step++); /* warm-up (cuBLASLt, clocks) */
        cudaCheck(cudaStreamSynchronize(stream));
        const double t0 = now_s();
        for (int i = 0; i < steps; i++) one_step(&m, inputs, targets, B, T, step++);
        cudaCheck(cudaStreamSynchronize(stream));
        const double dt = (now_s() - t0) / steps;
        const double tps = N / dt;
        printf("ours: model %s B%d T%d attn=%s recompute=%d: %.2f ms/step, %.0f tokens/s, MFU %.1f%% (989 TFLOP/s peak)\n",
               model_name, B, T, attn_mode_name(m.attn_mode), recompute, dt * 1e3, tps,
               100.0 * flops_per_token * tps / 989e12);
        memset(prof->ms, 0, sizeof(prof->ms));
        m.profiler = prof;
        for (int i = 0; i < steps; i++) {
            one_step(&m, inputs, targets, B, T, step++);
            prof_flush(&m);
        }
        double total = 0;
        for (int p = 0; p < NUM_PHASES; p++) total += prof->ms[p];
        printf("  %-28s %10s %7s\n", "kernel kind", "ms/step", "share");
        for (int p = 0; p < NUM_PHASES; p++)
            printf("  %-28s %10.3f %6.1f%%\n", gpu_phase_names[p], prof->ms[p] / steps, 100.0 * prof->ms[p] / total);
        printf("  %-28s %10.3f (GPU time between the first and last event; wall %.3f)\n", "total", total / steps,
               dt * 1e3);
    }
    m.profiler = NULL;
    for (int i = 0; i < PROFILER_MAX_MARKS; i++) cudaCheck(cudaEventDestroy(prof->events[i]));
    free(prof); free(inputs); free(targets);
    gpt_cuda_free(&m);
    return 0;
}
