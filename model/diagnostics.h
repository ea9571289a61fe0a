/*
 * model/diagnostics.h - gradient-health and attention diagnostics of a
 * training run, cheap enough to leave on (CPU side; the CUDA kernels of the
 * same quantities are in model/diagnostics.cuh).
 *
 * Why: the question of this project is whether the BF16 attention backward
 * quietly spoils training. Its fingerprints are a key offset that grows
 * (rho = |mean key| / rms spread of the keys), a key bias that drifts although
 * its exact gradient is zero, and a dQ error that grows with rho
 * (docs/attention_numerics.md). This module measures them every N steps from
 * the buffers the trainers already hold, writes them as log.jsonl fields that
 * scripts/compare_runs.py plots, replays one layer's backward against a more
 * accurate recomputation (the in-run probe), writes attention captures, and
 * offers the gauge-fixing arm (--zero-key-bias-grad), and decides when the
 * trainer warns that rho or the dQ error crossed a threshold (--warn-rho,
 * --warn-dq-err). docs/diagnostics.md explains every number and what it costs.
 *
 * What is measured per layer (LayerDiag; NaN = not measured, written as null):
 *   rho_max, rho_median   key offset per head h over all B*T keys of h:
 *                         |mean_k| / sqrt(mean ||k - mean_k||^2); max and
 *                         median (mean of the middle two for even NH) over heads
 *   q_absmax, k_absmax    max |element| of Q and of K (whole layer)
 *   logit_max             max of s * q_i.k_j over visible pairs j <= i
 *   entropy_mean          mean over query rows of the softmax entropy (nats)
 *   -- both on the query rows chosen by diag_sample_row (exact for all rows
 *      when rows_per_head <= 0 or >= T); every key of those rows is used.
 *   grad_norm             L2 norm of this layer's gradient (all per-layer tensors)
 *   key_bias_norm         ||qkvb[l][C:2C)||, key_bias_grad_norm likewise for the
 *                         gradient (exactly zero in exact arithmetic)
 *
 * Layouts are those of attention/attention.h (qkv [B, T, 3, NH, HS]) and the
 * parameter table of model/gpt_config.h. Plain C; also included by the CUDA
 * side (LayerDiag is the same bytes on host and device).
 */
#ifndef MODEL_DIAGNOSTICS_H
#define MODEL_DIAGNOSTICS_H

#include <stddef.h>
#include <stdint.h>

#include "attention/attention.h"
#include "attention/support/attn_capture.h"
#include "model/gpt_config.h"

#ifdef __cplusplus
extern "C" {
#endif

#ifdef __CUDACC__
#define DIAG_HOST_DEVICE __host__ __device__
#else
#define DIAG_HOST_DEVICE
#endif

typedef struct {
    float rho_max, rho_median;
    float q_absmax, k_absmax;
    float logit_max;
    float entropy_mean;
    float grad_norm;
    float key_bias_norm, key_bias_grad_norm;
} LayerDiag;

/* Default number of query rows per (batch, head) used for logit_max and
   entropy_mean: 32 rows cost 32*T*HS multiply-adds per head, under 1/16 of
   the forward's Q K^T at T = 1024. */
#define DIAG_DEFAULT_ROWS_PER_HEAD 32

/* Sets every field of per_layer[0..L) to NaN ("not measured"). */
void diag_layers_clear(LayerDiag* per_layer, int L);

/* Number of query rows a (batch, head) contributes: T when rows_per_head <= 0
   or >= T, else rows_per_head. */
static inline DIAG_HOST_DEVICE int diag_rows_used(int rows_per_head, int T) {
    return (rows_per_head <= 0 || rows_per_head >= T) ? T : rows_per_head;
}
/* The r-th sampled query row (0 <= r < diag_rows_used): evenly spaced, the
   last one is always row T-1 (the row that sees every key):
   t_r = floor((r+1) * T / R) - 1. With R == T this is row r. */
static inline DIAG_HOST_DEVICE int diag_sample_row(int r, int rows_per_head, int T) {
    const int R = diag_rows_used(rows_per_head, T);
    return (int)(((int64_t)(r + 1) * T) / R) - 1;
}

/* Attention diagnostics of one layer from its qkv activations (fp32 values,
   attention.h layout): fills rho_max, rho_median, q_absmax, k_absmax,
   logit_max, entropy_mean of *out; other fields are left alone. Sums in
   double, OpenMP over heads. */
void diag_attention_cpu(const float* qkv, int B, int T, int NH, int HS, int rows_per_head, LayerDiag* out);

/* Per-head rho into rho_per_head[NH] (for tests and tools). */
void diag_key_rho_cpu(const float* qkv, int B, int T, int NH, int HS, double* rho_per_head);

/* Median of n floats (mean of the two middle ones when n is even; NaN sorts
   last). n >= 1. The GPU code uses the same rule. */
float diag_median(const float* values, int n);

/* Gradient norms and key-bias norms from the parameter table: fills
   grad_norm, key_bias_norm, key_bias_grad_norm of per_layer[0..L). Writes the
   L2 norm of the whole gradient buffer (every tensor, also wte/wpe/lnf) to
   *global_grad_norm when it is not NULL. grads may be NULL (then only
   key_bias_norm is filled). */
void diag_params_cpu(const GPTConfig* cfg, const ParamTensorInfo table[NUM_PARAM_TENSORS], const float* params,
                     const float* grads, LayerDiag* per_layer, double* global_grad_norm);

/* The gauge-fixing arm (--zero-key-bias-grad): sets the key-bias gradient
   qkvb[l][C:2C) of every layer to zero. Its exact value is zero (softmax does
   not see a common key shift), so this removes only rounding noise that Adam
   would otherwise turn into a steady drift. Call after backward (and after the
   gradient all-reduce, or before it on every rank), before the norm/clip and
   the optimizer. */
void diag_zero_key_bias_grad_cpu(const GPTConfig* cfg, const ParamTensorInfo table[NUM_PARAM_TENSORS], float* grads);

/* ---- the in-run probe: the current mode's dQ / dK against a better recomputation ---- */
typedef enum {
    DIAG_PROBE_REF_FP64 = 0, /* CPU: attention_backward_ref in double on the same inputs */
    DIAG_PROBE_REF_FP32 = 1, /* GPU: the fp32 attention mode on the same inputs (BF16 outputs) */
} DiagProbeRef;

typedef struct {
    int layer;              /* -1 when no probe ran */
    AttnMode mode;          /* the mode whose backward was probed */
    DiagProbeRef reference;
    int heads;              /* B * NH values summarised */
    double dq_err_median, dq_err_max;  /* per (b, h) ||dQ - dQ_ref||_F / ||dQ_ref||_F */
    double dk_err_median, dk_err_max;
} DiagProbe;

/* Marks a probe result as "none" (layer -1; diag_write_json then omits it). */
void diag_probe_clear(DiagProbe* p);

/* CPU probe of one layer: recomputes that layer's backward in `mode` from the
   layer's saved forward state (qkv, out, stats of that mode, as the trainer
   holds them) and its output gradient dout, and the exact backward in fp64 on
   the same inputs (rounded to BF16 first when io is ATTN_IO_BF16, since that
   is what the mode saw), and summarises the per-head relative errors of dQ and
   dK. dq_err / dk_err [B*NH] receive the per-head errors when not NULL.
   Cost: two attention backwards of one layer (the fp64 one recomputes P). */
void diag_probe_cpu(AttnMode mode, AttnOptions opt, AttnIO io, AttnShape s, int layer, const float* qkv,
                    const float* out, const float* stats, const float* dout, double* dq_err, double* dk_err,
                    DiagProbe* result);

/* ---- the log.jsonl record ---- */
/* Writes the diagnostics as the body of a JSON object (no braces, no leading
   comma) into buf: run-level summary keys first, which compare_runs.py plots,
     "rho_max"            max over layers of rho_max
     "rho_median"         median over layers of rho_median
     "q_absmax", "k_absmax", "logit_max"   max over layers
     "entropy_mean"       mean over layers
     "key_bias_norm"      L2 norm of the key bias of all layers
     "key_bias_grad_norm" likewise for its gradient
   then per-layer arrays "layer_rho_max", "layer_rho_median", "layer_q_absmax",
   "layer_k_absmax", "layer_logit_max", "layer_entropy", "layer_grad_norm",
   "layer_key_bias_norm", "layer_key_bias_grad_norm" (L numbers each), then,
   when probe != NULL and probe->layer >= 0, "probe_layer", "probe_mode",
   "probe_ref" ("fp64"/"fp32"), "probe_dq_err", "probe_dk_err" (medians over
   heads), "probe_dq_err_max", "probe_dk_err_max". Numbers use %.9g; NaN/Inf
   (not measured) are written as null. The global gradient norm is NOT written:
   the step record already carries "grad_norm".
   Returns the length written; dies if cap < diag_json_bytes(L). */
int diag_write_json(char* buf, size_t cap, const LayerDiag* per_layer, int L, const DiagProbe* probe);
/* A buffer size that always suffices for diag_write_json with L layers. */
size_t diag_json_bytes(int L);

/* ---- early warning: a layer's rho or the in-run probe's dQ error crossed a threshold ---- */
/* The trainers' --warn-rho and --warn-dq-err (docs/diagnostics.md, "Early warning"). A warning fires
   when a value rises above its threshold, once per (kind, layer): it re-arms only after the value has
   fallen below DIAG_WARN_REARM x threshold, so a value that hovers at the threshold does not warn at
   every diagnostics step. The state lives in memory only: a resumed run starts with every warning
   armed. Layers past DIAG_WARN_MAX_LAYERS are not watched. */
#define DIAG_WARN_MAX_LAYERS 256
#define DIAG_WARN_REARM 0.8
typedef enum { DIAG_WARN_RHO = 0, DIAG_WARN_DQ_ERR = 1, DIAG_WARN_KINDS = 2 } DiagWarnKind;

typedef struct {
    DiagWarnKind kind;
    int layer;
    double value, threshold;
} DiagWarning;

typedef struct {
    double threshold[DIAG_WARN_KINDS];  /* <= 0: that kind is off */
    AttnMode mode;                      /* the run's mode, for the hint */
    int trained_under;                  /* resumed under another mode: the checkpoint's mode, else -1 */
    int64_t trained_until;              /* ... the step of that checkpoint */
    unsigned char fired[DIAG_WARN_KINDS][DIAG_WARN_MAX_LAYERS];  /* 1: warned, not yet re-armed */
    DiagWarning pending[DIAG_WARN_KINDS * DIAG_WARN_MAX_LAYERS]; /* the last diag_warn_check's new warnings */
    int num_pending;
} DiagWarn;

/* Every warning armed; warn_rho / warn_dq_err <= 0 turn that kind off. */
void diag_warn_init(DiagWarn* w, double warn_rho, double warn_dq_err, AttnMode mode);
/* The run was resumed under w->mode from a checkpoint of step `step` trained under `mode` (-1: not
   switched). A key offset seen then may have been built before the switch, and the note says so. */
void diag_warn_set_trained_under(DiagWarn* w, int mode, int64_t step);
/* Checks one diagnostics step: per layer rho_max of per_layer[0..L) (NaN = not measured: skipped) and,
   when probe != NULL and probe->layer >= 0, the probed layer's dq_err_median. Fills w->pending with the
   warnings that fire now and returns their number. */
int diag_warn_check(DiagWarn* w, const LayerDiag* per_layer, int L, const DiagProbe* probe);
/* Pending warning i as a console message (one line plus a hint line: how to continue under gproj) and
   as the body of the log record {"event": "attn_warning", <body>}:
   "step": S, "kind": "rho"|"dq_err", "layer": l, "value": v, "threshold": t, "mode": "bf16". */
void diag_warning_text(const DiagWarn* w, int i, int64_t step, char* console, size_t console_cap, char* json,
                       size_t json_cap);

/* ---- attention capture at chosen steps and layers ---- */
#define DIAG_CAPTURE_MAX_ITEMS 256

typedef struct {
    int64_t steps[DIAG_CAPTURE_MAX_ITEMS];  /* sorted, distinct */
    int num_steps;                          /* 0: never capture */
    int layers[DIAG_CAPTURE_MAX_ITEMS];     /* sorted, distinct */
    int num_layers;                         /* 0: every layer */
} DiagCaptureSpec;

/* Parses a comma-separated list of non-negative integers ("1000,2000,5000";
   "" gives an empty list), sorted and deduplicated into values[0..*count).
   Returns 0, or -1 with a one-line message naming `what` (e.g. "--capture-steps")
   and the bad item in err. */
int diag_parse_int_list(const char* text, const char* what, int64_t* values, int max_values, int* count,
                        char* err, size_t errlen);
/* From the trainer flags --capture-steps S1,S2,... and --capture-layers
   L1,L2,... ("" = every layer). Layers must be < num_layers. 0 or -1 + message. */
int diag_capture_spec_from_flags(const char* steps, const char* layers, int num_layers, DiagCaptureSpec* spec,
                                 char* err, size_t errlen);
/* The combined form "STEPS:LAYERS", e.g. "1000,2000:0,5,11" (":LAYERS" may be
   left out = every layer), for a --capture-attn flag. 0 or -1 + message. */
int diag_capture_spec_parse(const char* text, int num_layers, DiagCaptureSpec* spec, char* err, size_t errlen);
/* 1 if the spec asks for a capture of this layer at this step. */
int diag_capture_wanted(const DiagCaptureSpec* spec, int64_t step, int layer);
/* 1 if any layer is to be captured at this step (to decide before backward
   whether dO must be kept). */
int diag_capture_step_wanted(const DiagCaptureSpec* spec, int64_t step);
/* "<dir>/attn_step00001000_layer05.bin" into buf. */
void diag_capture_path(char* buf, size_t n, const char* dir, int64_t step, int layer);
/* The header of a trainer's capture: dtype, shape, layer, step, mode, and the flags for the optional out and
   stats (what both trainers' capture writers fill in). */
AttnCaptureInfo diag_capture_info(AttnCaptureDtype dtype, int64_t step, int layer, AttnMode mode, AttnShape s,
                                  int has_out, int has_stats);

/* Writes one layer's attention call (fp32 values, module layout: qkv, out,
   stats of `mode`, dout) as an fp32 capture file (attention/support/attn_capture.h)
   at diag_capture_path(dir, step, layer). out / stats may be NULL. The GPU
   trainer uses diag_capture_layer_cuda (diagnostics.cuh) instead. */
void diag_capture_write_cpu(const char* dir, int64_t step, int layer, AttnMode mode, AttnShape s,
                            const float* qkv, const float* out, const float* stats, const float* dout);

#ifdef __cplusplus
}
#endif

#endif /* MODEL_DIAGNOSTICS_H */
