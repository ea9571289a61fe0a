/*
 * attention/cpu/attention_cpu_rows.h - the per-row building blocks of the CPU
 * emulation (attention_cpu.c), exposed for study tools.
 *
 * Why: a tool that emulates a *variant* of a mode (dev/gproj_variants.c:
 * cheaper forms of gproj) must round exactly where the modes round, with the
 * same dot products, the same softmax recomputation and the same fp32 D. It
 * calls these functions instead of copying them, so a change to the
 * emulation moves the variants with it. They are thin wrappers over the
 * static helpers attention_forward_cpu / attention_backward_cpu use; the
 * inputs are one head's contiguous [T, HS] buffers.
 *
 * Offers: attn_cpu_load_head (one head of qkv or out into [T, HS], rounded to
 * BF16 under ATTN_IO_BF16), the forward numerators and the backward's
 * normalised P of one row, fp32 mode's pivoted D, and the fp32 dot / axpy
 * (order of the dot product free, as on tensor cores; compiled with the
 * emulation's pinned flags).
 */
#ifndef ATTENTION_ATTENTION_CPU_ROWS_H
#define ATTENTION_ATTENTION_CPU_ROWS_H

#include "attention/attention.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Which tensor attn_cpu_load_head reads: the q, k, v parts of qkv, or out/dout. */
typedef enum { ATTN_HEAD_Q = 0, ATTN_HEAD_K = 1, ATTN_HEAD_V = 2, ATTN_HEAD_OUT = 3 } AttnHeadPart;

/* Head (b, h) of src (qkv layout for Q/K/V, out layout for ATTN_HEAD_OUT)
   into dst [T, HS]; rounded to BF16 when io is ATTN_IO_BF16 (as on entry to
   the modes). */
void attn_cpu_load_head(AttnIO io, AttnShape s, const float* src, AttnHeadPart part, int b, int h, float* dst);

/* Row i of the forward (tile-max shift off): S[0..i] = q_i . k_j, e[0..i] the
   mode's softmax numerators; returns the max m the softmax subtracted, *l the
   fp32 sum of e. */
float attn_cpu_forward_numerators_row(AttnMode mode, AttnShape s, const float* Q, const float* K, int i, float* S,
                                      float* e, float* l);

/* Row i of the backward of head (b, h): S[0..i] and the normalised P[0..i]
   the mode recomputes from stats [B, NH, T, 2] (bit-equal to what
   attention_backward_cpu uses). */
void attn_cpu_backward_probs_row(AttnMode mode, AttnShape s, const float* Q, const float* K, const float* stats,
                                 int b, int h, int i, float* S, float* P);

/* fp32 mode's D around the pivot c = dO . O: returns D - c = sum_j P_j (dP_j - c). */
float attn_cpu_pivoted_D_minus_c(const float* P, const float* dP, float c, int n);

/* fp32 dot product (sum order free) and y += w * x, as the emulation computes them. */
float attn_cpu_dot(const float* a, const float* b, int n);
void attn_cpu_axpy(float w, const float* x, float* y, int n);

#ifdef __cplusplus
}
#endif

#endif /* ATTENTION_ATTENTION_CPU_ROWS_H */
