/*
 * attention/cpu/attention_ref.c - the fp64 reference of causal softmax attention
 * (forward, backward, softmax statistics), the yardstick every mode is
 * measured against.
 *
 * Why: the question of the project is how far each mode's rounding moves the
 * outputs, so the reference must be exact up to fp64 rounding (~1e-16), far
 * below the BF16 effects of ~1e-3 being measured. It takes the very same
 * (BF16-representable) inputs as the mode under test, as doubles.
 *
 * Formulas (row i sees keys j <= i; s = 1/sqrt(HS)):
 *   S_ij = q_i . k_j,  m_i = max_j S_ij,  P_ij = exp((S_ij - m_i) s) / l_i,
 *   O_i = sum_j P_ij v_j;
 *   dP_ij = dO_i . v_j,  D_i = sum_j P_ij dP_ij  (from P, not from a stored O),
 *   evaluated as D_i = dP_ii + sum_j P_ij (dP_ij - dP_ii): equal in exact
 *   arithmetic (sum_j P_ij = 1), but free of cancellation when all dP_ij
 *   share a large common part (e.g. identical values: then dS is exactly 0),
 *   dS_ij = P_ij (dP_ij - D_i),  dQ_i = s sum_j dS_ij k_j,
 *   dK_j = s sum_i dS_ij q_i,  dV_j = sum_i P_ij dO_i.
 * Loops are plain and row by row (T x T never stored); OpenMP over (b, h).
 * The backward is checked against finite differences of the forward in
 * tests/test_attention_cpu.c.
 */
#include <math.h>
#include <string.h>
#include "attention/attention.h"
#include "common/utils.h"

/* Pointers to head h of token t within the qkv layout. */
static size_t qkv_part(AttnShape s, int b, int t, int part, int h) {
    return ((((size_t)b * s.T + t) * 3 + part) * s.NH + h) * s.HS;
}
static size_t out_at(AttnShape s, int b, int t, int h) { return (((size_t)b * s.T + t) * s.NH + h) * s.HS; }

enum { PART_Q = 0, PART_K = 1, PART_V = 2 };

/* Row i of the softmax: fills P[0..i] (normalised) and returns m_i and l_i. */
static void ref_softmax_row(AttnShape s, const double* qkv, int b, int h, int i, double* P, double* m_out,
                            double* l_out) {
    const double scale = 1.0 / sqrt((double)s.HS);
    const double* q = qkv + qkv_part(s, b, i, PART_Q, h);
    double m = -INFINITY;
    for (int j = 0; j <= i; j++) {
        const double* k = qkv + qkv_part(s, b, j, PART_K, h);
        double acc = 0;
        for (int d = 0; d < s.HS; d++) acc += q[d] * k[d];
        P[j] = acc;
        if (acc > m) m = acc;
    }
    double l = 0;
    for (int j = 0; j <= i; j++) {
        P[j] = exp((P[j] - m) * scale);
        l += P[j];
    }
    for (int j = 0; j <= i; j++) P[j] /= l;
    *m_out = m;
    *l_out = l;
}

void attention_forward_ref(AttnShape s, const double* qkv, double* out) {
    attn_shape_check(s, "attention_forward_ref");
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.NH; h++) {
            double* P = (double*)mallocCheck(sizeof(double) * (size_t)s.T);
            for (int i = 0; i < s.T; i++) {
                double m, l;
                ref_softmax_row(s, qkv, b, h, i, P, &m, &l);
                double* o = out + out_at(s, b, i, h);
                memset(o, 0, sizeof(double) * (size_t)s.HS);
                for (int j = 0; j <= i; j++) {
                    const double* v = qkv + qkv_part(s, b, j, PART_V, h);
                    for (int d = 0; d < s.HS; d++) o[d] += P[j] * v[d];
                }
            }
            free(P);
        }
    }
}

void attention_stats_ref(AttnShape s, const double* qkv, double* stats_ref) {
    attn_shape_check(s, "attention_stats_ref");
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.NH; h++) {
            double* P = (double*)mallocCheck(sizeof(double) * (size_t)s.T);
            for (int i = 0; i < s.T; i++) {
                double* st = stats_ref + (((size_t)b * s.NH + h) * s.T + i) * 2;
                ref_softmax_row(s, qkv, b, h, i, P, &st[0], &st[1]);
            }
            free(P);
        }
    }
}

void attention_backward_ref(AttnShape s, const double* qkv, const double* dout, double* dqkv) {
    attn_shape_check(s, "attention_backward_ref");
    const double scale = 1.0 / sqrt((double)s.HS);
    memset(dqkv, 0, sizeof(double) * attn_qkv_count(s));
#pragma omp parallel for collapse(2) schedule(dynamic)
    for (int b = 0; b < s.B; b++) {
        for (int h = 0; h < s.NH; h++) {
            double* P = (double*)mallocCheck(sizeof(double) * (size_t)s.T);
            double* dS = (double*)mallocCheck(sizeof(double) * (size_t)s.T);
            for (int i = 0; i < s.T; i++) {
                double m, l;
                ref_softmax_row(s, qkv, b, h, i, P, &m, &l);
                const double* q = qkv + qkv_part(s, b, i, PART_Q, h);
                const double* dO = dout + out_at(s, b, i, h);
                for (int j = 0; j <= i; j++) {
                    const double* v = qkv + qkv_part(s, b, j, PART_V, h);
                    double dP = 0;
                    for (int d = 0; d < s.HS; d++) dP += dO[d] * v[d];
                    dS[j] = dP;
                }
                const double pivot = dS[i]; /* dP_ii */
                double D_minus_pivot = 0;
                for (int j = 0; j <= i; j++) D_minus_pivot += P[j] * (dS[j] - pivot);
                double* dq = dqkv + qkv_part(s, b, i, PART_Q, h);
                for (int j = 0; j <= i; j++) {
                    double ds = P[j] * ((dS[j] - pivot) - D_minus_pivot);
                    const double* k = qkv + qkv_part(s, b, j, PART_K, h);
                    double* dk = dqkv + qkv_part(s, b, j, PART_K, h);
                    double* dv = dqkv + qkv_part(s, b, j, PART_V, h);
                    for (int d = 0; d < s.HS; d++) {
                        dq[d] += scale * ds * k[d];
                        dk[d] += scale * ds * q[d];
                        dv[d] += P[j] * dO[d];
                    }
                }
            }
            free(P);
            free(dS);
        }
    }
}
