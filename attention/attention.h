/*
 * attention/attention.h - the switchable attention module's public contract.
 *
 * Why: the whole project asks how the numerics of the attention kernel change
 * training. So the attention mode is ONE run-time value shared by the CPU
 * reference, the CUDA kernels, the trainers, the probe and the tests, and all
 * modes share one memory layout and one saved state per layer: switching the
 * mode (even mid-run, from a checkpoint) changes nothing else.
 * What each mode computes, and where it rounds, is docs/attention_numerics.md.
 *
 * Layout (the model's fused QKV buffer, no permutes):
 *   qkv   [B, T, 3, NH, HS]  row t of batch b holds q | k | v, head h at h*HS
 *   out   [B, T, NH, HS]     (feeds the output projection directly)
 *   stats [B, NH, T, 2]      two fp32 per query row, the saved softmax state:
 *                            bf16, cudnn: {LSE_i (natural log, scaled units), 0}
 *                            other modes: {m_i (raw score max), l_i (row sum)}
 *   dout like out, dqkv like qkv.
 * Causal: query t sees keys 0..t. Scale s = 1/sqrt(HS).
 *
 * cudnn mode (GPU only) is cuDNN's fused kernel reached through its backend API
 * (attention/cudnn/); it keeps the same layout and bf16 mode's stats {LSE, 0}.
 *
 * Offers (this header, plain C): the mode enum and its names, the shape
 * struct, options, and the CPU entry points (attention_cpu.c, fp32 arrays
 * holding the values; see AttnIO) plus the fp64 reference (attention_ref.c).
 * The CUDA entry points live in attention/attention_cuda.cuh.
 */
#ifndef ATTENTION_ATTENTION_H
#define ATTENTION_ATTENTION_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    ATTN_FP32 = 0,   /* no intermediate rounding; FP32-accurate inside */
    ATTN_BF16 = 1,   /* FlashAttention-3 style, faithful to its rounding and FMA softmax */
    ATTN_REPAIR = 2, /* bf16 with the FMA softmax flaw repaired (P_max == 1 exactly) */
    ATTN_GPROJ = 3,  /* repair + P-weighted projection restoring zero row sums of dS */
    ATTN_CUDNN = 4,  /* cuDNN's own fused flash attention (GPU only; attention/cudnn/) */
    ATTN_NUM_MODES = 5
} AttnMode;

/* The modes 0..ATTN_NUM_EMULATED_MODES-1 are the ones this project defines: each has an exact
   CPU emulation (attention_cpu.c) and our own CUDA kernels. cudnn is cuDNN's kernel, GPU only,
   with no CPU emulation; loops over "every mode" of the CPU side, the emulation tests and our
   kernels run over the emulated ones. */
enum { ATTN_NUM_EMULATED_MODES = 4 };
/* 1 for fp32, bf16, repair, gproj; 0 for cudnn and invalid values. */
int attn_mode_is_emulated(AttnMode mode);
/* Dies with one clear message, naming `who`, unless `mode` is an emulated mode: the CPU entry
   points and the CPU trainer call it (cudnn runs only on the GPU). */
void attn_mode_require_emulated(AttnMode mode, const char* who);

/* Names as used by the --attn flag: "fp32", "bf16", "repair", "gproj", "cudnn". */
const char* attn_mode_name(AttnMode mode);
/* Parses a flag value; returns 0 on success, -1 for an unknown name. */
int attn_mode_parse(const char* name, AttnMode* mode);
/* "fp32|bf16|repair|gproj|cudnn", for help texts and error messages. */
const char* attn_mode_choices(void);
/* "fp32|bf16|repair|gproj": the emulated modes, for the CPU side's messages. */
const char* attn_emulated_mode_choices(void);
/* Parses a comma-separated list of mode names ("bf16,gproj") and sets
   selected[mode] = 1 for each (others are left as they are). Returns the
   number of modes named, or -1 with a message naming the unknown one. */
int attn_mode_parse_list(const char* list, int selected[ATTN_NUM_MODES], char* err, size_t errlen);

typedef struct {
    int B;   /* batch */
    int NH;  /* heads */
    int T;   /* sequence length (causal) */
    int HS;  /* head size */
} AttnShape;

typedef struct {
    /* repair mode only, off by default: the Qiu & Yao tile-max shift arm
       (see docs/attention_numerics.md); conflicts with P_max == 1, so it is never
       combined silently. Ignored by the other modes. */
    int tile_max_shift;
    /* CUDA only (the CPU code ignores it): 1 = always run the portable
       mma.sync kernels (sm_80 and later), even where an architecture-specific
       kernel computes the same mode (the Hopper forward on sm_90, see
       attention/cuda/hopper/attention_hopper.cuh); 0, the default = the fastest exact
       kernel for the current device. For tests and benchmarks that compare
       the two paths. */
    int force_portable;
    /* CUDA only (the CPU code is deterministic whatever it says): 1 = the
       backward sums every FP32 partial in a fixed order, so the same call on
       the same inputs gives the same dq, dk, dv bits on every run; 0, the
       default = the dQ partials of the key blocks are added to one FP32
       accumulator in arrival order (bf16, repair, fp32; runs then repeat
       only to rounding). gproj is deterministic either way (its dQ comes
       from the query-major row pass). On: bf16, repair and fp32 need
       ceil(T / 128) times the FP32 dQ of workspace
       (attention_cuda_workspace_bytes with these options says how much);
       docs/determinism.md says how and what it costs. */
    int deterministic;
} AttnOptions;

/*
 * CPU I/O precision. The mode contract takes BF16 Q, K, V, dO and returns BF16
 * O, dQ, dK, dV. ATTN_IO_BF16 applies exactly that at the module boundary
 * (inputs rounded to BF16 on entry, outputs rounded on exit), which is what
 * the GPU kernels see and what tests compare against. ATTN_IO_FP32 skips the
 * boundary rounding and keeps only each mode's internal rounding; the FP32 CPU
 * model uses it, so that in fp32 mode it is plain FP32 attention (finite
 * differences, PyTorch parity) and in the other modes the training effect of
 * the internal rounding is still there.
 */
typedef enum { ATTN_IO_FP32 = 0, ATTN_IO_BF16 = 1 } AttnIO;

/* Size in floats of the stats buffer for a shape: B*NH*T*2. */
size_t attn_stats_count(AttnShape s);
/* Sizes in elements of the qkv / dqkv buffer (B*T*3*NH*HS) and of out / dout (B*T*NH*HS). */
size_t attn_qkv_count(AttnShape s);
size_t attn_out_count(AttnShape s);
/* Dies with a clear message (naming `who`) unless B, NH, T, HS are all >= 1. */
void attn_shape_check(AttnShape s, const char* who);

/* The two softmax constants every implementation must share (computed in
   double, rounded once to fp32): s = 1/sqrt(HS) and c = s * log2(e). */
float attn_softmax_scale(int HS);
float attn_exp2_scale(int HS);

/* Repair's optional tile-max shift arm works on key tiles of this many
   columns, aligned at key 0 (keys 0..63, 64..127, ...), and counts a score as
   tied with its tile max when (m~ - S_ij) * s <= ATTN_SHIFT_TIE_TOL. The GPU
   kernels use the same tile so that CPU and GPU agree on the shifted max. */
#define ATTN_SHIFT_TILE_KEYS 64
#define ATTN_SHIFT_TIE_TOL 1e-3f

/* ---- CPU emulation of each mode (attention_cpu.c), OpenMP over (b, h) ---- */
void attention_forward_cpu(AttnMode mode, AttnOptions opt, AttnIO io, AttnShape s,
                           const float* qkv, float* out, float* stats);
/* Accumulates nothing: dqkv is overwritten. out and stats are the forward's. */
void attention_backward_cpu(AttnMode mode, AttnOptions opt, AttnIO io, AttnShape s,
                            const float* qkv, const float* out, const float* stats,
                            const float* dout, float* dqkv);

/* The same backward, also reporting per query row the relative residual of
   the effective dS that the dQ GEMM consumes, |sum_j dS'_ij| / sum_j |dS'_ij|
   (0 for an all-zero row), into row_residual [B, NH, T] (may be NULL).
   dS' is dS (fp32 mode), bf(dS) (bf16, repair) or bf(dS) - lambda*bf(P) (gproj). */
void attention_backward_cpu_diag(AttnMode mode, AttnOptions opt, AttnIO io, AttnShape s,
                                 const float* qkv, const float* out, const float* stats,
                                 const float* dout, float* dqkv, float* row_residual);
/* Softmax numerators as the mode computes them, written to probs [B, NH, T, T]
   (row i, column j; zero for j > i). from_stats = 0: the forward's values
   (e_ij = exp2 of the mode's exponent, before any normalisation; l_i is their
   sum). from_stats = 1: what the backward recomputes from qkv and stats
   before normalising (repair, gproj, fp32: e_ij from the stored m_i, which
   must equal the forward's bit for bit; bf16: P_ij from the stored LSE,
   already normalised). For tests and the probe; T x T memory. */
void attention_probs_cpu(AttnMode mode, AttnOptions opt, AttnIO io, AttnShape s,
                         const float* qkv, const float* stats, int from_stats, float* probs);

/* ---- fp64 reference (attention_ref.c): exact softmax attention in double ---- */
/* Same layouts as above, in double. The backward takes D_i = sum_j P_ij dP_ij
   from its own P (not from a stored O), so it is exact up to fp64 rounding. */
void attention_forward_ref(AttnShape s, const double* qkv, double* out);
void attention_backward_ref(AttnShape s, const double* qkv, const double* dout, double* dqkv);
/* Per query row the exact max raw score m_i = max_j q_i.k_j and the row sum
   l_i = sum_j exp((S_ij - m_i) * s), into stats_ref [B, NH, T, 2] (for checking
   the {m, l} stats of the CPU emulation and the GPU kernels). */
void attention_stats_ref(AttnShape s, const double* qkv, double* stats_ref);

/* ---- BF16 helpers shared by the CPU code, tests and tools ---- */
/* Round-to-nearest-even to BF16, returned as float (NaN stays NaN). */
float bf16_round(float x);
unsigned short float_to_bf16_bits(float x);
float bf16_bits_to_float(unsigned short b);

#ifdef __cplusplus
}
#endif

#endif /* ATTENTION_ATTENTION_H */
