/*
 * dev/attention_lab/probes/probe_common.cuh - what every layout probe (dev/attention_lab/probes/probe_*.cu) does
 * the same way: load one tile of each operand at token 0 through the kernel's TMA maps, write accumulators out as
 * row-major FP32 rows for the host to compare element by element, check the probe's shape and launch its one
 * CTA. Lab code: production kernels never write fragments out. Included after the probed kernel's device header
 * (attention/cuda/hopper/kernel_*.cuh, which brings hopper_wgmma.cuh: its fragment layout, register 4j + 2r + e
 * is row row0 + 8r, column 8j + 2t + e; its mbarrier and TMA helpers).
 */
#ifndef DEV_ATTENTION_LAB_PROBES_PROBE_COMMON_CUH
#define DEV_ATTENTION_LAB_PROBES_PROBE_COMMON_CUH

#include "attention/attention.h"
#include "common/cuda_utils.cuh"
#include "common/utils.h"

namespace {

/* One accumulator of this thread's rows as FP32 rows: out[(row0 + 8r) * pitch + col0 + 8j + 2t + e] =
   acc[4j + 2r + e]; by default a whole tile of 2 * REGS columns. */
template <int REGS>
__device__ __forceinline__ void store_acc_rows(float* out, const float (&acc)[REGS], int row0, int t, int col0 = 0,
                                               int pitch = 2 * REGS) {
#pragma unroll
    for (int j = 0; j < REGS / 4; j++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) out[(row0 + 8 * r) * pitch + col0 + 8 * j + 2 * t + e] = acc[4 * j + 2 * r + e];
}

/* Two accumulators of the same rows and columns (S and dP, X and Y). */
template <int REGS>
__device__ __forceinline__ void store_fragment_rows(float* out0, float* out1, const float (&acc0)[REGS],
                                                    const float (&acc1)[REGS], int row0, int col0, int pitch, int t) {
    store_acc_rows(out0, acc0, row0, t, col0, pitch);
    store_acc_rows(out1, acc1, row0, t, col0, pitch);
}

/* Thread 0: zeroes the CTA's give-up flag (where the probe has one) and initialises one mbarrier for `arrivals`;
   the caller's __syncthreads publishes both. */
__device__ __forceinline__ void probe_init_barrier(uint64_t* bar, uint32_t arrivals, int* cta_abort) {
    if (threadIdx.x != 0) return;
    if (cta_abort) *cta_abort = 0;
    mbar_init(bar, arrivals);
    mbar_init_fence();
    fence_proxy_async();
}

/* Where a probe's tiles go in shared memory and how the kernel cuts them: `chunks` 64-column chunks per tile
   (encode_head_map's box width), q_chunk_bytes apart in Q and dO, kv_chunk_bytes apart in K and V; each K/V
   chunk `key_boxes` boxes of box_rows tokens, box_bytes apart. dout null: the probe has no dO. */
struct ProbeTiles {
    unsigned char *q, *k, *v, *dout;
    int chunks, q_chunk_bytes, kv_chunk_bytes, key_boxes, box_rows, box_bytes;
};
constexpr int kProbeChunkCols = 64;

/* One box per operand (HS 64 with the keys in one box): one chunk, one key box. */
__device__ __forceinline__ ProbeTiles probe_one_box_tiles(unsigned char* q, unsigned char* k, unsigned char* v,
                                                          unsigned char* dout) {
    return ProbeTiles{q, k, v, dout, 1, 0, 0, 1, 0, 0};
}

/* The whole CTA: the barrier set up (probe_init_barrier with one arrival), then thread 0 arms it for `bytes` and
   loads head `head`'s tiles from token 0 (qkv [1, T, 3, NH, HS]: plane slot * NH + head, slots Q 0, K 1, V 2;
   tokens past T read as zeros). The caller waits for phase 0 with its kernel's own wait. */
__device__ __forceinline__ void probe_load_tiles(const ProbeTiles& p, const CUtensorMap* qkv_map,
                                                 const CUtensorMap* dout_map, uint64_t* bar, int NH, int head,
                                                 uint32_t bytes, int* cta_abort) {
    probe_init_barrier(bar, 1, cta_abort);
    __syncthreads();
    if (threadIdx.x != 0) return;
    mbar_arrive_expect_tx(bar, bytes);
    for (int ch = 0; ch < p.chunks; ch++) {
        const int col = ch * kProbeChunkCols;
        for (int b = 0; b < p.key_boxes; b++) {
            const int dst = ch * p.kv_chunk_bytes + b * p.box_bytes;
            tma_load_4d(p.k + dst, qkv_map, bar, col, 1 * NH + head, b * p.box_rows, 0);
            tma_load_4d(p.v + dst, qkv_map, bar, col, 2 * NH + head, b * p.box_rows, 0);
        }
        tma_load_4d(p.q + ch * p.q_chunk_bytes, qkv_map, bar, col, 0 * NH + head, 0, 0);
        if (p.dout) tma_load_4d(p.dout + ch * p.q_chunk_bytes, dout_map, bar, col, head, 0, 0);
    }
}

/* Dies unless the probe's shape is one it covers: B = 1, T <= max_T, 0 <= head < NH, and the head size
   (hs_ok; hs_text names the sizes). */
inline void probe_require_shape(const char* probe, AttnShape s, int head, int max_T, bool hs_ok, const char* hs_text) {
    if (s.B != 1 || s.T > max_T || head < 0 || head >= s.NH || !hs_ok) {
        die("%s: needs B = 1, T <= %d, 0 <= head < NH, HS %s (got B=%d NH=%d T=%d HS=%d head %d)", probe, max_T,
            hs_text, s.B, s.NH, s.T, s.HS, head);
    }
}

/* The probe's output tiles, consecutive in one device buffer: each take(n) is the next n floats. */
struct ProbeTileCursor {
    float* at;
    float* take(size_t n) {
        float* tile = at;
        at += n;
        return tile;
    }
};

/* One CTA of `threads` with smem_bytes of dynamic shared memory; synchronous launch errors die. */
template <typename... Params, typename... Args>
inline void probe_launch(void (*kernel)(Params...), int threads, int smem_bytes, Args... args) {
    cudaCheck(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes));
    kernel<<<1, threads, smem_bytes>>>(args...);
    cudaCheckLastError();
}

}  // namespace

#endif /* DEV_ATTENTION_LAB_PROBES_PROBE_COMMON_CUH */
