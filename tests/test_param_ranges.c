/*
 * tests/test_param_ranges.c - CPU tests of model/param_ranges.h, the range
 * arithmetic of data-parallel training: the per-layer gradient buckets plus
 * the rest bucket tile the parameter buffer exactly once; splitting a range
 * at ZeRO-1 shard boundaries gives pieces that each lie in their owner's
 * shard and tile the range; the optimizer pieces of every rank's shard tile
 * the shard and stay inside their tensor, and over all ranks tile the buffer.
 * Checked for the real presets (up to 450m) and world sizes 1..8, against
 * the shards of train/dist.h's zero_shard (alignment 128, as train_gpt uses,
 * and 1).
 */
#include <stdlib.h>
#include <string.h>

#include "model/gpt_config.h"
#include "model/param_ranges.h"
#include "tests/testing.h"
#include "train/dist.h"

static int by_start(const void* a, const void* b) {
    const ParamRange *x = (const ParamRange*)a, *y = (const ParamRange*)b;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* Do ranges[0..n) (any order) tile [lo, hi) exactly (no gap, no overlap, none empty)? */
static int tiles(ParamRange* ranges, int n, size_t lo, size_t hi) {
    qsort(ranges, (size_t)n, sizeof *ranges, by_start);
    size_t at = lo;
    for (int i = 0; i < n; i++) {
        if (ranges[i].start != at || ranges[i].end <= ranges[i].start) return 0;
        at = ranges[i].end;
    }
    return at == hi;
}

/* name: a preset; qk_norm, tie: the options set on it (-1 keeps the preset's). The buckets hold the tensors
   the config has: a layer's are the per-layer ones (with QK-norm the gains too), the rest the others. */
static void test_buckets(const char* name, int qk_norm, int tie) {
    GPTConfig cfg;
    char err[256];
    if (gpt_config_from_descriptor(name, &cfg, err, sizeof err) != 0) {
        CHECK(0, "preset %s: %s", name, err);
        return;
    }
    if (qk_norm >= 0) cfg.qk_norm = qk_norm;
    if (tie >= 0) cfg.tie_embeddings = tie;
    ParamTensorInfo table[NUM_PARAM_TENSORS];
    const size_t P = gpt_param_table(&cfg, table);
    const int L = cfg.num_layers;
    /* what the buckets must hold, from the table (GPT-2: 12 per layer; wte, wpe, lnfw, lnfb) */
    int want_layer = 0, expect_rest[NUM_PARAM_TENSORS], want_rest = 0;
    for (int id = 0; id < NUM_PARAM_TENSORS; id++) {
        if (table[id].count == 0) continue;
        const int per_layer = (id >= P_LN1W && id <= P_FCPROJB) || id == P_QNORMW || id == P_KNORMW;
        if (per_layer) want_layer++;
        else expect_rest[want_rest++] = id;
    }
    ParamRange* all = (ParamRange*)malloc(sizeof(ParamRange) * (size_t)(L + 1) * PARAM_BUCKET_MAX_RANGES);
    int n = 0, layer_counts_ok = 1, in_layer_ok = 1;
    for (int l = L - 1; l >= 0; l--) { /* backward order */
        const int k = param_bucket_ranges(table, l, all + n);
        layer_counts_ok &= k == want_layer;
        for (int i = 0; i < k; i++) {
            const ParamTensorInfo* t = &table[all[n + i].tag];
            const size_t per = t->count / (size_t)t->layers;
            in_layer_ok &= t->layers == L && all[n + i].start == t->offset + (size_t)l * per &&
                           all[n + i].end - all[n + i].start == per;
        }
        n += k;
    }
    const int k_rest = param_bucket_ranges(table, PARAM_BUCKET_REST, all + n);
    int rest_ids_ok = k_rest == want_rest;
    for (int i = 0; i < k_rest && i < want_rest; i++) rest_ids_ok &= all[n + i].tag == expect_rest[i];
    n += k_rest;
    CHECK(layer_counts_ok, "%s: each layer bucket has the %d per-layer tensors", name, want_layer);
    CHECK(in_layer_ok, "%s: each slice of layer l is that layer's part of its tensor", name);
    CHECK(rest_ids_ok, "%s: the rest bucket is the %d other tensors, in table order", name, want_rest);
    if (gpt_config_is_gpt2(&cfg))
        CHECK(want_layer == 12 && want_rest == 4 && expect_rest[0] == P_WTE && expect_rest[1] == P_WPE &&
                  expect_rest[2] == P_LNFW && expect_rest[3] == P_LNFB,
              "%s: GPT-2's buckets: the 12 per-layer tensors; wte, wpe, lnfw, lnfb", name);
    CHECK(tiles(all, n, 0, P), "%s: %d layer buckets + rest tile all %zu parameters exactly once", name, L, P);
    free(all);

    const int worlds[] = {1, 2, 3, 4, 8};
    const size_t aligns[] = {128, 1};
    for (size_t wi = 0; wi < sizeof worlds / sizeof worlds[0]; wi++) {
        for (size_t ai = 0; ai < sizeof aligns / sizeof aligns[0]; ai++) {
            const int W = worlds[wi];
            const ZeroShard z0 = zero_shard(P, W, 0, aligns[ai]);
            const size_t S = z0.shard_size;
            /* every bucket range, split by owner: pieces inside the owner's shard, tiling the range */
            int split_ok = 1;
            ParamRange bucket[PARAM_BUCKET_MAX_RANGES], pieces[64];
            for (int l = PARAM_BUCKET_REST; l < L; l++) {
                const int k = param_bucket_ranges(table, l, bucket);
                for (int i = 0; i < k; i++) {
                    const int np = param_split_by_owner(bucket[i].start, bucket[i].end, S, pieces, 64);
                    for (int j = 0; j < np; j++)
                        split_ok &= pieces[j].tag >= 0 && pieces[j].tag < W &&
                                    pieces[j].start >= (size_t)pieces[j].tag * S &&
                                    pieces[j].end <= (size_t)(pieces[j].tag + 1) * S &&
                                    (j == 0 || pieces[j].tag == pieces[j - 1].tag + 1);
                    split_ok &= tiles(pieces, np, bucket[i].start, bucket[i].end);
                }
            }
            CHECK(split_ok, "%s, %d ranks, align %zu: bucket pieces lie in their owner's shard and tile the bucket",
                  name, W, aligns[ai]);
            /* optimizer pieces of each rank: inside their tensor, tiling the valid part of the shard */
            ParamRange* over_ranks = (ParamRange*)malloc(sizeof(ParamRange) * (size_t)W * NUM_PARAM_TENSORS);
            int total = 0, opt_ok = 1;
            for (int r = 0; r < W; r++) {
                const ZeroShard z = zero_shard(P, W, r, aligns[ai]);
                ParamRange* mine = over_ranks + total;
                const int k = param_opt_pieces(table, z.offset, z.offset + z.valid, mine);
                for (int i = 0; i < k; i++) {
                    const ParamTensorInfo* t = &table[mine[i].tag];
                    opt_ok &= mine[i].start >= t->offset && mine[i].end <= t->offset + t->count;
                }
                ParamRange copy[NUM_PARAM_TENSORS];
                memcpy(copy, mine, sizeof(ParamRange) * (size_t)k);
                opt_ok &= z.valid == 0 ? k == 0 : tiles(copy, k, z.offset, z.offset + z.valid);
                total += k;
            }
            CHECK(opt_ok, "%s, %d ranks, align %zu: optimizer pieces stay in their tensor and tile each shard", name,
                  W, aligns[ai]);
            CHECK(tiles(over_ranks, total, 0, P), "%s, %d ranks, align %zu: the shards' optimizer pieces tile all "
                  "parameters", name, W, aligns[ai]);
            free(over_ranks);
        }
    }
}

static void test_split_edges(void) {
    test_section("splitting at shard boundaries: edge cases");
    ParamRange p[8];
    int n = param_split_by_owner(10, 10, 4, p, 8);
    CHECK(n == 0, "an empty range gives no pieces (%d)", n);
    n = param_split_by_owner(4, 8, 4, p, 8);
    CHECK(n == 1 && p[0].tag == 1 && p[0].start == 4 && p[0].end == 8, "a range equal to shard 1 is one piece");
    n = param_split_by_owner(3, 13, 4, p, 8);
    CHECK(n == 4 && p[0].tag == 0 && p[0].end == 4 && p[3].tag == 3 && p[3].start == 12 && p[3].end == 13,
          "[3, 13) over shards of 4: owners 0..3, cut at 4, 8, 12 (%d pieces)", n);
    n = param_split_by_owner(0, 100, 4, p, 3);
    CHECK(n == 3 && p[2].end == 12, "max_out stops the split (the caller continues from the last end)");
}

int main(void) {
    const char* presets[] = {"tiny", "small", "d12", "d24", "450m", "llama-small", "llama-d12"};
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        test_section(presets[i]);
        test_buckets(presets[i], -1, -1);
    }
    /* the options' tensors: QK-norm gains per layer (ln1w .. fcprojw and qnormw, knormw: 9 with llama's
       options), an untied lm_head in the rest bucket */
    test_section("llama-small --qk-norm 1 --tie-embeddings 0");
    test_buckets("llama-small", 1, 0);
    test_section("small --qk-norm 1 --tie-embeddings 0");
    test_buckets("small", 1, 0);
    test_split_edges();
    return test_summary();
}
