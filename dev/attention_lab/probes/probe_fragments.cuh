/*
 * dev/attention_lab/probes/probe_fragments.cuh - the row-pass layout probes' (probe_rows64.cu, probe_rows128.cu)
 * device store of two accumulators as row-major FP32 rows, so the host can compare each fragment element with its
 * expected row and column. Lab code: production kernels never write fragments out. In the including file's
 * anonymous namespace, after attention/cuda/hopper/kernel_rows.cuh (hopper_wgmma.cuh's fragment layout: register
 * 4j + 2r + e is row row0 + 8r, column 8j + 2t + e).
 */
#ifndef DEV_ATTENTION_LAB_PROBES_PROBE_FRAGMENTS_CUH
#define DEV_ATTENTION_LAB_PROBES_PROBE_FRAGMENTS_CUH

namespace {

/* The layout probes' output of two accumulators of this thread's rows: out[(row0 + 8r) * pitch + col0 + 8j +
   2t + e] = acc[4j + 2r + e], FP32. */
template <int REGS>
__device__ __forceinline__ void store_fragment_rows(float* out0, float* out1, const float (&acc0)[REGS],
                                                    const float (&acc1)[REGS], int row0, int col0, int pitch, int t) {
#pragma unroll
    for (int j = 0; j < REGS / 4; j++)
#pragma unroll
        for (int r = 0; r < 2; r++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int at = (row0 + 8 * r) * pitch + col0 + 8 * j + 2 * t + e;
                out0[at] = acc0[4 * j + 2 * r + e];
                out1[at] = acc1[4 * j + 2 * r + e];
            }
}

}  // namespace

#endif /* DEV_ATTENTION_LAB_PROBES_PROBE_FRAGMENTS_CUH */
