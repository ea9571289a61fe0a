/*
 * model/matmul_record.h - one GEMM shape's cuBLASLt algorithm as plain bytes.
 *
 * Why: the GPU trainer picks each GEMM's algorithm by timing (model/matmul.cuh), and the algorithm fixes the
 * GEMM's summation order, hence its bits. A run that is resumed must run the algorithms it ran before, so the
 * choice travels in the resume state (train/resume_state.h), and on a multi-GPU run rank 0's choice goes to
 * every rank. This header is plain C so that the resume-state code (C, tested on the CPU) can hold the
 * records without knowing cuBLASLt.
 *
 * Offers: MatmulAlgoRecord, MATMUL_MAX_RECORDS.
 */
#ifndef MODEL_MATMUL_RECORD_H
#define MODEL_MATMUL_RECORD_H

#include <stdint.h>

/* The GEMM's key (model/matmul.cuh's MatmulKey: column-major D[m, n] = op(A) op(B), its transposes, whether
   it accumulates into D, its epilogue) and the 64 bytes of its cublasLtMatmulAlgo_t. 96 bytes, no padding. */
typedef struct {
    int32_t m, n, k, trans_a, trans_b, accumulate, epilogue, reserved;
    uint64_t algo[8];
} MatmulAlgoRecord;

/* The most records a context keeps and a resume state holds (model/matmul.cuh's MATMUL_MAX_PLANS). */
#define MATMUL_MAX_RECORDS 128

#endif /* MODEL_MATMUL_RECORD_H */
