/*
 * dev/bench_attention.cu - times our CUDA attention, forward and
 * forward+backward, in every mode, on the shapes the project's performance
 * targets name (docs/DESIGN.md: bf16 mode at least equal to PyTorch's cuDNN
 * SDPA; gproj and fp32 costs over bf16).
 *
 * Why its own program: the numbers are only comparable with
 * dev/bench_attention_torch.py (PyTorch SDPA, cuDNN and flash backends) if
 * both measure the same way, so both follow the same recipe:
 *   - random non-zero BF16 inputs (q, k, v, dO ~ N(0,1)), in the module's
 *     fused layout qkv [B, T, 3, NH, HS];
 *   - several input sets rotated from one launch to the next, together at
 *     least 3x the L2 cache, so no launch finds its inputs already cached;
 *   - warm-up launches, then CUDA-event timing of every launch and the
 *     median over many repeats; the GPU is held in a short spin kernel while
 *     the timed launches are queued, so host launch overhead never shows up
 *     as GPU idle time inside a timed interval;
 *   - FLOPs counted as FlashAttention counts them: causal forward
 *     4*B*H*T*T*D/2, backward 2.5x that, forward+backward 3.5x.
 * Backward is timed on its own too (it reads the out and stats that the same
 * mode's forward wrote for that input set). After timing, out and dqkv are
 * checked for NaN/Inf so a broken kernel cannot post a fast time unnoticed: its
 * row is marked NON-FINITE and the program exits 1 after the table.
 *
 * scripts/bench_attention.sh runs this and the PyTorch script in one go and
 * writes the comparison table; --jsonl is the format they share.
 * Paths: a mode name times the default kernels (on an sm_90 device the Hopper
 * wgmma forward, attention/cuda/hopper/attention_hopper.cuh, and the Hopper passes of the
 * backward at HS 64 and 128, attention/cuda/hopper/attention_hopper_bwd.cuh; elsewhere the
 * portable mma.sync kernels); "MODE:portable" times the same mode with
 * AttnOptions.force_portable = 1, i.e. the whole portable path, forward AND
 * backward, so `--modes bf16,bf16:portable` puts all-default next to
 * all-portable. Its rows and JSON objects carry variant "MODE:portable" (the
 * script's table lists only the plain names); every row says which forward
 * and which backward ran ("fwd: hopper|portable, bwd: hopper|portable"; JSON
 * fields "fwd_path", "bwd_path").
 * cudnn mode (cuDNN's own fused kernel, attention/cudnn/) is timed the same way, next to ours, in a build
 * with cuDNN (default list there; fwd_path / bwd_path "cudnn"). Its first call per shape builds cuDNN's plan,
 * which the forward run before the timing absorbs; it has neither a portable path nor a deterministic
 * backward, so "cudnn:portable" is refused and its ":det" rows are skipped with a note.
 * Deterministic backward: --deterministic on times every chosen (mode, path) with AttnOptions.deterministic = 1
 * (docs/determinism.md), --deterministic both times each twice, flag off then on, in adjacent rows; the "on"
 * rows and JSON objects carry the variant suffix ":det" and the JSON field "deterministic": 1, so the cost of
 * the fixed summation order reads off per mode in one run.
 * Usage: build/bench_attention --help
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "attention/attention.h"
#include "attention/attention_cuda.cuh"
#include "attention/cudnn/attention_cudnn.cuh"
#include "common/cuda_utils.cuh"
#include "common/utils.h"

/* The shapes of the performance targets (DESIGN.md, issue 4). */
static const AttnShape k_default_shapes[] = {
    {8, 16, 1024, 64}, {4, 16, 2048, 64}, {8, 8, 1024, 128}, {2, 16, 4096, 128}};
#define MAX_SHAPES 32
#define L2_MULTIPLE 3    /* the rotated input sets together span >= this many L2 caches */
#define MAX_INPUT_SETS 64

typedef struct {
    AttnShape shapes[MAX_SHAPES];
    int num_shapes;
    int modes[ATTN_NUM_MODES];          /* 1 = benchmark this mode (default forward path) */
    int portable_modes[ATTN_NUM_MODES]; /* 1 = also/only "MODE:portable" (force_portable = 1); never cudnn */
    int det_first, det_last;   /* AttnOptions.deterministic values timed: off 0..0, on 1..1, both 0..1 */
    int warmup;
    int repeats;
    uint64_t seed;
    const char* jsonl_path;    /* NULL: no machine-readable output */
} BenchArgs;

static void print_help(void) {
    printf(
        "bench_attention - time our causal attention (forward, backward, forward+backward) per mode\n"
        "\n"
        "usage: build/bench_attention [options]\n"
        "  --shape B,H,T,D    a shape to time (repeatable); default: 8,16,1024,64 4,16,2048,64\n"
        "                     8,8,1024,128 2,16,4096,128. Head size D must be one the kernels support (64, 128).\n"
        "  --modes LIST       comma-separated subset of %s (default: all; cudnn, cuDNN's own\n"
        "                     kernel, only in a build with cuDNN); a name with the suffix :portable\n"
        "                     (bf16:portable) times that mode on the whole portable mma.sync path, forward and\n"
        "                     backward (force_portable), next to the default one (on sm_90 the Hopper forward\n"
        "                     and backward kernels; cudnn has no portable path); rows say which ran\n"
        "  --deterministic off|on|both\n"
        "                     the backward's AttnOptions.deterministic: off (default), on (rows \"MODE:det\"), or\n"
        "                     both: each mode and path timed with it off and on, in adjacent rows (cudnn has\n"
        "                     no deterministic backward: its on rows are skipped with a note)\n"
        "  --warmup N         untimed launches per measurement (default 5)\n"
        "  --repeats N        timed launches per measurement; the median is reported (default 30)\n"
        "  --seed N           input seed (default 1234)\n"
        "  --jsonl FILE       also append one JSON object per (shape, mode) to FILE (the format\n"
        "                     scripts/bench_attention.sh merges with dev/bench_attention_torch.py's)\n"
        "  --help             this text\n"
        "\n"
        "FLOPs as FlashAttention counts them: causal forward 4*B*H*T*T*D/2, backward 2.5x, forward+backward 3.5x.\n"
        "Inputs are random N(0,1) BF16, rotated over enough sets to exceed 3x the L2 cache. Needs an NVIDIA GPU.\n",
        attn_mode_choices());
}

static int parse_positive(const char* flag, const char* text) {
    char* end = NULL;
    long v = strtol(text, &end, 10);
    if (end == text || *end != '\0' || v < 1 || v > 1000000)
        die("%s %s: expected a positive integer", flag, text);
    return (int)v;
}

/* --modes: comma-separated mode names, each optionally with the suffix ":portable"; sets the flags of
   each named (mode, path) and returns how many were named. Dies naming the bad entry. */
static int parse_mode_list(const char* list, int modes[ATTN_NUM_MODES], int portable_modes[ATTN_NUM_MODES]) {
    static const char k_portable_suffix[] = ":portable";
    const size_t suffix_len = sizeof k_portable_suffix - 1;
    int named = 0;
    const char* p = list;
    while (*p) {
        const char* comma = strchr(p, ',');
        const size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char name[64];
        if (len == 0 || len >= sizeof name) die("--modes %s: empty or overlong entry (choices: %s[:portable])", list,
                                                attn_mode_choices());
        memcpy(name, p, len);
        name[len] = '\0';
        int portable = 0;
        if (len > suffix_len && strcmp(name + len - suffix_len, k_portable_suffix) == 0) {
            portable = 1;
            name[len - suffix_len] = '\0';
        }
        AttnMode mode;
        if (attn_mode_parse(name, &mode) != 0)
            die("--modes %s: unknown mode '%s' (choices: %s, each optionally with :portable)", list, name,
                attn_mode_choices());
        if (mode == ATTN_CUDNN) {
            if (portable)
                die("--modes %s: cudnn is cuDNN's own kernel and has no portable path (no cudnn:portable)\n"
                    "  hint: name it as plain cudnn", list);
            attention_cudnn_require("bench_attention --modes cudnn");
        }
        (portable ? portable_modes : modes)[mode] = 1;
        named++;
        p += len + (comma ? 1 : 0);
    }
    return named;
}

static void parse_args(int argc, char** argv, BenchArgs* a) {
    memset(a, 0, sizeof *a);
    a->warmup = 5;
    a->repeats = 30;
    a->seed = 1234;
    int any_mode = 0;
    for (int i = 1; i < argc; i++) {
        const char* flag = argv[i];
        if (strcmp(flag, "--help") == 0 || strcmp(flag, "-h") == 0) {
            print_help();
            exit(0);
        }
        if (i + 1 >= argc) die("%s needs a value (see --help)", flag);
        const char* val = argv[++i];
        if (strcmp(flag, "--shape") == 0) {
            if (a->num_shapes >= MAX_SHAPES) die("--shape: at most %d shapes", MAX_SHAPES);
            AttnShape s;
            char tail;
            if (sscanf(val, "%d,%d,%d,%d%c", &s.B, &s.NH, &s.T, &s.HS, &tail) != 4 || s.B < 1 || s.NH < 1 ||
                s.T < 1 || s.HS < 1)
                die("--shape %s: expected B,H,T,D with four positive integers, e.g. --shape 8,16,1024,64", val);
            a->shapes[a->num_shapes++] = s;
        } else if (strcmp(flag, "--modes") == 0) {
            if (parse_mode_list(val, a->modes, a->portable_modes) > 0) any_mode = 1;
        } else if (strcmp(flag, "--deterministic") == 0) {
            if (strcmp(val, "off") == 0) a->det_first = a->det_last = 0;
            else if (strcmp(val, "on") == 0) a->det_first = a->det_last = 1;
            else if (strcmp(val, "both") == 0) a->det_first = 0, a->det_last = 1;
            else die("--deterministic %s: expected off, on or both", val);
        } else if (strcmp(flag, "--warmup") == 0) {
            a->warmup = parse_positive(flag, val);
        } else if (strcmp(flag, "--repeats") == 0) {
            a->repeats = parse_positive(flag, val);
        } else if (strcmp(flag, "--seed") == 0) {
            a->seed = strtoull(val, NULL, 10);
        } else if (strcmp(flag, "--jsonl") == 0) {
            a->jsonl_path = val;
        } else {
            die("unknown option '%s' (see --help)", flag);
        }
    }
    if (a->num_shapes == 0) {
        a->num_shapes = (int)(sizeof k_default_shapes / sizeof k_default_shapes[0]);
        memcpy(a->shapes, k_default_shapes, sizeof k_default_shapes);
    }
    if (!any_mode) {
        for (int m = 0; m < ATTN_NUM_EMULATED_MODES; m++) a->modes[m] = 1;
        a->modes[ATTN_CUDNN] = attention_cudnn_available();
    }
}

/* ---- device helpers ---- */

/* splitmix64 of (seed, index): independent per element, no state. */
__device__ static uint64_t mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* N(0,1) BF16 values by Box-Muller; an exact zero is replaced by a small value
   so that every input is non-zero. */
__global__ static void fill_normal_bf16(__nv_bfloat16* x, size_t n, uint64_t seed) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint64_t r = mix64(seed * 0x100000001B3ull + i);
        float u1 = ((float)(r >> 40) + 1.0f) * (1.0f / 16777217.0f);  /* (0, 1] */
        float u2 = (float)((r >> 16) & 0xFFFFFF) * (1.0f / 16777216.0f);
        float z = sqrtf(-2.0f * logf(u1)) * cospif(2.0f * u2);
        __nv_bfloat16 b = __float2bfloat16(z);
        if (__bfloat162float(b) == 0.0f) b = __float2bfloat16(0.01f);
        x[i] = b;
    }
}

/* Keeps the GPU busy for `ns` nanoseconds (one thread), so the launches queued
   behind it start back to back. */
__global__ static void spin_for_ns(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

__global__ static void count_nonfinite_bf16(const __nv_bfloat16* x, size_t n, unsigned long long* count) {
    unsigned long long local = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        local += !isfinite(__bfloat162float(x[i]));
    if (local) atomicAdd(count, local);
}

/* One input set: everything a forward and a backward read and write. */
typedef struct {
    __nv_bfloat16* qkv;
    __nv_bfloat16* out;
    __nv_bfloat16* dout;
    __nv_bfloat16* dqkv;
    float* stats;
} InputSet;

static size_t input_set_bytes(AttnShape s) {
    return (2 * attn_qkv_count(s) + 2 * attn_out_count(s)) * sizeof(__nv_bfloat16) +
           attn_stats_count(s) * sizeof(float);
}

static void fill(__nv_bfloat16* x, size_t n, uint64_t seed) {
    fill_normal_bf16<<<1024, 256>>>(x, n, seed);
    cudaCheckLastError();
}

static void alloc_input_set(InputSet* set, AttnShape s, uint64_t seed) {
    cudaCheck(cudaMalloc((void**)&set->qkv, attn_qkv_count(s) * sizeof(__nv_bfloat16)));
    cudaCheck(cudaMalloc((void**)&set->out, attn_out_count(s) * sizeof(__nv_bfloat16)));
    cudaCheck(cudaMalloc((void**)&set->dout, attn_out_count(s) * sizeof(__nv_bfloat16)));
    cudaCheck(cudaMalloc((void**)&set->dqkv, attn_qkv_count(s) * sizeof(__nv_bfloat16)));
    cudaCheck(cudaMalloc((void**)&set->stats, attn_stats_count(s) * sizeof(float)));
    fill(set->qkv, attn_qkv_count(s), seed * 4 + 0);
    fill(set->dout, attn_out_count(s), seed * 4 + 1);
    cudaCheck(cudaMemset(set->out, 0, attn_out_count(s) * sizeof(__nv_bfloat16)));
    cudaCheck(cudaMemset(set->dqkv, 0, attn_qkv_count(s) * sizeof(__nv_bfloat16)));
    cudaCheck(cudaMemset(set->stats, 0, attn_stats_count(s) * sizeof(float)));
}

static void free_input_set(InputSet* set) {
    cudaCheck(cudaFree(set->qkv));
    cudaCheck(cudaFree(set->out));
    cudaCheck(cudaFree(set->dout));
    cudaCheck(cudaFree(set->dqkv));
    cudaCheck(cudaFree(set->stats));
}

typedef enum { OP_FWD = 0, OP_BWD = 1, OP_FWDBWD = 2, NUM_OPS = 3 } BenchOp;
static const char* const k_op_names[NUM_OPS] = {"fwd", "bwd", "fwd+bwd"};
/* FLOPs of each op in units of the causal forward's 4*B*H*T*T*D/2. */
static const double k_op_flop_factor[NUM_OPS] = {1.0, 2.5, 3.5};

static void run_op(BenchOp op, AttnMode mode, AttnOptions opt, AttnShape s, const InputSet* set, void* workspace,
                   cudaStream_t stream) {
    if (op == OP_FWD || op == OP_FWDBWD)
        attention_forward_cuda(mode, opt, s, set->qkv, set->out, set->stats, workspace, stream);
    if (op == OP_BWD || op == OP_FWDBWD)
        attention_backward_cuda(mode, opt, s, set->qkv, set->out, set->stats, set->dout, set->dqkv, workspace, stream);
}

static int cmp_float(const void* a, const void* b) {
    float x = *(const float*)a, y = *(const float*)b;
    return (x > y) - (x < y);
}

/* Median milliseconds of `repeats` launches of op, input sets rotated. */
static double time_op(BenchOp op, AttnMode mode, AttnOptions opt, AttnShape s, const InputSet* sets, int num_sets,
                      void* workspace, int warmup, int repeats, cudaStream_t stream) {
    for (int r = 0; r < warmup; r++) run_op(op, mode, opt, s, &sets[r % num_sets], workspace, stream);
    cudaEvent_t* start = (cudaEvent_t*)mallocCheck(sizeof(cudaEvent_t) * repeats);
    cudaEvent_t* stop = (cudaEvent_t*)mallocCheck(sizeof(cudaEvent_t) * repeats);
    for (int r = 0; r < repeats; r++) {
        cudaCheck(cudaEventCreate(&start[r]));
        cudaCheck(cudaEventCreate(&stop[r]));
    }
    /* 2 ms plus 50 us per launch: longer than queueing them all takes */
    spin_for_ns<<<1, 1, 0, stream>>>(2000000ull + 50000ull * (unsigned long long)repeats);
    cudaCheckLastError();
    for (int r = 0; r < repeats; r++) {
        /* offset by warmup so the first timed launch does not reuse the last warm-up's set */
        const InputSet* set = &sets[(warmup + r) % num_sets];
        cudaCheck(cudaEventRecord(start[r], stream));
        run_op(op, mode, opt, s, set, workspace, stream);
        cudaCheck(cudaEventRecord(stop[r], stream));
    }
    cudaCheckLastError();
    cudaCheck(cudaStreamSynchronize(stream));
    float* ms = (float*)mallocCheck(sizeof(float) * repeats);
    for (int r = 0; r < repeats; r++) {
        cudaCheck(cudaEventElapsedTime(&ms[r], start[r], stop[r]));
        cudaCheck(cudaEventDestroy(start[r]));
        cudaCheck(cudaEventDestroy(stop[r]));
    }
    qsort(ms, (size_t)repeats, sizeof(float), cmp_float);
    double median = (repeats % 2) ? ms[repeats / 2] : 0.5 * (ms[repeats / 2 - 1] + ms[repeats / 2]);
    free(ms);
    free(start);
    free(stop);
    return median;
}

static unsigned long long count_nonfinite(const __nv_bfloat16* x, size_t n, unsigned long long* d_count) {
    cudaCheck(cudaMemset(d_count, 0, sizeof(unsigned long long)));
    count_nonfinite_bf16<<<1024, 256>>>(x, n, d_count);
    cudaCheckLastError();
    unsigned long long h = 0;
    cudaCheck(cudaMemcpy(&h, d_count, sizeof h, cudaMemcpyDeviceToHost));
    return h;
}

int main(int argc, char** argv) {
    BenchArgs args;
    parse_args(argc, argv, &args);

    int num_devices = 0;
    cudaError_t err = cudaGetDeviceCount(&num_devices);
    if (err != cudaSuccess || num_devices == 0) {
        fprintf(stderr, "error: bench_attention needs an NVIDIA GPU, and none is usable here (%s).\n"
                "  hint: run it on a GPU machine, e.g. through scripts/bench_attention.sh there\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "no CUDA devices");
        return 1;
    }
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    FILE* jsonl = args.jsonl_path ? fopenCheck(args.jsonl_path, "a") : NULL;
    printf("bench_attention on %s (sm_%d%d, %d SMs, L2 %.0f MiB); median of %d launches after %d warm-up\n",
           prop.name, prop.major, prop.minor, prop.multiProcessorCount, prop.l2CacheSize / 1048576.0,
           args.repeats, args.warmup);
    if (args.modes[ATTN_CUDNN])
        printf("cudnn: cuDNN %ld (built against %ld), cuDNN's fused SDPA through its backend API\n",
               attention_cudnn_version(), attention_cudnn_header_version());
    printf("%-20s %-16s %10s %10s %10s %11s %11s %11s %s\n", "shape", "mode", "fwd ms", "bwd ms", "f+b ms",
           "fwd TF/s", "bwd TF/s", "f+b TF/s", "NaN/Inf");
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    unsigned long long* d_count;
    int rows_nonfinite = 0; /* rows whose outputs had NaN or Inf: the exit status is 1 then */
    cudaCheck(cudaMalloc((void**)&d_count, sizeof(unsigned long long)));

    for (int si = 0; si < args.num_shapes; si++) {
        const AttnShape s = args.shapes[si];
        size_t set_bytes = input_set_bytes(s);
        int num_sets = (int)((L2_MULTIPLE * (size_t)prop.l2CacheSize + set_bytes - 1) / set_bytes);
        if (num_sets < 2) num_sets = 2;
        if (num_sets > MAX_INPUT_SETS) num_sets = MAX_INPUT_SETS;
        size_t workspace_bytes = 0;
        for (int m = 0; m < ATTN_NUM_MODES; m++) {
            if (!args.modes[m] && !args.portable_modes[m]) continue;
            attention_cuda_check_shape(s, (AttnMode)m);
            if (m == ATTN_CUDNN) continue; /* cuDNN owns its workspace (attention/cudnn/) */
            AttnOptions ws_opt = {};
            ws_opt.deterministic = args.det_last; /* the larger of the workspaces timed */
            size_t w = attention_cuda_workspace_bytes(s, (AttnMode)m, ws_opt);
            if (w > workspace_bytes) workspace_bytes = w;
        }
        InputSet* sets = (InputSet*)mallocCheck(sizeof(InputSet) * num_sets);
        for (int i = 0; i < num_sets; i++) alloc_input_set(&sets[i], s, args.seed * 1000 + (uint64_t)i);
        void* workspace = NULL;
        if (workspace_bytes) cudaCheck(cudaMalloc(&workspace, workspace_bytes));
        cudaCheck(cudaDeviceSynchronize());
        char shape_name[64];
        snprintf(shape_name, sizeof shape_name, "B%d H%d T%d D%d", s.B, s.NH, s.T, s.HS);
        const double fwd_flops = 4.0 * s.B * s.NH * (double)s.T * s.T * s.HS / 2.0;

        for (int m = 0; m < ATTN_NUM_MODES; m++)
            for (int force_portable = 0; force_portable <= 1; force_portable++)
            for (int det = args.det_first; det <= args.det_last; det++) {
                if (!(force_portable ? args.portable_modes[m] : args.modes[m])) continue;
                const AttnMode mode = (AttnMode)m;
                if (mode == ATTN_CUDNN && det) {
                    printf("%-20s %-16s skipped: cudnn has no deterministic backward\n", shape_name, "cudnn:det");
                    continue;
                }
                AttnOptions path_opt;
                memset(&path_opt, 0, sizeof path_opt);
                path_opt.force_portable = force_portable;
                path_opt.deterministic = det;
                const char* fwd_path = attn_fwd_path_name(attention_forward_cuda_path(mode, path_opt, s, sets[0].qkv));
                const char* bwd_path =
                    attn_bwd_path_name(attention_backward_cuda_path(mode, path_opt, s, sets[0].qkv, sets[0].dout));
                char variant[32];
                snprintf(variant, sizeof variant, "%s%s%s", attn_mode_name(mode), force_portable ? ":portable" : "",
                         det ? ":det" : "");
                /* every set gets this mode's out and stats before its backward is timed alone */
                for (int i = 0; i < num_sets; i++) run_op(OP_FWD, mode, path_opt, s, &sets[i], workspace, stream);
                double ms[NUM_OPS];
                for (int op = 0; op < NUM_OPS; op++)
                    ms[op] = time_op((BenchOp)op, mode, path_opt, s, sets, num_sets, workspace, args.warmup,
                                     args.repeats, stream);
                unsigned long long bad = 0;
                for (int i = 0; i < num_sets; i++)
                    bad += count_nonfinite(sets[i].out, attn_out_count(s), d_count) +
                           count_nonfinite(sets[i].dqkv, attn_qkv_count(s), d_count);
                rows_nonfinite += bad != 0;
                double tflops[NUM_OPS];
                for (int op = 0; op < NUM_OPS; op++)
                    tflops[op] = k_op_flop_factor[op] * fwd_flops / (ms[op] * 1e-3) / 1e12;
                printf("%-20s %-16s %10.4f %10.4f %10.4f %11.1f %11.1f %11.1f %llu%s  (fwd: %s, bwd: %s)\n", shape_name,
                       variant, ms[OP_FWD], ms[OP_BWD], ms[OP_FWDBWD], tflops[OP_FWD], tflops[OP_BWD],
                       tflops[OP_FWDBWD], bad, bad ? "  <- NON-FINITE OUTPUTS" : "", fwd_path, bwd_path);
                fflush(stdout);
                if (jsonl) {
                    fprintf(jsonl,
                            "{\"impl\": \"ours\", \"variant\": \"%s\", \"fwd_path\": \"%s\", \"bwd_path\": \"%s\", "
                            "\"deterministic\": %d, \"B\": %d, \"H\": %d, \"T\": %d, \"D\": %d",
                            variant, fwd_path, bwd_path, det, s.B, s.NH, s.T, s.HS);
                    for (int op = 0; op < NUM_OPS; op++)
                        fprintf(jsonl, ", \"%s_ms\": %.6f, \"%s_tflops\": %.3f",
                                op == OP_FWDBWD ? "fwdbwd" : k_op_names[op], ms[op],
                                op == OP_FWDBWD ? "fwdbwd" : k_op_names[op], tflops[op]);
                    fprintf(jsonl, ", \"nonfinite\": %llu, \"input_sets\": %d, \"repeats\": %d, \"device\": \"%s\"}\n",
                            bad, num_sets, args.repeats, prop.name);
                    fflush(jsonl);
                }
            }
        for (int i = 0; i < num_sets; i++) free_input_set(&sets[i]);
        free(sets);
        if (workspace) cudaCheck(cudaFree(workspace));
    }
    cudaCheck(cudaFree(d_count));
    cudaCheck(cudaStreamDestroy(stream));
    if (jsonl) fcloseCheck(jsonl);
    printf("FLOPs: causal fwd 4*B*H*T*T*D/2, bwd 2.5x, fwd+bwd 3.5x (FlashAttention's count)\n");
    if (rows_nonfinite) {
        fprintf(stderr, "bench_attention: %d row(s) above had NaN/Inf outputs (marked NON-FINITE): their kernels are "
                        "broken and their times mean nothing\n  hint: build/tests/test_attention_gpu names the failing "
                        "check\n", rows_nonfinite);
        return 1;
    }
    return 0;
}
