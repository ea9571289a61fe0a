/*
 * attention/cuda/launch_overlap.cuh - programmatic dependent launch (PDL) for the backward's chain of kernels
 * (prep -> key-major pass -> dQ post-pass): the next kernel of the stream is launched while the one before
 * it drains, and waits inside for that one's results.
 *
 * Why: the backward is three or four kernels in a row, and each boundary costs the GPU a drain, a launch and
 * a ramp (at B8 H16 T1024 d64 the bf16 backward's kernels under ncu add up to a few percent less than the
 * backward timed whole under bench_attention). With PDL (compute capability 9.0 and later) the dependent
 * grid's CTAs are placed on the SMs as soon as every CTA of the grid before it has started (or said it no
 * longer holds them back), run their prologue, and block in griddepcontrol.wait until that grid has finished
 * and its memory is visible.
 *
 * Offers:
 *   wait_for_previous_grid()      - device: returns once the grid launched before this one in the stream has
 *       completed and its writes are visible (a no-op when this grid was not launched with PDL, and on
 *       targets before sm_90, where the instruction does not exist). Call it before reading anything that
 *       grid writes, and before writing anything it reads.
 *   let_next_grid_launch()        - device: this CTA no longer holds the next grid's launch back (a no-op
 *       where PDL does not exist). Not a promise about memory: the next grid still waits for completion.
 *   launch_after_previous_grid(overlap, kernel, grid, block, smem, stream, args...) - host: launches kernel
 *       like <<<grid, block, smem, stream>>>, with the PDL attribute when overlap is nonzero. Callers pass
 *       overlap only on devices of compute capability 9.0 (the attribute's home) and only for kernels that
 *       call wait_for_previous_grid() before touching the previous grid's data.
 *       The environment variable ATTN_PDL=0 launches everything without the attribute (plain stream order;
 *       the waits are then no-ops): the A/B switch for measuring what PDL buys. Read once per process.
 */
#pragma once
#include <stdlib.h>
#include <utility>
#include <cuda_runtime.h>
#include "common/cuda_utils.cuh"

__device__ __forceinline__ void wait_for_previous_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void let_next_grid_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* ATTN_PDL unset or not "0": PDL where callers ask for it */
static inline int launch_overlap_enabled(void) {
    static int enabled = -1; /* a race between host threads writes the same answer twice */
    if (enabled < 0) {
        const char* env = getenv("ATTN_PDL");
        enabled = !(env != NULL && env[0] == '0' && env[1] == '\0');
    }
    return enabled;
}

template <typename... KernelArgs, typename... Args>
void launch_after_previous_grid(int overlap, void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                                cudaStream_t stream, Args&&... args) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = block;
    config.dynamicSmemBytes = smem;
    config.stream = stream;
    cudaLaunchAttribute attribute[1];
    attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = attribute;
    config.numAttrs = (overlap && launch_overlap_enabled()) ? 1 : 0;
    cudaCheck(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}
