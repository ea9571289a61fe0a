/*
 * model/rope_table.h - the rotary position table (--pos rope): cos and sin of
 * every (position, frequency) pair, built on the host.
 *
 * Why: the CPU reference and the GPU kernels must rotate by the same angles
 * to the last bit, so both read one table made by this one function instead
 * of each evaluating cos/sin in its own precision. Contract (rotate-half
 * convention of HF Llama / GPT-NeoX), for head size HS (even) and
 * i in [0, HS/2):
 *   inv_freq_i = (float) base^(-2i/HS)          (double, rounded once)
 *   angle      = (float)t * inv_freq_i          (an FP32 product)
 *   table[t][i] = { (float)cos(angle), (float)sin(angle) }  (double, rounded once)
 * Plain C (no CUDA), so model/gpt_cpu.c may include it as well as rope.cuh.
 *
 * Offers: RopeCosSin, rope_table_entries, rope_table_fill.
 */
#ifndef MODEL_ROPE_TABLE_H
#define MODEL_ROPE_TABLE_H

#include <math.h>
#include <stddef.h>

/* One table entry: the rotation of pair i at position t. */
typedef struct {
    float cos, sin;
} RopeCosSin;

/* Entries of the table for positions [0, T) and head size HS: T * HS/2. */
static inline size_t rope_table_entries(int T, int HS) { return (size_t)T * (size_t)(HS / 2); }

/* table[t * HS/2 + i] for t in [0, T), i in [0, HS/2), as the contract above. */
static inline void rope_table_fill(RopeCosSin* table, int T, int HS, double base) {
    const int half = HS / 2;
    for (int i = 0; i < half; i++) {
        const float inv_freq = (float)pow(base, -2.0 * i / HS);
        for (int t = 0; t < T; t++) {
            const float angle = (float)t * inv_freq;
            table[(size_t)t * half + i].cos = (float)cos((double)angle);
            table[(size_t)t * half + i].sin = (float)sin((double)angle);
        }
    }
}

#endif /* MODEL_ROPE_TABLE_H */
