/*
 * dev/gproj_variants.h - CPU emulation of cheaper variants of the gproj
 * attention backward, for the study in docs/gproj_variants.md.
 *
 * Why: exact gproj (docs/attention_numerics.md) needs whole-row sums
 * r_i = sum_j bf(dS_ij), p_i = sum_j bf(P_ij) before any dK contribution, so
 * its CUDA kernel runs a query-major pre-pass plus two extra GEMMs (1.5x bf16
 * mode). Before anyone writes CUDA for a cheaper, separately named mode we
 * need to know which formulation keeps gproj's accuracy on the hard cases.
 * This module emulates each candidate with the rounding points a real kernel
 * would have, on top of the repair forward (stats {m, l}, BF16 O), using the
 * emulation's own building blocks (attention/cpu/attention_cpu_rows.h).
 *
 * A variant is three choices:
 *   D    where D_i comes from: the stored BF16 O (dO . O, as bf16/repair/
 *        gproj), FP32 (sum_j P dP, pivoted, as fp32 mode: needs the row
 *        pre-pass), or the stored O plus its BF16 rounding residual
 *        O_lo = bf(O_f32 - O) (dO . O + dO . O_lo: one extra saved tensor),
 *        the latter also from a forward that forms O with fp32 P (the P V
 *        GEMM on BF16 hi + lo parts of e, as fp32 mode's forward does), so
 *        that D matches the backward's P and not only the forward's bf(e),
 *        or from a forward that divides sum_j bf(e_j) V_j by sum_j bf(e_j)
 *        instead of l (its weights then sum to 1, so a common value vector
 *        passes through O exactly and does not enter D's error), its O_lo
 *        kept in BF16 or as an int8 count of 1/256 of O's BF16 ulp (half
 *        the bytes, about the same 8 significant bits);
 *   dQ   correction: none, P-weighted (gproj's exact lambda_i = r_i / p_i and
 *        a second accumulator sum_j bf(P_ij) K_j), uniform (r_i times the
 *        prefix mean of the keys), or forward-PK (r_i times the forward's
 *        weighted key mean sum_j bf(e_ij) K_j / sum_j bf(e_ij), saved in fp32,
 *        or saved in BF16 as its difference to the prefix key mean, which the
 *        backward recomputes, or to the query's own key K_i, which the
 *        backward has: either way the key offset cancels in the difference);
 *   dK   correction: none, P-weighted inline (gproj: bf(-lambda_i P_ij) as
 *        its own operand in the same accumulator), P-weighted deferred (the
 *        same operand in a post-pass, added to an fp32 dK workspace, or to
 *        the BF16-rounded dK), or uniform (dK_j -= s sum_{i>=j} r_i/n_i Q_i).
 * Outputs are what the training step sees: BF16 dQ, dK, dV in the qkv
 * layout (dV is repair's in every variant), plus the per-row residual
 * |sum_j dS'_ij| / sum_j |dS'_ij| of the operand the dQ GEMM effectively uses.
 *
 * Offers: the variant table gv_variants (names, definitions, extra cost and
 * saved state relative to bf16 mode), gv_backward_variants, and
 * gv_add_value_offset (a common value vector on top of a generated case).
 */
#ifndef DEV_GPROJ_VARIANTS_H
#define DEV_GPROJ_VARIANTS_H

#include <stdint.h>
#include "attention/attention.h"

typedef enum {
    GV_D_STORED_O = 0,    /* dO . O, the stored BF16 O of the repair forward */
    GV_D_FP32 = 1,        /* sum_j P dP (pivoted), needs the row pre-pass */
    GV_D_O_RESIDUAL = 2,  /* dO . O + dO . O_lo, O_lo = bf(O_f32 - O) of the repair forward */
    GV_D_FP32P_FORWARD = 3, /* the same, from a forward whose P V product uses fp32 P (hi + lo) */
    GV_D_SUMBE_FORWARD = 4, /* the same, from a forward normalising by sum_j bf(e_j) instead of l */
    GV_D_SUMBE_NO_LO = 5,   /* dO . O of that forward's BF16 O alone (no O_lo saved) */
    GV_D_SUMBE_LO8 = 6,     /* dO . O + dO . O_lo of that forward, O_lo saved as int8 in 1/256 of O's BF16 ulp */
    GV_NUM_D = 7
} GvDSource;
typedef enum {
    GV_DQ_NONE = 0,
    GV_DQ_PWEIGHTED,
    GV_DQ_UNIFORM,
    GV_DQ_FORWARD_PK,       /* the forward's weighted key mean, saved in fp32 */
    GV_DQ_FORWARD_PK_BF16,  /* the same, saved in BF16 relative to the prefix key mean */
    GV_DQ_FORWARD_PK_OWNKEY, /* the same, saved in BF16 relative to the query's own key K_i */
} GvDqFix;
typedef enum {
    GV_DK_NONE = 0,
    GV_DK_PWEIGHTED,            /* inline, as gproj */
    GV_DK_DEFERRED,             /* post-pass into an fp32 dK workspace */
    GV_DK_DEFERRED_ON_BF16,     /* post-pass added to the BF16-rounded dK */
    GV_DK_UNIFORM,
} GvDkFix;

typedef struct {
    const char* name;   /* short label used in tables and on the command line */
    GvDSource D;
    GvDqFix dq;
    GvDkFix dk;
    const char* extra_work;  /* relative to bf16 mode (fwd 2 GEMMs, bwd 5 GEMMs) */
    const char* extra_state; /* beyond the one stats tensor [B, NH, T, 2] */
} GvVariant;

/* Index of each variant in gv_variants (the table the tool and the test share). */
enum {
    GV_REPAIR = 0,      /* engine's repair: must equal attention_backward_cpu bit for bit */
    GV_GPROJ,           /* engine's gproj: must equal attention_backward_cpu bit for bit */
    GV_A_PDQ,           /* (a) P-weighted dQ only */
    GV_B_PDQ_D32,       /* (b) (a) + FP32 D */
    GV_B_PDQ_DRES,      /* (b') (a) + D from O and its stored residual */
    GV_C_UNIF_D32,      /* (c) uniform dQ and dK with FP32 D */
    GV_C_UNIF,          /* (c') uniform dQ and dK, D from the BF16 O */
    GV_D_DEFER,         /* (d) deferred dK correction, fp32 dK workspace */
    GV_D_DEFER_BF16,    /* (d') deferred dK correction on the BF16 dK */
    GV_E_PDQ_UDK,       /* (e1) P-weighted dQ + uniform dK, D from the BF16 O */
    GV_E_PDQ_DRES_UDK,  /* (e2) P-weighted dQ + uniform dK, D from O + residual */
    GV_E_FPK_DRES_UDK,  /* (e3) forward-PK dQ + uniform dK, D from O + residual */
    GV_E_FPKB_DRES_UDK, /* (e4) (e3) with the forward's key mean saved in BF16 relative to the prefix mean */
    GV_E_PDQ_D32F_UDK,  /* (e5) (e2) with O and O_lo from an fp32-P forward */
    GV_E_PDQ_DSUM_UDK,  /* (e6) (e2) with O and O_lo from a forward normalised by sum_j bf(e_j) */
    GV_E_PDQ_DSUMO_UDK, /* (e7) (e6) without O_lo: D from that forward's BF16 O alone */
    GV_E_PDQ_DSUM,      /* (e6') (e6) without the dK post-pass: dK rounded where the main kernel forms it */
    GV_F_FPKB_DSUM_UDK, /* (f1) the forward's key mean (BF16, relative to the prefix mean) with (e6)'s D and dK */
    GV_F_FPKI_DSUM_UDK, /* (f2) (f1) with the key mean saved relative to the query's own key */
    GV_F_FPKI_DSUM,     /* (f3) (f2) without the dK post-pass: bf16 mode's backward plus r_i and the dQ fix */
    GV_F_FPKI_DSUM8,    /* (f4) (f3) with O_lo saved in 8 bits */
    GV_NUM_VARIANTS
};
extern const GvVariant gv_variants[GV_NUM_VARIANTS];

/* Runs the repair forward (ATTN_IO_BF16; and once with ATTN_IO_FP32 for the
   fp32 O whose rounding residual some variants store) and the backward of
   every variant on the same BF16-representable inputs. dqkv[v] (qkv layout)
   gets variant v's BF16 dQ, dK and dV; row_residual[v] [B, NH, T] (may be
   NULL) the residual of its effective dQ operand; out[v] (may be NULL; out
   layout) the BF16 O its forward would return (repair's, except for the
   variants whose D needs a different forward). */
void gv_backward_variants(AttnShape s, const float* qkv, const float* dout, float* const dqkv[GV_NUM_VARIANTS],
                          float* const row_residual[GV_NUM_VARIANTS], float* const out[GV_NUM_VARIANTS]);

/* Adds a common value vector to every value of qkv (BF16-rounded after the
   addition): V += rho_v * sqrt(HS) * u_h, u_h a random unit vector per head
   shared by the batch (rho_v = |mean v| / rms spread for N(0,1) values). Real
   runs have such offsets (docs/diagnostics.md: rho_v 17.6 at step 10); the
   contract's hard cases do not, and they decide whether a D taken from the
   forward's O is good enough. */
void gv_add_value_offset(AttnShape s, float* qkv, double rho_v, uint64_t seed);

#endif /* DEV_GPROJ_VARIANTS_H */
