/*
 * attention/cuda/hopper/hopper_work_queue.cuh - which work item a CTA of a persistent launch takes next.
 *
 * Why: causal work items differ in length (an item of the last query rows reads every key tile, one of the
 * first rows reads one), and a persistent launch (one CTA per SM) that walks a fixed stride of the
 * longest-first list gives some CTAs the longest item of round after round: at T 1024 over d12's 384 heads
 * its busiest CTA gets 6% more key tiles than the mean, at T 8192 13% (docs/attention_kernels.md, design
 * table). A CTA that takes its next item from a shared counter when it is ready for one runs the
 * longest-processing-time-first schedule that the hardware gives a launch of one CTA per item.
 *
 * Offers (device code, one counter pair per translation unit's pass: the including file declares it,
 * zero-initialised, as a __device__ HopperWorkQueue):
 *   work_queue_next(q, n_items) -> the next item, gridDim.x + the count taken so far (items below gridDim.x
 *       are the CTAs' first, blockIdx.x each), or n_items once none is left;
 *   work_queue_finish(q): the calling CTA takes no more; the last CTA to call it zeroes both counters, so the
 *       next launch starts from item gridDim.x again.
 * Both are called by one thread of the CTA (its producer). A launch of one CTA per item takes its items
 * from blockIdx.x alone and does not touch the counters. Launches that share a counter pair must not overlap:
 * the passes of one translation unit run one after another on a stream, and a launch that waits for the
 * previous grid (launch_overlap.cuh) calls work_queue_next only after that wait.
 */
#ifndef ATTENTION_CUDA_HOPPER_HOPPER_WORK_QUEUE_CUH
#define ATTENTION_CUDA_HOPPER_HOPPER_WORK_QUEUE_CUH

struct HopperWorkQueue {
    unsigned taken;    /* items handed out past the CTAs' first */
    unsigned finished; /* CTAs that take no more */
};

__device__ __forceinline__ unsigned work_queue_next(HopperWorkQueue* q, unsigned n_items) {
    const unsigned w = gridDim.x + atomicAdd(&q->taken, 1u);
    return w < n_items ? w : n_items;
}

__device__ __forceinline__ void work_queue_finish(HopperWorkQueue* q) {
    __threadfence(); /* this CTA's last atomicAdd on `taken`, before it counts as finished */
    if (atomicAdd(&q->finished, 1u) == gridDim.x - 1u) {
        __threadfence(); /* every CTA has taken its last item: the counters are free */
        q->taken = 0;
        q->finished = 0;
    }
}

#endif /* ATTENTION_CUDA_HOPPER_HOPPER_WORK_QUEUE_CUH */
