/*
 * attention/cuda/tile_order.cuh - which tile of which head a CTA of a causal attention grid takes.
 *
 * Why: causal tiles differ in length (a forward query tile q reads q + 1 key tiles; a key-major backward
 * tile k meets T/BQ - k query tiles), and the grids are launched as (tiles, B * NH). The hardware hands
 * CTAs out in linear order, x fastest, so "longest tile first within each head" still leaves long tiles
 * of the last heads for the end of the launch, where they run while the other SMs sit idle. Ranking the
 * linear block id tile-major instead hands out every head's longest tile before any head's second: the
 * longest-processing-time-first schedule, whose tail is one of the shortest tiles.
 *
 * Offers: attn_tile_longest_first() -> {rank, bh}: rank 0 is the longest tile class, bh = b * NH + h.
 * Every CTA still gets exactly one (rank, bh) pair: the map is a bijection of the grid.
 */
#ifndef ATTENTION_TILE_ORDER_CUH
#define ATTENTION_TILE_ORDER_CUH

struct AttnTileOrder {
    int rank; /* 0 = the longest tiles (the kernel turns it into its tile index) */
    int bh;   /* b * NH + h */
};

/* For a grid (tiles, B * NH): gridDim.y = B * NH; the linear id x + y * gridDim.x, ranked tile-major. */
__device__ __forceinline__ AttnTileOrder attn_tile_longest_first() {
    const unsigned long long linear = blockIdx.x + (unsigned long long)blockIdx.y * gridDim.x;
    AttnTileOrder o;
    o.rank = (int)(linear / gridDim.y);
    o.bh = (int)(linear % gridDim.y);
    return o;
}

#endif /* ATTENTION_TILE_ORDER_CUH */
