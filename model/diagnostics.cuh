/*
 * model/diagnostics.cuh - the run diagnostics of model/diagnostics.h on the
 * GPU, over the trainer's BF16 activations, parameters and gradients.
 *
 * Why: the GPU trainer must watch the key offset, the key-bias drift and the
 * in-run dQ error every N steps without copying activations to the host. The
 * quantities and their definitions (which query rows, the median rule, NaN
 * propagation) are exactly those of the CPU code in model/diagnostics_cpu.c,
 * which tests/test_diagnostics_gpu.cu checks these kernels against. Results
 * stay on the device (one LayerDiag per layer, the same bytes as on the host)
 * until diag_cuda_fetch copies them back once per diagnostic step.
 *
 * Cost (bytes moved, per diagnostic step; docs/diagnostics.md has the figures):
 *   attention diagnostics, per layer: K read twice (mean, spread) and Q once
 *     (3 * N * C BF16), plus R sampled rows per (b, h) that each read the
 *     visible K twice (2 * B * NH * R * T/2 * HS BF16, mostly from L2);
 *   parameter norms: the gradient buffer once + the key biases;
 *   probe (one layer): one backward in the current mode plus one forward and
 *     one backward in fp32 mode, on the trainer's stream.
 * Reductions run in a fixed order (no atomics): same inputs, same numbers.
 *
 * Offers:
 *   DiagCuda, diag_cuda_init / diag_cuda_free (device scratch, sized once)
 *   diag_cuda_clear            - marks every layer "not measured" (NaN)
 *   diag_attention_cuda        - one layer's rho, max |q|/|k|, logit max, entropy
 *   diag_params_cuda           - per-layer gradient norms, key-bias norms and
 *                                the global gradient norm
 *   diag_probe_cuda            - enqueue the in-run probe of one layer (the
 *                                current mode against fp32 mode)
 *   diag_cuda_fetch            - copy everything back (synchronizes) and
 *                                summarise the probe on the host
 *   diag_zero_key_bias_grad_cuda - the --zero-key-bias-grad arm
 *   diag_capture_layer_cuda    - write one layer's Q, K, V, dO, O, stats to
 *                                an attention capture file (synchronizes)
 * Link: attention/attention_cuda.cu.o, model/diagnostics_cpu.o and the
 * attention CPU objects (metrics, capture writer).
 */
#ifndef MODEL_DIAGNOSTICS_CUH
#define MODEL_DIAGNOSTICS_CUH

#include <math.h>
#include <string.h>

#include "attention/attention_cuda.cuh"
#include "attention/attn_capture.h"
#include "attention/attn_metrics.h"
#include "model/diagnostics.h"
#include "model/kernel_common.cuh"

#define DIAG_MAX_HS 256          /* head sizes the row kernel's shared q can hold */
#define DIAG_KEY_CHUNKS 64       /* row chunks per head for the key mean / spread passes */
#define DIAG_THREADS 256
#define DIAG_PIECE_ELEMS (1 << 18) /* parameter-norm work item: 256K elements */

/* One contiguous run of parameters or gradients whose squares add into one slot. */
typedef struct {
    long long start;
    int count;
    int from_grads; /* 1: gradient buffer, 0: parameter buffer */
} DiagPiece;

typedef struct {
    GPTConfig cfg;
    ParamTensorInfo table[NUM_PARAM_TENSORS];
    int max_B, max_T, NH, HS, rows_per_head;
    LayerDiag* d_layers;       /* [L] device */
    LayerDiag* h_nan_layers;   /* [L] host, all NaN (for diag_cuda_clear) */
    /* attention scratch */
    float* d_key_partial;      /* [NH][DIAG_KEY_CHUNKS][HS] */
    double* d_key_mean;        /* [NH][HS] */
    float* d_spread_partial;   /* [NH][DIAG_KEY_CHUNKS] */
    float* d_absmax_partial;   /* [NH][DIAG_KEY_CHUNKS][2] */
    float* d_row_logit_max;    /* [B*NH*R] */
    float* d_row_entropy;      /* [B*NH*R] */
    float* d_rho;              /* [NH] */
    /* parameter norms: pieces grouped by slot (slot_begin[s] .. slot_begin[s+1]) */
    int num_slots;             /* 3L + 1: layer grads, key-bias params, key-bias grads, other grads */
    int num_pieces;
    DiagPiece* d_pieces;
    int* d_slot_begin;         /* [num_slots + 1] */
    float* d_piece_partial;    /* [num_pieces] */
    double* d_global_grad_sq;  /* [1] */
    /* probe scratch, allocated on first use */
    __nv_bfloat16* d_probe_dqkv_mode;
    __nv_bfloat16* d_probe_dqkv_ref;
    __nv_bfloat16* d_probe_out_ref;
    float* d_probe_stats_ref;
    void* d_probe_workspace;
    float* d_probe_err;        /* [2][B*NH]: dQ then dK relative errors per head */
    DiagProbe probe_pending;   /* what the enqueued probe was (layer -1: none) */
} DiagCuda;

/* ---------------------------------------------------------------- device helpers */

/* max that keeps a NaN once seen (fmaxf drops NaN and would hide a broken layer) */
__device__ __forceinline__ float diag_nan_max(float m, float v) { return ((v > m || isnan(v)) && !isnan(m)) ? v : m; }

__device__ __forceinline__ float diag_warp_nan_max(float v) {
    for (int off = 16; off > 0; off >>= 1) v = diag_nan_max(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}
/* NaN-propagating block max; blockDim.x a multiple of 32. Every thread gets the result. */
__device__ __forceinline__ float diag_block_nan_max(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = diag_warp_nan_max(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < warps ? partial[lane] : -INFINITY;
    return diag_warp_nan_max(v);
}
/* Block sum in double, fixed order; blockDim.x <= 1024, multiple of 32. */
__device__ __forceinline__ double diag_block_sum_double(double v) {
    __shared__ double partial[32];
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = lane < warps ? partial[lane] : 0.0;
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

__device__ __forceinline__ size_t diag_qkv_at(int T, int NH, int HS, int b, int t, int part, int h) {
    return ((((size_t)b * T + t) * 3 + part) * NH + h) * HS;
}

/* ---------------------------------------------------------------- attention kernels */

/* Pass 1, grid (DIAG_KEY_CHUNKS, NH): per (head, chunk of the N = B*T rows) the
   sum of the keys per dimension, and max |q|, max |k| of those rows. Thread
   (group g, dim d) walks rows g, g + groups, ... of the chunk. */
__global__ void diag_key_sum_kernel(float* key_partial, float* absmax_partial, const floatX* qkv, int N, int T,
                                    int NH, int HS) {
    __shared__ float sums[DIAG_THREADS];
    const int h = blockIdx.y, chunk = blockIdx.x;
    const int groups = DIAG_THREADS / HS, g = threadIdx.x / HS, d = threadIdx.x % HS;
    const int row0 = (int)((long long)chunk * N / DIAG_KEY_CHUNKS), row1 = (int)((long long)(chunk + 1) * N / DIAG_KEY_CHUNKS);
    float sum = 0.0f, qmax = 0.0f, kmax = 0.0f;
    if (g < groups) {
        for (int n = row0 + g; n < row1; n += groups) {
            const size_t base = diag_qkv_at(T, NH, HS, n / T, n % T, 0, h);
            const float q = to_float(qkv[base + d]);
            const float k = to_float(qkv[base + (size_t)NH * HS + d]);
            sum += k;
            qmax = diag_nan_max(qmax, fabsf(q));
            kmax = diag_nan_max(kmax, fabsf(k));
        }
    }
    sums[threadIdx.x] = sum;
    qmax = diag_block_nan_max(qmax);
    kmax = diag_block_nan_max(kmax);
    __syncthreads();
    if (threadIdx.x < HS) {
        float s = 0.0f;
        for (int gg = 0; gg < groups; gg++) s += sums[gg * HS + threadIdx.x];
        key_partial[((size_t)h * DIAG_KEY_CHUNKS + chunk) * HS + threadIdx.x] = s;
    }
    if (threadIdx.x == 0) {
        absmax_partial[((size_t)h * DIAG_KEY_CHUNKS + chunk) * 2 + 0] = qmax;
        absmax_partial[((size_t)h * DIAG_KEY_CHUNKS + chunk) * 2 + 1] = kmax;
    }
}

/* grid NH: mean key per head and dimension, in double, chunks added in order. */
__global__ void diag_key_mean_kernel(double* key_mean, const float* key_partial, int N, int HS) {
    const int h = blockIdx.x;
    for (int d = threadIdx.x; d < HS; d += blockDim.x) {
        double s = 0.0;
        for (int c = 0; c < DIAG_KEY_CHUNKS; c++) s += (double)key_partial[((size_t)h * DIAG_KEY_CHUNKS + c) * HS + d];
        key_mean[(size_t)h * HS + d] = s / (double)N;
    }
}

/* Pass 2, grid (DIAG_KEY_CHUNKS, NH): sum of ||k - mean||^2 over the chunk's rows
   (the deviation is formed before squaring: no cancellation at large rho). */
__global__ void diag_key_spread_kernel(float* spread_partial, const floatX* qkv, const double* key_mean, int N, int T,
                                       int NH, int HS) {
    const int h = blockIdx.y, chunk = blockIdx.x;
    const int groups = DIAG_THREADS / HS, g = threadIdx.x / HS, d = threadIdx.x % HS;
    const int row0 = (int)((long long)chunk * N / DIAG_KEY_CHUNKS), row1 = (int)((long long)(chunk + 1) * N / DIAG_KEY_CHUNKS);
    float acc = 0.0f;
    if (g < groups) {
        const float mean = (float)key_mean[(size_t)h * HS + d];
        for (int n = row0 + g; n < row1; n += groups) {
            const float dev = to_float(qkv[diag_qkv_at(T, NH, HS, n / T, n % T, 1, h) + d]) - mean;
            acc += dev * dev;
        }
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) spread_partial[(size_t)h * DIAG_KEY_CHUNKS + chunk] = acc;
}

/* grid B*NH*R: one sampled query row per block. Pass 1 finds the max logit
   s*q.k_j over the visible keys, pass 2 recomputes the logits and forms
   H = ln l - sum e (x - m) / l with e = exp(x - m). */
__global__ void diag_rows_kernel(float* row_logit_max, float* row_entropy, const floatX* qkv, int T, int NH, int HS,
                                 int rows_per_head, float scale) {
    __shared__ float q_s[DIAG_MAX_HS];
    const int R = diag_rows_used(rows_per_head, T);
    const int idx = blockIdx.x;
    const int r = idx % R, h = (idx / R) % NH, b = idx / (R * NH);
    const int t = diag_sample_row(r, rows_per_head, T);
    for (int d = threadIdx.x; d < HS; d += blockDim.x) q_s[d] = to_float(qkv[diag_qkv_at(T, NH, HS, b, t, 0, h) + d]);
    __syncthreads();
    float m = -INFINITY;
    for (int j = threadIdx.x; j <= t; j += blockDim.x) {
        const floatX* k = qkv + diag_qkv_at(T, NH, HS, b, j, 1, h);
        float dot = 0.0f;
        for (int d = 0; d < HS; d++) dot += q_s[d] * to_float(k[d]);
        m = diag_nan_max(m, scale * dot);
    }
    m = diag_block_nan_max(m);
    float l = 0.0f, ex = 0.0f;
    for (int j = threadIdx.x; j <= t; j += blockDim.x) {
        const floatX* k = qkv + diag_qkv_at(T, NH, HS, b, j, 1, h);
        float dot = 0.0f;
        for (int d = 0; d < HS; d++) dot += q_s[d] * to_float(k[d]);
        const float x = scale * dot - m;
        const float e = expf(x);
        l += e;
        ex += e * x;
    }
    l = block_sum(l);
    ex = block_sum(ex);
    if (threadIdx.x == 0) {
        row_logit_max[idx] = m;
        row_entropy[idx] = logf(l) - ex / l;
    }
}

/* One block: per-head rho, then max and median over heads (insertion sort,
   NaN last, mean of the middle two for even NH, as diag_median), max |q|,
   max |k|, max logit and mean entropy over the sampled rows, into *out. */
__global__ void diag_attention_finalize_kernel(LayerDiag* out, float* rho, const double* key_mean,
                                               const float* spread_partial, const float* absmax_partial,
                                               const float* row_logit_max, const float* row_entropy, int N, int NH,
                                               int HS, int num_rows) {
    for (int h = threadIdx.x; h < NH; h += blockDim.x) {
        double mean2 = 0.0, spread2 = 0.0;
        for (int d = 0; d < HS; d++) mean2 += key_mean[(size_t)h * HS + d] * key_mean[(size_t)h * HS + d];
        for (int c = 0; c < DIAG_KEY_CHUNKS; c++) spread2 += (double)spread_partial[(size_t)h * DIAG_KEY_CHUNKS + c];
        spread2 /= (double)N;
        rho[h] = (float)(spread2 > 0.0 ? sqrt(mean2) / sqrt(spread2) : (mean2 > 0.0 ? INFINITY : 0.0));
    }
    float qmax = 0.0f, kmax = 0.0f;
    for (int i = threadIdx.x; i < NH * DIAG_KEY_CHUNKS; i += blockDim.x) {
        qmax = diag_nan_max(qmax, absmax_partial[2 * i]);
        kmax = diag_nan_max(kmax, absmax_partial[2 * i + 1]);
    }
    float lmax = -INFINITY;
    double ent = 0.0;
    for (int i = threadIdx.x; i < num_rows; i += blockDim.x) {
        lmax = diag_nan_max(lmax, row_logit_max[i]);
        ent += (double)row_entropy[i];
    }
    qmax = diag_block_nan_max(qmax);
    kmax = diag_block_nan_max(kmax);
    lmax = diag_block_nan_max(lmax);
    ent = diag_block_sum_double(ent);
    __syncthreads(); /* rho[] complete */
    if (threadIdx.x == 0) {
        for (int i = 1; i < NH; i++) { /* sort ascending, NaN last */
            const float v = rho[i];
            int j = i - 1;
            while (j >= 0 && (isnan(rho[j]) ? !isnan(v) : (!isnan(v) && rho[j] > v))) {
                rho[j + 1] = rho[j];
                j--;
            }
            rho[j + 1] = v;
        }
        float rmax = -INFINITY;
        for (int i = 0; i < NH; i++) rmax = diag_nan_max(rmax, rho[i]);
        out->rho_max = rmax;
        out->rho_median = (NH % 2) ? rho[NH / 2] : 0.5f * (rho[NH / 2 - 1] + rho[NH / 2]);
        out->q_absmax = qmax;
        out->k_absmax = kmax;
        out->logit_max = lmax;
        out->entropy_mean = (float)(ent / (double)num_rows);
    }
}

/* ---------------------------------------------------------------- parameter-norm kernels */

/* grid num_pieces: sum of squares of one piece. */
__global__ void diag_piece_kernel(float* piece_partial, const DiagPiece* pieces, const floatX* params,
                                  const floatX* grads) {
    const DiagPiece p = pieces[blockIdx.x];
    const floatX* x = (p.from_grads ? grads : params) + p.start;
    float acc = 0.0f;
    for (int i = threadIdx.x; i < p.count; i += blockDim.x) {
        const float v = to_float(x[i]);
        acc += v * v;
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) piece_partial[blockIdx.x] = acc;
}

/* One block, a thread per slot: adds its pieces in order (double), writes the norms. */
__global__ void diag_params_finalize_kernel(LayerDiag* layers, double* global_grad_sq, const float* piece_partial,
                                            const int* slot_begin, int L) {
    __shared__ double slot_sq[1024];
    const int num_slots = 3 * L + 1;
    for (int s = threadIdx.x; s < num_slots; s += blockDim.x) {
        double acc = 0.0;
        for (int i = slot_begin[s]; i < slot_begin[s + 1]; i++) acc += (double)piece_partial[i];
        slot_sq[s] = acc;
    }
    __syncthreads();
    for (int l = threadIdx.x; l < L; l += blockDim.x) {
        layers[l].grad_norm = (float)sqrt(slot_sq[l]);
        layers[l].key_bias_norm = (float)sqrt(slot_sq[L + l]);
        layers[l].key_bias_grad_norm = (float)sqrt(slot_sq[2 * L + l]);
    }
    if (threadIdx.x == 0) {
        double g = slot_sq[3 * L];
        for (int l = 0; l < L; l++) g += slot_sq[l];
        *global_grad_sq = g;
    }
}

/* ---------------------------------------------------------------- probe kernel */

/* grid (B*NH, 2): per (b, h) and part (0 dQ, 1 dK) ||x - ref||_F / ||ref||_F
   (||x||_F when the reference is exactly zero, as attn_metrics does). */
__global__ void diag_probe_err_kernel(float* err, const floatX* dqkv, const floatX* dqkv_ref, int T, int NH, int HS) {
    const int bh = blockIdx.x, part = blockIdx.y, b = bh / NH, h = bh % NH;
    float diff2 = 0.0f, ref2 = 0.0f, x2 = 0.0f;
    for (int i = threadIdx.x; i < T * HS; i += blockDim.x) {
        const size_t at = diag_qkv_at(T, NH, HS, b, i / HS, part, h) + i % HS;
        const float x = to_float(dqkv[at]), r = to_float(dqkv_ref[at]);
        diff2 += (x - r) * (x - r);
        ref2 += r * r;
        x2 += x * x;
    }
    diff2 = block_sum(diff2);
    ref2 = block_sum(ref2);
    x2 = block_sum(x2);
    if (threadIdx.x == 0) err[(size_t)part * gridDim.x + bh] = ref2 > 0.0f ? sqrtf(diff2 / ref2) : sqrtf(x2);
}

/* ---------------------------------------------------------------- host API */

/* Sizes everything for batches up to (B, T) of cfg; rows_per_head as in
   diag_attention_cpu (DIAG_DEFAULT_ROWS_PER_HEAD is the suggested value). */
static void diag_cuda_init(DiagCuda* d, const GPTConfig* cfg, int B, int T, int rows_per_head) {
    memset(d, 0, sizeof *d);
    d->cfg = *cfg;
    gpt_param_table(cfg, d->table);
    const int L = cfg->num_layers;
    d->max_B = B;
    d->max_T = T;
    d->NH = cfg->num_heads;
    d->HS = cfg->channels / cfg->num_heads;
    d->rows_per_head = rows_per_head;
    if (d->HS > DIAG_MAX_HS)
        die("diag_cuda_init: head size %d is larger than the diagnostics support (%d); raise DIAG_MAX_HS in "
            "model/diagnostics.cuh", d->HS, DIAG_MAX_HS);
    if (3 * L + 1 > 1024) die("diag_cuda_init: %d layers is more than the parameter-norm kernel handles (341)", L);
    const int NH = d->NH, HS = d->HS, R = diag_rows_used(rows_per_head, T);
    cudaCheck(cudaMalloc((void**)&d->d_layers, (size_t)L * sizeof(LayerDiag)));
    d->h_nan_layers = (LayerDiag*)mallocCheck((size_t)L * sizeof(LayerDiag));
    diag_layers_clear(d->h_nan_layers, L);
    cudaCheck(cudaMemcpy(d->d_layers, d->h_nan_layers, (size_t)L * sizeof(LayerDiag), cudaMemcpyHostToDevice));
    cudaCheck(cudaMalloc((void**)&d->d_key_partial, (size_t)NH * DIAG_KEY_CHUNKS * HS * sizeof(float)));
    cudaCheck(cudaMalloc((void**)&d->d_key_mean, (size_t)NH * HS * sizeof(double)));
    cudaCheck(cudaMalloc((void**)&d->d_spread_partial, (size_t)NH * DIAG_KEY_CHUNKS * sizeof(float)));
    cudaCheck(cudaMalloc((void**)&d->d_absmax_partial, (size_t)NH * DIAG_KEY_CHUNKS * 2 * sizeof(float)));
    cudaCheck(cudaMalloc((void**)&d->d_row_logit_max, (size_t)B * NH * R * sizeof(float)));
    cudaCheck(cudaMalloc((void**)&d->d_row_entropy, (size_t)B * NH * R * sizeof(float)));
    cudaCheck(cudaMalloc((void**)&d->d_rho, (size_t)NH * sizeof(float)));

    /* parameter-norm pieces, grouped by slot: layer l's gradient (every per-layer
       tensor), key-bias params, key-bias grads, then the non-layer gradient tensors */
    d->num_slots = 3 * L + 1;
    int cap = 1024, n = 0;
    DiagPiece* pieces = (DiagPiece*)mallocCheck((size_t)cap * sizeof(DiagPiece));
    int* slot_begin = (int*)mallocCheck((size_t)(d->num_slots + 1) * sizeof(int));
#define DIAG_ADD_RANGE(START, COUNT, FROM_GRADS)                                                  \
    for (long long s0 = 0; s0 < (long long)(COUNT); s0 += DIAG_PIECE_ELEMS) {                     \
        if (n == cap) pieces = (DiagPiece*)realloc(pieces, (size_t)(cap *= 2) * sizeof(DiagPiece)); \
        if (pieces == NULL) die("diag_cuda_init: out of host memory");                            \
        pieces[n].start = (long long)(START) + s0;                                                \
        long long left = (long long)(COUNT) - s0;                                                 \
        pieces[n].count = (int)(left < DIAG_PIECE_ELEMS ? left : DIAG_PIECE_ELEMS);               \
        pieces[n].from_grads = (FROM_GRADS);                                                      \
        n++;                                                                                      \
    }
    const int C = cfg->channels;
    const long long key_bias0 = (long long)d->table[P_QKVB].offset + C;
    for (int l = 0; l < L; l++) {
        slot_begin[l] = n;
        for (int id = P_LN1W; id <= P_FCPROJB; id++) {
            const long long per = (long long)(d->table[id].count / (size_t)L);
            DIAG_ADD_RANGE(d->table[id].offset + l * per, per, 1)
        }
    }
    for (int l = 0; l < L; l++) {
        slot_begin[L + l] = n;
        DIAG_ADD_RANGE(key_bias0 + (long long)l * 3 * C, C, 0)
    }
    for (int l = 0; l < L; l++) {
        slot_begin[2 * L + l] = n;
        DIAG_ADD_RANGE(key_bias0 + (long long)l * 3 * C, C, 1)
    }
    slot_begin[3 * L] = n;
    for (int id = 0; id < NUM_PARAM_TENSORS; id++) {
        if (id >= P_LN1W && id <= P_FCPROJB) continue;
        DIAG_ADD_RANGE(d->table[id].offset, d->table[id].count, 1)
    }
    slot_begin[3 * L + 1] = n;
#undef DIAG_ADD_RANGE
    d->num_pieces = n;
    cudaCheck(cudaMalloc((void**)&d->d_pieces, (size_t)n * sizeof(DiagPiece)));
    cudaCheck(cudaMemcpy(d->d_pieces, pieces, (size_t)n * sizeof(DiagPiece), cudaMemcpyHostToDevice));
    cudaCheck(cudaMalloc((void**)&d->d_slot_begin, (size_t)(d->num_slots + 1) * sizeof(int)));
    cudaCheck(cudaMemcpy(d->d_slot_begin, slot_begin, (size_t)(d->num_slots + 1) * sizeof(int),
                         cudaMemcpyHostToDevice));
    cudaCheck(cudaMalloc((void**)&d->d_piece_partial, (size_t)n * sizeof(float)));
    cudaCheck(cudaMalloc((void**)&d->d_global_grad_sq, sizeof(double)));
    free(pieces);
    free(slot_begin);
    diag_probe_clear(&d->probe_pending);
}

static void diag_cuda_free(DiagCuda* d) {
    cudaCheck(cudaFree(d->d_layers));
    free(d->h_nan_layers);
    cudaCheck(cudaFree(d->d_key_partial));
    cudaCheck(cudaFree(d->d_key_mean));
    cudaCheck(cudaFree(d->d_spread_partial));
    cudaCheck(cudaFree(d->d_absmax_partial));
    cudaCheck(cudaFree(d->d_row_logit_max));
    cudaCheck(cudaFree(d->d_row_entropy));
    cudaCheck(cudaFree(d->d_rho));
    cudaCheck(cudaFree(d->d_pieces));
    cudaCheck(cudaFree(d->d_slot_begin));
    cudaCheck(cudaFree(d->d_piece_partial));
    cudaCheck(cudaFree(d->d_global_grad_sq));
    cudaCheck(cudaFree(d->d_probe_dqkv_mode));
    cudaCheck(cudaFree(d->d_probe_dqkv_ref));
    cudaCheck(cudaFree(d->d_probe_out_ref));
    cudaCheck(cudaFree(d->d_probe_stats_ref));
    cudaCheck(cudaFree(d->d_probe_workspace));
    cudaCheck(cudaFree(d->d_probe_err));
    memset(d, 0, sizeof *d);
}

/* Start of a diagnostic step: every field of every layer back to NaN (not
   measured), no probe pending. */
static void diag_cuda_clear(DiagCuda* d, cudaStream_t stream) {
    cudaCheck(cudaMemcpyAsync(d->d_layers, d->h_nan_layers, (size_t)d->cfg.num_layers * sizeof(LayerDiag),
                              cudaMemcpyHostToDevice, stream));
    diag_probe_clear(&d->probe_pending);
}

/* Attention diagnostics of layer `layer` from its qkv activations (BF16,
   attention.h layout, batch (B, T) <= the sizes given to diag_cuda_init). */
static void diag_attention_cuda(DiagCuda* d, int layer, const floatX* qkv, int B, int T, cudaStream_t stream) {
    if (layer < 0 || layer >= d->cfg.num_layers || B > d->max_B || T > d->max_T || B < 1 || T < 1)
        die("diag_attention_cuda: layer %d / batch %dx%d outside what diag_cuda_init sized (%d layers, %dx%d)", layer,
            B, T, d->cfg.num_layers, d->max_B, d->max_T);
    const int NH = d->NH, HS = d->HS, N = B * T, R = diag_rows_used(d->rows_per_head, T);
    const dim3 key_grid(DIAG_KEY_CHUNKS, NH);
    diag_key_sum_kernel<<<key_grid, DIAG_THREADS, 0, stream>>>(d->d_key_partial, d->d_absmax_partial, qkv, N, T, NH,
                                                               HS);
    cudaCheckLastError();
    diag_key_mean_kernel<<<NH, 128, 0, stream>>>(d->d_key_mean, d->d_key_partial, N, HS);
    cudaCheckLastError();
    diag_key_spread_kernel<<<key_grid, DIAG_THREADS, 0, stream>>>(d->d_spread_partial, qkv, d->d_key_mean, N, T, NH,
                                                                  HS);
    cudaCheckLastError();
    diag_rows_kernel<<<B * NH * R, 128, 0, stream>>>(d->d_row_logit_max, d->d_row_entropy, qkv, T, NH, HS,
                                                     d->rows_per_head, attn_softmax_scale(HS));
    cudaCheckLastError();
    diag_attention_finalize_kernel<<<1, DIAG_THREADS, 0, stream>>>(d->d_layers + layer, d->d_rho, d->d_key_mean,
                                                                   d->d_spread_partial, d->d_absmax_partial,
                                                                   d->d_row_logit_max, d->d_row_entropy, N, NH, HS,
                                                                   B * NH * R);
    cudaCheckLastError();
}

/* Gradient norms (per layer and global) and key-bias norms from the BF16
   parameter and gradient buffers (laid out by gpt_param_table). */
static void diag_params_cuda(DiagCuda* d, const floatX* params, const floatX* grads, cudaStream_t stream) {
    diag_piece_kernel<<<d->num_pieces, DIAG_THREADS, 0, stream>>>(d->d_piece_partial, d->d_pieces, params, grads);
    cudaCheckLastError();
    diag_params_finalize_kernel<<<1, 1024, 0, stream>>>(d->d_layers, d->d_global_grad_sq, d->d_piece_partial,
                                                        d->d_slot_begin, d->cfg.num_layers);
    cudaCheckLastError();
}

/*
 * Enqueues the in-run probe of one layer: the layer's backward in `mode`
 * (from the trainer's saved out and stats of that mode) and, as reference, a
 * forward + backward in fp32 mode on the same qkv and dout, each into the
 * probe's own scratch (the trainer's buffers are only read). dout is the
 * gradient w.r.t. the attention output of this layer, i.e. what the trainer
 * passes to attention_backward_cuda for it; call this right before or after
 * that call, before the buffer is reused. Results: diag_cuda_fetch.
 */
static void diag_probe_cuda(DiagCuda* d, AttnMode mode, AttnOptions opt, int layer, const floatX* qkv,
                            const floatX* out, const float* stats, const floatX* dout, int B, int T,
                            cudaStream_t stream) {
    const AttnShape s = {B, d->NH, T, d->HS};
    if (B > d->max_B || T > d->max_T) die("diag_probe_cuda: batch %dx%d larger than diag_cuda_init's %dx%d", B, T,
                                          d->max_B, d->max_T);
    if (d->d_probe_dqkv_mode == NULL) { /* first probe: allocate for the largest shape */
        const AttnShape smax = {d->max_B, d->NH, d->max_T, d->HS};
        size_t ws = 16;
        for (int m = 0; m < ATTN_NUM_MODES; m++) {
            size_t w = attention_cuda_workspace_bytes(smax, (AttnMode)m);
            ws = w > ws ? w : ws;
        }
        cudaCheck(cudaMalloc((void**)&d->d_probe_dqkv_mode, attn_qkv_count(smax) * sizeof(floatX)));
        cudaCheck(cudaMalloc((void**)&d->d_probe_dqkv_ref, attn_qkv_count(smax) * sizeof(floatX)));
        cudaCheck(cudaMalloc((void**)&d->d_probe_out_ref, attn_out_count(smax) * sizeof(floatX)));
        cudaCheck(cudaMalloc((void**)&d->d_probe_stats_ref, attn_stats_count(smax) * sizeof(float)));
        cudaCheck(cudaMalloc(&d->d_probe_workspace, ws));
        cudaCheck(cudaMalloc((void**)&d->d_probe_err, 2 * (size_t)d->max_B * d->NH * sizeof(float)));
    }
    attention_backward_cuda(mode, opt, s, qkv, out, stats, dout, d->d_probe_dqkv_mode, d->d_probe_workspace, stream);
    attention_forward_cuda(ATTN_FP32, opt, s, qkv, d->d_probe_out_ref, d->d_probe_stats_ref, d->d_probe_workspace,
                           stream);
    attention_backward_cuda(ATTN_FP32, opt, s, qkv, d->d_probe_out_ref, d->d_probe_stats_ref, dout,
                            d->d_probe_dqkv_ref, d->d_probe_workspace, stream);
    diag_probe_err_kernel<<<dim3(B * d->NH, 2), DIAG_THREADS, 0, stream>>>(d->d_probe_err, d->d_probe_dqkv_mode,
                                                                          d->d_probe_dqkv_ref, T, d->NH, d->HS);
    cudaCheckLastError();
    diag_probe_clear(&d->probe_pending);
    d->probe_pending.layer = layer;
    d->probe_pending.mode = mode;
    d->probe_pending.reference = DIAG_PROBE_REF_FP32;
    d->probe_pending.heads = B * d->NH;
}

/* Copies the per-layer results into host_layers[L] (and the global gradient
   norm, the probe summary when those pointers are not NULL); synchronizes the
   stream. probe->layer is -1 when no probe was enqueued since diag_cuda_clear. */
static void diag_cuda_fetch(DiagCuda* d, LayerDiag* host_layers, DiagProbe* probe, double* global_grad_norm,
                            cudaStream_t stream) {
    const int L = d->cfg.num_layers;
    double gsq = NAN;
    cudaCheck(cudaMemcpyAsync(host_layers, d->d_layers, (size_t)L * sizeof(LayerDiag), cudaMemcpyDeviceToHost,
                              stream));
    if (global_grad_norm)
        cudaCheck(cudaMemcpyAsync(&gsq, d->d_global_grad_sq, sizeof(double), cudaMemcpyDeviceToHost, stream));
    const int heads = d->probe_pending.heads;
    float* err = NULL;
    if (probe && d->probe_pending.layer >= 0) {
        err = (float*)mallocCheck(2 * (size_t)heads * sizeof(float));
        cudaCheck(cudaMemcpyAsync(err, d->d_probe_err, 2 * (size_t)heads * sizeof(float), cudaMemcpyDeviceToHost,
                                  stream));
    }
    cudaCheck(cudaStreamSynchronize(stream));
    if (global_grad_norm) *global_grad_norm = sqrt(gsq);
    if (probe) {
        *probe = d->probe_pending;
        if (err) {
            double* v = (double*)mallocCheck((size_t)heads * sizeof(double));
            for (int i = 0; i < heads; i++) v[i] = err[i];
            AttnErrStat sq = attn_err_stat_of(v, heads);
            for (int i = 0; i < heads; i++) v[i] = err[heads + i];
            AttnErrStat sk = attn_err_stat_of(v, heads);
            probe->dq_err_median = sq.median;
            probe->dq_err_max = sq.max;
            probe->dk_err_median = sk.median;
            probe->dk_err_max = sk.max;
            free(v);
        }
    }
    free(err);
}

/* --zero-key-bias-grad: zero qkvb[l][C:2C) of the BF16 gradient buffer for
   every layer (one strided memset). */
static void diag_zero_key_bias_grad_cuda(const GPTConfig* cfg, const ParamTensorInfo table[NUM_PARAM_TENSORS],
                                         floatX* grads, cudaStream_t stream) {
    const size_t C = (size_t)cfg->channels;
    cudaCheck(cudaMemset2DAsync(grads + table[P_QKVB].offset + C, 3 * C * sizeof(floatX), 0, C * sizeof(floatX),
                                (size_t)cfg->num_layers, stream));
}

/* Writes one layer's attention call from device buffers to
   diag_capture_path(dir, step, layer) as a BF16 capture file; out / stats
   may be NULL. Synchronizes the stream (capture steps are rare). */
static void diag_capture_layer_cuda(const char* dir, int64_t step, int layer, AttnMode mode, AttnShape s,
                                    const floatX* qkv, const floatX* out, const float* stats, const floatX* dout,
                                    cudaStream_t stream) {
    const size_t nqkv = attn_qkv_count(s), nout = attn_out_count(s), nst = attn_stats_count(s);
    uint16_t* h_qkv = (uint16_t*)mallocCheck(nqkv * sizeof(uint16_t));
    uint16_t* h_dout = (uint16_t*)mallocCheck(nout * sizeof(uint16_t));
    uint16_t* h_out = out ? (uint16_t*)mallocCheck(nout * sizeof(uint16_t)) : NULL;
    float* h_stats = stats ? (float*)mallocCheck(nst * sizeof(float)) : NULL;
    cudaCheck(cudaMemcpyAsync(h_qkv, qkv, nqkv * sizeof(uint16_t), cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaMemcpyAsync(h_dout, dout, nout * sizeof(uint16_t), cudaMemcpyDeviceToHost, stream));
    if (out) cudaCheck(cudaMemcpyAsync(h_out, out, nout * sizeof(uint16_t), cudaMemcpyDeviceToHost, stream));
    if (stats) cudaCheck(cudaMemcpyAsync(h_stats, stats, nst * sizeof(float), cudaMemcpyDeviceToHost, stream));
    cudaCheck(cudaStreamSynchronize(stream));
    AttnCaptureInfo info;
    memset(&info, 0, sizeof info);
    info.dtype = ATTN_CAPTURE_BF16;
    info.shape = s;
    info.layer = layer;
    info.step = step;
    info.attn_mode = (uint32_t)mode;
    char path[4096];
    diag_capture_path(path, sizeof path, dir, step, layer);
    attn_capture_write_module_bf16(path, &info, h_qkv, h_out, h_stats, h_dout);
    free(h_qkv);
    free(h_dout);
    free(h_out);
    free(h_stats);
}

#endif /* MODEL_DIAGNOSTICS_CUH */
