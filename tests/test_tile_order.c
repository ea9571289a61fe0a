/*
 * tests/test_tile_order.c - attention/cuda/tile_order.cuh: the map from a CTA's linear id to its (tile rank,
 * head), on the host (the kernels run the same inline function).
 *
 * Checks, over grids from 1 x 1 to d12's 8 x 384 and section sizes 0, 1, uneven and >= the head count:
 * the map is a bijection of the grid; the heads of a section are consecutive and the sections come in order;
 * inside a section the ranks never decrease (longest first) and each rank lists the section's heads in order;
 * section 0 is the one-section order rank = id / heads, bh = id % heads; the section sizes
 * attn_tile_section_heads picks (d12's 384 heads of T 1024 x HS 64: 48 for K, V; 24 with the dQ accumulator),
 * with their floor of kAttnTileSectionMinHeads, made equal (attn_tile_section_balanced, checked against counting);
 * gproj's HS-64 sections (attn_tile_section_gproj_hs64: 16 heads at T 1024, 8 at 2048, 4 at 4096 and the floor)
 * and the HS-128 forward's (attn_tile_section_fwd_hs128: 16 heads at T 1024, 4 at 4096 and 8192).
 * The forward's work items (attn_query_item) against a count made here row by row: every row of every head in
 * exactly one item, its key tiles those holding a key <= its last row before T, and longest first.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention/cuda/tile_order.cuh"
#include "tests/testing.h"

static void check_grid(int tiles, int heads, int section) {
    const long long n = (long long)tiles * heads;
    char* seen = (char*)calloc((size_t)n, 1);
    const int per = (section <= 0 || section > heads) ? heads : section;
    int bijective = 1, ordered = 1, one_section = 1;
    for (long long id = 0; id < n; id++) {
        const AttnTileOrder o = attn_tile_rank_head((unsigned)id, tiles, heads, section);
        if (o.rank < 0 || o.rank >= tiles || o.bh < 0 || o.bh >= heads || seen[(long long)o.rank * heads + o.bh]) {
            bijective = 0;
            break;
        }
        seen[(long long)o.rank * heads + o.bh] = 1;
        /* where the id must land: section s = bh / per covers ids [s * per * tiles, ...) tile-major */
        const int s = o.bh / per, first = s * per, width = heads - first < per ? heads - first : per;
        const long long want = (long long)first * tiles + (long long)o.rank * width + (o.bh - first);
        if (want != id) ordered = 0;
        if (section == 0 && (o.rank != id / heads || o.bh != id % heads)) one_section = 0;
    }
    CHECK(bijective, "tiles %d heads %d section %d: every (rank, head) exactly once", tiles, heads, section);
    CHECK(ordered, "tiles %d heads %d section %d: sections in order, longest first inside each", tiles, heads,
          section);
    if (section == 0) CHECK(one_section, "tiles %d heads %d: section 0 is rank = id / heads", tiles, heads);
    free(seen);
}

/* Longest first within each section: the items of one section (heads bh / section) come in non-increasing
   length; a new section starts over. */
typedef struct LptCheck {
    int ok, prev_length, prev_section;
} LptCheck;
static void lpt_next(LptCheck* c, int bh, int section, int length) {
    const int sec = section > 0 ? bh / section : 0;
    if (sec != c->prev_section) c->prev_length = 1 << 30, c->prev_section = sec;
    if (length > c->prev_length) c->ok = 0;
    c->prev_length = length;
}

/* the query-major items of a launch (q_tiles x heads, rows per item, key tiles of key_tile) against rows and keys
   counted one by one */
static void check_query_items(int T, int heads, int rows, int key_tile, int section) {
    const int NH = 3, q_tiles = (T + rows - 1) / rows;
    char* covered = (char*)calloc((size_t)heads * (size_t)q_tiles * (size_t)rows, 1);
    int ok = 1;
    LptCheck lpt = {1, 1 << 30, 0};
    for (long long id = 0; id < (long long)q_tiles * heads; id++) {
        const AttnTileOrder o = attn_tile_rank_head((unsigned)id, q_tiles, heads, section);
        const AttnQueryItem it = attn_query_item(o, q_tiles, rows, key_tile, NH, T);
        if (it.bh != o.bh || it.b * NH + it.h != it.bh || it.h < 0 || it.h >= NH || it.q0 % rows != 0) ok = 0;
        for (int r = it.q0; r < it.q0 + rows; r++) {
            if (r < 0 || r >= q_tiles * rows || covered[(size_t)it.bh * q_tiles * rows + r]++) ok = 0;
        }
        int want = 0; /* key tiles with a key <= the last row before T */
        const int last = (it.q0 + rows < T ? it.q0 + rows : T) - 1;
        for (int k0 = 0; k0 <= last; k0 += key_tile) want++;
        if (it.n_key_tiles != want) ok = 0;
        lpt_next(&lpt, o.bh, section, it.n_key_tiles);
    }
    CHECK(ok, "T %d heads %d rows %d key tiles %d section %d: query items cover every row once, their key tiles "
          "counted", T, heads, rows, key_tile, section);
    CHECK(lpt.ok, "T %d heads %d rows %d section %d: query items longest first within each section", T, heads, rows,
          section);
    free(covered);
}

/* A pass's own section rule on a shape, and the size it must pick. */
typedef struct {
    AttnShape s;
    int want;
    const char* what;
} SectionCase;
static void check_sections(const char* pass, int (*rule)(AttnShape), const SectionCase* cases, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const int got = rule(cases[i].s);
        CHECK(got == cases[i].want, "%s, %s: got %d", pass, cases[i].what, got);
    }
}

int main(void) {
    test_section("the map");
    const int tiles[] = {1, 2, 5, 8, 64};
    const int heads[] = {1, 3, 12, 97, 384};
    const int sections[] = {0, 1, 2, 7, 48, 96, 384, 1000};
    for (size_t a = 0; a < sizeof(tiles) / sizeof(tiles[0]); a++)
        for (size_t b = 0; b < sizeof(heads) / sizeof(heads[0]); b++)
            for (size_t c = 0; c < sizeof(sections) / sizeof(sections[0]); c++)
                check_grid(tiles[a], heads[b], sections[c]);
    /* a section of 2 over 5 heads and 3 tiles, written out: heads {0,1} x ranks 0..2, {2,3}, then {4} */
    {
        const int want[15][2] = {{0, 0}, {0, 1}, {1, 0}, {1, 1}, {2, 0}, {2, 1}, {0, 2}, {0, 3},
                                 {1, 2}, {1, 3}, {2, 2}, {2, 3}, {0, 4}, {1, 4}, {2, 4}};
        int ok = 1;
        for (int id = 0; id < 15; id++) {
            const AttnTileOrder o = attn_tile_rank_head((unsigned)id, 3, 5, 2);
            if (o.rank != want[id][0] || o.bh != want[id][1]) ok = 0;
        }
        CHECK(ok, "3 tiles x 5 heads in sections of 2: the order written out");
    }
    /* large grids: the 32-bit ids up to the bound attention_cuda_check_shape keeps (tiles x heads < 2^32) */
    {
        AttnTileOrder o = attn_tile_rank_head(65535u * 4096u - 1u, 4096, 65535, 100);
        CHECK(o.rank == 4095 && o.bh == 65534, "the last id of a 4096 x 65535 grid: rank %d bh %d", o.rank, o.bh);
        o = attn_tile_rank_head(65536u * 65535u - 1u, 65536, 65535, 100); /* 2^32 - 65537 */
        CHECK(o.rank == 65535 && o.bh == 65534, "the last id of a 65536 x 65535 grid: rank %d bh %d", o.rank, o.bh);
        o = attn_tile_rank_head(65536u * 65535u - 1u, 65536, 65535, 0);
        CHECK(o.rank == 65535 && o.bh == 65534, "the same, one section: rank %d bh %d", o.rank, o.bh);
        o = attn_tile_rank_head(65536u * 100u * 2u + 3u * 100u + 7u, 65536, 65535, 100); /* section 2, rank 3 */
        CHECK(o.rank == 3 && o.bh == 207, "an id in the third section of 100 heads: rank %d bh %d (want 3, 207)",
              o.rank, o.bh);
    }

    test_section("the work items");
    const int item_T[] = {1, 63, 64, 65, 127, 128, 129, 191, 192, 193, 1000, 1024, 2049};
    for (size_t a = 0; a < sizeof(item_T) / sizeof(item_T[0]); a++)
        for (int section = 0; section <= 2; section++) {
            check_query_items(item_T[a], 6, 128, 128, section); /* the forward at HS 128 */
            check_query_items(item_T[a], 6, 192, 128, section); /* the forward at HS 64 */
        }

    test_section("the section sizes");
    unsetenv("ATTN_TILE_SECTION_HEADS");
    const long long budget = kAttnTileSectionBytes;
    int n = attn_tile_section_heads(1024, 64, kTileSectionKV, 384);
    CHECK(n == (int)(budget / (1024LL * 64 * 4)) && 384 % n == 0, "d12 K, V: %d heads per section, 384 in equal ones",
          n);
    n = attn_tile_section_heads(1024, 64, kTileSectionQdOdQ, 384);
    CHECK(n == (int)(budget / (1024LL * 64 * 8)) && 384 % n == 0, "d12 Q, dO, dQ: %d heads per section", n);
    /* d24's 256 heads: 48 fit with K, V, so 6 sections (5 x 48 + 16), made equal: 43 */
    n = attn_tile_section_heads(1024, 64, kTileSectionKV, 256);
    CHECK(budget / (1024LL * 64 * 4) == 48 && n == 43, "d24 K, V: 6 sections of 43, got %d", n);
    n = attn_tile_section_heads(1024, 64, kTileSectionKV, 16);
    CHECK(n == 0, "16 heads that fit: one section (0), got %d", n);
    /* 6 heads' bytes fit under the floor of 24: two sections of the 32 heads, made equal: 16 */
    n = attn_tile_section_heads(4096, 128, kTileSectionQdOdQ, 32);
    CHECK(kAttnTileSectionMinHeads == 24 && n == 16, "B2 H16 T4096 D128 key-major: the floor's 2 sections, equal: %d",
          n);
    n = attn_tile_section_heads(1 << 20, 128, kTileSectionQdOdQ, 8);
    CHECK(n == 0, "8 heads, each larger than the budget: fewer than the floor, one section, got %d", n);
    /* 100 heads at the floor of 24: 5 sections, made equal: 20 */
    n = attn_tile_section_heads(1 << 20, 128, kTileSectionQdOdQ, 100);
    CHECK(n == 20, "100 heads larger than the budget: the floor's 5 sections, equal: 20, got %d", n);

    /* gproj's HS-64 backward passes: 4 MiB of K, V (or Q, dO) per section, at least 4 heads */
    const SectionCase gproj[] = {
        {{32, 12, 1024, 64}, 16, "d12's 384 heads at T 1024: sections of 16"},
        {{16, 16, 1024, 64}, 16, "450m's 256 heads at T 1024: sections of 16"},
        {{4, 16, 2048, 64}, 8, "64 heads at T 2048: sections of 8"},
        {{2, 16, 4096, 64}, 4, "32 heads at T 4096: sections of 4"},
        {{1, 16, 65536, 64}, 4, "heads larger than the budget: the floor of 4"},
        {{2, 20, 1024, 64}, 14, "40 heads at T 1024: 3 sections of 16 made equal, 14"},
        {{1, 12, 1024, 64}, 0, "12 heads that fit: one section (0)"},
    };
    check_sections("gproj's HS-64 passes", attn_tile_section_gproj_hs64, gproj, sizeof(gproj) / sizeof(gproj[0]));
    /* the Hopper forward at HS 128: 8 MiB of K, V per section, at least 4 heads */
    const SectionCase fwd128[] = {
        {{8, 8, 1024, 128}, 16, "64 heads at T 1024: sections of 16"},
        {{2, 16, 4096, 128}, 4, "32 heads at T 4096: sections of 4"},
        {{1, 16, 8192, 128}, 4, "16 heads at T 8192: the floor of 4"},
        {{2, 5, 1024, 128}, 0, "10 heads that fit: one section (0)"},
    };
    check_sections("the forward at HS 128", attn_tile_section_fwd_hs128, fwd128, sizeof(fwd128) / sizeof(fwd128[0]));

    test_section("sections of equal size");
    /* against the definition, by counting: as many sections as the plain size gives, and the smallest size that
       does (one head fewer per section would take another section); one check per head count, naming the first
       section size that fails */
    for (int heads = 1; heads <= 400; heads++) {
        int bad_section = -1, bad_b = 0;
        for (int section = 0; section <= heads + 1 && bad_section < 0; section++) {
            const int b = attn_tile_section_balanced(section, heads);
            int ok;
            if (section <= 0 || section >= heads) {
                ok = b == 0; /* one section stays one (0) */
            } else {
                int count = 0, count_b = 0, count_smaller = 0;
                for (int first = 0; first < heads; first += section) count++;
                for (int first = 0; first < heads && b > 0; first += b) count_b++;
                if (b > 1)
                    for (int first = 0; first < heads; first += b - 1) count_smaller++;
                ok = b > 0 && b <= section && count_b == count && (b == 1 || count_smaller > count);
            }
            if (!ok) bad_section = section, bad_b = b;
        }
        CHECK(bad_section < 0, "%d heads: sections of %d made equal give %d", heads, bad_section, bad_b);
    }
    CHECK(attn_tile_section_balanced(48, 256) == 43, "d24's 256 heads in sections of 48 (5 + 16): 6 of 43, got %d",
          attn_tile_section_balanced(48, 256));
    CHECK(attn_tile_section_balanced(96, 384) == 96, "d12's 384 heads in sections of 96: already equal, got %d",
          attn_tile_section_balanced(96, 384));
    return test_summary();
}
