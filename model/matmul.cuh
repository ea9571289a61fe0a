/*
 * model/matmul.cuh - every dense layer of the model through cuBLASLt.
 *
 * Why: the four projections per layer and the tied output head are almost
 * all of the FLOPs. cuBLASLt runs them on tensor cores (BF16 in, FP32
 * accumulate, BF16 out) and fuses the bias add (and, for the MLP's first
 * projection, the GELU with the pre-activation kept in an aux buffer for
 * backward) into the GEMM's epilogue, so no extra pass over the output.
 *
 * Layout convention (row-major, like the rest of the model):
 *   forward   out[N, OC] = inp[N, K] @ W[OC, K]^T (+ bias[OC]) (-> GELU)
 *   backward  dinp[N, K] (+)= dout[N, OC] @ W[OC, K]
 *             dW[OC, K]  += dout^T @ inp        (always accumulates: grad accumulation)
 * Bias gradients are column sums (layernorm.cuh: bias_backward,
 * deterministic). cuBLAS sees these as column-major products; the mapping is
 * written out once in matmul_forward/matmul_backward below.
 *
 * Offers: MatmulContext (+ init/free), matmul_forward (bias / GELU epilogues),
 * matmul_backward_input, matmul_backward_weight, cublasCheck.
 */
#ifndef MODEL_MATMUL_CUH
#define MODEL_MATMUL_CUH

#include <cublasLt.h>
#include "model/kernel_common.cuh"

static inline void cublas_check_at(cublasStatus_t status, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) {
        die_at(file, line, "cuBLAS error %d (see cublas_api.h cublasStatus_t)\n  hint: shapes must be positive and multiples of 8; "
               "is the GPU out of memory?", (int)status);
    }
}
#define cublasCheck(status) cublas_check_at((status), __FILE__, __LINE__)

#define MATMUL_WORKSPACE_BYTES (32ull << 20) /* cuBLASLt's recommendation for Hopper */

typedef struct {
    cublasLtHandle_t handle;
    void* workspace;
    size_t workspace_bytes;
} MatmulContext;

static void matmul_context_init(MatmulContext* ctx) {
    cublasCheck(cublasLtCreate(&ctx->handle));
    ctx->workspace_bytes = MATMUL_WORKSPACE_BYTES;
    cudaCheck(cudaMalloc(&ctx->workspace, ctx->workspace_bytes));
}

static void matmul_context_free(MatmulContext* ctx) {
    cublasCheck(cublasLtDestroy(ctx->handle));
    cudaCheck(cudaFree(ctx->workspace));
}

typedef enum {
    MATMUL_EPILOGUE_NONE = 0,
    MATMUL_EPILOGUE_BIAS = 1,          /* D = A B + bias */
    MATMUL_EPILOGUE_GELU_AUX_BIAS = 2, /* aux = A B + bias; D = gelu(aux) */
} MatmulEpilogue;

/*
 * Column-major D[m, n] (ld m) = op(A) op(B) (+ D if accumulate) with the
 * epilogue. A is stored [k, m] (ld k) if trans_a else [m, k] (ld m); B is
 * stored [n, k] (ld n) if trans_b else [k, n] (ld k). bias has m entries;
 * aux (GELU) is [m, n] with ld m.
 */
static void matmul_cublaslt(MatmulContext* ctx, floatX* d, const floatX* a, const floatX* b, const floatX* bias,
                            floatX* aux, int m, int n, int k, int trans_a, int trans_b, int accumulate,
                            MatmulEpilogue epilogue, cudaStream_t stream) {
    if (m <= 0 || n <= 0 || k <= 0) die("matmul: bad shape m=%d n=%d k=%d", m, n, k);
    if (((uintptr_t)a | (uintptr_t)b | (uintptr_t)d | (uintptr_t)bias | (uintptr_t)aux) % 16 != 0)
        die("matmul: a pointer is not 16-byte aligned (m=%d n=%d k=%d)", m, n, k);
    cublasLtMatmulDesc_t desc;
    cublasCheck(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    if (epilogue == MATMUL_EPILOGUE_BIAS) epi = CUBLASLT_EPILOGUE_BIAS;
    if (epilogue == MATMUL_EPILOGUE_GELU_AUX_BIAS) epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if (epilogue != MATMUL_EPILOGUE_NONE) {
        if (bias == nullptr) die("matmul: the bias epilogue needs a bias pointer");
        const cudaDataType_t bias_type = CUDA_R_16BF;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                   sizeof(bias_type)));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    if (epilogue == MATMUL_EPILOGUE_GELU_AUX_BIAS) {
        if (aux == nullptr) die("matmul: the GELU epilogue needs an aux buffer for the pre-activation");
        const int64_t aux_ld = m;
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux,
                                                   sizeof(aux)));
        cublasCheck(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                                   sizeof(aux_ld)));
    }
    cublasLtMatrixLayout_t layout_a, layout_b, layout_d;
    cublasCheck(trans_a ? cublasLtMatrixLayoutCreate(&layout_a, CUDA_R_16BF, k, m, k)
                        : cublasLtMatrixLayoutCreate(&layout_a, CUDA_R_16BF, m, k, m));
    cublasCheck(trans_b ? cublasLtMatrixLayoutCreate(&layout_b, CUDA_R_16BF, n, k, n)
                        : cublasLtMatrixLayoutCreate(&layout_b, CUDA_R_16BF, k, n, k));
    cublasCheck(cublasLtMatrixLayoutCreate(&layout_d, CUDA_R_16BF, m, n, m));

    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &ctx->workspace_bytes, sizeof(ctx->workspace_bytes)));
    cublasLtMatmulHeuristicResult_t heuristic;
    int found = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(ctx->handle, desc, layout_a, layout_b, layout_d, layout_d, pref, 1,
                                               &heuristic, &found));
    if (found == 0) {
        die("matmul: cuBLASLt has no algorithm for m=%d n=%d k=%d trans_a=%d trans_b=%d epilogue=%d\n"
            "  hint: channel counts must be multiples of 8", m, n, k, trans_a, trans_b, (int)epilogue);
    }
    const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    cublasCheck(cublasLtMatmul(ctx->handle, desc, &alpha, a, layout_a, b, layout_b, &beta, d, layout_d, d, layout_d,
                               &heuristic.algo, ctx->workspace, ctx->workspace_bytes, stream));
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_a));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_b));
    cublasCheck(cublasLtMatrixLayoutDestroy(layout_d));
    cublasCheck(cublasLtMatmulDescDestroy(desc));
}

/*
 * out[N, OC] = inp[N, K] @ W[OC, K]^T (+ bias). In column-major terms
 * out^T[OC, N] = W^T... i.e. m = OC, n = N, k = K, A = W (stored [K, OC]
 * column-major, transposed), B = inp (stored [K, N], not transposed).
 * With gelu_preact non-NULL (requires bias): gelu_preact = inp W^T + bias and
 * out = gelu(gelu_preact).
 */
static void matmul_forward(MatmulContext* ctx, floatX* out, const floatX* inp, const floatX* weight,
                           const floatX* bias, floatX* gelu_preact, int N, int K, int OC, cudaStream_t stream) {
    MatmulEpilogue epi = bias ? MATMUL_EPILOGUE_BIAS : MATMUL_EPILOGUE_NONE;
    if (gelu_preact) epi = MATMUL_EPILOGUE_GELU_AUX_BIAS;
    matmul_cublaslt(ctx, out, weight, inp, bias, gelu_preact, OC, N, K, 1, 0, 0, epi, stream);
}

/* dinp[N, K] = dout[N, OC] @ W[OC, K] (accumulate: +=). Column-major:
   dinp^T[K, N] = W^T[K, OC] dout^T[OC, N]: m = K, n = N, k = OC, no transposes. */
static void matmul_backward_input(MatmulContext* ctx, floatX* dinp, const floatX* dout, const floatX* weight, int N,
                                  int K, int OC, int accumulate, cudaStream_t stream) {
    matmul_cublaslt(ctx, dinp, weight, dout, nullptr, nullptr, K, N, OC, 0, 0, accumulate, MATMUL_EPILOGUE_NONE,
                    stream);
}

/* dW[OC, K] += dout[N, OC]^T @ inp[N, K]. Column-major:
   dW^T[K, OC] = inp^T[K, N] dout[N, OC]: m = K, n = OC, k = N, B transposed. */
static void matmul_backward_weight(MatmulContext* ctx, floatX* dweight, const floatX* dout, const floatX* inp, int N,
                                   int K, int OC, cudaStream_t stream) {
    matmul_cublaslt(ctx, dweight, inp, dout, nullptr, nullptr, K, OC, N, 0, 1, 1, MATMUL_EPILOGUE_NONE, stream);
}

#endif /* MODEL_MATMUL_CUH */
