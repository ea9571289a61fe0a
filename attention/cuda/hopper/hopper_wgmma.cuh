/*
 * attention/cuda/hopper/hopper_wgmma.cuh - the Hopper (sm_90a) building blocks of the wgmma attention kernels:
 * mbarriers, TMA tile copies, wgmma shared-memory descriptors, the wgmma instructions the kernels use
 * (inline PTX), their register-fragment layout, and the host-side tensor-map encoder.
 *
 * Why: wgmma (a warpgroup's asynchronous 64 x N x 16 MMA reading shared memory through descriptors),
 * TMA (one thread moves a whole swizzled tile, tracked by an mbarrier) and the fragment layouts are
 * where a Hopper kernel goes wrong silently. The layout probe of dev/attention_lab/hopper_fwd.cu checks
 * them on the device (S = Q K^T and O = bf(S) V exact, both head sizes), and
 * every Hopper kernel (forward, backward, their labs) includes them from here instead of re-deriving
 * them. Compiles only for sm_90a (wgmma and setmaxnreg exist nowhere else): a file that includes this
 * header is built with `-gencode arch=compute_90a,code=sm_90a` alone (see attention/module.mk).
 *
 * Offers (namespace hopper_wgmma):
 *   smem_u32, aligned_smem_base, mbar_init / mbar_init_fence / mbar_arrive / mbar_arrive_expect_tx / mbar_expect_tx /
 *   mbar_try_wait / mbar_wait, fence_proxy_async, init_pipeline_barriers<STAGES>, tma_load_4d, make_smem_desc,
 *   wgmma_fence / wgmma_commit / wgmma_wait<N>, reg_fence / reg_fences, zero_accumulators, two_gemms_written
 *   (two GEMMs that write their accumulators, as one waited-for commit group), pack_bf16x2,
 *   wgmma_m64n128k16_ss, wgmma_m64n64k16_ss, wgmma_m64n64k16_rs, wgmma_m64n128k16_rs, wgmma_pv, quad_max,
 *   quad_sum, setmaxnreg_inc / setmaxnreg_dec,
 *   red_add_f32x2_if, named_bar_sync / named_bar_arrive / named_bar_sync_any, warpgroup_sync;
 *   the 64 x 64 tile steps of the HS-64 backward kernels (key-major pass, row pass, their labs):
 *   warpgroup_two_ss_64x64 (two K-major SS GEMMs as one batch: S and dP, or their transposes; _issue: the
 *   wgmmas alone),
 *   pack_acc_a_operand (FP32 accumulator -> BF16 register A operand), warpgroup_rs_issue_n64,
 *   load_staged_a_operand (the A operand from a BF16 tile staged in shared memory; the key-major passes stage
 *   bf(dS^T) with hopper_bwd_common.cuh's stage_ds_words);
 *   tma_reduce_add_3d, bulk_commit_group, bulk_wait_group_read<N>, bulk_wait_group<N> (TMA reduce-add of an
 *   FP32 tile into global memory);
 *   host: tensor_map_encoder (cuTensorMapEncodeTiled without linking libcuda), encode_head_map (the 4-D
 *   tensor map of qkv or dout that every kernel here loads its tiles through), encode_dq_acc_map (the 3-D
 *   map of the FP32 dQ accumulator that the reduce-adds write through).
 */
#ifndef ATTENTION_HOPPER_WGMMA_CUH
#define ATTENTION_HOPPER_WGMMA_CUH

#include <stdint.h>
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention.h"
#include "common/cuda_utils.cuh"
#include "common/utils.h"

namespace hopper_wgmma {

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ uint32_t smem_u32(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* The first 1024-byte aligned byte at or after `raw` (dynamic shared memory is only 16-byte aligned): TMA's
   128B swizzle and the descriptors' base offset 0 need every tile on a swizzle atom (8 rows x 128 B); the
   kernels allocate one atom of slack for it. */
constexpr int kSwizzle128BAtomBytes = 1024;
__device__ __forceinline__ unsigned char* aligned_smem_base(unsigned char* raw) {
    return raw + ((kSwizzle128BAtomBytes - (smem_u32(raw) & (kSwizzle128BAtomBytes - 1))) & (kSwizzle128BAtomBytes - 1));
}

/* ---- mbarrier: a 64-bit shared-memory object with an expected arrival count, a pending transaction
   byte count and a phase bit. A phase completes when all expected threads have arrived AND the
   transaction count is back to zero; waiters poll with try_wait.parity on the parity of the phase they
   wait for (the first phase has parity 0). ---- */
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(arrivals) : "memory");
}
/* Makes the initialised barriers visible to the other threads and to the async (TMA) proxy. */
__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
/* Orders this thread's generic-proxy shared-memory writes before later async-proxy (TMA, wgmma)
   accesses of the same memory. */
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* One arrival that also announces `bytes` more transaction bytes (the TMA copies complete them). */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}
/* Announces `bytes` more transaction bytes WITHOUT arriving: a thread that must write other shared data before
   its arrival (a producer's row state) can start the copies first. */
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
/* One poll of the barrier at shared address addr: 1 once the phase of parity `parity` has completed, 0 when
   try_wait timed out first (poll again). The bounded waits of the kernels and labs poll with it too. */
__device__ __forceinline__ uint32_t mbar_try_wait(uint32_t addr, uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
    return done;
}
/* Blocks until the phase of parity `parity` has completed. */
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
    const uint32_t addr = smem_u32(bar);
    uint32_t done = 0;
    while (!done) done = mbar_try_wait(addr, parity);
}

/* Thread 0's set-up of a TMA pipeline's barriers: `once` (the tiles loaded once per CTA) with one arrival,
   per stage s full[s] with full_arrivals (the producer's arrive.expect_tx, plus the TMA bytes) and empty[s]
   with empty_arrivals (every consumer thread, after its last read of the stage); then made visible to the
   other threads and to the async proxy that TMA completes on. The caller __syncthreads() after it. */
template <int STAGES>
__device__ __forceinline__ void init_pipeline_barriers(uint64_t* once, uint64_t* full, uint64_t* empty,
                                                       uint32_t full_arrivals, uint32_t empty_arrivals) {
    mbar_init(once, 1);
    for (int s = 0; s < STAGES; s++) {
        mbar_init(&full[s], full_arrivals);
        mbar_init(&empty[s], empty_arrivals);
    }
    mbar_init_fence();
    fence_proxy_async();
}

/* ---- TMA: copy one box of the 4-D tensor map at coordinates {c0 (column), c1 (slot*NH + head), c2 (token),
   c3 (batch)} into shared memory at dst (1024-byte aligned for the 128B swizzle), completing its bytes on
   `bar`. Out-of-range rows are written as zeros and still count their bytes. ---- */
__device__ __forceinline__ void tma_load_4d(void* dst, const CUtensorMap* map, uint64_t* bar, int c0, int c1, int c2,
                                            int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5, %6}], [%2];\n" ::"r"(smem_u32(dst)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
        : "memory");
}

/* ---- TMA reduce-add: the 3-D box of `map` at {c0, c1, c2} += the FP32 tile at src (shared memory, laid out
   as the map's swizzle says), element by element in L2; out-of-range elements are skipped. Issued by one
   thread; bulk_commit_group closes the thread's copies so far into one group, bulk_wait_group_read<N> waits
   until at most N of its groups still READ shared memory (their source may then be rewritten),
   bulk_wait_group<N> until at most N are incomplete. The writer's generic-proxy stores to src must be made
   visible to the async proxy first (fence_proxy_async, then a barrier to the issuing thread). ---- */
__device__ __forceinline__ void tma_reduce_add_3d(const CUtensorMap* map, const void* src, int c0, int c1, int c2) {
    asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%2, %3, %4}], [%1];\n" ::"l"(
                     reinterpret_cast<uint64_t>(map)),
                 "r"(smem_u32(src)), "r"(c0), "r"(c1), "r"(c2)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit_group() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void bulk_wait_group_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void bulk_wait_group() { asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory"); }

/* ---- wgmma shared-memory matrix descriptor (PTX ISA, "Matrix Descriptor Format"), 64 bits:
     bits  0-13  start address >> 4 (shared-state-space byte address)
     bits 16-29  leading dimension byte offset (LBO) >> 4
     bits 32-45  stride dimension byte offset (SBO) >> 4
     bits 49-51  matrix base offset (0: every tile here starts 1024-byte aligned)
     bits 62-63  swizzle mode: 0 none, 1 128-byte, 2 64-byte, 3 32-byte.
   With the 128-byte swizzle, a "row" is 128 bytes (64 BF16) and 8 rows (1024 bytes) form the swizzle
   atom: 16-byte chunk j of row r sits at chunk j ^ (r % 8), which is what TMA's CU_TENSOR_MAP_SWIZZLE_128B
   writes. Operand kinds used here:
   - K-major (Q as A, K as B of S = Q K^T; the reduced dimension, the head dim, is contiguous): SBO = 1024
     (from one group of 8 rows to the next along M/N); LBO is not used while the 16-wide k-step stays in
     one 128-byte row (it always does: a k-step starts at byte 32*k of the row) - set to 1 (16 bytes) as
     CUTLASS does; the k-step moves the start address by 32 bytes inside the swizzled row.
   - N-major (V as B of O = P V, imm-trans-b = 1: N, the head dim, is contiguous): SBO = 1024 (from one
     group of 8 keys (k) to the next), LBO = bytes of one 64-column chunk of the tile (from one 64-wide
     block of N to the next; only read when N > 64, i.e. HS 128); a k-step (16 keys) moves the start by
     16 rows = 2048 bytes. ---- */
__device__ __forceinline__ uint64_t make_smem_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
    constexpr uint64_t kSwizzle128B = 1;
    return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo_bytes >> 4) & 0x3FFF) << 16) |
           ((uint64_t)((sbo_bytes >> 4) & 0x3FFF) << 32) | (kSwizzle128B << 62);
}

/* ---- wgmma issue/ordering:
   fence   - orders this thread's earlier register and shared-memory accesses before the next wgmma
             reads its accumulator / A registers (needed before the first wgmma of a batch whenever those
             registers were touched by ordinary instructions, e.g. the rescale of O);
   commit  - closes the wgmmas issued so far into one group;
   wait<N> - blocks until at most N groups are still in flight (0: all results are in the registers).
   After the wait, reg_fence() on each accumulator keeps the compiler from moving reads of the results
   above the wait (the asm of the wgmma "wrote" them, as far as the compiler knows). ---- */
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}
template <int N>
__device__ __forceinline__ void reg_fence(uint32_t (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) asm volatile("" : "+r"(r[i][j])::"memory");
}
/* reg_fence on each argument, in order (one statement for a run of them). */
template <class... R>
__device__ __forceinline__ void reg_fences(R&... r) {
    (reg_fence(r), ...);
}
/* Two accumulators zeroed for the GEMMs about to write them, and fenced: the compiler keeps the moves above the
   wgmma fence that follows (sunk past it, they make ptxas serialise the wgmmas with an injected
   warpgroup.arrive). */
template <int N>
__device__ __forceinline__ void zero_accumulators(float (&a)[N], float (&b)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) a[i] = b[i] = 0.f;
    reg_fences(a, b);
}

/* Two accumulators written (not accumulated) by the wgmmas that `issue_both` issues (nothing else: the SS GEMMs of
   S and dP, or their transposes), as one commit group, waited for: zeroed, fenced, issued, committed, waited and
   fenced again, the sequence every pass's score GEMMs need. */
template <int N, typename IssueBoth>
__device__ __forceinline__ void two_gemms_written(float (&d0)[N], float (&d1)[N], IssueBoth&& issue_both) {
    zero_accumulators(d0, d1);
    wgmma_fence();
    issue_both();
    wgmma_commit();
    wgmma_wait<0>();
    reg_fences(d0, d1);
}

/* ---- Register fragments of wgmma .m64nNk16 (PTX ISA figures "WGMMA .m64nNk16 register fragment
   layout"), warp w (0-3) of the warpgroup, lane = 4 g + t:
   accumulator D (FP32, N/2 registers): warp w holds rows 16w..16w+15; register 4j + 2r + e is
     D[16w + g + 8r][8j + 2t + e] (j = 0..N/8-1 the 8-column block, r, e in {0, 1}) - per warp exactly
     the C fragment of mma.sync m16n8 repeated over N/8 blocks;
   A in registers (BF16, 4 x bf16x2): rows 16w + g (+8), the m16n8k16 A fragment: a0 = A[g][2t..2t+1],
     a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..].
   So accumulator registers 8k..8k+7 of S (columns 16k..16k+15) are, rounded to BF16 and packed, the A
   operand of k-step k of O += P V: the FlashAttention-2 register trick carries over. ---- */
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi); /* lo -> low half (lower column), RNE */
    return *reinterpret_cast<uint32_t*>(&v);
}

/* D[64 x 128] += A[64 x 16] * B[16 x 128]: A and B from shared memory through descriptors, both K-major
   (imm-trans-a = imm-trans-b = 0); the predicate scale-d is true (D accumulates), imm-scale-a = imm-scale-b = 1
   (no negation). */
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred acc;\nsetp.ne.b32 acc, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, acc, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(desc_a), "l"(desc_b), "r"(1));
}

/* D[64 x 64] += A[64 x 16] * B[16 x 64]: A and B from shared memory through descriptors, both K-major
   (imm-trans-a = imm-trans-b = 0); scale-d true, no negation. The N = 64 form of wgmma_m64n128k16_ss
   (32 accumulator registers, same descriptor meaning): the backward's S, dP (and their transposes). */
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred acc;\nsetp.ne.b32 acc, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, acc, 1, 1, 0, 0;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(desc_a), "l"(desc_b), "r"(1));
}

/* D[64 x 64] += A[64 x 16] * B[16 x 64]: A from registers (four bf16x2 per thread, see the header comment),
   B from shared memory, N-major (imm-trans-b = 1: V is stored [key][head dim]); scale-d true, no negation. */
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred acc;\nsetp.ne.b32 acc, %37, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, acc, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

/* D[64 x 128] += A[64 x 16] * B[16 x 128]: A from registers (four bf16x2 per thread, see the header comment),
   B from shared memory, N-major (imm-trans-b = 1: V is stored [key][head dim]); scale-d true, no negation. */
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "{\n.reg .pred acc;\nsetp.ne.b32 acc, %69, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, acc, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(1));
}

/* O += P V for the head size of the instantiation (N = HS). */
__device__ __forceinline__ void wgmma_pv(float (&o)[32], const uint32_t (&a)[4], uint64_t desc_v) {
    wgmma_m64n64k16_rs(o, a, desc_v);
}
__device__ __forceinline__ void wgmma_pv(float (&o)[64], const uint32_t (&a)[4], uint64_t desc_v) {
    wgmma_m64n128k16_rs(o, a, desc_v);
}

__device__ __forceinline__ float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* setmaxnreg (sm_90a): every thread of the warpgroup executes it with the same count; a producer
   warpgroup gives registers back (dec) so the consumer warpgroups can take them (inc). */
template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS)); }
template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS)); }

/* red.global.add.v2.f32 (what atomicAdd(float2*) becomes on sm_90) under a predicate instead of a branch:
   a divergent branch between a wgmma issue and its wait makes ptxas serialise the wgmmas (C7518). */
__device__ __forceinline__ void red_add_f32x2_if(float* dst, float lo, float hi, bool ok) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %3, 0;\n@p red.global.add.v2.f32 [%0], {%1, %2};\n}\n" ::"l"(dst),
                 "f"(lo), "f"(hi), "r"((int)ok)
                 : "memory");
}

/* Named barrier `id` (1-15; 0 is __syncthreads) of `threads` threads (a multiple of 32): sync waits until that many
   have arrived or synced (acquire: their earlier shared-memory writes are visible after it), arrive counts this
   thread and goes on (release). A producer/consumer pair of warpgroups hands a shared tile over with them. */
__device__ __forceinline__ void named_bar_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_bar_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
/* named_bar_sync that also returns whether `pred` was true in any of the `threads` threads: one answer for all of
   them (bar.red.or), where a flag each reads after a plain barrier may change between their reads. */
__device__ __forceinline__ bool named_bar_sync_any(int id, int threads, bool pred) {
    uint32_t any;
    asm volatile("{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n bar.red.or.pred q, %2, %3, p;\n"
                 " selp.u32 %0, 1, 0, q;\n}\n"
                 : "=r"(any)
                 : "r"((uint32_t)pred), "r"(id), "r"(threads)
                 : "memory");
    return any != 0;
}

/* Barrier of one 128-thread warpgroup wg (named barrier 1 + wg; 0 is __syncthreads). */
__device__ __forceinline__ void warpgroup_sync(int wg) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
}

/* ---- 64 x 64 tile steps of the HS-64 backward kernels. Every tile is [rows][64 BF16 = 128 bytes], 128B
   swizzled, 1024-byte aligned; one wgmma k-step is 16 BF16 (32 bytes along a row, or 16 rows). ---- */
constexpr int kTileK = 64;            /* head size / keys / queries of one tile side */
constexpr int kTileKSteps = kTileK / 16;
constexpr int kTileRowBytes = 128;    /* one 128B-swizzle row */

/* D0 += A0 B0^T and D1 += A1 B1^T (64 x 64 each, over a 64-wide reduced dimension), all four operands K-major
   tiles at the given shared addresses: the 8 wgmmas issued, nothing else (the caller zeroes, fences, commits
   and waits; warpgroup_two_ss_64x64 below, or a commit group that also holds other GEMMs). */
__device__ __forceinline__ void warpgroup_two_ss_64x64_issue(float (&d0)[32], float (&d1)[32], uint32_t a0_addr,
                                                             uint32_t b0_addr, uint32_t a1_addr, uint32_t b1_addr) {
    constexpr uint32_t kUnusedLbo = 16; /* K-major swizzled operands ignore LBO ("assumed 1", 16 bytes) */
    constexpr int kAtomBytes = 8 * kTileRowBytes;
#pragma unroll
    for (int kk = 0; kk < kTileKSteps; kk++) {
        const uint32_t off = kk * 16 * (int)sizeof(bf16);
        wgmma_m64n64k16_ss(d0, make_smem_desc(a0_addr + off, kUnusedLbo, kAtomBytes),
                           make_smem_desc(b0_addr + off, kUnusedLbo, kAtomBytes));
    }
#pragma unroll
    for (int kk = 0; kk < kTileKSteps; kk++) {
        const uint32_t off = kk * 16 * (int)sizeof(bf16);
        wgmma_m64n64k16_ss(d1, make_smem_desc(a1_addr + off, kUnusedLbo, kAtomBytes),
                           make_smem_desc(b1_addr + off, kUnusedLbo, kAtomBytes));
    }
}

/* D0 = A0 B0^T and D1 = A1 B1^T (64 x 64 each, over a 64-wide reduced dimension), all four operands K-major
   tiles at the given shared addresses (the warpgroup's 64 rows of A), issued as one commit group (the
   tensor core runs them back to back) and waited for. Written, not accumulated. The key-major pass calls
   it with (K_w, Q) and (V_w, dO) for S^T and dP^T, the row pass with (Q, K) and (dO, V) for S and dP. */
__device__ __forceinline__ void warpgroup_two_ss_64x64(float (&d0)[32], float (&d1)[32], uint32_t a0_addr,
                                                       uint32_t b0_addr, uint32_t a1_addr, uint32_t b1_addr) {
    two_gemms_written(d0, d1, [&] { warpgroup_two_ss_64x64_issue(d0, d1, a0_addr, b0_addr, a1_addr, b1_addr); });
}

/* A 64 x 64 FP32 accumulator rounded to BF16 and packed as the register A operand of a GEMM over its 64
   columns: k-step kk takes columns 16kk..16kk+15 = registers 8kk..8kk+7 (the fragment comment above). */
__device__ __forceinline__ void pack_acc_a_operand(uint32_t (&a)[kTileKSteps][4], const float (&acc)[32]) {
#pragma unroll
    for (int kk = 0; kk < kTileKSteps; kk++) {
        a[kk][0] = pack_bf16x2(acc[8 * kk + 0], acc[8 * kk + 1]); /* row g,   cols 2t, 2t+1 */
        a[kk][1] = pack_bf16x2(acc[8 * kk + 2], acc[8 * kk + 3]); /* row g+8, cols 2t, 2t+1 */
        a[kk][2] = pack_bf16x2(acc[8 * kk + 4], acc[8 * kk + 5]); /* row g,   cols 2t+8, 2t+9 */
        a[kk][3] = pack_bf16x2(acc[8 * kk + 6], acc[8 * kk + 7]); /* row g+8, cols 2t+8, 2t+9 */
    }
}

/* acc += A B over 64 reduced rows: A from registers (4 k-steps), B an N-major 64 x 64 tile at b_addr (rows =
   the reduced dimension, 16 rows = 2048 bytes per k-step; as V in the forward). Issued only: the caller
   fences before and commits and waits after. */
__device__ __forceinline__ void warpgroup_rs_issue_n64(float (&acc)[32], const uint32_t (&a)[kTileKSteps][4],
                                                       uint32_t b_addr) {
    constexpr uint32_t kUnusedLbo = kTileK * kTileRowBytes; /* LBO: unused for N = 64 */
#pragma unroll
    for (int kk = 0; kk < kTileKSteps; kk++)
        wgmma_m64n64k16_rs(acc, a[kk], make_smem_desc(b_addr + kk * 16 * kTileRowBytes, kUnusedLbo,
                                                      8 * kTileRowBytes));
}

/* The register A fragments of a GEMM over a staged [row][k] BF16 tile (PITCH elements per row) for this
   warp's 16 rows: k-step kk (columns 16kk..16kk+15): a0 = (row g, cols 2t, 2t+1), a1 = (row g+8, ...),
   a2 = (row g, cols 2t+8, 2t+9), a3 = (row g+8, cols 2t+8, 2t+9). */
template <int PITCH>
__device__ __forceinline__ void load_staged_a_operand(uint32_t (&a)[kTileKSteps][4], const bf16* tile, int warp_in_wg,
                                                      int g, int t) {
    const int row = warp_in_wg * 16 + g;
#pragma unroll
    for (int kk = 0; kk < kTileKSteps; kk++) {
        const int k = 16 * kk + 2 * t;
        a[kk][0] = *reinterpret_cast<const uint32_t*>(tile + row * PITCH + k);
        a[kk][1] = *reinterpret_cast<const uint32_t*>(tile + (row + 8) * PITCH + k);
        a[kk][2] = *reinterpret_cast<const uint32_t*>(tile + row * PITCH + k + 8);
        a[kk][3] = *reinterpret_cast<const uint32_t*>(tile + (row + 8) * PITCH + k + 8);
    }
}

/* cuTensorMapEncodeTiled through the runtime's driver entry point (no link against libcuda). */
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = NULL;
    if (fn == NULL) {
        void* p = NULL;
        cudaDriverEntryPointQueryResult found;
        cudaCheck(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &found));
        if (found != cudaDriverEntryPointSuccess || p == NULL) {
            die("hopper attention: the driver has no cuTensorMapEncodeTiled\n"
                "  hint: TMA needs an NVIDIA driver for CUDA 12.0 or newer");
        }
        fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
    }
    return fn;
}

/* The TMA tensor map of a BF16 tensor [B, T, heads, HS] as 4-D {HS, heads, T, B} (innermost first; token
   stride heads * HS), boxes of {64 columns (one 128-byte swizzle row), 1 head, box_rows tokens, 1 batch},
   128-byte swizzle, zeros outside (rows past T read as 0 and still count their bytes). qkv [B, T, 3, NH,
   HS]: heads = 3 NH (slot * NH + head); dout [B, T, NH, HS]: heads = NH. Host-only encoding, cheap enough
   per call. A failure dies naming `who` (the kernel or lab) and `what` (the tensor). */
inline CUtensorMap encode_head_map(const void* base, AttnShape s, int heads, int box_rows, const char* who,
                                   const char* what) {
    CUtensorMap map;
    const cuuint64_t row_bytes = (cuuint64_t)heads * s.HS * sizeof(bf16);
    const cuuint64_t dims[4] = {(cuuint64_t)s.HS, (cuuint64_t)heads, (cuuint64_t)s.T, (cuuint64_t)s.B};
    const cuuint64_t strides[3] = {/* bytes, of dims 1..3 */ (cuuint64_t)s.HS * sizeof(bf16), row_bytes,
                                   (cuuint64_t)s.T * row_bytes};
    const cuuint32_t box[4] = {64, 1, (cuuint32_t)box_rows, 1};
    const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
    const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, const_cast<void*>(base), dims,
                                            strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                            CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        die("%s: cuTensorMapEncodeTiled failed (CUresult %d) for %s, B=%d NH=%d T=%d HS=%d\n"
            "  hint: the buffer must be 16-byte aligned (cudaMalloc is) and HS a multiple of 64",
            who, (int)r, what, s.B, s.NH, s.T, s.HS);
    }
    return map;
}

/* The TMA tensor map of the FP32 dQ accumulator [B*NH][T][HS] as 3-D {HS, T, B*NH} (innermost first): boxes of
   {32 columns (one 128-byte swizzle row), box_rows tokens, 1 head}, 128-byte swizzle. Rows past T belong to no
   box (a reduce-add skips them), so a query tile that runs past T never touches the next head's rows.
   slices > 1: the deterministic backward's [slices][B*NH][T][HS] (one accumulator per key block,
   docs/determinism.md) as {HS, T, slices * B*NH}: slice kb of head bh is index kb * B*NH + bh of the last
   dimension. */
inline CUtensorMap encode_dq_acc_map(float* dq_acc, AttnShape s, int box_rows, const char* who, int slices = 1) {
    CUtensorMap map;
    const cuuint64_t dims[3] = {(cuuint64_t)s.HS, (cuuint64_t)s.T, (cuuint64_t)slices * s.B * s.NH};
    const cuuint64_t strides[2] = {(cuuint64_t)s.HS * sizeof(float), (cuuint64_t)s.T * s.HS * sizeof(float)};
    const cuuint32_t box[3] = {32, (cuuint32_t)box_rows, 1};
    const cuuint32_t elem_strides[3] = {1, 1, 1};
    const CUresult r = tensor_map_encoder()(&map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, dq_acc, dims, strides, box,
                                            elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        die("%s: cuTensorMapEncodeTiled failed (CUresult %d) for the dQ accumulator, B=%d NH=%d T=%d HS=%d\n"
            "  hint: the workspace must be 16-byte aligned (cudaMalloc is)", who, (int)r, s.B, s.NH, s.T, s.HS);
    }
    return map;
}

}  // namespace hopper_wgmma

#endif /* ATTENTION_HOPPER_WGMMA_CUH */
