/*
 * attention/cuda/tile_order.cuh - which tile of which head a CTA of a causal attention grid takes.
 *
 * Why: causal tiles differ in length (a forward query tile q reads q + 1 key tiles; a key-major backward
 * tile k meets T/BQ - k query tiles), and the grids are launched as (tiles, B * NH). The hardware hands
 * CTAs out in linear order, x fastest, so "longest tile first within each head" leaves long tiles of the
 * last heads for the end of the launch, where they run while the other SMs sit idle. Ranking the linear
 * block id tile-major hands out every head's longest tile before any head's second: the
 * longest-processing-time-first (LPT) schedule, whose tail is one of the shortest tiles.
 *
 * Over all heads at once, though, the CTAs that share a head's data (a forward's K and V, a key-major
 * pass's Q, dO and dQ accumulator) run B * NH CTAs apart: at d12's 384 heads the data in flight between
 * two uses is several times the 50 MB L2, and every tile reads its head from HBM again. So the heads are
 * taken in sections: LPT over the heads of one section, section after section. A section holds as many
 * heads as fit a share of the L2 (attn_tile_section_heads), all sections of one size (a last section of a few
 * heads would end the launch with few short tiles beside its long ones); the tail of one section overlaps the
 * longest tiles of the next, so only the last section's tail is the launch's.
 *
 * Offers:
 *   attn_tile_rank_head(linear, tiles, heads, section) -> {rank, bh}: the map itself, on host and device
 *       (tests check that it is a bijection of the grid and LPT within each section), in 32-bit arithmetic: a
 *       launch keeps tiles * heads below 2^32 (attention_cuda_check_shape);
 *   attn_tile_longest_first(section) -> {rank, bh} of this CTA: rank 0 is the longest tile class,
 *       bh = b * NH + h; gridDim = (tiles, B * NH);
 *   attn_tile_section(shape, bytes_per_elem) (host): a launch's section, attn_tile_section_heads(T, HS,
 *       bytes_per_elem, B * NH);
 *   attn_query_item(order, q_tiles, rows, key_tile, NH, T): what the work item of a (rank, bh) covers in a
 *       query-major pass (the forward: rows q0.. and the key tiles up to its last row before T);
 *   attn_tile_section_balanced(section, heads) (host): the same number of sections, of equal size;
 *   attn_tile_section_heads(T, HS, bytes_per_elem, heads) (host): the heads whose
 *       T x HS x bytes_per_elem shared bytes fit kAttnTileSectionBytes, at least kAttnTileSectionMinHeads,
 *       in sections made equal;
 *       ATTN_TILE_SECTION_HEADS=N in the environment sets N instead (0: one section over all heads, for
 *       A/B timing);
 *   attn_tile_section_gproj_hs64(shape) (host): the section of gproj's two HS-64 backward passes, the same rule
 *       on a smaller budget (kAttnGprojSectionBytes);
 *   attn_tile_section_fwd_hs128(shape) (host): the section of the Hopper forward at head size 128, the same rule
 *       on its own budget and floor (kAttnFwd128SectionBytes).
 */
#ifndef ATTENTION_TILE_ORDER_CUH
#define ATTENTION_TILE_ORDER_CUH

#include <stdlib.h>

#include "attention/attention.h"

#if defined(__CUDACC__)
#define ATTN_TILE_HD __host__ __device__ __forceinline__
#else
#define ATTN_TILE_HD static inline
#endif

typedef struct AttnTileOrder {
    int rank; /* 0 = the longest tiles (the kernel turns it into its tile index) */
    int bh;   /* b * NH + h */
} AttnTileOrder;

/* The part of the L2 (50 MB on H100 and H200) a section's shared data may take: the rest holds the
   streamed tiles and the other operands of the step. 12 MiB with equal sections against 24 MiB with a remainder
   section: the forward 3.0-3.5% and the backward 1.0-2.5% faster at d12's grid, the backward 1.4-3.0% at d24's,
   the forward 0.7-1.5% slower at B8 H16 T1024 and B4 H16 T2048 d64
   (dev/results/attention_sections_12mib_2026-12-05.md). And the fewest
   heads a section holds before it is made equal: on the H200, sections of 3-6 heads slowed the HS-128
   key-major pass by 12-16% at T 4096-8192 against one section, while 24 heads cost nothing there
   (dev/results/attention_tile_order_2026-12-02.md); a launch of fewer heads runs as one section. */
enum { kAttnTileSectionBytes = 12 << 20, kAttnTileSectionMinHeads = 24 };

/* gproj's HS-64 backward passes, its row pass (K, V shared) and its key-major pass (Q, dO shared), take sections
   of 4 MiB of shared data, at least 4 heads: 16 heads at T 1024, 8 at T 2048, 4 at T 4096. Against the 12 MiB rule
   (43-48 heads at T 1024, 22 at T 2048, 16 at T 4096) gproj's backward was 2.7-3.7% faster at B8 H16, B16 H16 and
   B32 H12 T1024 and 2.3% at B4 H16 T2048, every round below every round of the rule (four alternating rounds),
   and 4.0-5.1% at B2 H16 T4096 with 4-head sections in every pass; 16 heads at T 2048 and 8 at T 4096 were
   slower, the forward was slower with sections this small and bf16's key-major pass no faster
   (dev/results/attention_sections_per_pass_2026-12-05.md). */
enum { kAttnGprojSectionBytes = 4 << 20, kAttnGprojSectionMinHeads = 4 };

/* The Hopper forward at HS 128 takes sections of 8 MiB of K and V, at least 4 heads: 16 heads at T 1024, 4 at
   T 4096 and 8192. Against the 12 MiB rule with its 24-head floor (22 heads at B8 H8 T1024, 16 at B2 H16 T4096, one
   section of 16 at B1 H16 T8192) the forward was 1.3-2.4% faster at those three shapes, bf16 and gproj, in a
   same-build A/B (four of the six with every round below); two sweeps before it agreed (3.3-4.1% at B8 H8 T1024,
   1.1-2.3% at T 8192, 0.8-0.9% for bf16 at T 4096), and put 8 heads at T 1024 2.5-3.6% slower. The fwd+bwd pair
   moved -1.2% to +0.1%, within its spread. The floor of 24 stays for the HS-128 backward, where 3-6-head sections
   cost 12-16% on an H200 (dev/results/attention_sections_per_pass_2026-12-05.md). */
enum { kAttnFwd128SectionBytes = 8 << 20, kAttnFwd128SectionMinHeads = 4 };

/* Bytes per (token, head column) that a launch's CTAs of one head share: K and V (the forward, the row pass);
   Q and dO (gproj's key-major pass); Q, dO and the FP32 dQ accumulator (the key-major passes that send dQ). */
enum { kTileSectionKV = 4, kTileSectionQdO = 4, kTileSectionQdOdQ = 8 };

/* linear in [0, tiles * heads) -> its (rank, bh). Sections of `section` heads (0 or >= heads: one section);
   inside a section of n heads the ids go tile-major: n CTAs of rank 0, then n of rank 1, ...; the last
   section holds the heads left over. Unsigned 32-bit: every CTA of a launch runs this before its first copy,
   and a 64-bit division is a sequence of about a hundred machine instructions where the 32-bit one is a few. */
ATTN_TILE_HD AttnTileOrder attn_tile_rank_head(unsigned linear, int tiles, int heads, int section) {
    const unsigned per = (section <= 0 || section > heads) ? (unsigned)heads : (unsigned)section;
    const unsigned span = (unsigned)tiles * per;
    const unsigned s = linear / span;
    const unsigned first = s * per;
    const unsigned n = (unsigned)heads - first < per ? (unsigned)heads - first : per;
    const unsigned local = linear - s * span;
    AttnTileOrder o;
    o.rank = (int)(local / n);
    o.bh = (int)(first + local % n);
    return o;
}

/* A query-major work item: rows q0 .. q0 + rows - 1 of head bh = b * NH + h (rank 0: the last rows, which see
   the most keys), and its key tiles of key_tile keys, 0 .. n_key_tiles - 1: up to the one holding its last row
   before T (causal). */
typedef struct AttnQueryItem {
    int q0, bh, b, h, n_key_tiles;
} AttnQueryItem;
ATTN_TILE_HD AttnQueryItem attn_query_item(AttnTileOrder o, int q_tiles, int rows, int key_tile, int NH, int T) {
    AttnQueryItem it;
    it.q0 = (q_tiles - 1 - o.rank) * rows;
    it.bh = o.bh;
    it.b = o.bh / NH;
    it.h = o.bh % NH;
    const int last = (it.q0 + rows < T ? it.q0 + rows : T) - 1;
    it.n_key_tiles = last / key_tile + 1;
    return it;
}
#if defined(__CUDACC__)
/* For a grid (tiles, B * NH): the linear id x + y * gridDim.x through attn_tile_rank_head. */
__device__ __forceinline__ AttnTileOrder attn_tile_longest_first(int section) {
    const unsigned linear = blockIdx.x + blockIdx.y * gridDim.x;
    return attn_tile_rank_head(linear, (int)gridDim.x, (int)gridDim.y, section);
}
#endif

/* Sections of `section` heads over `heads` heads made equal: the same number of sections, count, of the
   smallest size that keeps it, ceil(heads / count), so the last is at most count - 1 heads short of the others
   instead of holding the remainder. 0 (one section) stays 0. */
static inline int attn_tile_section_balanced(int section, int heads) {
    if (section <= 0 || section >= heads) return 0;
    const int count = (heads + section - 1) / section;
    return (heads + count - 1) / count;
}

/* The section of a launch over `heads` heads whose CTAs share T x HS x bytes_per_elem bytes of each head
   (forward and row pass: K, V = 4; key-major passes: Q, dO = 4, + 4 for an FP32 dQ accumulator): as many heads as
   fit `budget` bytes, at least `min_heads`, then the sections made equal (attn_tile_section_balanced), so none is
   a remainder of a few heads. ATTN_TILE_SECTION_HEADS, when set, overrides every rule built on it.
   attn_tile_section_heads is the general rule (kAttnTileSectionBytes, kAttnTileSectionMinHeads). */
static inline int attn_tile_section_heads_within(int T, int HS, int bytes_per_elem, int heads, long long budget,
                                                 int min_heads) {
    static int env = -2; /* -1: unset; a race between host threads writes the same answer twice */
    if (env == -2) {
        const char* v = getenv("ATTN_TILE_SECTION_HEADS");
        env = (v != NULL && v[0] >= '0' && v[0] <= '9') ? atoi(v) : -1;
    }
    if (env >= 0) return env;
    const long long per_head = (long long)T * HS * bytes_per_elem;
    long long n = per_head > 0 ? budget / per_head : heads;
    if (n < min_heads) n = min_heads;
    return n >= heads ? 0 : attn_tile_section_balanced((int)n, heads);
}
static inline int attn_tile_section_heads(int T, int HS, int bytes_per_elem, int heads) {
    return attn_tile_section_heads_within(T, HS, bytes_per_elem, heads, kAttnTileSectionBytes,
                                          kAttnTileSectionMinHeads);
}

/* The section of a launch on shape s (B * NH heads of T x HS), what every kernel launch passes. */
static inline int attn_tile_section(AttnShape s, int bytes_per_elem) {
    return attn_tile_section_heads(s.T, s.HS, bytes_per_elem, s.B * s.NH);
}
/* The section of the Hopper forward at HS 128 on shape s (4 bytes per token-column: K, V). */
static inline int attn_tile_section_fwd_hs128(AttnShape s) {
    return attn_tile_section_heads_within(s.T, s.HS, kTileSectionKV, s.B * s.NH, kAttnFwd128SectionBytes,
                                          kAttnFwd128SectionMinHeads);
}
/* The section of gproj's HS-64 row pass and key-major pass on shape s (4 bytes per token-column: K, V or Q, dO). */
static inline int attn_tile_section_gproj_hs64(AttnShape s) {
    return attn_tile_section_heads_within(s.T, s.HS, kTileSectionKV, s.B * s.NH, kAttnGprojSectionBytes,
                                          kAttnGprojSectionMinHeads);
}

#endif /* ATTENTION_TILE_ORDER_CUH */
