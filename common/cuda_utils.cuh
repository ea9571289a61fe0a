/*
 * common/cuda_utils.cuh - fail-loudly checks for CUDA calls, shared by every
 * CUDA file of the project (kernels, trainer, GPU tests, benchmarks).
 *
 * Why: a CUDA error surfaces asynchronously and far from its cause; checking
 * every runtime call and every kernel launch, and printing the file and line
 * with the CUDA error string, turns "illegal memory access somewhere" into one
 * line that names the call (the llm.c habit, cudaCheck).
 *
 * Offers: cudaCheck(err)      - dies with file:line and the CUDA error string;
 *         cudaCheckLastError() - checks the last launch (call after <<<>>>);
 *         ceil_div(a, b)       - integer ceiling division for grid sizes.
 */
#ifndef COMMON_CUDA_UTILS_CUH
#define COMMON_CUDA_UTILS_CUH

#include <cuda_runtime.h>
#include "common/utils.h"

static inline void cuda_check_at(cudaError_t err, const char* file, int line) {
    if (err != cudaSuccess) {
        die_at(file, line, "CUDA error: %s (%s)\n"
               "  hint: run under compute-sanitizer to find the faulting kernel; "
               "'out of memory' means a smaller batch or sequence length",
               cudaGetErrorString(err), cudaGetErrorName(err));
    }
}
#define cudaCheck(err) cuda_check_at((err), __FILE__, __LINE__)
#define cudaCheckLastError() cuda_check_at(cudaGetLastError(), __FILE__, __LINE__)

static inline __host__ __device__ long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }

#endif /* COMMON_CUDA_UTILS_CUH */
