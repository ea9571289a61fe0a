/*
 * model/layernorm.cuh - LayerNorm forward/backward, the fused residual add,
 * and the deterministic column sums that parameter gradients need; the row
 * kernels are one family with RMSNorm (model/rmsnorm.cuh offers its API).
 *
 * Why: GPT-2 normalizes the residual stream twice per layer and once at the
 * end. Forward is fused with the residual add that precedes it
 * (residual = a + b; out = LN(residual)), which saves one full read and write
 * of the stream per LayerNorm. Statistics (mean, 1/std) are FP32 and saved for
 * backward (and for --recompute, which rebuilds the normalized output from
 * them instead of storing it).
 *
 * LayerNorm and RMSNorm differ only in the centring (RMSNorm: mean taken as
 * 0, no bias), so the three kernels are templates over RowNorm and each
 * `if constexpr` block is the one place the two differ; the LayerNorm
 * instances compile to the PTX the plain kernels had.
 *
 * Parameter gradients (dweight, dbias, and matmul biases) are sums over all
 * B*T rows. Atomics would make them depend on scheduling; instead a 2-D grid
 * sums fixed chunks of ROWS_PER_CHUNK rows into an FP32 scratch (one row of
 * partial sums per chunk), and a second kernel adds the chunks in order.
 * Same inputs, same bits, on every run.
 *
 * Offers: layernorm_forward, fused_residual_layernorm_forward,
 * layernorm_backward (dinp += ..., dweight += ..., dbias += ...),
 * bias_backward (dbias += column sums), colreduce_scratch_floats, and for
 * rmsnorm.cuh the kernel family rownorm_forward_kernel<RowNorm>,
 * rownorm_backward_input_kernel<RowNorm>, column_reduce<RowNorm>.
 * Shapes: rows N = B*T, channels C (C % 8 == 0), row-major [N, C].
 */
#ifndef MODEL_LAYERNORM_CUH
#define MODEL_LAYERNORM_CUH

#include "model/kernel_common.cuh"

#define LN_EPS 1e-5f
#define COLREDUCE_ROWS_PER_CHUNK 256
#define COLREDUCE_COLS_PER_BLOCK 256  /* 32 threads x 8 channels */
#define COLREDUCE_ROW_THREADS 8

/* The two row normalizations of the family: LayerNorm centres each row and
   has a bias; RMSNorm takes the mean as 0 and has a gain only. */
enum RowNorm { ROWNORM_LAYER = 0, ROWNORM_RMS = 1 };
#define ROWNORM_BLOCK 256 /* threads of the row kernels: one warp per row */

/* FP32 floats of scratch the column reductions need for N rows of `cols` sums. */
static inline size_t colreduce_scratch_floats(long long N, long long cols) {
    return (size_t)ceil_div(N, COLREDUCE_ROWS_PER_CHUNK) * (size_t)cols;
}

/* One warp per row. If residual_out is non-NULL, the row is first formed as
 * residual_out = bf16(inp + residual_b) (the fused residual add); otherwise
 * inp is normalized. RMSNorm: mean_out and bias are not read or written. */
template <int NORM>
__global__ void rownorm_forward_kernel(floatX* out, float* mean_out, float* rstd_out, floatX* residual_out,
                                         const floatX* inp, const floatX* residual_b, const floatX* weight,
                                         const floatX* bias, int N, int C) {
    const int warps_per_block = blockDim.x / 32;
    const int row = blockIdx.x * warps_per_block + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= N) return;
    const long long base = (long long)row * C;
    const floatX* x = inp + base;
    if (residual_out != nullptr) {
        /* Fused residual add: write the rounded sum, then normalize it. */
        for (int c = lane * 8; c < C; c += 256) {
            const Pack8 a = load_pack8(inp + base + c), b = load_pack8(residual_b + base + c);
            Pack8 s;
#pragma unroll
            for (int k = 0; k < 8; k++) s.v[k] = from_float(to_float(a.v[k]) + to_float(b.v[k]));
            store_pack8(residual_out + base + c, s);
        }
        __syncwarp();
        x = residual_out + base;
    }
    float mean = 0.0f;
    if constexpr (NORM == ROWNORM_LAYER) {
        float sum = 0.0f;
        for (int c = lane * 8; c < C; c += 256) {
            const Pack8 v = load_pack8(x + c);
#pragma unroll
            for (int k = 0; k < 8; k++) sum += to_float(v.v[k]);
        }
        mean = warp_sum(sum) / C;
    }
    float sq = 0.0f;
    for (int c = lane * 8; c < C; c += 256) {
        const Pack8 v = load_pack8(x + c);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float d = to_float(v.v[k]);
            if constexpr (NORM == ROWNORM_LAYER) d -= mean;
            sq += d * d;
        }
    }
    const float rstd = rsqrtf(warp_sum(sq) / C + LN_EPS);
    for (int c = lane * 8; c < C; c += 256) {
        const Pack8 v = load_pack8(x + c), w = load_pack8(weight + c);
        Pack8 o;
        if constexpr (NORM == ROWNORM_LAYER) {
            const Pack8 b = load_pack8(bias + c);
#pragma unroll
            for (int k = 0; k < 8; k++)
                o.v[k] = from_float((to_float(v.v[k]) - mean) * rstd * to_float(w.v[k]) + to_float(b.v[k]));
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++) o.v[k] = from_float(to_float(v.v[k]) * rstd * to_float(w.v[k]));
        }
        store_pack8(out + base + c, o);
    }
    if (lane == 0) {
        if constexpr (NORM == ROWNORM_LAYER) mean_out[row] = mean;
        rstd_out[row] = rstd;
    }
}

static void layernorm_forward(floatX* out, float* mean, float* rstd, const floatX* inp, const floatX* weight,
                              const floatX* bias, int N, int C, cudaStream_t stream) {
    rownorm_forward_kernel<ROWNORM_LAYER><<<ceil_div(N, ROWNORM_BLOCK / 32), ROWNORM_BLOCK, 0, stream>>>(
        out, mean, rstd, nullptr, inp, nullptr, weight, bias, N, C);
    cudaCheckLastError();
}

/* residual = a + b (BF16), out = LayerNorm(residual). */
static void fused_residual_layernorm_forward(floatX* residual, floatX* out, float* mean, float* rstd,
                                             const floatX* a, const floatX* b, const floatX* weight,
                                             const floatX* bias, int N, int C, cudaStream_t stream) {
    rownorm_forward_kernel<ROWNORM_LAYER><<<ceil_div(N, ROWNORM_BLOCK / 32), ROWNORM_BLOCK, 0, stream>>>(
        out, mean, rstd, residual, a, b, weight, bias, N, C);
    cudaCheckLastError();
}

/* Row part of the backward, one warp per row:
 *   xhat = (x - mean) * rstd, g = dout * w,
 *   dinp += rstd * (g - mean(g) - xhat * mean(g * xhat));
 * RMSNorm: mean = 0 and no mean(g) term (mean is not read). */
template <int NORM>
__global__ void rownorm_backward_input_kernel(floatX* dinp, const floatX* dout, const floatX* inp,
                                                const float* mean, const float* rstd, const floatX* weight, int N,
                                                int C) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (row >= N) return;
    const long long base = (long long)row * C;
    float m = 0.0f;
    if constexpr (NORM == ROWNORM_LAYER) m = mean[row];
    const float r = rstd[row];
    float sum_g = 0.0f, sum_gx = 0.0f;
    for (int c = lane * 8; c < C; c += 256) {
        const Pack8 d = load_pack8(dout + base + c), x = load_pack8(inp + base + c), w = load_pack8(weight + c);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const float g = to_float(d.v[k]) * to_float(w.v[k]);
            if constexpr (NORM == ROWNORM_LAYER) sum_g += g;
            sum_gx += g * (to_float(x.v[k]) - m) * r;
        }
    }
    float mean_g = 0.0f;
    if constexpr (NORM == ROWNORM_LAYER) mean_g = warp_sum(sum_g) / C;
    const float mean_gx = warp_sum(sum_gx) / C;
    for (int c = lane * 8; c < C; c += 256) {
        const Pack8 d = load_pack8(dout + base + c), x = load_pack8(inp + base + c), w = load_pack8(weight + c);
        Pack8 di = load_pack8(dinp + base + c);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            const float g = to_float(d.v[k]) * to_float(w.v[k]);
            const float xhat = (to_float(x.v[k]) - m) * r;
            if constexpr (NORM == ROWNORM_LAYER)
                di.v[k] = from_float(to_float(di.v[k]) + r * (g - mean_g - xhat * mean_gx));
            else
                di.v[k] = from_float(to_float(di.v[k]) + r * (g - xhat * mean_gx));
        }
        store_pack8(dinp + base + c, di);
    }
}

/*
 * Column partial sums over one chunk of rows. grid (ceil(C/256), chunks),
 * block (32, COLREDUCE_ROW_THREADS). Writes partial[chunk][c] = sum over the
 * chunk's rows of dout[r][c] and, when inp is non-NULL (LayerNorm),
 * partial[chunk][C + c] = sum of dout[r][c] * xhat[r][c] (RMSNorm: xhat =
 * x * rstd, mean not read).
 */
template <int NORM>
__global__ void colreduce_partial_kernel(float* partial, const floatX* dout, const floatX* inp, const float* mean,
                                         const float* rstd, int N, int C) {
    __shared__ float smem[2][COLREDUCE_ROW_THREADS][COLREDUCE_COLS_PER_BLOCK];
    const int c = blockIdx.x * COLREDUCE_COLS_PER_BLOCK + threadIdx.x * 8;
    const int chunk = blockIdx.y;
    const int row_end = min(N, (chunk + 1) * COLREDUCE_ROWS_PER_CHUNK);
    const int with_xhat = inp != nullptr;
    float acc_d[8] = {0, 0, 0, 0, 0, 0, 0, 0}, acc_dx[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (c < C) {
        for (int r = chunk * COLREDUCE_ROWS_PER_CHUNK + threadIdx.y; r < row_end; r += COLREDUCE_ROW_THREADS) {
            const Pack8 d = load_pack8(dout + (long long)r * C + c);
            if (with_xhat) {
                const Pack8 x = load_pack8(inp + (long long)r * C + c);
                float m = 0.0f;
                if constexpr (NORM == ROWNORM_LAYER) m = mean[r];
                const float rs = rstd[r];
#pragma unroll
                for (int k = 0; k < 8; k++) {
                    acc_d[k] += to_float(d.v[k]);
                    acc_dx[k] += to_float(d.v[k]) * (to_float(x.v[k]) - m) * rs;
                }
            } else {
#pragma unroll
                for (int k = 0; k < 8; k++) acc_d[k] += to_float(d.v[k]);
            }
        }
    }
#pragma unroll
    for (int k = 0; k < 8; k++) {
        smem[0][threadIdx.y][threadIdx.x * 8 + k] = acc_d[k];
        smem[1][threadIdx.y][threadIdx.x * 8 + k] = acc_dx[k];
    }
    __syncthreads();
    /* Fixed-order sum over the row threads; each thread finishes whole columns. */
    const int tid = threadIdx.y * 32 + threadIdx.x;
    for (int col = tid; col < COLREDUCE_COLS_PER_BLOCK; col += 32 * COLREDUCE_ROW_THREADS) {
        const int cc = blockIdx.x * COLREDUCE_COLS_PER_BLOCK + col;
        if (cc >= C) continue;
        float s = 0.0f, sx = 0.0f;
        for (int y = 0; y < COLREDUCE_ROW_THREADS; y++) {
            s += smem[0][y][col];
            sx += smem[1][y][col];
        }
        partial[(long long)chunk * (with_xhat ? 2 * C : C) + cc] = s;
        if (with_xhat) partial[(long long)chunk * 2 * C + C + cc] = sx;
    }
}

/* grad_sum[c] += sum over chunks (in order) of partial[chunk][c] (and the
   second half into grad_xhat when it is non-NULL). RMSNorm has no bias:
   grad_sum is not read or written. */
template <int NORM>
__global__ void colreduce_final_kernel(floatX* grad_sum, floatX* grad_xhat, const float* partial, int chunks, int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const int stride = grad_xhat ? 2 * C : C;
    float s = 0.0f, sx = 0.0f;
    for (int k = 0; k < chunks; k++) {
        s += partial[(long long)k * stride + c];
        if (grad_xhat) sx += partial[(long long)k * stride + C + c];
    }
    if constexpr (NORM == ROWNORM_LAYER) grad_sum[c] = from_float(to_float(grad_sum[c]) + s);
    if (grad_xhat) grad_xhat[c] = from_float(to_float(grad_xhat[c]) + sx);
}

/* grad_sum[c] += sum_r dout[r][c], and when inp is non-NULL grad_xhat[c] +=
   sum_r dout[r][c] * xhat[r][c] (xhat from inp, mean, rstd): the two column
   kernels above, chunks of rows in a fixed order (deterministic).
   scratch: colreduce_scratch_floats(N, C) floats, (N, 2*C) with inp.
   RMSNorm (NORM = ROWNORM_RMS, inp non-NULL): xhat = x * rstd, grad_sum and
   mean unused (may be NULL). */
template <int NORM>
static void column_reduce(floatX* grad_sum, floatX* grad_xhat, float* scratch, const floatX* dout, const floatX* inp,
                          const float* mean, const float* rstd, int N, int C, cudaStream_t stream) {
    const int chunks = ceil_div(N, COLREDUCE_ROWS_PER_CHUNK);
    dim3 grid(ceil_div(C, COLREDUCE_COLS_PER_BLOCK), chunks), block(32, COLREDUCE_ROW_THREADS);
    colreduce_partial_kernel<NORM><<<grid, block, 0, stream>>>(scratch, dout, inp, mean, rstd, N, C);
    cudaCheckLastError();
    colreduce_final_kernel<NORM><<<ceil_div(C, 256), 256, 0, stream>>>(grad_sum, grad_xhat, scratch, chunks, C);
    cudaCheckLastError();
}

/* dbias[c] += sum_r dout[r][c]  (matmul bias gradient; deterministic).
   scratch: colreduce_scratch_floats(N, C) floats. */
static void bias_backward(floatX* dbias, const floatX* dout, float* scratch, int N, int C, cudaStream_t stream) {
    if (dbias == nullptr) return; /* a model without this bias (--bias 0) */
    column_reduce<ROWNORM_LAYER>(dbias, nullptr, scratch, dout, nullptr, nullptr, nullptr, N, C, stream);
}

/* dinp += d LN / d inp; dweight += sum dout*xhat; dbias += sum dout.
   inp is the LayerNorm's input (the residual stream), mean/rstd its saved
   statistics. scratch: colreduce_scratch_floats(N, 2*C) floats. */
static void layernorm_backward(floatX* dinp, floatX* dweight, floatX* dbias, float* scratch, const floatX* dout,
                               const floatX* inp, const floatX* weight, const float* mean, const float* rstd, int N,
                               int C, cudaStream_t stream) {
    rownorm_backward_input_kernel<ROWNORM_LAYER><<<ceil_div(N, ROWNORM_BLOCK / 32), ROWNORM_BLOCK, 0, stream>>>(
        dinp, dout, inp, mean, rstd, weight, N, C);
    cudaCheckLastError();
    column_reduce<ROWNORM_LAYER>(dbias, dweight, scratch, dout, inp, mean, rstd, N, C, stream);
}

#endif /* MODEL_LAYERNORM_CUH */
