/*
 * model/matmul.cuh - every dense layer of the model through cuBLASLt.
 *
 * Why: the four projections per layer and the tied output head are almost
 * all of the FLOPs. cuBLASLt runs them on tensor cores (BF16 in, FP32
 * accumulate, BF16 out) and fuses the elementwise work around them into the
 * GEMM's epilogue, so it costs no extra pass over memory:
 *   forward   the bias add; for the MLP's first projection also the GELU,
 *             with the pre-activation written to an aux buffer (GELU_AUX_BIAS);
 *   backward  the GELU backward (multiply by gelu'(pre-activation), read from
 *             that aux buffer) on the input-gradient GEMM that produces
 *             d(gelu output) (DGELU).
 *
 * Layout convention (row-major, like the rest of the model):
 *   forward   out[N, OC] = inp[N, K] @ W[OC, K]^T (+ bias[OC]) (-> GELU)
 *   backward  dinp[N, K] (+)= dout[N, OC] @ W[OC, K]    (optionally * gelu'(pre[N, K]))
 *             dW[OC, K]  += dout^T @ inp                (always accumulates: grad accumulation)
 * cuBLAS sees these as column-major products; the mapping is written out once
 * in each wrapper below.
 *
 * What it buys (H200, cuBLASLt of CUDA 13.0, d12 shapes N = 32768, C = 768,
 * timed 2026-11-29): DGELU makes the fcproj input-gradient GEMM ~0.07 ms
 * slower but removes a ~0.14 ms elementwise pass per layer; GELU_AUX_BIAS
 * likewise replaces the forward GELU pass. A d12 step went from 66.8 to
 * 65.6 ms (--recompute 1) and 65.5 to 64.5 ms (--recompute 0).
 *
 * Where the unfused path stays, and why (same machine and shapes):
 *  - Bias gradients stay a separate deterministic column sum (layernorm.cuh:
 *    bias_backward). cuBLASLt's BGRADB epilogue on the weight-gradient GEMM
 *    computes them, but (1) it only writes them as BF16 (an FP32 bias-gradient
 *    type is refused: CUBLAS_STATUS_INVALID_VALUE from the heuristic), so
 *    accumulating over micro-batches would round twice, and (2) it made the
 *    four weight-gradient GEMMs of a layer ~0.2 ms slower (0.64 -> 0.87 ms
 *    with the heuristic's first algorithm, 0.83 ms with the fastest of its
 *    first 8), more than the four column sums cost (0.17 ms). DGELU_BGRAD
 *    (fc's bias gradient out of the DGELU GEMM) was slower still (0.30 ->
 *    0.84 ms).
 *  - gelu.cuh's standalone forward serves --recompute: rebuilding gelu(pre)
 *    in backward has no GEMM to ride on.
 *
 * Algorithms: each GEMM shape (MatmulKey) gets one plan on its first call,
 * its descriptors and one algorithm, kept for every later call: the
 * heuristic's first (llm.c's choice), or, while the context tunes
 * (tune_candidates > 0: train_gpt --matmul-tune), the fastest of the
 * heuristic's first candidates timed on that call's operands. An algorithm
 * fixes a GEMM's sum order, so the plans export as records
 * (model/matmul_record.h) that the resume state keeps and a resumed run
 * restores. On the H200 timing made the GEMMs 2-4% faster in a step and the
 * attention after them slower by as much
 * (dev/results/gemm_algorithm_timing_2026-12-04.md; the step runs at the
 * board's power limit and timed GEMMs lower the clock by 3-4%,
 * dev/results/power_cap_d12_2026-12-04.md): the trainer's default is the
 * heuristic's first.
 *
 * Alignment (checked, with a message): every pointer 16 bytes; m of the aux
 * epilogues (the aux leading dimension) a multiple of 8.
 *
 * Offers: MatmulContext (+ init/free), matmul_forward (bias / GELU epilogues),
 * matmul_backward_input, matmul_backward_input_dgelu, matmul_backward_weight,
 * cublasCheck; the plans: MatmulKey (matmul_key), MatmulPlan (matmul_plan_make / _run /
 * _candidates / _destroy), matmul_plans_clear; timing and records:
 * MatmulTuneSummary (matmul_tune_summary), matmul_records_export,
 * matmul_records_restore.
 */
#ifndef MODEL_MATMUL_CUH
#define MODEL_MATMUL_CUH

#include <string.h>
#include <time.h>
#include <cublasLt.h>
#include "model/kernel_common.cuh"
#include "model/matmul_record.h"

static inline void cublas_check_at(cublasStatus_t status, const char* file, int line) {
    if (status != CUBLAS_STATUS_SUCCESS) {
        die_at(file, line, "cuBLAS error %d (see cublas_api.h cublasStatus_t)\n  hint: shapes must be positive and multiples of 8; "
               "is the GPU out of memory?", (int)status);
    }
}
#define cublasCheck(status) cublas_check_at((status), __FILE__, __LINE__)

#define MATMUL_WORKSPACE_BYTES (32ull << 20) /* cuBLASLt's recommendation for Hopper */

typedef enum {
    MATMUL_EPILOGUE_NONE = 0,
    MATMUL_EPILOGUE_BIAS,          /* D = A B + bias[m] */
    MATMUL_EPILOGUE_GELU_AUX_BIAS, /* aux = A B + bias[m]; D = gelu(aux) */
    MATMUL_EPILOGUE_GELU_AUX,      /* aux = A B; D = gelu(aux) (a model without linear biases) */
    MATMUL_EPILOGUE_DGELU,         /* D = (A B) * gelu'(aux) */
} MatmulEpilogue;

static const char* matmul_epilogue_name(MatmulEpilogue e) {
    switch (e) {
        case MATMUL_EPILOGUE_NONE: return "none";
        case MATMUL_EPILOGUE_BIAS: return "bias";
        case MATMUL_EPILOGUE_GELU_AUX_BIAS: return "gelu_aux_bias";
        case MATMUL_EPILOGUE_GELU_AUX: return "gelu_aux";
        case MATMUL_EPILOGUE_DGELU: return "dgelu";
    }
    return "?";
}

/* What an epilogue reads or writes besides A, B and D (NULL where unused). */
typedef struct {
    const floatX* bias; /* BIAS, GELU_AUX_BIAS: m entries */
    floatX* aux;        /* GELU_AUX(_BIAS): written; DGELU: read. [m, n], ld m */
} MatmulEpilogueArgs;

/* What fixes a call's cuBLASLt descriptors and algorithm: column-major D[m, n] (ld m) = op(A) op(B) (+ D if
   accumulate) with the epilogue; A stored [k, m] (ld k) if trans_a else [m, k] (ld m); B stored [n, k] (ld n) if
   trans_b else [k, n] (ld k). */
typedef struct {
    int m, n, k, trans_a, trans_b, accumulate;
    MatmulEpilogue epilogue;
} MatmulKey;

/* A key with no stray bytes (keys are compared with memcmp). */
static MatmulKey matmul_key(int m, int n, int k, int trans_a, int trans_b, int accumulate, MatmulEpilogue epilogue) {
    MatmulKey key;
    memset(&key, 0, sizeof(key));
    key.m = m, key.n = n, key.k = k, key.trans_a = trans_a, key.trans_b = trans_b, key.accumulate = accumulate;
    key.epilogue = epilogue;
    return key;
}

/* Where a plan's algorithm came from. */
typedef enum {
    MATMUL_ALGO_HEURISTIC = 0, /* the heuristic's first (llm.c's choice) */
    MATMUL_ALGO_TIMED,         /* the fastest of the heuristic's first candidates, timed on the call's operands */
    MATMUL_ALGO_RESTORED,      /* given back from a record (a resumed run, or rank 0's choice on every rank) */
} MatmulAlgoSource;

/* A key's descriptors, made once and kept (building them and asking the heuristic costs tens of microseconds of
   host time per call, which bounds small models' steps), and the algorithm every call of the key runs. The bias
   and aux pointers change per call and are set on desc just before it. */
typedef struct {
    MatmulKey key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t layout_a, layout_b, layout_d;
    cublasLtMatmulAlgo_t algo;
    MatmulAlgoSource source;
    int rank;                     /* TIMED: the chosen algorithm's place in the heuristic's list */
    float first_ms, chosen_ms;    /* TIMED: ms per call of the heuristic's first and of the chosen one */
    int calls_while_tuning;       /* calls of the key while the context was tuning (one training micro-step) */
} MatmulPlan;

/* Plans a context keeps: a model's training step has about 15 keys, its evaluation a few more; past this (a
   sampler's forward at every context length) a call makes a plan for itself alone. */
#define MATMUL_MAX_PLANS MATMUL_MAX_RECORDS
/* The most candidates a plan's timing tries (--matmul-tune). */
#define MATMUL_MAX_CANDIDATES 64
/* A timed candidate replaces the heuristic's first only if it is this much faster (timing noise is ~1%). */
#define MATMUL_TUNE_MIN_GAIN 0.01f

typedef struct {
    cublasLtHandle_t handle;
    void* workspace;
    size_t workspace_bytes;
    MatmulPlan plans[MATMUL_MAX_PLANS];
    int num_plans;
    /* > 0 while tuning: a key seen for the first time gets the fastest of the heuristic's first tune_candidates
       algorithms, timed on the call's own operands (so its outputs, and D of an accumulating GEMM, are garbage
       afterwards: tune on a micro-step whose results are thrown away). 0: new keys take the heuristic's first. */
    int tune_candidates;
    double tune_seconds;          /* host time spent timing */
} MatmulContext;

static void matmul_plan_destroy(MatmulPlan* p) {
    cublasCheck(cublasLtMatrixLayoutDestroy(p->layout_a));
    cublasCheck(cublasLtMatrixLayoutDestroy(p->layout_b));
    cublasCheck(cublasLtMatrixLayoutDestroy(p->layout_d));
    cublasCheck(cublasLtMatmulDescDestroy(p->desc));
}

static void matmul_context_init(MatmulContext* ctx) {
    memset(ctx, 0, sizeof(*ctx));
    cublasCheck(cublasLtCreate(&ctx->handle));
    ctx->workspace_bytes = MATMUL_WORKSPACE_BYTES;
    cudaCheck(cudaMalloc(&ctx->workspace, ctx->workspace_bytes));
}

/* Forgets every plan: the next call of each key makes it again. */
static void matmul_plans_clear(MatmulContext* ctx) {
    for (int i = 0; i < ctx->num_plans; i++) matmul_plan_destroy(&ctx->plans[i]);
    ctx->num_plans = 0;
}

static void matmul_context_free(MatmulContext* ctx) {
    matmul_plans_clear(ctx);
    cublasCheck(cublasLtDestroy(ctx->handle));
    cudaCheck(cudaFree(ctx->workspace));
    memset(ctx, 0, sizeof(*ctx));
}

static int matmul_key_needs_bias(MatmulEpilogue e) {
    return e == MATMUL_EPILOGUE_BIAS || e == MATMUL_EPILOGUE_GELU_AUX_BIAS;
}
static int matmul_key_needs_aux(MatmulEpilogue e) {
    return e == MATMUL_EPILOGUE_GELU_AUX_BIAS || e == MATMUL_EPILOGUE_GELU_AUX || e == MATMUL_EPILOGUE_DGELU;
}

/* Up to max_results algorithms for the plan's key, the heuristic's order (best guess first); returns how many. */
static int matmul_plan_candidates(MatmulContext* ctx, const MatmulPlan* plan, cublasLtMatmulHeuristicResult_t* results,
                                  int max_results) {
    cublasLtMatmulPreference_t pref;
    cublasCheck(cublasLtMatmulPreferenceCreate(&pref));
    cublasCheck(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &ctx->workspace_bytes, sizeof(ctx->workspace_bytes)));
    int found = 0;
    cublasCheck(cublasLtMatmulAlgoGetHeuristic(ctx->handle, plan->desc, plan->layout_a, plan->layout_b,
                                               plan->layout_d, plan->layout_d, pref, max_results, results, &found));
    cublasCheck(cublasLtMatmulPreferenceDestroy(pref));
    return found;
}

/* The context's plan of a key, or NULL. */
static MatmulPlan* matmul_plan_find(MatmulContext* ctx, const MatmulKey* key) {
    for (int i = 0; i < ctx->num_plans; i++)
        if (memcmp(&ctx->plans[i].key, key, sizeof(*key)) == 0) return &ctx->plans[i];
    return NULL;
}

/* A new plan of a key (descriptors, the heuristic's first algorithm) into *plan. */
static void matmul_plan_make(MatmulContext* ctx, MatmulKey key, MatmulPlan* plan) {
    const char* epi_name = matmul_epilogue_name(key.epilogue);
    memset(plan, 0, sizeof(*plan));
    plan->key = key;
    const int m = key.m, n = key.n, k = key.k;
    cublasCheck(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_a = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    cublasCheck(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof(op_a)));
    cublasCheck(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof(op_b)));
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    switch (key.epilogue) {
        case MATMUL_EPILOGUE_NONE: epi = CUBLASLT_EPILOGUE_DEFAULT; break;
        case MATMUL_EPILOGUE_BIAS: epi = CUBLASLT_EPILOGUE_BIAS; break;
        case MATMUL_EPILOGUE_GELU_AUX_BIAS: epi = CUBLASLT_EPILOGUE_GELU_AUX_BIAS; break;
        case MATMUL_EPILOGUE_GELU_AUX: epi = CUBLASLT_EPILOGUE_GELU_AUX; break;
        case MATMUL_EPILOGUE_DGELU: epi = CUBLASLT_EPILOGUE_DGELU; break;
    }
    cublasCheck(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    if (matmul_key_needs_bias(key.epilogue)) {
        const cudaDataType_t bias_type = CUDA_R_16BF;
        cublasCheck(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                   sizeof(bias_type)));
    }
    if (matmul_key_needs_aux(key.epilogue)) {
        const int64_t aux_ld = m; /* aux has D's shape and layout */
        cublasCheck(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld,
                                                   sizeof(aux_ld)));
    }
    cublasCheck(key.trans_a ? cublasLtMatrixLayoutCreate(&plan->layout_a, CUDA_R_16BF, k, m, k)
                            : cublasLtMatrixLayoutCreate(&plan->layout_a, CUDA_R_16BF, m, k, m));
    cublasCheck(key.trans_b ? cublasLtMatrixLayoutCreate(&plan->layout_b, CUDA_R_16BF, n, k, n)
                            : cublasLtMatrixLayoutCreate(&plan->layout_b, CUDA_R_16BF, k, n, k));
    cublasCheck(cublasLtMatrixLayoutCreate(&plan->layout_d, CUDA_R_16BF, m, n, m));
    cublasLtMatmulHeuristicResult_t first;
    if (matmul_plan_candidates(ctx, plan, &first, 1) == 0) {
        die("matmul: cuBLASLt has no algorithm for m=%d n=%d k=%d trans_a=%d trans_b=%d epilogue %s\n"
            "  hint: channel counts must be multiples of 8", m, n, k, key.trans_a, key.trans_b, epi_name);
    }
    plan->algo = first.algo;
}

/* One call of a plan with the given algorithm (NULL: the plan's): the epilogue's pointers set on its
   descriptor, then the GEMM enqueued. */
static void matmul_plan_run(MatmulContext* ctx, MatmulPlan* plan, const cublasLtMatmulAlgo_t* algo, floatX* d,
                            const floatX* a, const floatX* b, MatmulEpilogueArgs args, cudaStream_t stream) {
    if (matmul_key_needs_bias(plan->key.epilogue))
        cublasCheck(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &args.bias,
                                                   sizeof(args.bias)));
    if (matmul_key_needs_aux(plan->key.epilogue))
        cublasCheck(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &args.aux,
                                                   sizeof(args.aux)));
    const float alpha = 1.0f, beta = plan->key.accumulate ? 1.0f : 0.0f;
    cublasCheck(cublasLtMatmul(ctx->handle, plan->desc, &alpha, a, plan->layout_a, b, plan->layout_b, &beta, d,
                               plan->layout_d, d, plan->layout_d, algo ? algo : &plan->algo, ctx->workspace,
                               ctx->workspace_bytes, stream));
}

static double matmul_wall_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* Times the heuristic's first ctx->tune_candidates algorithms of a new plan on the call's operands (two warm-up
   calls, then the mean of five, host-synchronized) and keeps the fastest, or the heuristic's first unless
   another is MATMUL_TUNE_MIN_GAIN faster. Overwrites d (and aux of a GELU_AUX epilogue); accumulates into d
   many times over when the key accumulates. */
static void matmul_plan_time(MatmulContext* ctx, MatmulPlan* plan, floatX* d, const floatX* a, const floatX* b,
                             MatmulEpilogueArgs args, cudaStream_t stream) {
    const double t0 = matmul_wall_seconds();
    cublasLtMatmulHeuristicResult_t cand[MATMUL_MAX_CANDIDATES];
    const int want = ctx->tune_candidates < MATMUL_MAX_CANDIDATES ? ctx->tune_candidates : MATMUL_MAX_CANDIDATES;
    const int found = matmul_plan_candidates(ctx, plan, cand, want);
    cudaEvent_t e0, e1;
    cudaCheck(cudaEventCreate(&e0));
    cudaCheck(cudaEventCreate(&e1));
    enum { kWarmup = 2, kTimed = 5 };
    float first = -1.0f, best = 0.0f;
    int best_rank = 0;
    for (int r = 0; r < found; r++) {
        if (cand[r].state != CUBLAS_STATUS_SUCCESS) continue;
        for (int i = 0; i < kWarmup; i++) matmul_plan_run(ctx, plan, &cand[r].algo, d, a, b, args, stream);
        cudaCheck(cudaEventRecord(e0, stream));
        for (int i = 0; i < kTimed; i++) matmul_plan_run(ctx, plan, &cand[r].algo, d, a, b, args, stream);
        cudaCheck(cudaEventRecord(e1, stream));
        cudaCheck(cudaEventSynchronize(e1));
        float ms = 0.0f;
        cudaCheck(cudaEventElapsedTime(&ms, e0, e1));
        ms /= kTimed;
        if (r == 0) first = best = ms;
        else if (first >= 0.0f && ms < best && ms < (1.0f - MATMUL_TUNE_MIN_GAIN) * first) best = ms, best_rank = r;
    }
    cudaCheck(cudaEventDestroy(e0));
    cudaCheck(cudaEventDestroy(e1));
    if (first >= 0.0f) { /* else the plan keeps the heuristic's first, untimed */
        plan->algo = cand[best_rank].algo;
        plan->source = MATMUL_ALGO_TIMED;
        plan->rank = best_rank;
        plan->first_ms = first;
        plan->chosen_ms = best;
    }
    ctx->tune_seconds += matmul_wall_seconds() - t0;
}

/*
 * Column-major D[m, n] (ld m) = op(A) op(B) (+ D if accumulate) with the
 * epilogue (MatmulKey's layout), checked, through the key's plan (made on the key's first call: timed while
 * the context tunes).
 */
static void matmul_cublaslt(MatmulContext* ctx, floatX* d, const floatX* a, const floatX* b, int m, int n, int k,
                            int trans_a, int trans_b, int accumulate, MatmulEpilogue epilogue,
                            MatmulEpilogueArgs args, cudaStream_t stream) {
    const char* epi_name = matmul_epilogue_name(epilogue);
    if (m <= 0 || n <= 0 || k <= 0) die("matmul: bad shape m=%d n=%d k=%d (epilogue %s)", m, n, k, epi_name);
    if (((uintptr_t)a | (uintptr_t)b | (uintptr_t)d | (uintptr_t)args.bias | (uintptr_t)args.aux) % 16 != 0)
        die("matmul: a pointer is not 16-byte aligned (m=%d n=%d k=%d, epilogue %s)", m, n, k, epi_name);
    const int needs_bias = matmul_key_needs_bias(epilogue), needs_aux = matmul_key_needs_aux(epilogue);
    if (needs_bias != (args.bias != nullptr) || needs_aux != (args.aux != nullptr))
        die("matmul: epilogue %s got the wrong set of bias / aux pointers (bias %s, aux %s)", epi_name,
            args.bias ? "set" : "NULL", args.aux ? "set" : "NULL");
    /* cuBLASLt: the GELU aux leading dimension must be a multiple of 8 */
    if (needs_aux && m % 8 != 0) die("matmul: epilogue %s needs m %% 8 == 0 (m=%d)", epi_name, m);
    /* DGELU multiplies the whole result by gelu'(aux); with beta = 1 the old D would be multiplied too */
    if (epilogue == MATMUL_EPILOGUE_DGELU && accumulate) die("matmul: the DGELU epilogue cannot accumulate into D");
    const MatmulKey key = matmul_key(m, n, k, trans_a, trans_b, accumulate, epilogue);
    MatmulPlan* plan = matmul_plan_find(ctx, &key);
    if (plan == NULL && ctx->num_plans < MATMUL_MAX_PLANS) {
        plan = &ctx->plans[ctx->num_plans];
        matmul_plan_make(ctx, key, plan);
        ctx->num_plans++;
        if (ctx->tune_candidates > 0) matmul_plan_time(ctx, plan, d, a, b, args, stream);
    }
    if (plan) {
        if (ctx->tune_candidates > 0) plan->calls_while_tuning++;
        matmul_plan_run(ctx, plan, NULL, d, a, b, args, stream);
    } else { /* the table is full (a sampler's growing contexts): a plan for this call alone */
        MatmulPlan once;
        matmul_plan_make(ctx, key, &once);
        matmul_plan_run(ctx, &once, NULL, d, a, b, args, stream);
        matmul_plan_destroy(&once);
    }
}

/* ---- the algorithms as records (the resume state, rank 0's choice on every rank) ---- */

static_assert(sizeof(cublasLtMatmulAlgo_t) == sizeof(((MatmulAlgoRecord*)0)->algo),
              "MatmulAlgoRecord holds a cublasLtMatmulAlgo_t's bytes");

/* The context's plans as records (at most max); returns how many. */
static int matmul_records_export(const MatmulContext* ctx, MatmulAlgoRecord* out, int max) {
    int n = 0;
    for (int i = 0; i < ctx->num_plans && n < max; i++, n++) {
        const MatmulKey* k = &ctx->plans[i].key;
        MatmulAlgoRecord* r = &out[n];
        memset(r, 0, sizeof(*r));
        r->m = k->m, r->n = k->n, r->k = k->k, r->trans_a = k->trans_a, r->trans_b = k->trans_b;
        r->accumulate = k->accumulate, r->epilogue = (int32_t)k->epilogue;
        memcpy(r->algo, &ctx->plans[i].algo, sizeof(r->algo));
    }
    return n;
}

/* Gives the context the records' algorithms: the plan of each record's key (made if new) runs the record's
   algorithm from now on. Each is first checked by cuBLASLt against the key's descriptors on this GPU and
   library; returns 0, or -1 with a message naming the first that does not fit (the context is then unchanged
   for it and the records after it). */
static int matmul_records_restore(MatmulContext* ctx, const MatmulAlgoRecord* recs, int n, char* err, size_t errlen) {
    for (int i = 0; i < n; i++) {
        const MatmulAlgoRecord* r = &recs[i];
        if (r->epilogue < MATMUL_EPILOGUE_NONE || r->epilogue > MATMUL_EPILOGUE_DGELU || r->m <= 0 || r->n <= 0 ||
            r->k <= 0) {
            snprintf(err, errlen, "record %d is not a GEMM this program runs (m=%d n=%d k=%d epilogue %d)", i, r->m,
                     r->n, r->k, r->epilogue);
            return -1;
        }
        const MatmulKey key =
            matmul_key(r->m, r->n, r->k, r->trans_a, r->trans_b, r->accumulate, (MatmulEpilogue)r->epilogue);
        MatmulPlan* plan = matmul_plan_find(ctx, &key);
        MatmulPlan fresh;
        if (plan == NULL) matmul_plan_make(ctx, key, &fresh);
        MatmulPlan* p = plan ? plan : &fresh;
        cublasLtMatmulAlgo_t algo;
        memcpy(&algo, r->algo, sizeof(algo));
        cublasLtMatmulHeuristicResult_t check;
        const cublasStatus_t st = cublasLtMatmulAlgoCheck(ctx->handle, p->desc, p->layout_a, p->layout_b,
                                                          p->layout_d, p->layout_d, &algo, &check);
        if (st != CUBLAS_STATUS_SUCCESS || check.workspaceSize > ctx->workspace_bytes) {
            snprintf(err, errlen, "the algorithm of GEMM m=%d n=%d k=%d (%s) does not run here (cuBLASLt status %d, "
                     "workspace %zu of %zu bytes)", r->m, r->n, r->k, matmul_epilogue_name(key.epilogue), (int)st,
                     (size_t)check.workspaceSize, ctx->workspace_bytes);
            if (!plan) matmul_plan_destroy(&fresh);
            return -1;
        }
        if (!plan) {
            if (ctx->num_plans == MATMUL_MAX_PLANS) {
                matmul_plan_destroy(&fresh);
                snprintf(err, errlen, "more than %d records", MATMUL_MAX_PLANS);
                return -1;
            }
            ctx->plans[ctx->num_plans++] = fresh;
            p = &ctx->plans[ctx->num_plans - 1];
        }
        p->algo = algo;
        p->source = MATMUL_ALGO_RESTORED;
    }
    return 0;
}

/* What timing bought: over the plans timed, the ms per tuning micro-step of their calls under the heuristic's
   first and under the chosen algorithms, and how many plans were timed and changed. */
typedef struct {
    int timed, changed;
    double first_ms, chosen_ms, seconds;
} MatmulTuneSummary;

static MatmulTuneSummary matmul_tune_summary(const MatmulContext* ctx) {
    MatmulTuneSummary s;
    memset(&s, 0, sizeof(s));
    for (int i = 0; i < ctx->num_plans; i++) {
        const MatmulPlan* p = &ctx->plans[i];
        if (p->source != MATMUL_ALGO_TIMED) continue;
        s.timed++;
        s.changed += p->rank != 0;
        s.first_ms += (double)p->first_ms * p->calls_while_tuning;
        s.chosen_ms += (double)p->chosen_ms * p->calls_while_tuning;
    }
    s.seconds = ctx->tune_seconds;
    return s;
}

/*
 * out[N, OC] = inp[N, K] @ W[OC, K]^T (+ bias). In column-major terms
 * out^T[OC, N] = W^T... i.e. m = OC, n = N, k = K, A = W (stored [K, OC]
 * column-major, transposed), B = inp (stored [K, N], not transposed).
 * With gelu_preact non-NULL: gelu_preact = inp W^T (+ bias) and
 * out = gelu(gelu_preact) (gelu_preact [N, OC] row-major = aux [OC, N] ld OC).
 * bias NULL: no bias (a model built with --bias 0).
 */
static void matmul_forward(MatmulContext* ctx, floatX* out, const floatX* inp, const floatX* weight,
                           const floatX* bias, floatX* gelu_preact, int N, int K, int OC, cudaStream_t stream) {
    MatmulEpilogue epi = bias ? MATMUL_EPILOGUE_BIAS : MATMUL_EPILOGUE_NONE;
    if (gelu_preact) epi = bias ? MATMUL_EPILOGUE_GELU_AUX_BIAS : MATMUL_EPILOGUE_GELU_AUX;
    const MatmulEpilogueArgs args = {bias, gelu_preact};
    matmul_cublaslt(ctx, out, weight, inp, OC, N, K, 1, 0, 0, epi, args, stream);
}

/* dinp[N, K] = dout[N, OC] @ W[OC, K] (accumulate: +=). Column-major:
   dinp^T[K, N] = W^T[K, OC] dout^T[OC, N]: m = K, n = N, k = OC, no transposes. */
static void matmul_backward_input(MatmulContext* ctx, floatX* dinp, const floatX* dout, const floatX* weight, int N,
                                  int K, int OC, int accumulate, cudaStream_t stream) {
    const MatmulEpilogueArgs args = {nullptr, nullptr};
    matmul_cublaslt(ctx, dinp, weight, dout, K, N, OC, 0, 0, accumulate, MATMUL_EPILOGUE_NONE, args, stream);
}

/* The input gradient of a matmul whose input was gelu(gelu_preact), taken
   through the GELU: dinp[N, K] = (dout[N, OC] @ W[OC, K]) * gelu'(gelu_preact[N, K]),
   overwritten. Same mapping as matmul_backward_input (m = K, n = N, k = OC);
   gelu_preact [N, K] row-major is the aux [K, N] with ld K = m, the layout
   matmul_forward's GELU epilogue wrote it in. */
static void matmul_backward_input_dgelu(MatmulContext* ctx, floatX* dinp, const floatX* dout, const floatX* weight,
                                        const floatX* gelu_preact, int N, int K, int OC, cudaStream_t stream) {
    if (gelu_preact == nullptr) die("matmul_backward_input_dgelu: needs the GELU pre-activation");
    const MatmulEpilogueArgs args = {nullptr, (floatX*)gelu_preact}; /* read only (DGELU) */
    matmul_cublaslt(ctx, dinp, weight, dout, K, N, OC, 0, 0, 0, MATMUL_EPILOGUE_DGELU, args, stream);
}

/* dW[OC, K] += dout[N, OC]^T @ inp[N, K]. Column-major:
   dW^T[K, OC] = inp^T[K, N] dout[N, OC]: m = K, n = OC, k = N, B transposed.
   (The bias gradient is layernorm.cuh's bias_backward: see the top comment.) */
static void matmul_backward_weight(MatmulContext* ctx, floatX* dweight, const floatX* dout, const floatX* inp, int N,
                                   int K, int OC, cudaStream_t stream) {
    const MatmulEpilogueArgs args = {nullptr, nullptr};
    matmul_cublaslt(ctx, dweight, inp, dout, K, OC, N, 0, 1, 1, MATMUL_EPILOGUE_NONE, args, stream);
}

#endif /* MODEL_MATMUL_CUH */
