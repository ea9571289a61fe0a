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
 *     (3 * N * C BF16, 16-byte loads), plus the sampled rows: each block of
 *     DIAG_ROWS_PER_BLOCK rows of one (b, h) reads the keys up to its last
 *     row once, coalesced, into shared memory (N * C BF16 per layer at the
 *     default 32 rows per head, mostly from L2: Q and K were just read);
 *   parameter norms: the gradient buffer once + the key biases (16-byte loads);
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
 * Link: attention/cuda/attention_cuda.cu.o, model/diagnostics_cpu.o and the
 * attention CPU objects (metrics, capture writer).
 */
#ifndef MODEL_DIAGNOSTICS_CUH
#define MODEL_DIAGNOSTICS_CUH

#include <math.h>
#include <string.h>

#include "attention/attention_cuda.cuh"
#include "attention/support/attn_capture.h"
#include "attention/support/attn_metrics.h"
#include "model/diagnostics.h"
#include "model/kernel_common.cuh"

#define DIAG_MAX_HS 256          /* largest head size (the row kernel's shared memory is ~99 KB at 256) */
#define DIAG_KEY_CHUNKS 64       /* row chunks per head for the key mean / spread passes */
#define DIAG_THREADS 256
#define DIAG_ROW_WARPS 8         /* warps per block of the sampled-row kernel (in pairs) */
#define DIAG_ROW_GROUP 4         /* adjacent sampled rows scored together: one key read serves 4 dots */
#define DIAG_ROWS_PER_BLOCK (DIAG_ROW_WARPS * DIAG_ROW_GROUP) /* two groups per warp pair */
#define DIAG_KEY_TILE 64         /* keys staged in shared memory at a time: 32 per warp of a pair */
#define DIAG_KEY_PAD 4           /* floats after each staged key row: lanes' 16-byte reads hit distinct banks */
#define DIAG_FINALIZE_THREADS 1024 /* one block: a warp per head for rho, every thread on the sampled rows */
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
   (group g, pack p) reads dimensions 8p .. 8p+7 of rows g, g + groups, ... of
   the chunk as 16-byte vectors; the groups' sums are then added in group order. */
__global__ void diag_key_sum_kernel(float* key_partial, float* absmax_partial, const floatX* qkv, int N, int T,
                                    int NH, int HS) {
    __shared__ float sums[DIAG_THREADS * 8];
    const int h = blockIdx.y, chunk = blockIdx.x;
    const int packs = HS / 8, groups = DIAG_THREADS / packs, g = threadIdx.x / packs, p = threadIdx.x % packs;
    const int row0 = (int)((long long)chunk * N / DIAG_KEY_CHUNKS), row1 = (int)((long long)(chunk + 1) * N / DIAG_KEY_CHUNKS);
    float sum[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    float qmax = 0.0f, kmax = 0.0f;
    if (g < groups) {
        for (int n = row0 + g; n < row1; n += groups) {
            const size_t base = diag_qkv_at(T, NH, HS, n / T, n % T, 0, h) + 8 * p;
            const Pack8 q = load_pack8(qkv + base), k = load_pack8(qkv + base + (size_t)NH * HS);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float kv = to_float(k.v[e]);
                sum[e] += kv;
                qmax = diag_nan_max(qmax, fabsf(to_float(q.v[e])));
                kmax = diag_nan_max(kmax, fabsf(kv));
            }
        }
    }
#pragma unroll
    for (int e = 0; e < 8; e++) sums[threadIdx.x * 8 + e] = sum[e]; /* = sums[g * HS + 8p + e] */
    qmax = diag_block_nan_max(qmax);
    kmax = diag_block_nan_max(kmax);
    __syncthreads();
    for (int d = threadIdx.x; d < HS; d += blockDim.x) {
        float s = 0.0f;
        for (int gg = 0; gg < groups; gg++) s += sums[gg * HS + d];
        key_partial[((size_t)h * DIAG_KEY_CHUNKS + chunk) * HS + d] = s;
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
   (the deviation is formed before squaring: no cancellation at large rho).
   Same (group, pack) split as pass 1. */
__global__ void diag_key_spread_kernel(float* spread_partial, const floatX* qkv, const double* key_mean, int N, int T,
                                       int NH, int HS) {
    const int h = blockIdx.y, chunk = blockIdx.x;
    const int packs = HS / 8, groups = DIAG_THREADS / packs, g = threadIdx.x / packs, p = threadIdx.x % packs;
    const int row0 = (int)((long long)chunk * N / DIAG_KEY_CHUNKS), row1 = (int)((long long)(chunk + 1) * N / DIAG_KEY_CHUNKS);
    float acc = 0.0f;
    if (g < groups) {
        float mean[8];
#pragma unroll
        for (int e = 0; e < 8; e++) mean[e] = (float)key_mean[(size_t)h * HS + 8 * p + e];
        for (int n = row0 + g; n < row1; n += groups) {
            const Pack8 k = load_pack8(qkv + diag_qkv_at(T, NH, HS, n / T, n % T, 1, h) + 8 * p);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float dev = to_float(k.v[e]) - mean[e];
                acc += dev * dev;
            }
        }
    }
    acc = block_sum(acc);
    if (threadIdx.x == 0) spread_partial[(size_t)h * DIAG_KEY_CHUNKS + chunk] = acc;
}

/* Shared memory of diag_rows_kernel: the block's query rows, then one tile of
   keys, both as FP32 (each key row padded by DIAG_KEY_PAD floats). */
static inline size_t diag_rows_smem_bytes(int HS) {
    return ((size_t)DIAG_ROWS_PER_BLOCK * HS + (size_t)DIAG_KEY_TILE * (HS + DIAG_KEY_PAD)) * sizeof(float);
}

/* Eight BF16 values to eight FP32 values at dst (16-byte aligned). */
__device__ __forceinline__ void diag_store_pack8_float(float* dst, const Pack8& v) {
    reinterpret_cast<float4*>(dst)[0] = make_float4(to_float(v.v[0]), to_float(v.v[1]), to_float(v.v[2]), to_float(v.v[3]));
    reinterpret_cast<float4*>(dst)[1] = make_float4(to_float(v.v[4]), to_float(v.v[5]), to_float(v.v[6]), to_float(v.v[7]));
}

/* Online softmax statistics of a stream of logits s_j: m = max s_j (NaN once a
   NaN is seen), l = sum e_j, a = sum e_j x_j with x_j = s_j - m, e_j = exp(x_j).
   A state with l == 0 is empty (m = -inf). When m grows to m', every term of l
   and a is rescaled by c = exp(m - m') and a's x_j shift by (m - m'):
   a' = c (a + (m - m') l). The entropy is H = ln l - a / l. */
__device__ __forceinline__ void diag_softmax_push(float& m, float& l, float& a, float s) {
    if (s > m || isnan(s)) {
        const float c = l != 0.0f ? expf(m - s) : 0.0f;
        a = l != 0.0f ? c * (a + (m - s) * l) : 0.0f;
        l = c * l + 1.0f;
        m = s;
    } else {
        const float x = s - m, e = expf(x);
        l += e;
        a += e * x;
    }
}
/* (m, l, a) <- the statistics of both streams together; symmetric in its two
   arguments, so a butterfly leaves every lane with the same bits. */
__device__ __forceinline__ void diag_softmax_merge(float& m, float& l, float& a, float m2, float l2, float a2) {
    const float mm = diag_nan_max(m, m2);
    float ln = 0.0f, an = 0.0f;
    if (l != 0.0f) {
        const float c = expf(m - mm);
        ln += c * l;
        an += c * (a + (m - mm) * l);
    }
    if (l2 != 0.0f) {
        const float c = expf(m2 - mm);
        ln += c * l2;
        an += c * (a2 + (m2 - mm) * l2);
    }
    m = mm;
    l = ln;
    a = an;
}

/* grid (B*NH, ceil(R / DIAG_ROWS_PER_BLOCK)), DIAG_ROW_WARPS warps, dynamic
   shared memory diag_rows_smem_bytes(HS). Block (bh, y) takes the sampled rows
   r = y * DIAG_ROWS_PER_BLOCK + i of head bh, in groups of DIAG_ROW_GROUP
   adjacent rows (similar lengths). The warps work in pairs; pair p owns groups
   p and G-1-p of the G = 2 * pairs groups (one short and one long: equal work
   per pair). The keys 0 .. t of the block's last row pass through shared
   memory in tiles of DIAG_KEY_TILE (coalesced 16-byte loads, each key read
   once per block); in a tile, lane j of the pair's warp w scores key
   32 w + j against all rows of a group at once (each key vector read once for
   DIAG_ROW_GROUP FP32 dots, each in dimension order, times the softmax scale)
   and pushes each visible logit into that row's online statistics. At the end
   the statistics are merged over the lanes, then over the pair. Output per
   row: the max logit m and H = ln l - sum e (x - m) / l, at index bh * R + r. */
__global__ void __launch_bounds__(DIAG_ROW_WARPS * 32, 3)
    diag_rows_kernel(float* row_logit_max, float* row_entropy, const floatX* qkv, int T, int NH, int HS,
                     int rows_per_head, float scale) {
    constexpr int kGroups = DIAG_ROWS_PER_BLOCK / DIAG_ROW_GROUP, kPairs = DIAG_ROW_WARPS / 2;
    constexpr int kRows = 2 * DIAG_ROW_GROUP; /* rows of one warp: two groups */
    static_assert(kGroups == 2 * kPairs && DIAG_KEY_TILE == 64, "two groups per warp pair, 32 keys per warp");
    extern __shared__ float4 diag_rows_smem[];
    __shared__ float pair_stats[kPairs][kRows][3];
    float* q_s = reinterpret_cast<float*>(diag_rows_smem); /* [DIAG_ROWS_PER_BLOCK][HS] */
    float* k_s = q_s + (size_t)DIAG_ROWS_PER_BLOCK * HS;    /* [DIAG_KEY_TILE][HS + DIAG_KEY_PAD] */
    const int R = diag_rows_used(rows_per_head, T);
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int r0 = blockIdx.y * DIAG_ROWS_PER_BLOCK, rows_here = min(DIAG_ROWS_PER_BLOCK, R - r0);
    const int packs = HS / 8, k_stride = HS + DIAG_KEY_PAD;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, pair = warp / 2, half = warp % 2;

    for (int i = threadIdx.x; i < DIAG_ROWS_PER_BLOCK * packs; i += blockDim.x) {
        const int row = i / packs, p = i % packs;
        float* dst = q_s + (size_t)row * HS + 8 * p;
        if (row < rows_here) {
            const int t = diag_sample_row(r0 + row, rows_per_head, T);
            diag_store_pack8_float(dst, load_pack8(qkv + diag_qkv_at(T, NH, HS, b, t, 0, h) + 8 * p));
        } else {
            reinterpret_cast<float4*>(dst)[0] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            reinterpret_cast<float4*>(dst)[1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
    }
    int first_row[2], t_row[kRows], t_group[2];
    float m[kRows], l[kRows], a[kRows];
#pragma unroll
    for (int gi = 0; gi < 2; gi++) {
        first_row[gi] = (gi == 0 ? pair : kGroups - 1 - pair) * DIAG_ROW_GROUP;
        t_group[gi] = -1;
#pragma unroll
        for (int rr = 0; rr < DIAG_ROW_GROUP; rr++) {
            const int row = first_row[gi] + rr, s = gi * DIAG_ROW_GROUP + rr;
            t_row[s] = row < rows_here ? diag_sample_row(r0 + row, rows_per_head, T) : -1;
            t_group[gi] = max(t_group[gi], t_row[s]);
            m[s] = -INFINITY;
            l[s] = 0.0f;
            a[s] = 0.0f;
        }
    }
    const int t_last = diag_sample_row(r0 + rows_here - 1, rows_per_head, T);
    const int key = half * 32 + lane; /* this lane's key in every tile */

    for (int j0 = 0; j0 <= t_last; j0 += DIAG_KEY_TILE) {
        const int tile_keys = min(DIAG_KEY_TILE, t_last + 1 - j0);
        __syncthreads(); /* the previous tile is no longer read */
        for (int i = threadIdx.x; i < tile_keys * packs; i += blockDim.x) {
            const int kk = i / packs, p = i % packs;
            diag_store_pack8_float(k_s + (size_t)kk * k_stride + 8 * p,
                                   load_pack8(qkv + diag_qkv_at(T, NH, HS, b, j0 + kk, 1, h) + 8 * p));
        }
        __syncthreads(); /* the tile (and, first time round, q_s) is complete */
        const int j = j0 + key;
        const float4* k4 = reinterpret_cast<const float4*>(k_s + (size_t)key * k_stride);
#pragma unroll
        for (int gi = 0; gi < 2; gi++) {
            if (key >= tile_keys || j > t_group[gi]) continue; /* no row of the group sees key j */
            const float4* q4 = reinterpret_cast<const float4*>(q_s + (size_t)first_row[gi] * HS);
            float dot[DIAG_ROW_GROUP];
#pragma unroll
            for (int rr = 0; rr < DIAG_ROW_GROUP; rr++) dot[rr] = 0.0f;
            for (int v = 0; v < HS / 4; v++) {
                const float4 kv = k4[v];
#pragma unroll
                for (int rr = 0; rr < DIAG_ROW_GROUP; rr++) {
                    const float4 qv = q4[rr * (HS / 4) + v];
                    dot[rr] += qv.x * kv.x;
                    dot[rr] += qv.y * kv.y;
                    dot[rr] += qv.z * kv.z;
                    dot[rr] += qv.w * kv.w;
                }
            }
#pragma unroll
            for (int rr = 0; rr < DIAG_ROW_GROUP; rr++) {
                const int s = gi * DIAG_ROW_GROUP + rr;
                if (j <= t_row[s]) diag_softmax_push(m[s], l[s], a[s], scale * dot[rr]);
            }
        }
    }

#pragma unroll
    for (int s = 0; s < kRows; s++) {
        for (int off = 16; off > 0; off >>= 1) {
            const float m2 = __shfl_xor_sync(0xffffffffu, m[s], off);
            const float l2 = __shfl_xor_sync(0xffffffffu, l[s], off);
            const float a2 = __shfl_xor_sync(0xffffffffu, a[s], off);
            diag_softmax_merge(m[s], l[s], a[s], m2, l2, a2);
        }
        if (half == 1 && lane == 0) {
            pair_stats[pair][s][0] = m[s];
            pair_stats[pair][s][1] = l[s];
            pair_stats[pair][s][2] = a[s];
        }
    }
    __syncthreads(); /* the second warp of each pair has left its statistics */
    if (half == 0 && lane == 0) {
#pragma unroll
        for (int s = 0; s < kRows; s++) {
            const int row = first_row[s / DIAG_ROW_GROUP] + s % DIAG_ROW_GROUP;
            if (row >= rows_here) continue;
            diag_softmax_merge(m[s], l[s], a[s], pair_stats[pair][s][0], pair_stats[pair][s][1], pair_stats[pair][s][2]);
            const size_t idx = (size_t)bh * R + r0 + row;
            row_logit_max[idx] = m[s];
            row_entropy[idx] = logf(l[s]) - a[s] / l[s];
        }
    }
}

/* One block of DIAG_FINALIZE_THREADS: per-head rho, then max and median over heads (insertion sort,
   NaN last, mean of the middle two for even NH, as diag_median), max |q|,
   max |k|, max logit and mean entropy over the sampled rows, into *out. */
__global__ void diag_attention_finalize_kernel(LayerDiag* out, float* rho, const double* key_mean,
                                               const float* spread_partial, const float* absmax_partial,
                                               const float* row_logit_max, const float* row_entropy, int N, int NH,
                                               int HS, int num_rows) {
    const int lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int h = threadIdx.x / 32; h < NH; h += warps) { /* a warp per head */
        double mean2 = 0.0, spread2 = 0.0;
        for (int d = lane; d < HS; d += 32) mean2 += key_mean[(size_t)h * HS + d] * key_mean[(size_t)h * HS + d];
        for (int c = lane; c < DIAG_KEY_CHUNKS; c += 32) spread2 += (double)spread_partial[(size_t)h * DIAG_KEY_CHUNKS + c];
        for (int off = 16; off > 0; off >>= 1) {
            mean2 += __shfl_xor_sync(0xffffffffu, mean2, off);
            spread2 += __shfl_xor_sync(0xffffffffu, spread2, off);
        }
        spread2 /= (double)N;
        if (lane == 0) rho[h] = (float)(spread2 > 0.0 ? sqrt(mean2) / sqrt(spread2) : (mean2 > 0.0 ? INFINITY : 0.0));
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

/* grid num_pieces: sum of squares of one piece; 16-byte vectors when the piece
   allows (aligned start, whole packs), else one element at a time. */
__global__ void diag_piece_kernel(float* piece_partial, const DiagPiece* pieces, const floatX* params,
                                  const floatX* grads) {
    const DiagPiece p = pieces[blockIdx.x];
    const floatX* x = (p.from_grads ? grads : params) + p.start;
    float acc = 0.0f;
    if ((uintptr_t)x % sizeof(Pack8) == 0 && p.count % 8 == 0) {
        for (int i = threadIdx.x; i < p.count / 8; i += blockDim.x) {
            const Pack8 v = load_pack8(x + 8 * (size_t)i);
#pragma unroll
            for (int e = 0; e < 8; e++) acc += to_float(v.v[e]) * to_float(v.v[e]);
        }
    } else {
        for (int i = threadIdx.x; i < p.count; i += blockDim.x) {
            const float v = to_float(x[i]);
            acc += v * v;
        }
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
    const int packs = HS / 8;
    float diff2 = 0.0f, ref2 = 0.0f, x2 = 0.0f;
    for (int i = threadIdx.x; i < T * packs; i += blockDim.x) {
        const size_t at = diag_qkv_at(T, NH, HS, b, i / packs, part, h) + 8 * (i % packs);
        const Pack8 xv = load_pack8(dqkv + at), rv = load_pack8(dqkv_ref + at);
#pragma unroll
        for (int e = 0; e < 8; e++) {
            const float x = to_float(xv.v[e]), r = to_float(rv.v[e]);
            diff2 += (x - r) * (x - r);
            ref2 += r * r;
            x2 += x * x;
        }
    }
    diff2 = block_sum(diff2);
    ref2 = block_sum(ref2);
    x2 = block_sum(x2);
    if (threadIdx.x == 0) err[(size_t)part * gridDim.x + bh] = ref2 > 0.0f ? sqrtf(diff2 / ref2) : sqrtf(x2);
}

/* ---------------------------------------------------------------- host API */

/* Sizes everything for batches up to (B, T) of cfg; rows_per_head as in
   diag_attention_cpu (DIAG_DEFAULT_ROWS_PER_HEAD is the suggested value). */
/* The tensors whose gradient counts in a layer's grad_norm: the per-layer id range P_LN1W..P_FCPROJB and the
   QK-norm gains (as diag_params_cpu); a tensor the config does not have has count 0 and adds nothing. */
static inline int diag_per_layer_tensor(int id) {
    return (id >= P_LN1W && id <= P_FCPROJB) || id == P_QNORMW || id == P_KNORMW;
}

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
    if (d->HS % 8 != 0)
        die("diag_cuda_init: head size %d is not a multiple of 8 (the diagnostic kernels read 16-byte vectors of 8 "
            "BF16 values); choose channels / heads divisible by 8", d->HS);
    {
        const size_t row_smem = diag_rows_smem_bytes(d->HS);
        int device = 0, optin = 0;
        cudaCheck(cudaGetDevice(&device));
        cudaCheck(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
        if (row_smem > (size_t)optin)
            die("diag_cuda_init: head size %d needs %zu bytes of shared memory per block, this GPU allows %d; lower "
                "DIAG_ROW_WARPS or DIAG_KEY_TILE in model/diagnostics.cuh", d->HS, row_smem, optin);
        cudaCheck(cudaFuncSetAttribute(diag_rows_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)row_smem));
    }
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
    /* --bias 0: no key bias; its slots stay empty and diag_cuda_fetch reports its norms as NaN (null) */
    const long long key_bias_count = d->table[P_QKVB].count ? C : 0;
    for (int l = 0; l < L; l++) {
        slot_begin[l] = n;
        for (int id = P_LN1W; id < NUM_PARAM_TENSORS; id++) {
            if (!diag_per_layer_tensor(id)) continue;
            const long long per = (long long)(d->table[id].count / (size_t)L);
            DIAG_ADD_RANGE(d->table[id].offset + l * per, per, 1)
        }
    }
    for (int l = 0; l < L; l++) {
        slot_begin[L + l] = n;
        DIAG_ADD_RANGE(key_bias0 + (long long)l * 3 * C, key_bias_count, 0)
    }
    for (int l = 0; l < L; l++) {
        slot_begin[2 * L + l] = n;
        DIAG_ADD_RANGE(key_bias0 + (long long)l * 3 * C, key_bias_count, 1)
    }
    slot_begin[3 * L] = n;
    for (int id = 0; id < NUM_PARAM_TENSORS; id++) {
        if (diag_per_layer_tensor(id)) continue;
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
    if ((uintptr_t)qkv % sizeof(Pack8) != 0)
        die("diag_attention_cuda: qkv of layer %d is not 16-byte aligned (the kernels read 16-byte vectors)", layer);
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
    const dim3 row_grid(B * NH, (unsigned)ceil_div(R, DIAG_ROWS_PER_BLOCK));
    diag_rows_kernel<<<row_grid, DIAG_ROW_WARPS * 32, diag_rows_smem_bytes(HS), stream>>>(
        d->d_row_logit_max, d->d_row_entropy, qkv, T, NH, HS, d->rows_per_head, attn_softmax_scale(HS));
    cudaCheckLastError();
    diag_attention_finalize_kernel<<<1, DIAG_FINALIZE_THREADS, 0, stream>>>(d->d_layers + layer, d->d_rho, d->d_key_mean,
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
        for (int m = 0; m < ATTN_NUM_EMULATED_MODES; m++) {
            size_t w = attention_cuda_workspace_bytes(smax, (AttnMode)m, opt);
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
    if (d->table[P_QKVB].count == 0) /* --bias 0: there is no key bias to measure (as diag_params_cpu) */
        for (int l = 0; l < L; l++) host_layers[l].key_bias_norm = host_layers[l].key_bias_grad_norm = NAN;
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
    if (table[P_QKVB].count == 0) die("--zero-key-bias-grad: this model has no QKV bias (--bias 0); drop the flag");
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
    const AttnCaptureInfo info = diag_capture_info(ATTN_CAPTURE_BF16, step, layer, mode, s, out != nullptr,
                                                   stats != nullptr);
    char path[4096];
    diag_capture_path(path, sizeof path, dir, step, layer);
    attn_capture_write_module_bf16(path, &info, h_qkv, h_out, h_stats, h_dout);
    free(h_qkv);
    free(h_dout);
    free(h_out);
    free(h_stats);
}

#endif /* MODEL_DIAGNOSTICS_CUH */
