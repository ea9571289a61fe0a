/*
 * attention/cudnn/attention_cudnn.cuh - cudnn mode: cuDNN's own fused causal BF16 flash attention,
 * reached through cuDNN's backend (graph) API, behind the module's contract.
 *
 * Why: the kernel PyTorch users run (torch SDPA's cuDNN backend) is the one whose training behaviour the
 * project asks about, so cudnn mode runs that kernel itself inside our trainer, on our layout and our
 * saved state: Q, K, V read in place from qkv [B, T, 3, NH, HS], O written to out [B, T, NH, HS], dQ, dK,
 * dV written into dqkv, and stats [B, NH, T, 2] holding {LSE_i, 0} like bf16 mode (natural log, scaled
 * units), so a run can switch between cudnn and any other mode on resume.
 *
 * Two units implement this header; the Makefile links one:
 *   attention_cudnn.cu       (cuDNN found) builds the graphs, keeps one plan per shape, runs them;
 *   attention_cudnn_none.cu  (no cuDNN) fails every call with one message naming the fix.
 *
 * Offers:
 *   attention_cudnn_available  - 1 in a build with cuDNN, 0 without; attention_cudnn_require dies without.
 *   attention_forward_cudnn / attention_backward_cudnn - the mode's entry points (attention_cuda.cu's
 *       dispatch calls them for ATTN_CUDNN). The first call for a shape (B, NH, T, HS) builds and caches
 *       its plan (heuristics mode A, then the fallback list; the first engine config that finalizes
 *       wins); the workspace is owned here and grown as needed (cudaMalloc: the first call of a shape must
 *       not be inside CUDA graph capture, and stops with the fix if it is). Asynchronous on `stream`
 *       after that, and capturable (attention_cudnn.cu says what a call launches).
 *   attention_cudnn_describe   - the engines and knobs the cached plans of a shape use (for logs).
 *   attention_cudnn_version / attention_cudnn_header_version - cudnnGetVersion() and CUDNN_VERSION.
 *   The explicit-variant API below (CudnnAttnVariant, attention_cudnn_plan_*) builds one named variant
 *   with its full build log and reports failures instead of dying: for dev/cudnn_check.cu.
 */
#ifndef ATTENTION_CUDNN_ATTENTION_CUDNN_CUH
#define ATTENTION_CUDNN_ATTENTION_CUDNN_CUH

#include <stddef.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include "attention/attention.h"

int attention_cudnn_available(void);
/* Returns in a build with cuDNN; without, dies with the fix, naming `who` (a trainer calls it at start-up). */
void attention_cudnn_require(const char* who);
long attention_cudnn_version(void);        /* cudnnGetVersion() of the loaded library; 0 without cuDNN */
long attention_cudnn_header_version(void); /* CUDNN_VERSION of the headers built against; 0 without cuDNN */

void attention_forward_cudnn(AttnShape s, const __nv_bfloat16* qkv, __nv_bfloat16* out, float* stats,
                             cudaStream_t stream);
void attention_backward_cudnn(AttnShape s, const __nv_bfloat16* qkv, const __nv_bfloat16* out, const float* stats,
                              const __nv_bfloat16* dout, __nv_bfloat16* dqkv, cudaStream_t stream);
/* The chosen variant, engine index, knobs and workspace of the plans cached for s ("no plan yet" if none). */
const char* attention_cudnn_describe(AttnShape s);

/* One graph variant. The production path tries them in the order attention_cudnn.cu documents. */
typedef struct {
    int stats_packed; /* 0: cuDNN reads/writes LSE in our stats slot, strides (NH*T*2, T*2, 2, 1);
                         1: a packed [B, NH, T] fp32 scratch, copied to/from the slot around the call */
    int dqkv_packed;  /* backward: 0: dQ, dK, dV written in place into dqkv with qkv's strides;
                         1: three [B, T, NH, HS] scratch tensors, copied into dqkv after the call */
    int dq_accum;     /* backward: 0: the dS K matmul writes dQ (the engine keeps dP in its workspace);
                         1: it writes an fp32 [B, NH, T, HS] accumulator, an identity op rounds it to dQ */
    int fallback_only; /* 1: skip heuristics mode A, take the engine configs of CUDNN_HEUR_MODE_FALLBACK */
} CudnnAttnVariant;

typedef struct CudnnAttnPlan CudnnAttnPlan;
/* Builds the forward (backward = 0) or backward graph of variant v for shape s, its heuristics list and
   the first plan that finalizes. Appends one line per step (tensor, node, graph, heuristics, engine
   config tried) with its status to log (NUL-terminated, truncated at loglen). NULL if any step failed. */
CudnnAttnPlan* attention_cudnn_plan_build(AttnShape s, int backward, CudnnAttnVariant v, char* log, size_t loglen);
const char* attention_cudnn_plan_describe(const CudnnAttnPlan* p); /* variant, engine, knobs, workspace */
const char* attention_cudnn_plan_json(const CudnnAttnPlan* p);     /* the plan's JSON as cuDNN reports it, or "" */
size_t attention_cudnn_plan_workspace_bytes(const CudnnAttnPlan* p); /* cuDNN's workspace + our scratch */
/* Run a plan (asynchronous on stream). 0 on success, else nonzero with the reason in err. */
int attention_cudnn_plan_forward(CudnnAttnPlan* p, const __nv_bfloat16* qkv, __nv_bfloat16* out, float* stats,
                                 cudaStream_t stream, char* err, size_t errlen);
int attention_cudnn_plan_backward(CudnnAttnPlan* p, const __nv_bfloat16* qkv, const __nv_bfloat16* out,
                                  const float* stats, const __nv_bfloat16* dout, __nv_bfloat16* dqkv,
                                  cudaStream_t stream, char* err, size_t errlen);
void attention_cudnn_plan_free(CudnnAttnPlan* p);

#endif /* ATTENTION_CUDNN_ATTENTION_CUDNN_CUH */
