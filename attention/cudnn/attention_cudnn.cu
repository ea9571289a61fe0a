/*
 * attention/cudnn/attention_cudnn.cu - cudnn mode with cuDNN found: the causal BF16 SDPA forward and
 * backward as cuDNN backend operation graphs, one cached plan per shape (attention_cudnn.cuh).
 *
 * Why graphs of primitive ops: the native SDPA_FWD / SDPA_BWD operation descriptors of cuDNN 9.19 have
 * no causal-mask attribute, so the attention is written as the operation graph that cuDNN's fused flash
 * engine recognises (the pattern cuDNN's frontend lowers its SDPA node to):
 *
 *   forward:  S = Q K^T (fp32)            P = bf16(exp(S' - M) / L)      O = P V
 *             S' = select(row >= col, S * scale, -inf)                   M = rowmax(S'), L = rowsum(exp(S' - M))
 *             Stats = M + log(L)  (= our bf16 mode's LSE: natural log, scaled units)
 *   backward: Dsum = rowsum(dO * O) * 1           P = exp(select(row >= col, S * scale - Stats, -inf))
 *             dV = bf16(P)^T dO                   dS = (dO V^T - Dsum) * P * scale
 *             dK = bf16(dS)^T Q                   dQ = dS K  (directly, or through an fp32 accumulator)
 * Virtual tensors are fp32 unless the pattern rounds them (P, the transposed P and dS); every op computes
 * in fp32 (the comparison in BOOLEAN); the scale, -inf and 1 are by-value fp32 scalars.
 *
 * Strides (C = NH * HS): Q, K, V are read in place from qkv [B, T, 3, NH, HS] as (B, NH, T, HS) with
 * strides (T*3C, HS, 3C, 1) at offsets 0, C, 2C (K and, in the backward, V are passed transposed, dims
 * (B, NH, HS, T), strides (T*3C, HS, 1, 3C)); O and dO (T*C, HS, C, 1); dQ, dK, dV like Q inside dqkv.
 * Stats: (B, NH, T, 1) fp32 at strides (NH*T*2, T*2, 2, 1), i.e. element 0 of our stats slot; element 1
 * is set to 0 after the forward (bf16 mode's {LSE, 0}).
 *
 * Per call on the training path (the first variant of each list, the one every shape built on the H200
 * with cuDNN 9.14: dev/results/cudnn_attention_2026-12-02.md): forward = one cudnnBackendExecute and one
 * small kernel (stats_slot_fill: element 1 of each slot to 0); backward = one cudnnBackendExecute, nothing
 * else. The host side of each call is cudnnSetStream and one variant-pack descriptor (created, finalized,
 * destroyed). The packed fallback variants add one small kernel each: stats_slot_fill also copies the
 * packed LSE in (forward), stats_slot_pack copies it out (backward), grads_unpack moves the three packed
 * gradients into dqkv (backward).
 *
 * CUDA graphs (train_gpt --cuda-graph 1): cudnnBackendExecute launches the plan's kernels on the handle's
 * stream, so a call can be stream-captured once its plan and the workspace exist. Everything that cannot
 * be captured happens on the first call of a shape: plan building (cuDNN may compile kernels and allocate)
 * and workspace growth (cudaMalloc). The trainer runs one eager micro-step before it captures; a first call
 * of a shape, or a workspace growth, inside a capture stops with a message naming the shape and the fix
 * instead of failing inside cuDNN. The captured graph keeps the workspace pointer of its capture: an
 * outgrown workspace is never freed, and a plan is never freed while the process runs.
 *
 * Variants (CudnnAttnVariant), tried in this order by the production path, the first that builds wins:
 *   forward:  stats in the slot; stats packed (scratch + copy).
 *   backward: for stats in the slot, then packed; for dqkv in place, then packed scratch + copy: dQ
 *             direct first when the engine's dP workspace (B*NH*T64*T64*2 bytes, T64 = T rounded up to
 *             64) is at most 256 MiB, else the fp32 accumulator first, then the other.
 *
 * Owns: the cuDNN handle (one per process, first device used), the plan cache (ATTN_CUDNN_CACHE shapes; a
 *   full cache drops its oldest forward-only shape, which the sampler makes at every context length),
 * and one device workspace shared by all plans (cuDNN's workspace followed by our scratch: Dsum, the dQ
 * accumulator, packed stats, packed dQ/dK/dV), grown on demand (an outgrown one is kept, not freed).
 * Every cuDNN call is checked: a failure names file:line, cudnnGetErrorString and cudnnGetLastErrorString.
 */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>
#include <cudnn.h>
#include "attention/cudnn/attention_cudnn.cuh"
#include "common/cuda_utils.cuh"
#include "common/utils.h"

namespace {

/* ---- error reporting ---- */

std::string last_error_string() {
    char buf[2048] = "";
    cudnnGetLastErrorString(buf, sizeof buf);
    return buf[0] ? std::string(buf) : std::string("(none)");
}

/* For calls outside graph building (handle, execute): die with file:line and both error strings. */
void cudnn_check_impl(cudnnStatus_t st, const char* what, const char* file, int line) {
    if (st == CUDNN_STATUS_SUCCESS) return;
    die("cuDNN error at %s:%d in %s: %s (status %d)\n  cuDNN's last error: %s\n"
        "  hint: dev/cudnn_check.sh reports every graph node and engine for a shape; CUDNN_LOGERR_DBG=1 "
        "CUDNN_LOGDEST_DBG=stderr makes cuDNN log its own reasons",
        file, line, what, cudnnGetErrorString(st), (int)st, last_error_string().c_str());
}
#define CUDNN_CHECK(call) cudnn_check_impl((call), #call, __FILE__, __LINE__)

cudnnHandle_t g_handle = NULL;
cudnnHandle_t handle_get() {
    if (g_handle == NULL) CUDNN_CHECK(cudnnCreate(&g_handle));
    return g_handle;
}

/* ---- the shared workspace ----
   Grown, never freed: a CUDA graph captured earlier (--cuda-graph) keeps the old pointer, so an outgrown
   buffer stays allocated for the life of the process (growth happens once per new, larger shape). */

/* Dies if stream is being captured into a CUDA graph: `what` (a plan build or a workspace growth) cannot be. */
void require_not_capturing(cudaStream_t stream, const char* what, AttnShape s) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    cudaCheck(cudaStreamIsCapturing(stream, &cs));
    if (cs != cudaStreamCaptureStatusNone)
        die("attention (cuDNN): %s for B=%d NH=%d T=%d HS=%d inside CUDA graph capture: it builds cuDNN plans or "
            "allocates, which a graph cannot hold\n"
            "  hint: run one call of this shape before capturing (train_gpt does one eager step first), or "
            "--cuda-graph 0", what, s.B, s.NH, s.T, s.HS);
}

void* g_ws = NULL;
size_t g_ws_bytes = 0;
void* workspace_get(size_t bytes, cudaStream_t stream, AttnShape s) {
    if (bytes <= g_ws_bytes && g_ws != NULL) return g_ws;
    require_not_capturing(stream, "a larger cuDNN workspace", s);
    const size_t grown = bytes + bytes / 4 > 256 ? bytes + bytes / 4 : 256;
    cudaCheck(cudaMalloc(&g_ws, grown));
    g_ws_bytes = grown;
    return g_ws;
}

size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

/* ---- the small kernels around cuDNN's call (grid-stride, one launch each) ---- */

const int kCopyThreads = 256;
unsigned copy_blocks(size_t n) {
    const size_t b = (n + kCopyThreads - 1) / kCopyThreads;
    return (unsigned)(b < 4096 ? (b > 0 ? b : 1) : 4096);
}

/* Our stats slot [rows, 2] after the forward: element 1 to 0; element 0 from lse when the LSE went to a
   packed [rows] scratch (lse NULL: cuDNN wrote element 0 in place). */
__global__ void stats_slot_fill(float* stats, const float* lse, size_t rows) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows; i += (size_t)gridDim.x * blockDim.x) {
        if (lse) stats[2 * i] = lse[i];
        stats[2 * i + 1] = 0.0f;
    }
}

/* Element 0 of each slot into a packed [rows] scratch (the backward's packed-stats variant). */
__global__ void stats_slot_pack(float* packed, const float* stats, size_t rows) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < rows; i += (size_t)gridDim.x * blockDim.x)
        packed[i] = stats[2 * i];
}

/* The three packed [B*T, C] gradients g (dQ, dK, dV one after another) into dqkv [B*T, 3, C], in 16-byte
   vectors (C is a multiple of 64 elements; both buffers are 16-byte aligned). */
__global__ void grads_unpack(uint4* dqkv, const uint4* g, size_t bt, size_t c_vec) {
    const size_t n = 3 * bt * c_vec;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const size_t k = i / (bt * c_vec), r = (i / c_vec) % bt, c = i % c_vec;
        dqkv[(r * 3 + k) * c_vec + c] = g[i];
    }
}

/* ---- the graph builder: every descriptor is kept until the plan is freed; each step is logged ---- */

enum Uid : int64_t {
    U_Q = 1, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEGINF, U_DO, U_DQ, U_DK, U_DV, U_DSUM, U_DQACC, U_ONE,
    U_VIRTUAL = 100
};

struct Builder {
    std::vector<cudnnBackendDescriptor_t> owned;
    std::vector<cudnnBackendDescriptor_t> ops;
    char* log;
    size_t cap;
    size_t len;
    int failed;
    int64_t next_uid;
};

void blog(Builder* g, const char* fmt, ...) {
    if (g->log == NULL || g->cap == 0) return;
    if (g->len + 1 >= g->cap) return;
    va_list ap;
    va_start(ap, fmt);
    const int n = vsnprintf(g->log + g->len, g->cap - g->len, fmt, ap);
    va_end(ap);
    if (n > 0) g->len = g->len + (size_t)n < g->cap ? g->len + (size_t)n : g->cap - 1;
}

/* Records a failed call (step, file:line, both error strings) and marks the build failed. */
int bcheck(Builder* g, cudnnStatus_t st, const char* step, const char* what, const char* file, int line) {
    if (st == CUDNN_STATUS_SUCCESS) return 1;
    blog(g, "  FAILED %s: %s at %s:%d: %s (status %d); cuDNN's last error: %s\n", step, what, file, line,
         cudnnGetErrorString(st), (int)st, last_error_string().c_str());
    g->failed = 1;
    return 0;
}
#define BCHECK(g, step, call) bcheck((g), (call), (step), #call, __FILE__, __LINE__)

cudnnBackendDescriptor_t bcreate(Builder* g, cudnnBackendDescriptorType_t type, const char* step) {
    cudnnBackendDescriptor_t d = NULL;
    if (!BCHECK(g, step, cudnnBackendCreateDescriptor(type, &d))) return NULL;
    g->owned.push_back(d);
    return d;
}

const char* dtype_name(cudnnDataType_t t) {
    switch (t) {
        case CUDNN_DATA_FLOAT: return "f32";
        case CUDNN_DATA_BFLOAT16: return "bf16";
        case CUDNN_DATA_INT32: return "i32";
        case CUDNN_DATA_BOOLEAN: return "bool";
        default: return "?";
    }
}

struct Dims {
    int64_t d[4];
    int64_t s[4];
};

cudnnBackendDescriptor_t tensor(Builder* g, const char* name, int64_t uid, cudnnDataType_t dt, Dims x, bool virt,
                                bool by_value = false) {
    if (g->failed) return NULL;
    if (uid < 0) uid = g->next_uid++;
    cudnnBackendDescriptor_t t = bcreate(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, name);
    if (t == NULL) return NULL;
    int64_t align = 16;
    int ok = BCHECK(g, name, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt)) &&
             BCHECK(g, name, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, x.d)) &&
             BCHECK(g, name, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, x.s)) &&
             BCHECK(g, name, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid)) &&
             BCHECK(g, name, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align)) &&
             BCHECK(g, name, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &virt));
    if (ok && by_value)
        ok = BCHECK(g, name, cudnnBackendSetAttribute(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value));
    if (ok) ok = BCHECK(g, name, cudnnBackendFinalize(t));
    blog(g, "  tensor %-14s uid %3lld %-4s dims (%lld,%lld,%lld,%lld) strides (%lld,%lld,%lld,%lld)%s%s: %s\n", name,
         (long long)uid, dtype_name(dt), (long long)x.d[0], (long long)x.d[1], (long long)x.d[2], (long long)x.d[3],
         (long long)x.s[0], (long long)x.s[1], (long long)x.s[2], (long long)x.s[3], virt ? " virtual" : "",
         by_value ? " by-value" : "", ok ? "ok" : "FAILED");
    return ok ? t : NULL;
}

void add_op(Builder* g, const char* name, cudnnBackendDescriptor_t op, int ok) {
    if (ok) ok = BCHECK(g, name, cudnnBackendFinalize(op));
    blog(g, "  node   %-22s %s\n", name, ok ? "ok" : "FAILED");
    if (ok) g->ops.push_back(op);
}

const char* pw_name(cudnnPointwiseMode_t m) {
    switch (m) {
        case CUDNN_POINTWISE_MUL: return "mul";
        case CUDNN_POINTWISE_ADD: return "add";
        case CUDNN_POINTWISE_SUB: return "sub";
        case CUDNN_POINTWISE_DIV: return "div";
        case CUDNN_POINTWISE_EXP: return "exp";
        case CUDNN_POINTWISE_LOG: return "log";
        case CUDNN_POINTWISE_CMP_GE: return "cmp_ge";
        case CUDNN_POINTWISE_BINARY_SELECT: return "binary_select";
        case CUDNN_POINTWISE_GEN_INDEX: return "gen_index";
        case CUDNN_POINTWISE_IDENTITY: return "identity";
        default: return "pointwise";
    }
}

/* y = mode(x [, b [, t]]); axis >= 0 for GEN_INDEX. */
void pointwise(Builder* g, const char* name, cudnnPointwiseMode_t mode, cudnnBackendDescriptor_t x,
               cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y,
               cudnnDataType_t prec = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    if (g->failed) return;
    char step[96];
    snprintf(step, sizeof step, "%s (%s)", name, pw_name(mode));
    cudnnBackendDescriptor_t pw = bcreate(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, step);
    if (pw == NULL) return;
    int ok = BCHECK(g, step, cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode)) &&
             BCHECK(g, step, cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec));
    if (ok && axis >= 0)
        ok = BCHECK(g, step, cudnnBackendSetAttribute(pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis));
    if (ok) ok = BCHECK(g, step, cudnnBackendFinalize(pw));
    if (!ok) return;
    cudnnBackendDescriptor_t op = bcreate(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, step);
    if (op == NULL) return;
    ok = BCHECK(g, step, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw)) &&
         BCHECK(g, step, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x));
    if (ok && b) ok = BCHECK(g, step, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b));
    if (ok && t) ok = BCHECK(g, step, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t));
    if (ok) ok = BCHECK(g, step, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    add_op(g, step, op, ok);
}

/* c = a b (batched over the first two dims), fp32 compute. */
void matmul(Builder* g, const char* name, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b,
            cudnnBackendDescriptor_t c) {
    if (g->failed) return;
    cudnnBackendDescriptor_t mm = bcreate(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, name);
    if (mm == NULL) return;
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    int ok = BCHECK(g, name, cudnnBackendSetAttribute(mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp)) &&
             BCHECK(g, name, cudnnBackendFinalize(mm));
    if (!ok) return;
    cudnnBackendDescriptor_t op = bcreate(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, name);
    if (op == NULL) return;
    ok = BCHECK(g, name, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a)) &&
         BCHECK(g, name, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b)) &&
         BCHECK(g, name, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c)) &&
         BCHECK(g, name, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm));
    add_op(g, name, op, ok);
}

/* y = reduce(x) over the dims where y has extent 1, fp32 compute. */
void reduction(Builder* g, const char* name, cudnnReduceTensorOp_t rop, cudnnBackendDescriptor_t x,
               cudnnBackendDescriptor_t y) {
    if (g->failed) return;
    cudnnBackendDescriptor_t rd = bcreate(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, name);
    if (rd == NULL) return;
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    int ok = BCHECK(g, name, cudnnBackendSetAttribute(rd, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &rop)) &&
             BCHECK(g, name, cudnnBackendSetAttribute(rd, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp)) &&
             BCHECK(g, name, cudnnBackendFinalize(rd));
    if (!ok) return;
    cudnnBackendDescriptor_t op = bcreate(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, name);
    if (op == NULL) return;
    ok = BCHECK(g, name, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x)) &&
         BCHECK(g, name, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y)) &&
         BCHECK(g, name, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &rd));
    add_op(g, name, op, ok);
}

/* y = x viewed with y's dims and strides (a transpose here). */
void reshape(Builder* g, const char* name, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    if (g->failed) return;
    cudnnBackendDescriptor_t op = bcreate(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, name);
    if (op == NULL) return;
    int ok = BCHECK(g, name, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x)) &&
             BCHECK(g, name, cudnnBackendSetAttribute(op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y));
    add_op(g, name, op, ok);
}

/* ---- shapes ---- */

struct Layout {
    int64_t B, NH, T, HS, C;
    Dims qkv_part;   /* Q, K, V, dQ, dK, dV in the fused buffer: (B, NH, T, HS) */
    Dims qkv_part_t; /* K or V transposed: (B, NH, HS, T) */
    Dims out;        /* O, dO and the packed dQ/dK/dV scratch: (B, NH, T, HS) with (T*C, HS, C, 1) */
    Dims scores;     /* (B, NH, T, T) */
    Dims scores_t;   /* the same, transposed view */
    Dims row;        /* (B, NH, T, 1) packed */
    Dims stats_slot; /* (B, NH, T, 1) in our [B, NH, T, 2] slot */
    Dims rowhs;      /* (B, NH, T, HS) packed fp32 */
    Dims scalar;
};

Layout make_layout(AttnShape s) {
    Layout L;
    L.B = s.B; L.NH = s.NH; L.T = s.T; L.HS = s.HS; L.C = (int64_t)s.NH * s.HS;
    const int64_t B = L.B, NH = L.NH, T = L.T, HS = L.HS, C = L.C;
    L.qkv_part = Dims{{B, NH, T, HS}, {T * 3 * C, HS, 3 * C, 1}};
    L.qkv_part_t = Dims{{B, NH, HS, T}, {T * 3 * C, HS, 1, 3 * C}};
    L.out = Dims{{B, NH, T, HS}, {T * C, HS, C, 1}};
    L.scores = Dims{{B, NH, T, T}, {NH * T * T, T * T, T, 1}};
    L.scores_t = Dims{{B, NH, T, T}, {NH * T * T, T * T, 1, T}};
    L.row = Dims{{B, NH, T, 1}, {NH * T, T, 1, 1}};
    L.stats_slot = Dims{{B, NH, T, 1}, {NH * T * 2, T * 2, 2, 1}};
    L.rowhs = Dims{{B, NH, T, HS}, {NH * T * HS, T * HS, HS, 1}};
    L.scalar = Dims{{1, 1, 1, 1}, {1, 1, 1, 1}};
    return L;
}

/* The causal mask on x: row >= col keeps x, else -inf. */
cudnnBackendDescriptor_t causal_mask(Builder* g, const Layout& L, cudnnBackendDescriptor_t x,
                                     cudnnBackendDescriptor_t neginf) {
    cudnnBackendDescriptor_t row = tensor(g, "row_index", -1, CUDNN_DATA_INT32, L.scores, true);
    cudnnBackendDescriptor_t col = tensor(g, "col_index", -1, CUDNN_DATA_INT32, L.scores, true);
    cudnnBackendDescriptor_t keep = tensor(g, "causal_keep", -1, CUDNN_DATA_BOOLEAN, L.scores, true);
    cudnnBackendDescriptor_t y = tensor(g, "masked", -1, CUDNN_DATA_FLOAT, L.scores, true);
    pointwise(g, "gen_row_index", CUDNN_POINTWISE_GEN_INDEX, x, NULL, NULL, row, CUDNN_DATA_FLOAT, 2);
    pointwise(g, "gen_col_index", CUDNN_POINTWISE_GEN_INDEX, x, NULL, NULL, col, CUDNN_DATA_FLOAT, 3);
    pointwise(g, "row_ge_col", CUDNN_POINTWISE_CMP_GE, row, col, NULL, keep, CUDNN_DATA_BOOLEAN);
    pointwise(g, "causal_select", CUDNN_POINTWISE_BINARY_SELECT, x, neginf, keep, y);
    return y;
}

void build_forward(Builder* g, const Layout& L, const CudnnAttnVariant& v) {
    cudnnBackendDescriptor_t q = tensor(g, "Q", U_Q, CUDNN_DATA_BFLOAT16, L.qkv_part, false);
    cudnnBackendDescriptor_t kt = tensor(g, "K^T", U_K, CUDNN_DATA_BFLOAT16, L.qkv_part_t, false);
    cudnnBackendDescriptor_t vv = tensor(g, "V", U_V, CUDNN_DATA_BFLOAT16, L.qkv_part, false);
    cudnnBackendDescriptor_t o = tensor(g, "O", U_O, CUDNN_DATA_BFLOAT16, L.out, false);
    cudnnBackendDescriptor_t stats = tensor(g, "Stats", U_STATS, CUDNN_DATA_FLOAT, v.stats_packed ? L.row : L.stats_slot, false);
    cudnnBackendDescriptor_t scale = tensor(g, "scale", U_SCALE, CUDNN_DATA_FLOAT, L.scalar, false, true);
    cudnnBackendDescriptor_t neginf = tensor(g, "-inf", U_NEGINF, CUDNN_DATA_FLOAT, L.scalar, false, true);

    cudnnBackendDescriptor_t s = tensor(g, "S", -1, CUDNN_DATA_FLOAT, L.scores, true);
    matmul(g, "matmul Q K^T", q, kt, s);
    cudnnBackendDescriptor_t ss = tensor(g, "S*scale", -1, CUDNN_DATA_FLOAT, L.scores, true);
    pointwise(g, "scale", CUDNN_POINTWISE_MUL, s, scale, NULL, ss);
    cudnnBackendDescriptor_t sm = causal_mask(g, L, ss, neginf);
    cudnnBackendDescriptor_t m = tensor(g, "rowmax", -1, CUDNN_DATA_FLOAT, L.row, true);
    reduction(g, "reduce max", CUDNN_REDUCE_TENSOR_MAX, sm, m);
    cudnnBackendDescriptor_t z = tensor(g, "S-M", -1, CUDNN_DATA_FLOAT, L.scores, true);
    pointwise(g, "sub max", CUDNN_POINTWISE_SUB, sm, m, NULL, z);
    cudnnBackendDescriptor_t e = tensor(g, "exp(S-M)", -1, CUDNN_DATA_FLOAT, L.scores, true);
    pointwise(g, "exp", CUDNN_POINTWISE_EXP, z, NULL, NULL, e);
    cudnnBackendDescriptor_t l = tensor(g, "rowsum", -1, CUDNN_DATA_FLOAT, L.row, true);
    reduction(g, "reduce sum", CUDNN_REDUCE_TENSOR_ADD, e, l);
    cudnnBackendDescriptor_t lnl = tensor(g, "log(rowsum)", -1, CUDNN_DATA_FLOAT, L.row, true);
    pointwise(g, "log", CUDNN_POINTWISE_LOG, l, NULL, NULL, lnl);
    pointwise(g, "stats = max+log", CUDNN_POINTWISE_ADD, m, lnl, NULL, stats);
    cudnnBackendDescriptor_t p = tensor(g, "P", -1, CUDNN_DATA_BFLOAT16, L.scores, true);
    pointwise(g, "div sum", CUDNN_POINTWISE_DIV, e, l, NULL, p);
    matmul(g, "matmul P V", p, vv, o);
}

void build_backward(Builder* g, const Layout& L, const CudnnAttnVariant& v) {
    const Dims grad = v.dqkv_packed ? L.out : L.qkv_part;
    cudnnBackendDescriptor_t q = tensor(g, "Q", U_Q, CUDNN_DATA_BFLOAT16, L.qkv_part, false);
    cudnnBackendDescriptor_t kt = tensor(g, "K^T", U_K, CUDNN_DATA_BFLOAT16, L.qkv_part_t, false);
    cudnnBackendDescriptor_t vt = tensor(g, "V^T", U_V, CUDNN_DATA_BFLOAT16, L.qkv_part_t, false);
    cudnnBackendDescriptor_t o = tensor(g, "O", U_O, CUDNN_DATA_BFLOAT16, L.out, false);
    cudnnBackendDescriptor_t stats = tensor(g, "Stats", U_STATS, CUDNN_DATA_FLOAT, v.stats_packed ? L.row : L.stats_slot, false);
    cudnnBackendDescriptor_t scale = tensor(g, "scale", U_SCALE, CUDNN_DATA_FLOAT, L.scalar, false, true);
    cudnnBackendDescriptor_t neginf = tensor(g, "-inf", U_NEGINF, CUDNN_DATA_FLOAT, L.scalar, false, true);
    cudnnBackendDescriptor_t one = tensor(g, "one", U_ONE, CUDNN_DATA_FLOAT, L.scalar, false, true);
    cudnnBackendDescriptor_t dout = tensor(g, "dO", U_DO, CUDNN_DATA_BFLOAT16, L.out, false);
    cudnnBackendDescriptor_t dq = tensor(g, "dQ", U_DQ, CUDNN_DATA_BFLOAT16, grad, false);
    cudnnBackendDescriptor_t dk = tensor(g, "dK", U_DK, CUDNN_DATA_BFLOAT16, grad, false);
    cudnnBackendDescriptor_t dv = tensor(g, "dV", U_DV, CUDNN_DATA_BFLOAT16, grad, false);
    cudnnBackendDescriptor_t dsum = tensor(g, "Dsum", U_DSUM, CUDNN_DATA_FLOAT, L.row, false);

    /* Dsum = rowsum(dO * O) * 1 */
    cudnnBackendDescriptor_t doo = tensor(g, "dO*O", -1, CUDNN_DATA_FLOAT, L.rowhs, true);
    pointwise(g, "mul dO O", CUDNN_POINTWISE_MUL, dout, o, NULL, doo);
    cudnnBackendDescriptor_t dred = tensor(g, "rowsum(dO*O)", -1, CUDNN_DATA_FLOAT, L.row, true);
    reduction(g, "reduce dO O", CUDNN_REDUCE_TENSOR_ADD, doo, dred);
    pointwise(g, "Dsum = sum*1", CUDNN_POINTWISE_MUL, dred, one, NULL, dsum);

    /* P = exp(mask(S * scale - Stats)) */
    cudnnBackendDescriptor_t s = tensor(g, "S", -1, CUDNN_DATA_FLOAT, L.scores, true);
    matmul(g, "matmul Q K^T", q, kt, s);
    cudnnBackendDescriptor_t ss = tensor(g, "S*scale", -1, CUDNN_DATA_FLOAT, L.scores, true);
    pointwise(g, "scale", CUDNN_POINTWISE_MUL, s, scale, NULL, ss);
    cudnnBackendDescriptor_t z = tensor(g, "S-Stats", -1, CUDNN_DATA_FLOAT, L.scores, true);
    pointwise(g, "sub stats", CUDNN_POINTWISE_SUB, ss, stats, NULL, z);
    cudnnBackendDescriptor_t zm = causal_mask(g, L, z, neginf);
    cudnnBackendDescriptor_t p = tensor(g, "P", -1, CUDNN_DATA_FLOAT, L.scores, true);
    pointwise(g, "exp", CUDNN_POINTWISE_EXP, zm, NULL, NULL, p);

    /* dV = bf16(P)^T dO */
    cudnnBackendDescriptor_t pt = tensor(g, "P^T", -1, CUDNN_DATA_BFLOAT16, L.scores_t, true);
    reshape(g, "reshape P^T", p, pt);
    matmul(g, "matmul P^T dO", pt, dout, dv);

    /* dS = (dO V^T - Dsum) * P * scale */
    cudnnBackendDescriptor_t dp = tensor(g, "dP", -1, CUDNN_DATA_FLOAT, L.scores, true);
    matmul(g, "matmul dO V^T", dout, vt, dp);
    cudnnBackendDescriptor_t dp1 = tensor(g, "dP-Dsum", -1, CUDNN_DATA_FLOAT, L.scores, true);
    pointwise(g, "sub Dsum", CUDNN_POINTWISE_SUB, dp, dsum, NULL, dp1);
    cudnnBackendDescriptor_t ds0 = tensor(g, "(dP-Dsum)*P", -1, CUDNN_DATA_FLOAT, L.scores, true);
    pointwise(g, "mul P", CUDNN_POINTWISE_MUL, dp1, p, NULL, ds0);
    cudnnBackendDescriptor_t ds = tensor(g, "dS", -1, CUDNN_DATA_FLOAT, L.scores, true);
    pointwise(g, "mul scale", CUDNN_POINTWISE_MUL, ds0, scale, NULL, ds);

    /* dK = bf16(dS)^T Q */
    cudnnBackendDescriptor_t dst = tensor(g, "dS^T", -1, CUDNN_DATA_BFLOAT16, L.scores_t, true);
    reshape(g, "reshape dS^T", ds, dst);
    matmul(g, "matmul dS^T Q", dst, q, dk);

    /* dQ = dS K */
    cudnnBackendDescriptor_t kn = tensor(g, "K", -1, CUDNN_DATA_BFLOAT16, L.qkv_part, true);
    reshape(g, "reshape K", kt, kn);
    if (v.dq_accum) {
        cudnnBackendDescriptor_t acc = tensor(g, "dQ_accum", U_DQACC, CUDNN_DATA_FLOAT, L.rowhs, false);
        matmul(g, "matmul dS K (accum)", ds, kn, acc);
        pointwise(g, "dQ = identity(accum)", CUDNN_POINTWISE_IDENTITY, acc, NULL, NULL, dq);
    } else {
        matmul(g, "matmul dS K", ds, kn, dq);
    }
}

const char* knob_name(cudnnBackendKnobType_t k) {
    switch (k) {
        case CUDNN_KNOB_TYPE_SPLIT_K: return "SPLIT_K";
        case CUDNN_KNOB_TYPE_SWIZZLE: return "SWIZZLE";
        case CUDNN_KNOB_TYPE_TILE_SIZE: return "TILE_SIZE";
        case CUDNN_KNOB_TYPE_EDGE: return "EDGE";
        case CUDNN_KNOB_TYPE_KERNEL_CFG: return "KERNEL_CFG";
        case CUDNN_KNOB_TYPE_STAGES: return "STAGES";
        case CUDNN_KNOB_TYPE_TILE_M: return "TILE_M";
        case CUDNN_KNOB_TYPE_TILE_N: return "TILE_N";
        case CUDNN_KNOB_TYPE_STREAM_K: return "STREAM_K";
        case CUDNN_KNOB_TYPE_TILE_CGA_M: return "TILE_CGA_M";
        case CUDNN_KNOB_TYPE_TILE_CGA_N: return "TILE_CGA_N";
        case CUDNN_KNOB_TYPE_WARP_SPEC_CFG: return "WARP_SPEC_CFG";
        default: return NULL;
    }
}

/* "engine N, knobs {...}, numerical notes [...]" for one engine config. */
std::string describe_config(Builder* g, cudnnBackendDescriptor_t cfg) {
    std::string out;
    char buf[256];
    cudnnBackendDescriptor_t engine = bcreate(g, CUDNN_BACKEND_ENGINE_DESCRIPTOR, "describe engine");
    int64_t n = 0, index = -1;
    if (engine && cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n,
                                           &engine) == CUDNN_STATUS_SUCCESS)
        cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index);
    snprintf(buf, sizeof buf, "engine %lld", (long long)index);
    out += buf;
    enum { kMaxKnobs = 32 };
    cudnnBackendDescriptor_t knobs[kMaxKnobs];
    int made = 0;
    for (; made < kMaxKnobs; made++)
        if (cudnnBackendCreateDescriptor(CUDNN_BACKEND_KNOB_CHOICE_DESCRIPTOR, &knobs[made]) != CUDNN_STATUS_SUCCESS) break;
    int64_t nk = 0;
    if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES, CUDNN_TYPE_BACKEND_DESCRIPTOR, made, &nk,
                                 knobs) == CUDNN_STATUS_SUCCESS) {
        out += " knobs {";
        for (int64_t i = 0; i < nk && i < made; i++) {
            cudnnBackendKnobType_t type;
            int64_t value = 0, c = 0;
            cudnnBackendGetAttribute(knobs[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_TYPE, CUDNN_TYPE_KNOB_TYPE, 1, &c, &type);
            cudnnBackendGetAttribute(knobs[i], CUDNN_ATTR_KNOB_CHOICE_KNOB_VALUE, CUDNN_TYPE_INT64, 1, &c, &value);
            const char* name = knob_name(type);
            if (name) snprintf(buf, sizeof buf, "%s%s=%lld", i ? " " : "", name, (long long)value);
            else snprintf(buf, sizeof buf, "%sknob%d=%lld", i ? " " : "", (int)type, (long long)value);
            out += buf;
        }
        out += "}";
    }
    for (int i = 0; i < made; i++) cudnnBackendDestroyDescriptor(knobs[i]);
    if (engine) {
        cudnnBackendNumericalNote_t notes[16];
        int64_t nn = 0;
        if (cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE, 16, &nn,
                                     notes) == CUDNN_STATUS_SUCCESS) {
            out += " numerical notes [";
            for (int64_t i = 0; i < nn && i < 16; i++) {
                snprintf(buf, sizeof buf, "%s%d", i ? " " : "", (int)notes[i]);
                out += buf;
            }
            out += "]";
        }
    }
    return out;
}

}  // namespace

struct CudnnAttnPlan {
    AttnShape shape;
    int backward;
    CudnnAttnVariant variant;
    Builder g;
    cudnnBackendDescriptor_t plan;
    size_t cudnn_ws;       /* cuDNN's own workspace, at the start of ours */
    size_t off_dsum, off_dqacc, off_stats, off_grads, total_ws;
    float scale, neginf, one; /* by-value scalars (the variant pack points here) */
    std::string describe;
    std::string json;
};

namespace {

const char* variant_text(const CudnnAttnVariant& v, int backward, char* buf, size_t n) {
    if (backward)
        snprintf(buf, n, "stats %s, dqkv %s, dQ %s%s", v.stats_packed ? "packed+copy" : "in slot",
                 v.dqkv_packed ? "packed+copy" : "in place", v.dq_accum ? "fp32 accumulator" : "direct",
                 v.fallback_only ? ", fallback heuristics only" : "");
    else
        snprintf(buf, n, "stats %s%s", v.stats_packed ? "packed+copy" : "in slot",
                 v.fallback_only ? ", fallback heuristics only" : "");
    return buf;
}

/* Heuristics of one mode: the engine configs it lists, each tried until a plan finalizes. */
int try_heuristics(CudnnAttnPlan* p, cudnnBackendDescriptor_t graph, cudnnBackendHeurMode_t mode, const char* mname) {
    Builder* g = &p->g;
    cudnnBackendDescriptor_t heur = bcreate(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
    if (heur == NULL) return 0;
    if (!BCHECK(g, mname, cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &graph)) ||
        !BCHECK(g, mname, cudnnBackendSetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode)) ||
        !BCHECK(g, mname, cudnnBackendFinalize(heur)))
        return 0;
    int64_t count = 0;
    if (!BCHECK(g, mname, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count, NULL)))
        return 0;
    blog(g, "  heuristics %s: %lld engine config(s)\n", mname, (long long)count);
    if (count <= 0) return 0;
    std::vector<cudnnBackendDescriptor_t> cfgs((size_t)count, NULL);
    for (int64_t i = 0; i < count; i++)
        if ((cfgs[i] = bcreate(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, "engine config")) == NULL) return 0;
    int64_t got = 0;
    if (!BCHECK(g, mname, cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, cfgs.data())))
        return 0;
    cudnnHandle_t h = handle_get();
    for (int64_t i = 0; i < got; i++) {
        const std::string what = describe_config(g, cfgs[i]);
        cudnnBackendDescriptor_t plan = NULL;
        cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
        if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
        if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &cfgs[i]);
        if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(plan);
        if (st != CUDNN_STATUS_SUCCESS) {
            blog(g, "  config %lld/%lld (%s): plan not finalized: %s; cuDNN's last error: %s\n", (long long)i + 1,
                 (long long)got, what.c_str(), cudnnGetErrorString(st), last_error_string().c_str());
            if (plan) cudnnBackendDestroyDescriptor(plan);
            continue;
        }
        int64_t ws = 0, n = 0;
        cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &n, &ws);
        blog(g, "  config %lld/%lld (%s): plan finalized, workspace %lld bytes: CHOSEN\n", (long long)i + 1,
             (long long)got, what.c_str(), (long long)ws);
        std::vector<char> json(1 << 16, 0);
        int64_t jn = 0;
        if (cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION, CUDNN_TYPE_CHAR,
                                     (int64_t)json.size() - 1, &jn, json.data()) == CUDNN_STATUS_SUCCESS)
            p->json.assign(json.data(), strnlen(json.data(), json.size()));
        p->plan = plan;
        p->cudnn_ws = (size_t)ws;
        char vb[160];
        char db[1024];
        snprintf(db, sizeof db, "%s %s [%s]: heuristics %s, config %lld of %lld, %s, cuDNN workspace %lld bytes",
                 p->backward ? "backward" : "forward", "cudnn", variant_text(p->variant, p->backward, vb, sizeof vb),
                 mname, (long long)i + 1, (long long)got, what.c_str(), (long long)ws);
        p->describe = db;
        return 1;
    }
    return 0;
}

}  // namespace

int attention_cudnn_available(void) { return 1; }
void attention_cudnn_require(const char* who) { (void)who; }
long attention_cudnn_version(void) { return (long)cudnnGetVersion(); }
long attention_cudnn_header_version(void) { return (long)CUDNN_VERSION; }

CudnnAttnPlan* attention_cudnn_plan_build(AttnShape s, int backward, CudnnAttnVariant v, char* log, size_t loglen) {
    attn_shape_check(s, "attention (cuDNN)");
    CudnnAttnPlan* p = new CudnnAttnPlan();
    p->shape = s;
    p->backward = backward;
    p->variant = v;
    p->plan = NULL;
    p->g.log = log;
    p->g.cap = loglen;
    p->g.len = log && loglen ? strlen(log) : 0;
    p->g.failed = 0;
    p->g.next_uid = U_VIRTUAL;
    p->scale = attn_softmax_scale(s.HS);
    p->neginf = -INFINITY;
    p->one = 1.0f;
    Builder* g = &p->g;
    char vb[160];
    blog(g, "%s graph, B=%d NH=%d T=%d HS=%d, variant: %s\n", backward ? "backward" : "forward", s.B, s.NH, s.T, s.HS,
         variant_text(v, backward, vb, sizeof vb));
    const Layout L = make_layout(s);
    if (backward) build_backward(g, L, v);
    else build_forward(g, L, v);
    cudnnBackendDescriptor_t graph = NULL;
    if (!g->failed) {
        graph = bcreate(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "operation graph");
        cudnnHandle_t h = handle_get();
        const int ok = graph &&
                       BCHECK(g, "operation graph", cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h)) &&
                       BCHECK(g, "operation graph", cudnnBackendSetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                                                             (int64_t)g->ops.size(), g->ops.data())) &&
                       BCHECK(g, "operation graph", cudnnBackendFinalize(graph));
        int64_t engines = -1, n = 0;
        if (ok) cudnnBackendGetAttribute(graph, CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT, CUDNN_TYPE_INT64, 1, &n, &engines);
        blog(g, "  graph  %zu ops: %s (engines in cuDNN: %lld)\n", g->ops.size(), ok ? "finalized" : "FAILED", (long long)engines);
    }
    int found = 0;
    const int graph_ok = !g->failed;
    if (graph_ok && !v.fallback_only) found = try_heuristics(p, graph, CUDNN_HEUR_MODE_A, "mode A");
    if (graph_ok && !found) { /* mode A listed nothing that finalizes (or failed): the fallback list */
        g->failed = 0;
        found = try_heuristics(p, graph, CUDNN_HEUR_MODE_FALLBACK, "fallback");
    }
    if (!found) {
        blog(g, "  RESULT: no plan for this variant\n");
        attention_cudnn_plan_free(p);
        return NULL;
    }
    /* our scratch after cuDNN's workspace */
    const size_t rows = (size_t)s.B * s.NH * s.T;
    size_t off = align256(p->cudnn_ws);
    p->off_dsum = off;
    if (backward) off = align256(off + rows * sizeof(float));
    p->off_dqacc = off;
    if (backward && v.dq_accum) off = align256(off + rows * s.HS * sizeof(float));
    p->off_stats = off;
    if (v.stats_packed) off = align256(off + rows * sizeof(float));
    p->off_grads = off;
    if (backward && v.dqkv_packed) off = align256(off + attn_qkv_count(s) * sizeof(__nv_bfloat16));
    p->total_ws = off;
    blog(g, "  RESULT: plan ready, workspace %zu bytes (cuDNN %zu + scratch %zu)\n", p->total_ws, p->cudnn_ws,
         p->total_ws - align256(p->cudnn_ws));
    return p;
}

const char* attention_cudnn_plan_describe(const CudnnAttnPlan* p) { return p ? p->describe.c_str() : "no plan"; }
const char* attention_cudnn_plan_json(const CudnnAttnPlan* p) { return p ? p->json.c_str() : ""; }
size_t attention_cudnn_plan_workspace_bytes(const CudnnAttnPlan* p) { return p ? p->total_ws : 0; }

void attention_cudnn_plan_free(CudnnAttnPlan* p) {
    if (p == NULL) return;
    if (p->plan) cudnnBackendDestroyDescriptor(p->plan);
    for (size_t i = p->g.owned.size(); i-- > 0;) cudnnBackendDestroyDescriptor(p->g.owned[i]);
    delete p;
}

namespace {

int execute(CudnnAttnPlan* p, std::vector<int64_t>& uids, std::vector<void*>& ptrs, void* ws, cudaStream_t stream,
            char* err, size_t errlen) {
    cudnnHandle_t h = handle_get();
    CUDNN_CHECK(cudnnSetStream(h, stream));
    cudnnBackendDescriptor_t pack = NULL;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    const char* step = "create variant pack";
    if (st == CUDNN_STATUS_SUCCESS) {
        step = "variant pack uids";
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, (int64_t)uids.size(), uids.data());
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        step = "variant pack pointers";
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, (int64_t)ptrs.size(), ptrs.data());
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        step = "variant pack workspace";
        st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        step = "finalize variant pack";
        st = cudnnBackendFinalize(pack);
    }
    if (st == CUDNN_STATUS_SUCCESS) {
        step = "cudnnBackendExecute";
        st = cudnnBackendExecute(h, p->plan, pack);
    }
    if (pack) cudnnBackendDestroyDescriptor(pack);
    if (st != CUDNN_STATUS_SUCCESS) {
        snprintf(err, errlen, "%s (%s:%d): %s (status %d); cuDNN's last error: %s", step, __FILE__, __LINE__,
                 cudnnGetErrorString(st), (int)st, last_error_string().c_str());
        return 1;
    }
    return 0;
}

}  // namespace

int attention_cudnn_plan_forward(CudnnAttnPlan* p, const __nv_bfloat16* qkv, __nv_bfloat16* out, float* stats,
                                 cudaStream_t stream, char* err, size_t errlen) {
    const AttnShape s = p->shape;
    const size_t C = (size_t)s.NH * s.HS, rows = (size_t)s.B * s.NH * s.T;
    char* ws = (char*)workspace_get(p->total_ws, stream, s);
    float* lse = p->variant.stats_packed ? (float*)(ws + p->off_stats) : stats;
    std::vector<int64_t> uids = {U_Q, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEGINF};
    std::vector<void*> ptrs = {(void*)qkv, (void*)(qkv + C), (void*)(qkv + 2 * C), (void*)out, (void*)lse,
                               (void*)&p->scale, (void*)&p->neginf};
    if (execute(p, uids, ptrs, ws, stream, err, errlen)) return 1;
    /* element 1 of each slot is 0, as in bf16 mode; the packed variant's LSE goes into element 0 */
    stats_slot_fill<<<copy_blocks(rows), kCopyThreads, 0, stream>>>(stats, p->variant.stats_packed ? lse : NULL, rows);
    cudaCheck(cudaGetLastError());
    return 0;
}

int attention_cudnn_plan_backward(CudnnAttnPlan* p, const __nv_bfloat16* qkv, const __nv_bfloat16* out,
                                  const float* stats, const __nv_bfloat16* dout, __nv_bfloat16* dqkv,
                                  cudaStream_t stream, char* err, size_t errlen) {
    const AttnShape s = p->shape;
    const size_t C = (size_t)s.NH * s.HS, rows = (size_t)s.B * s.NH * s.T, part = (size_t)s.B * s.T * C;
    char* ws = (char*)workspace_get(p->total_ws, stream, s);
    const float* lse = stats;
    if (p->variant.stats_packed) {
        float* packed = (float*)(ws + p->off_stats);
        stats_slot_pack<<<copy_blocks(rows), kCopyThreads, 0, stream>>>(packed, stats, rows);
        cudaCheck(cudaGetLastError());
        lse = packed;
    }
    __nv_bfloat16* gq = dqkv;
    __nv_bfloat16* gk = dqkv + C;
    __nv_bfloat16* gv = dqkv + 2 * C;
    if (p->variant.dqkv_packed) {
        __nv_bfloat16* g0 = (__nv_bfloat16*)(ws + p->off_grads);
        gq = g0;
        gk = g0 + part;
        gv = g0 + 2 * part;
    }
    std::vector<int64_t> uids = {U_Q, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEGINF, U_ONE, U_DO, U_DQ, U_DK, U_DV, U_DSUM};
    std::vector<void*> ptrs = {(void*)qkv, (void*)(qkv + C), (void*)(qkv + 2 * C), (void*)out, (void*)lse,
                               (void*)&p->scale, (void*)&p->neginf, (void*)&p->one, (void*)dout, (void*)gq,
                               (void*)gk, (void*)gv, (void*)(ws + p->off_dsum)};
    if (p->variant.dq_accum) {
        uids.push_back(U_DQACC);
        ptrs.push_back((void*)(ws + p->off_dqacc));
    }
    if (execute(p, uids, ptrs, ws, stream, err, errlen)) return 1;
    if (p->variant.dqkv_packed) { /* each [B, T, NH, HS] gradient into its third of the dqkv rows */
        if (C % 8 != 0 || (uintptr_t)dqkv % 16 != 0)
            die("attention (cuDNN): the packed-gradient copy moves 16-byte vectors: NH*HS = %zu must be a multiple "
                "of 8 and dqkv (%p) 16-byte aligned\n  hint: use head size 64 or 128 and buffers from cudaMalloc",
                C, (void*)dqkv);
        const size_t bt = (size_t)s.B * s.T, c_vec = C * sizeof(__nv_bfloat16) / sizeof(uint4);
        grads_unpack<<<copy_blocks(3 * bt * c_vec), kCopyThreads, 0, stream>>>((uint4*)dqkv, (const uint4*)gq, bt, c_vec);
        cudaCheck(cudaGetLastError());
    }
    return 0;
}

/* ---- the production path: one forward and one backward plan per shape, built on first use ---- */

namespace {

#define ATTN_CUDNN_CACHE 16
struct CacheEntry {
    AttnShape s;
    CudnnAttnPlan* fwd;
    CudnnAttnPlan* bwd;
    std::string describe;
};
CacheEntry g_cache[ATTN_CUDNN_CACHE];
int g_cache_n = 0;

CacheEntry* cache_find(AttnShape s) {
    for (int i = 0; i < g_cache_n; i++)
        if (g_cache[i].s.B == s.B && g_cache[i].s.NH == s.NH && g_cache[i].s.T == s.T && g_cache[i].s.HS == s.HS)
            return &g_cache[i];
    return NULL;
}

/* Tries the variants in the documented order; dies with every variant's log if none builds. */
CudnnAttnPlan* build_first(AttnShape s, int backward) {
    std::vector<CudnnAttnVariant> order;
    if (!backward) {
        order.push_back(CudnnAttnVariant{0, 0, 0, 0});
        order.push_back(CudnnAttnVariant{1, 0, 0, 0});
    } else {
        const long long t64 = ((long long)s.T + 63) / 64 * 64;
        const int accum_first = (long long)s.B * s.NH * t64 * t64 * 2 > (256ll << 20);
        for (int sp = 0; sp < 2; sp++)
            for (int dp = 0; dp < 2; dp++)
                for (int a = 0; a < 2; a++) order.push_back(CudnnAttnVariant{sp, dp, a ? !accum_first : accum_first, 0});
    }
    std::vector<char> log(1 << 20, 0);
    for (const CudnnAttnVariant& v : order) {
        CudnnAttnPlan* p = attention_cudnn_plan_build(s, backward, v, log.data(), log.size());
        if (p) return p;
    }
    fprintf(stderr, "%s", log.data());
    die("attention (cuDNN): no %s plan for B=%d NH=%d T=%d HS=%d in any variant (the log above has every step)\n"
        "  hint: run dev/cudnn_check.sh on this machine for the full report; another mode (--attn bf16) runs "
        "without cuDNN", backward ? "backward" : "forward", s.B, s.NH, s.T, s.HS);
    return NULL;
}

CacheEntry* cache_get(AttnShape s, int backward, cudaStream_t stream) {
    CacheEntry* e = cache_find(s);
    if (e == NULL || (backward ? e->bwd : e->fwd) == NULL)
        require_not_capturing(stream, backward ? "the first backward call" : "the first forward call", s);
    if (e == NULL && g_cache_n == ATTN_CUDNN_CACHE) {
        /* Full: drop the oldest forward-only shape (the sampler's forwards at every context length, never
           trained on). The plans of a training shape have a backward and are never dropped, so a captured
           graph's plans stay alive. Queued work may still use the plan: wait for it first. */
        int victim = -1;
        for (int i = 0; i < g_cache_n && victim < 0; i++)
            if (g_cache[i].bwd == NULL) victim = i;
        if (victim < 0)
            die("attention (cuDNN): more than %d trained attention shapes in one process (B=%d NH=%d T=%d HS=%d is "
                "new)\n  hint: the plan cache holds one plan per shape; use fewer distinct batch sizes or sequence "
                "lengths", ATTN_CUDNN_CACHE, s.B, s.NH, s.T, s.HS);
        cudaCheck(cudaStreamSynchronize(stream));
        attention_cudnn_plan_free(g_cache[victim].fwd);
        for (int i = victim; i + 1 < g_cache_n; i++) g_cache[i] = g_cache[i + 1];
        g_cache_n--;
    }
    if (e == NULL) {
        e = &g_cache[g_cache_n++];
        e->s = s;
        e->fwd = e->bwd = NULL;
    }
    CudnnAttnPlan*& slot = backward ? e->bwd : e->fwd;
    if (slot == NULL) {
        slot = build_first(s, backward);
        e->describe = std::string(e->fwd ? attention_cudnn_plan_describe(e->fwd) : "forward: no plan yet") + "; " +
                      (e->bwd ? attention_cudnn_plan_describe(e->bwd) : "backward: no plan yet");
    }
    return e;
}

}  // namespace

void attention_forward_cudnn(AttnShape s, const __nv_bfloat16* qkv, __nv_bfloat16* out, float* stats,
                             cudaStream_t stream) {
    CacheEntry* e = cache_get(s, 0, stream);
    char err[4096];
    if (attention_cudnn_plan_forward(e->fwd, qkv, out, stats, stream, err, sizeof err))
        die("attention_forward_cudnn (B=%d NH=%d T=%d HS=%d, %s): %s", s.B, s.NH, s.T, s.HS,
            attention_cudnn_plan_describe(e->fwd), err);
}

void attention_backward_cudnn(AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* out, const float* stats,
                              const __nv_bfloat16* dout, __nv_bfloat16* dqkv, cudaStream_t stream) {
    CacheEntry* e = cache_get(s, 1, stream);
    char err[4096];
    if (attention_cudnn_plan_backward(e->bwd, qkv, out, stats, dout, dqkv, stream, err, sizeof err))
        die("attention_backward_cudnn (B=%d NH=%d T=%d HS=%d, %s): %s", s.B, s.NH, s.T, s.HS,
            attention_cudnn_plan_describe(e->bwd), err);
}

const char* attention_cudnn_describe(AttnShape s) {
    CacheEntry* e = cache_find(s);
    return e ? e->describe.c_str() : "no plan yet";
}
