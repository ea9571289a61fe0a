/*
 * model/encoder.cuh - token + position embedding, forward and backward.
 *
 * Why: the first layer of GPT-2: out[b,t,:] = wte[token[b,t],:] + wpe[t,:]
 * (wte alone for a model with rotary positions, which has no wpe).
 * Its backward is where llm.c-style trainers usually reach for atomics
 * (many positions hit the same wte row), which makes runs irreproducible.
 * Here the backward is deterministic without sorting on the GPU: the host,
 * which holds the token ids anyway, groups positions by token with a
 * counting sort (EncoderBuckets), and one CUDA block owns one token's wte
 * row, summing its positions in a fixed order. wpe rows are owned by one
 * thread per (t, channel chunk), summing over the batch in order.
 *
 * Offers: encoder_forward, EncoderBuckets (+ encoder_buckets_init/build/free,
 * encoder_buckets_sort: the host counting sort alone),
 * encoder_backward (accumulates into dwte and dwpe).
 */
#ifndef MODEL_ENCODER_CUH
#define MODEL_ENCODER_CUH

#include "model/kernel_common.cuh"

/* One thread writes 8 channels of one (b, t). C % 8 == 0. WPE 0: the token embedding alone (--pos rope,
   which has no wpe); the WPE 1 body is the learned-position model's. */
template <int WPE>
__global__ void encoder_forward_kernel(floatX* out, const int* tokens, const floatX* wte, const floatX* wpe,
                                       int BT, int T, int C) {
    const long long idx = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (idx >= (long long)BT * C) return;
    const int bt = (int)(idx / C), c = (int)(idx % C), t = bt % T;
    const Pack8 w = load_pack8(wte + (long long)tokens[bt] * C + c);
    if constexpr (WPE) {
        const Pack8 p = load_pack8(wpe + (long long)t * C + c);
        Pack8 o;
#pragma unroll
        for (int k = 0; k < 8; k++) o.v[k] = from_float(to_float(w.v[k]) + to_float(p.v[k]));
        store_pack8(out + idx, o);
    } else {
        (void)t;
        store_pack8(out + idx, w);
    }
}

/* out = wte[token] + wpe[t]; wpe NULL (a model without learned positions): out = wte[token]. */
static void encoder_forward(floatX* out, const int* tokens_dev, const floatX* wte, const floatX* wpe,
                            int B, int T, int C, cudaStream_t stream) {
    const int block = 256;
    const long long work = (long long)B * T * C / 8;
    if (wpe)
        encoder_forward_kernel<1><<<ceil_div(work, block), block, 0, stream>>>(out, tokens_dev, wte, wpe, B * T, T, C);
    else
        encoder_forward_kernel<0><<<ceil_div(work, block), block, 0, stream>>>(out, tokens_dev, wte, wpe, B * T, T, C);
    cudaCheckLastError();
}

/*
 * Positions grouped by token: token bucket_token[k] occurs at the positions
 * bucket_positions[bucket_start[k] .. bucket_start[k+1]) (ascending, so the
 * summation order is fixed). Built on the host per micro-batch; the device
 * copies live in one allocation sized for B*T positions.
 */
typedef struct {
    int num_buckets;
    int* host;          /* [3 * BT + 2]: start[num+1] | token[num] | positions[BT] (pageable:
                           an async upload from pageable memory is staged before it returns,
                           so the buffer may be rebuilt at once, with no stream sync) */
    int* dev;           /* same layout on the device */
    int* count_scratch; /* [vocab] host counts for the counting sort */
    int capacity_bt, vocab;
} EncoderBuckets;

static void encoder_buckets_init(EncoderBuckets* eb, int max_BT, int vocab) {
    eb->num_buckets = 0;
    eb->capacity_bt = max_BT;
    eb->vocab = vocab;
    const size_t bytes = (size_t)(3 * (size_t)max_BT + 2) * sizeof(int);
    eb->host = (int*)mallocCheck(bytes);
    cudaCheck(cudaMalloc((void**)&eb->dev, bytes));
    eb->count_scratch = (int*)callocCheck((size_t)vocab, sizeof(int));
}

static void encoder_buckets_free(EncoderBuckets* eb) {
    free(eb->host);
    cudaCheck(cudaFree(eb->dev));
    free(eb->count_scratch);
}

/* The host half of the bucketing, no CUDA calls (tested on the CPU): counting
   sort of positions 0..BT-1 by token id into out = start[num+1] | token[num] |
   positions[BT] (buckets in ascending token order, positions ascending in each
   bucket). count_scratch: vocab ints. Returns num, the number of distinct
   tokens. Dies on an id outside [0, vocab). */
static int encoder_buckets_sort(int* out, const int* tokens_host, int BT, int vocab, int* count_scratch) {
    int* count = count_scratch;
    memset(count, 0, sizeof(int) * (size_t)vocab);
    int num = 0;
    for (int i = 0; i < BT; i++) {
        const int tok = tokens_host[i];
        if (tok < 0 || tok >= vocab) die("encoder: token id %d at position %d outside [0, %d)", tok, i, vocab);
        if (count[tok]++ == 0) num++;
    }
    int* start = out;
    int* token = out + (num + 1);
    int* positions = out + (2 * num + 1);
    int k = 0, running = 0;
    for (int tok = 0; tok < vocab; tok++) {
        if (count[tok] == 0) continue;
        start[k] = running;
        token[k] = tok;
        running += count[tok];
        count[tok] = start[k]; /* reuse as the fill cursor */
        k++;
    }
    start[num] = running;
    for (int i = 0; i < BT; i++) positions[count[tokens_host[i]]++] = i;
    return num;
}

/* Sorts on the host, then one async upload. The device copy is replaced in
   stream order, after earlier backward passes. */
static void encoder_buckets_build(EncoderBuckets* eb, const int* tokens_host, int BT, cudaStream_t stream) {
    if (BT > eb->capacity_bt) die("encoder buckets: %d positions > capacity %d", BT, eb->capacity_bt);
    const int num = encoder_buckets_sort(eb->host, tokens_host, BT, eb->vocab, eb->count_scratch);
    eb->num_buckets = num;
    cudaCheck(cudaMemcpyAsync(eb->dev, eb->host, sizeof(int) * (size_t)(2 * num + 1 + BT),
                              cudaMemcpyHostToDevice, stream));
}

/* grid (num_buckets, C / (8 * blockDim.x) rounded up): block owns one wte row slice. */
__global__ void encoder_backward_wte_kernel(floatX* dwte, const floatX* dout, const int* buckets, int num_buckets,
                                            int C) {
    const int k = blockIdx.x;
    const int c = (blockIdx.y * blockDim.x + threadIdx.x) * 8;
    if (c >= C) return;
    const int* start = buckets;
    const int* token = buckets + (num_buckets + 1);
    const int* positions = buckets + (2 * num_buckets + 1);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int i = start[k]; i < start[k + 1]; i++) {
        const Pack8 d = load_pack8(dout + (long long)positions[i] * C + c);
#pragma unroll
        for (int j = 0; j < 8; j++) acc[j] += to_float(d.v[j]);
    }
    floatX* row = dwte + (long long)token[k] * C + c;
    Pack8 w = load_pack8(row);
#pragma unroll
    for (int j = 0; j < 8; j++) w.v[j] = from_float(to_float(w.v[j]) + acc[j]);
    store_pack8(row, w);
}

/* One thread per (t, 8 channels): sums over the batch in order. */
__global__ void encoder_backward_wpe_kernel(floatX* dwpe, const floatX* dout, int B, int T, int C) {
    const long long idx = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (idx >= (long long)T * C) return;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int b = 0; b < B; b++) {
        const Pack8 d = load_pack8(dout + (long long)b * T * C + idx);
#pragma unroll
        for (int j = 0; j < 8; j++) acc[j] += to_float(d.v[j]);
    }
    Pack8 w = load_pack8(dwpe + idx);
#pragma unroll
    for (int j = 0; j < 8; j++) w.v[j] = from_float(to_float(w.v[j]) + acc[j]);
    store_pack8(dwpe + idx, w);
}

/* dwte[token] += sum of dout over its positions; dwpe[t] += sum over b (dwpe NULL: skipped). */
static void encoder_backward(floatX* dwte, floatX* dwpe, const floatX* dout, const EncoderBuckets* eb, int B, int T,
                             int C, cudaStream_t stream) {
    const int block = 128;
    if (eb->num_buckets > 0) {
        dim3 grid(eb->num_buckets, ceil_div(C / 8, block));
        encoder_backward_wte_kernel<<<grid, block, 0, stream>>>(dwte, dout, eb->dev, eb->num_buckets, C);
        cudaCheckLastError();
    }
    if (dwpe == nullptr) return; /* no learned positions */
    encoder_backward_wpe_kernel<<<ceil_div((long long)T * C / 8, 256), 256, 0, stream>>>(dwpe, dout, B, T, C);
    cudaCheckLastError();
}

#endif /* MODEL_ENCODER_CUH */
