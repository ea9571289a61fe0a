/*
 * model/param_ranges.h - contiguous ranges of the flat parameter buffer that
 * data parallelism works on: the gradient bucket of a layer, the pieces of a
 * range per ZeRO-1 owner, and the tensors inside an optimizer range.
 *
 * Why: the parameter buffer is laid out tensor by tensor (model/gpt_config.h,
 * llm.c's order: all layers of ln1w, then all layers of ln1b, ...), so a
 * layer's gradients are 12 separate slices, and a ZeRO-1 shard (a plain cut of
 * the flat buffer, train/dist.h) starts and ends in the middle of tensors.
 * The GPU trainer reduces a layer's gradients as soon as backward has
 * finished that layer, sends each slice to the rank(s) whose shard holds it,
 * and runs AdamW on its shard tensor by tensor (weight decay is per tensor).
 * This arithmetic lives here, in plain C, so that tests/test_param_ranges.c
 * checks on the CPU that the buckets cover every parameter exactly once and
 * that no piece crosses a shard boundary.
 *
 * Offers: ParamRange, param_bucket_ranges (bucket of layer l, or
 * PARAM_BUCKET_REST = wte, wpe, lnf), param_split_by_owner, param_opt_pieces.
 */
#ifndef MODEL_PARAM_RANGES_H
#define MODEL_PARAM_RANGES_H

#include <stddef.h>

#include "model/gpt_config.h"

/* [start, end) of the flat buffer; `tag` is the owner rank (param_split_by_owner)
   or the ParamId (param_bucket_ranges, param_opt_pieces). */
typedef struct {
    size_t start, end;
    int tag;
} ParamRange;

/* The bucket that backward finishes last: every tensor that is not per layer.
   wte gets gradient from the output head (first in backward) and from the
   token embedding (last), so it is final only at the very end. */
#define PARAM_BUCKET_REST (-1)
/* At most this many ranges in one bucket (one per tensor). */
#define PARAM_BUCKET_MAX_RANGES NUM_PARAM_TENSORS

/* The slices of layer `layer`'s gradients (every tensor with layers > 1), or
   for PARAM_BUCKET_REST the tensors with layers == 1, in table order.
   Returns how many ranges were written to out[PARAM_BUCKET_MAX_RANGES]. */
static inline int param_bucket_ranges(const ParamTensorInfo table[NUM_PARAM_TENSORS], int layer, ParamRange* out) {
    int n = 0;
    for (int id = 0; id < NUM_PARAM_TENSORS; id++) {
        const ParamTensorInfo* t = &table[id];
        if (t->count == 0) continue; /* not in this config */
        if (layer == PARAM_BUCKET_REST) {
            if (t->layers != 1) continue;
            out[n].start = t->offset;
            out[n].end = t->offset + t->count;
        } else {
            if (t->layers == 1) continue;
            const size_t per = t->count / (size_t)t->layers;
            out[n].start = t->offset + (size_t)layer * per;
            out[n].end = out[n].start + per;
        }
        out[n].tag = id;
        n++;
    }
    return n;
}

/* Cuts [start, end) at ZeRO-1 shard boundaries (shards of shard_size
   elements, rank r owning [r*shard_size, (r+1)*shard_size)): each piece lies
   in one shard and is tagged with its owner. Returns the piece count (at
   most max_out; a range longer than max_out shards is a caller bug). */
static inline int param_split_by_owner(size_t start, size_t end, size_t shard_size, ParamRange* out, int max_out) {
    int n = 0;
    while (start < end && n < max_out) {
        const size_t owner = start / shard_size;
        const size_t owner_end = (owner + 1) * shard_size;
        out[n].start = start;
        out[n].end = owner_end < end ? owner_end : end;
        out[n].tag = (int)owner;
        start = out[n].end;
        n++;
    }
    return n;
}

/* The parts of each tensor inside the optimizer range [lo, hi), in table
   order, tagged with the ParamId (its weight-decay flag applies). Returns the
   count written to out[NUM_PARAM_TENSORS]. */
static inline int param_opt_pieces(const ParamTensorInfo table[NUM_PARAM_TENSORS], size_t lo, size_t hi,
                                   ParamRange* out) {
    int n = 0;
    for (int id = 0; id < NUM_PARAM_TENSORS; id++) {
        const ParamTensorInfo* t = &table[id];
        const size_t a = t->offset > lo ? t->offset : lo;
        const size_t b = t->offset + t->count < hi ? t->offset + t->count : hi;
        if (a >= b) continue;
        out[n].start = a;
        out[n].end = b;
        out[n].tag = id;
        n++;
    }
    return n;
}

#endif /* MODEL_PARAM_RANGES_H */
