/*
 * train_gpt.cu - the GPU trainer: GPT-2 pretraining on one or many NVIDIA
 * GPUs (one process per GPU) with the attention numerics switchable at run
 * time (--attn fp32|bf16|repair|gproj), and the run diagnostics that show
 * whether the BF16 attention backward spoils training.
 *
 * Why: this is the program users run. It is thin wiring: flags
 * (train/flags.h, the table shared with the CPU trainer), model presets and
 * checkpoints (model/), the data loader and tokenizer (dataloader/), the lr
 * schedule, run log, resume state and sampler (train/), the GPU model
 * (model/gpt_cuda.cuh), the launcher/collectives (train/dist.h, train/comm.h)
 * and the diagnostics (model/diagnostics.cuh). The loop mirrors
 * train_gpt_cpu.c step for step, so a run's log reads the same whichever
 * trainer made it.
 *
 * One optimizer step = grad_accum micro-steps of B x T tokens per process
 * (grad_accum = --total-batch-tokens / (B*T*processes)), the gradients
 * summed over processes, a global gradient norm, clipping, AdamW on FP32
 * master weights. Before the first step the memory the run needs is added up
 * and compared with the GPU's free memory; if it does not fit, the run stops
 * with what to lower.
 *
 * Data parallelism (docs/multi_gpu.md): launched by mpirun, by RANK /
 * WORLD_SIZE / LOCAL_RANK (+ --nccl-id-file), or plainly (one process).
 * Every rank reads its slice of each global batch (dataloader.h). On the last
 * micro-step of a step, gpt_cuda_backward's grad hook hands each layer's
 * gradients to a second CUDA stream as soon as they are final, where NCCL
 * reduces them while backward goes on (events order the two streams):
 *   --zero-stage 0: all-reduce; every rank runs AdamW on every parameter;
 *   --zero-stage 1: each gradient slice is reduced to the rank whose ZeRO-1
 *     shard holds it (zero_shard of the flat buffer; a bucketed
 *     reduce-scatter); each rank keeps master weights and moments for its
 *     shard only, updates it, and the BF16 parameters are all-gathered.
 * The loss and the squared gradient norm (each rank's shard of the reduced
 * gradients) are summed over ranks in rank order (comm_sum_scalars), so all
 * ranks clip with the same global norm. Only rank 0 prints, logs and writes
 * checkpoints; checkpoints hold the full model and full moments in table
 * order (the ZeRO-1 shards are gathered first), exactly what a one-GPU run
 * writes, so any process count can resume them. A failing rank names itself
 * and, under mpirun, ends the job.
 *
 * Checkpoints: model_NNNNNNNN.bin (llm.c layout, FP32 master weights, exact)
 * + state_NNNNNNNN.bin (moments, data position, RNG, attention mode) in
 * --out-dir; --resume continues bit-exactly with the same process count.
 * Flag conflicts, the run folder, data, lr schedule, resume, the checkpoint
 * schedule and retention, SIGTERM / SIGINT, divergence and --skip-update-z
 * are train/run_driver.c, the diagnostics' step plan and records
 * train/run_diag.h, both shared with the CPU trainer; the ranks agree on a
 * signal or a due wall-time checkpoint through the per-step sum of the loss,
 * so all of them save at the same step.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "model/gpt_cuda.cuh"
#include "attention/cudnn/attention_cudnn.cuh"
#include "model/diagnostics.cuh"
#include "train/comm.h"
extern "C" {
#include "model/checkpoint.h"
#include "model/gpt_cpu.h"
#include "dataloader/dataloader.h"
#include "dataloader/tokenizer.h"
#include "train/dist.h"
#include "train/flags.h"
#include "train/schedule.h"
#include "train/runlog.h"
#include "train/resume_state.h"
#include "train/run_diag.h"
#include "train/run_driver.h"
#include "train/sampler.h"
}

/* Dense BF16 tensor-core peak per GPU, for MFU. Matched by substring of the
   device name, first match wins. */
static const struct { const char* name; double bf16_flops; } peak_table[] = {
    {"H200", 989e12}, {"H100", 989e12}, {"H800", 989e12}, {"A100", 312e12}, {"L40S", 362e12}, {"4090", 165e12},
};
static double device_peak_flops(const char* device_name) {
    for (size_t i = 0; i < sizeof(peak_table) / sizeof(peak_table[0]); i++)
        if (strstr(device_name, peak_table[i].name)) return peak_table[i].bf16_flops;
    return 0.0; /* unknown: MFU not reported */
}

/* Training FLOPs per token: 6 per matmul weight (forward 2, backward 4,
   embedding lookups excluded, the tied head included) plus causal attention:
   per layer QK^T and PV over T/2 keys on average, 2*2*C*T/2 forward, x3. */
static double training_flops_per_token(const GPTConfig* c, int T) {
    const double C = c->channels, L = c->num_layers, Vp = c->padded_vocab_size;
    const double matmul_weights = L * 12.0 * C * C + Vp * C;
    return 6.0 * matmul_weights + 3.0 * L * 2.0 * C * T;
}

/* ------------------------------------------------------------------ failing ranks */

/* die() prints the error and exits; with more than one process this hook then
   says which rank it was and, under mpirun, ends every rank of the job (the
   others would otherwise wait forever in their next collective). */
static DistInfo g_dist = {0, 1, 0, LAUNCH_SINGLE};
static Comm* g_comm = NULL; /* set once the communicator exists */
static void rank_exit_hook(int status, void* unused) {
    (void)unused;
    if (status == 0 || g_dist.world_size == 1 || run_driver_exiting_together()) return; /* all ranks stop together */
    fprintf(stderr, "error: rank %d of %d stopped with the error above%s\n", g_dist.rank, g_dist.world_size,
            g_dist.launch == LAUNCH_MPI ? "; ending every rank of the job"
            : g_comm ? "; the other ranks stop at their next wait for this one"
                     : "; the other ranks stop when their launcher ends them");
    fflush(stderr);
    if (g_dist.launch == LAUNCH_MPI) dist_mpi_abort(status);
    comm_report_failure(g_comm);
}

/* ------------------------------------------------------------------ data parallelism */

/* The most doubles dp_sum_doubles sums at once: the step's loss sum and squared norm, then run_driver_poll's flags. */
enum { kDpSumDoubles = 2 + RUN_POLL_FLAGS };

/* (hi, lo) float pairs of doubles: comm_sum_scalars moves floats, so each
   double travels as hi = float(x), lo = float(x - hi) (about 48 bits). */
__global__ void split_doubles_kernel(float* out, const double* in, int n) {
    const int i = threadIdx.x;
    if (i >= n) return;
    const float hi = (float)in[i];
    out[2 * i] = hi;
    out[2 * i + 1] = (float)(in[i] - (double)hi);
}

typedef struct {
    DistInfo dist;
    Comm* comm;
    int zero_stage;
    ZeroShard shard;          /* this rank's part of the flat buffer: its ZeRO-1 shard, and its share of the norm */
    GPTCuda* model;
    cudaStream_t comm_stream; /* gradient reductions, overlapped with backward */
    cudaEvent_t ready;        /* compute stream: "gradients of the bucket are final" (reused per bucket) */
    cudaEvent_t comm_done;    /* comm stream: last reduction issued for the step is done */
    int reduce_now;           /* set on the last micro-step of a step */
    float* d_split;           /* [2 * kDpSumDoubles] split_doubles_kernel output */
    double* d_sums;           /* [kDpSumDoubles] loss sum, squared norm, run_driver_poll's flags: summed over ranks */
    /* per-step timing of the last micro-step (world_size > 1) */
    cudaEvent_t ev_bwd_start, ev_bwd_end, ev_comm_start, ev_waited, ev_gather_start, ev_gather_end;
    int comm_started;
    double sum_bwd_ms, sum_comm_ms, sum_exposed_ms, sum_gather_ms;
    int timed;
} DataParallel;

/* Sends flat range [a, b) of the gradients to be summed: all-reduce (stage
   0), or reduced onto the rank(s) whose ZeRO-1 shards it falls in (stage 1). */
static void dp_reduce_range(DataParallel* dp, size_t a, size_t b) {
    floatX* g = dp->model->grads;
    if (dp->zero_stage == 0) {
        comm_all_reduce_bf16(dp->comm, g + a, b - a, dp->comm_stream);
        return;
    }
    enum { MAX_PIECES = 64 };
    ParamRange pieces[MAX_PIECES];
    while (a < b) { /* a range spans at most a few shards; more than MAX_PIECES takes another round */
        const int n = param_split_by_owner(a, b, dp->shard.shard_size, pieces, MAX_PIECES);
        for (int i = 0; i < n; i++)
            comm_reduce_bf16(dp->comm, g + pieces[i].start, pieces[i].end - pieces[i].start, pieces[i].tag,
                             dp->comm_stream);
        a = pieces[n - 1].end;
    }
}

/* gpt_cuda_backward's grad hook: the bucket of `layer` (or the rest) is final. */
static void dp_grad_hook(void* ctx, int layer, cudaStream_t compute) {
    DataParallel* dp = (DataParallel*)ctx;
    if (!dp->reduce_now || dp->dist.world_size == 1) return;
    const GPTCuda* m = dp->model;
    cudaCheck(cudaEventRecord(dp->ready, compute));
    cudaCheck(cudaStreamWaitEvent(dp->comm_stream, dp->ready, 0));
    if (!dp->comm_started) {
        cudaCheck(cudaEventRecord(dp->ev_comm_start, dp->comm_stream));
        dp->comm_started = 1;
    }
    ParamRange bucket[PARAM_BUCKET_MAX_RANGES];
    const int n = param_bucket_ranges(m->params_info, layer, bucket);
    comm_group_begin(dp->comm);
    for (int i = 0; i < n; i++) dp_reduce_range(dp, bucket[i].start, bucket[i].end);
    comm_group_end(dp->comm);
    if (layer == GRAD_HOOK_REST) cudaCheck(cudaEventRecord(dp->comm_done, dp->comm_stream));
}

/* The data-parallel state of this rank: its comm stream, events and scalar buffers; with more than one
   process the model's grad hook (one GPU: no hook, it would do nothing, so backward holds no host
   callback). */
static void dp_init(DataParallel* dp, const DistInfo* dist, Comm* comm, int zero_stage, ZeroShard shard,
                    GPTCuda* model) {
    memset(dp, 0, sizeof *dp);
    dp->dist = *dist;
    dp->comm = comm;
    dp->zero_stage = zero_stage;
    dp->shard = shard;
    dp->model = model;
    cudaCheck(cudaStreamCreateWithFlags(&dp->comm_stream, cudaStreamNonBlocking));
    cudaEvent_t* evs[] = {&dp->ready, &dp->comm_done, &dp->ev_bwd_start, &dp->ev_bwd_end, &dp->ev_comm_start,
                          &dp->ev_waited, &dp->ev_gather_start, &dp->ev_gather_end};
    for (size_t i = 0; i < sizeof(evs) / sizeof(evs[0]); i++) cudaCheck(cudaEventCreate(evs[i]));
    cudaCheck(cudaMalloc((void**)&dp->d_split, 2 * kDpSumDoubles * sizeof(float)));
    cudaCheck(cudaMalloc((void**)&dp->d_sums, kDpSumDoubles * sizeof(double)));
    if (dist->world_size > 1) {
        model->grad_hook = dp_grad_hook;
        model->grad_hook_ctx = dp;
    }
}

/* After the last backward of a step: the compute stream waits for the reductions. */
static void dp_wait_gradients(DataParallel* dp, cudaStream_t compute) {
    if (dp->dist.world_size == 1) return;
    cudaCheck(cudaEventRecord(dp->ev_bwd_end, compute));
    cudaCheck(cudaStreamWaitEvent(compute, dp->comm_done, 0));
    cudaCheck(cudaEventRecord(dp->ev_waited, compute));
}

/* Sum over ranks, in rank order, of n <= kDpSumDoubles device doubles (bit-identical on
   every rank). Synchronizes the compute stream. */
static void dp_sum_doubles(DataParallel* dp, const double* d_values, int n, double* out, cudaStream_t compute) {
    double h[2 * kDpSumDoubles];
    if (n < 1 || n > kDpSumDoubles) die("internal: dp_sum_doubles of %d values (1..%d)", n, (int)kDpSumDoubles);
    split_doubles_kernel<<<1, 32, 0, compute>>>(dp->d_split, d_values, n);
    cudaCheckLastError();
    comm_sum_scalars(dp->comm, dp->d_split, h, 2 * n, compute);
    for (int i = 0; i < n; i++) out[i] = h[2 * i] + h[2 * i + 1];
}

/* ZeRO-1: every rank updated its shard of the BF16 parameters; gather them. */
static void dp_gather_params(DataParallel* dp, cudaStream_t compute) {
    if (dp->zero_stage == 0 || dp->dist.world_size == 1) return;
    cudaCheck(cudaEventRecord(dp->ev_gather_start, compute));
    comm_all_gather_bf16(dp->comm, dp->model->params, dp->shard.shard_size, compute);
    cudaCheck(cudaEventRecord(dp->ev_gather_end, compute));
}

/* After a step's host sync: adds the step's phase times. */
static void dp_account_timing(DataParallel* dp) {
    if (dp->dist.world_size == 1 || !dp->comm_started) return;
    float bwd = 0, comm = 0, exposed = 0, gather = 0;
    cudaCheck(cudaEventElapsedTime(&bwd, dp->ev_bwd_start, dp->ev_bwd_end));
    cudaCheck(cudaEventElapsedTime(&comm, dp->ev_comm_start, dp->comm_done));
    cudaCheck(cudaEventElapsedTime(&exposed, dp->ev_bwd_end, dp->ev_waited));
    if (dp->zero_stage == 1) cudaCheck(cudaEventElapsedTime(&gather, dp->ev_gather_start, dp->ev_gather_end));
    dp->sum_bwd_ms += bwd;
    dp->sum_comm_ms += comm;
    dp->sum_exposed_ms += exposed;
    dp->sum_gather_ms += gather;
    dp->timed++;
}

/* Gathers a ZeRO-1-sharded FP32 array (shard_size elements per rank, this
   rank's at `mine`) into host[num_params] on every rank, staging through the
   BF16 gradient buffer (2 * alloc_params bytes; the gradients are not needed
   between steps). Only rank 0's host copy is filled (the others only send).
   Without sharding, rank 0 copies its own. */
static void dp_gather_f32(DataParallel* dp, const float* mine, float* host, cudaStream_t compute) {
    GPTCuda* m = dp->model;
    const int W = dp->dist.world_size;
    if (gpt_cuda_opt_is_whole(m)) {
        if (dp->dist.rank != 0) return;
        cudaCheck(cudaStreamSynchronize(compute));
        cudaCheck(cudaMemcpy(host, mine, m->num_params * sizeof(float), cudaMemcpyDeviceToHost));
        return;
    }
    const size_t S = dp->shard.shard_size, chunk = m->alloc_params / 2 / (size_t)W;
    float* stage = (float*)m->grads;
    for (size_t at = 0; at < S; at += chunk) {
        const size_t n = S - at < chunk ? S - at : chunk;
        cudaCheck(cudaMemcpyAsync(stage + (size_t)dp->dist.rank * n, mine + at, n * sizeof(float),
                                  cudaMemcpyDeviceToDevice, compute));
        comm_all_gather_bf16(dp->comm, (__nv_bfloat16*)stage, 2 * n, compute);
        comm_synchronize(dp->comm, compute);
        for (int r = 0; r < W && dp->dist.rank == 0; r++) {
            const size_t first = (size_t)r * S + at;
            if (first >= m->num_params) break;
            const size_t take = m->num_params - first < n ? m->num_params - first : n;
            cudaCheck(cudaMemcpy(host + first, stage + (size_t)r * n, take * sizeof(float), cudaMemcpyDeviceToHost));
        }
    }
}

/* ------------------------------------------------------------------ diagnostics */

typedef struct {
    DiagCuda diag;
    int active;               /* diag_cuda_init done */
    DiagCaptureSpec capture;
    int probe_layer;          /* layer to probe in this step's last backward, -1: none */
    int capture_step;         /* -1: no capture in this step */
    AttnMode mode;
    AttnOptions opt;
    const char* out_dir;
    LayerDiag* host_layers;
    char* json;
    cudaEvent_t ev_a, ev_b;   /* GPU time of the end-of-step measurements (and ZeRO-1's gradient gather) */
    cudaEvent_t ev_pa, ev_pb; /* GPU time of the probe in backward */
    int probed;               /* the probe ran in this step */
    double step_ms;           /* diagnostics time of the current step (captures, which are file writes, excluded) */
    double sum_ms;            /* over measured steps after the first (which pays the probe's allocations) */
    int steps_with_diag, steps_summed;
    DiagWarn warn;            /* --warn-rho, --warn-dq-err (model/diagnostics.h) */
} TrainDiag;

/* attn_hook: the probe and captures read the layer's dO right after its attention backward. */
static void diag_attn_hook(void* ctx, int layer, AttnShape s, const floatX* qkv, const floatX* out,
                           const float* stats, const floatX* dout, cudaStream_t st) {
    TrainDiag* td = (TrainDiag*)ctx;
    const int probe = layer == td->probe_layer;
    const int capture = td->capture_step >= 0 && diag_capture_wanted(&td->capture, td->capture_step, layer);
    if (probe) {
        cudaCheck(cudaEventRecord(td->ev_pa, st));
        diag_probe_cuda(&td->diag, td->mode, td->opt, layer, qkv, out, stats, dout, s.B, s.T, st);
        cudaCheck(cudaEventRecord(td->ev_pb, st));
        td->probed = 1;
    }
    if (capture) diag_capture_layer_cuda(td->out_dir, td->capture_step, layer, td->mode, s, qkv, out, stats, dout, st);
}

/* ------------------------------------------------------------------ evaluation, sampling, checkpoints */

/* Mean loss over val_batches global batches of the validation loader (each
   rank its slice; the sums meet in rank order). */
static double evaluate(GPTCuda* model, DataParallel* dp, DataLoader* val, int batches, int B, int T, int* inputs,
                       int* targets) {
    char err[512];
    dataloader_reset(val);
    gpt_cuda_loss_reset(model);
    for (int i = 0; i < batches; i++) {
        if (dataloader_next(val, inputs, targets, err, sizeof(err)) != 0) die("validation data: %s", err);
        gpt_cuda_forward(model, inputs, targets, B, T, 0.0f);
    }
    double sum;
    dp_sum_doubles(dp, model->scalars_dev, 1, &sum, model->stream);
    return sum / ((double)batches * B * T * dp->dist.world_size);
}

/* Draws n tokens after <|endoftext|> at the given temperature (0 = greedy), one forward per token
   over the growing context (capped at T), batch 1. Rank 0 only. */
static void sample_text(GPTCuda* model, Tokenizer* tok, SamplerRng* rng, int n, float temperature, int T,
                        RunLog* log, int step) {
    const int V = model->config.vocab_size;
    int* ids = (int*)mallocCheck(sizeof(int) * (size_t)(n + 1));
    float* logits = (float*)mallocCheck(sizeof(float) * (size_t)V);
    ids[0] = GPT2_EOT_TOKEN;
    int len = 1;
    for (int i = 0; i < n; i++) {
        const int start = len > T ? len - T : 0, ctx = len - start;
        gpt_cuda_forward(model, ids + start, NULL, 1, ctx, 0.0f);
        gpt_cuda_logits_row(model, 0, ctx - 1, logits);
        const int next = sampler_draw(logits, V, temperature, rng);
        if (next < 0) die("sampling: every logit is non-finite (the model diverged)");
        ids[len++] = next;
    }
    char text[8192];
    sampler_decode(tok, ids + 1, n, text, sizeof(text));
    printf("---- sample (step %d)\n%s\n----\n", step, text);
    runlog_sample(log, step, text, ids + 1, n);
    free(ids);
    free(logits);
}

typedef struct {
    GPTCuda* model;
    DataParallel* dp;
    ResumeState* st;     /* everything but the moments and the params hash filled in by the caller */
    float* host_params;  /* [num_params] staging for the gathered master weights */
    int bf16;            /* --checkpoint-dtype bf16: the model file holds bf16 weights (llm.c version 5) */
} SaveCtx;

/* RunSaveFn. Every rank takes part (the ZeRO-1 shards are gathered); rank 0 writes the same two files a
   one-GPU run writes, the model first (a resume starts from the newest state, which names its model).
   With bf16 weights the state's hash is of the weights as saved (rounded), which a --resume reads back. */
static int save_checkpoint(void* ctx, int step, const char* model_path, const char* state_path, char* err,
                           size_t errlen) {
    SaveCtx* c = (SaveCtx*)ctx;
    GPTCuda* model = c->model;
    cudaCheck(cudaStreamSynchronize(model->stream)); /* the training loop does not wait for the last AdamW */
    dp_gather_f32(c->dp, model->master, c->host_params, model->stream);
    dp_gather_f32(c->dp, model->adam_m, c->st->m, model->stream);
    dp_gather_f32(c->dp, model->adam_v, c->st->v, model->stream);
    if (c->dp->dist.rank != 0) return 0;
    if (checkpoint_write_model(model_path, &model->config, c->host_params, c->bf16, err, errlen) != 0) return -1;
    if (c->bf16)
        for (size_t i = 0; i < model->num_params; i++) c->host_params[i] = bf16_round(c->host_params[i]);
    c->st->step = step;
    c->st->params_hash = resume_hash(c->host_params, model->num_params * sizeof(float), RESUME_HASH_INIT);
    return resume_state_write(state_path, c->st, err, errlen);
}

/* The run's timing after the loop (timed_steps > 0: the first step of the invocation is left out): mean
   ms/step, tokens/s and MFU on the console and in a "summary" record, with the data-parallel phases and the
   diagnostics' share when they were measured. */
static void report_timing(RunLog* log, int timed_steps, double time_sum, long long tokens_per_step, int world_size,
                          double flops_per_token, double peak, const DataParallel* dp, const TrainDiag* td) {
    const double step_ms = 1e3 * time_sum / timed_steps;
    const double tps = tokens_per_step / (time_sum / timed_steps);
    printf("mean over %d steps (first excluded): %.1f ms/step, %.0f tokens/s", timed_steps, step_ms, tps);
    if (peak > 0) printf(", MFU %.1f%%", 100.0 * flops_per_token * tps / world_size / peak);
    printf("\n");
    FILE* rec = runlog_begin(log, "summary");
    if (rec) {
        fprintf(rec, ", \"timed_steps\": %d, \"ms_per_step\": ", timed_steps);
        runlog_write_number(rec, step_ms);
        fprintf(rec, ", \"tokens_per_s\": ");
        runlog_write_number(rec, tps);
        fprintf(rec, ", \"world_size\": %d", world_size);
        if (dp->timed > 0) {
            fprintf(rec, ", \"backward_ms\": ");
            runlog_write_number(rec, dp->sum_bwd_ms / dp->timed);
            fprintf(rec, ", \"reduce_span_ms\": ");
            runlog_write_number(rec, dp->sum_comm_ms / dp->timed);
            fprintf(rec, ", \"reduce_exposed_ms\": ");
            runlog_write_number(rec, dp->sum_exposed_ms / dp->timed);
            fprintf(rec, ", \"param_gather_ms\": ");
            runlog_write_number(rec, dp->sum_gather_ms / dp->timed);
        }
        if (td->steps_summed > 0) {
            fprintf(rec, ", \"diag_ms_per_diag_step\": ");
            runlog_write_number(rec, td->sum_ms / td->steps_summed);
        }
    }
    runlog_end(log);
    if (dp->timed > 0)
        printf("data parallel, per step (mean of %d): backward of the last micro-step %.2f ms | gradient "
               "reduction span %.2f ms, exposed after backward %.2f ms | parameter all-gather %.2f ms\n",
               dp->timed, dp->sum_bwd_ms / dp->timed, dp->sum_comm_ms / dp->timed, dp->sum_exposed_ms / dp->timed,
               dp->sum_gather_ms / dp->timed);
    if (td->steps_summed > 0)
        printf("diagnostics: %.2f ms GPU time per measured step (%d steps, first excluded; captures not "
               "counted), %.2f%% of a mean step\n", td->sum_ms / td->steps_summed, td->steps_summed,
               100.0 * td->sum_ms / td->steps_summed / step_ms);
}

/* ------------------------------------------------------------------ GEMM algorithms */

/* Rank 0's `bytes` bytes into every rank's buf (an all-gather of each rank's copy, keeping rank 0's). */
static void dp_broadcast_bytes(DataParallel* dp, void* buf, size_t bytes, cudaStream_t compute) {
    const size_t slot = (bytes + 1) / 2; /* BF16 elements per rank: the gather copies bits, it adds nothing */
    __nv_bfloat16* full;
    cudaCheck(cudaMalloc((void**)&full, slot * 2 * (size_t)dp->dist.world_size));
    cudaCheck(cudaMemcpyAsync(full + slot * (size_t)dp->dist.rank, buf, bytes, cudaMemcpyHostToDevice, compute));
    comm_all_gather_bf16(dp->comm, full, slot, compute);
    cudaCheck(cudaMemcpyAsync(buf, full, bytes, cudaMemcpyDeviceToHost, compute));
    cudaCheck(cudaStreamSynchronize(compute));
    cudaCheck(cudaFree(full));
}

/* The cuBLASLt algorithm of every GEMM of the training step, before the first step (model/matmul.cuh): a resumed
   run's saved ones, so it repeats its bits (shapes it did not record, and every shape of a state that records
   none, or whose algorithms do not run on this GPU and library, are chosen anew, which the console says);
   otherwise timed on one throw-away micro-step (--matmul-tune N), or the heuristic's first (N = 0). With several
   processes rank 0 chooses and every rank runs its choice, the one the resume state then records. Prints one
   line and logs a "matmul_algos" record. Returns the cuBLASLt version the choice belongs to (the resume state
   records it beside the algorithms). */
static int64_t choose_matmul_algos(GPTCuda* model, DataParallel* dp, const ResumeState* saved, int resuming, int tune,
                                   RunLog* log) {
    char err[512];
    const int64_t lib = (int64_t)cublasLtGetVersion();
    const int rank0 = dp->dist.rank == 0;
    int num_saved = 0;
    const char* anew = NULL; /* why a resumed run chooses anew */
    if (resuming && saved->num_matmul_algos == 0) {
        /* an older build and the CPU trainer record none; with the heuristic's first nothing is chosen anew */
        if (tune > 0) anew = "the resume state records no GEMM algorithms (written by an older build or the CPU trainer)";
    } else if (resuming && saved->matmul_lib != lib) {
        anew = "the resume state's GEMM algorithms were chosen by another cuBLASLt version";
    } else if (resuming) {
        num_saved = saved->num_matmul_algos;
    }
    MatmulTuneSummary t;
    if (gpt_cuda_choose_matmul_algos(model, rank0 ? tune : 0, saved->matmul_algos, num_saved, &t, err,
                                     sizeof(err)) != 0) {
        anew = err;
        num_saved = 0;
        gpt_cuda_choose_matmul_algos(model, rank0 ? tune : 0, NULL, 0, &t, err, sizeof(err));
    }
    if (dp->dist.world_size > 1) {
        struct { int64_t n; MatmulAlgoRecord recs[MATMUL_MAX_RECORDS]; } table;
        table.n = matmul_records_export(&model->matmul, table.recs, MATMUL_MAX_RECORDS);
        dp_broadcast_bytes(dp, &table, sizeof(table), model->stream);
        if (table.n < 0 || table.n > MATMUL_MAX_RECORDS ||
            matmul_records_restore(&model->matmul, table.recs, (int)table.n, err, sizeof(err)) != 0)
            die("rank %d cannot run rank 0's GEMM algorithms: %s\n  hint: every rank needs the same GPU model and "
                "cuBLAS version", dp->dist.rank, err);
    }
    if (anew) printf("note: %s; choosing them anew, so this run's bits can differ from an uninterrupted run's\n", anew);
    const char* source = num_saved ? "restored" : tune > 0 ? "timed" : "heuristic";
    if (num_saved)
        printf("gemm algorithms: %d shapes restored from the resume state\n", num_saved);
    else if (tune > 0)
        printf("gemm algorithms: the fastest of the cuBLASLt heuristic's first %d, timed on one throw-away "
               "micro-step (%.1f s): %d of %d shapes changed; by those timings a micro-step's GEMMs take %.2f ms "
               "instead of %.2f (%+.1f%%)\n", tune, t.seconds, t.changed, t.timed, t.chosen_ms, t.first_ms,
               t.first_ms > 0 ? 100.0 * (t.chosen_ms / t.first_ms - 1.0) : 0.0);
    else
        printf("gemm algorithms: the cuBLASLt heuristic's first (--matmul-tune 0)\n");
    FILE* rec = runlog_begin(log, "matmul_algos");
    if (rec) {
        fprintf(rec, ", \"source\": ");
        json_write_string(rec, source);
        fprintf(rec, ", \"candidates\": %d, \"shapes\": %d, \"timed\": %d, \"changed\": %d, \"cublaslt\": %lld",
                tune, model->matmul.num_plans, t.timed, t.changed, (long long)lib);
        if (t.timed > 0) {
            fprintf(rec, ", \"first_ms\": ");
            runlog_write_number(rec, t.first_ms);
            fprintf(rec, ", \"chosen_ms\": ");
            runlog_write_number(rec, t.chosen_ms);
            fprintf(rec, ", \"seconds\": ");
            runlog_write_number(rec, t.seconds);
        }
    }
    runlog_end(log);
    return lib;
}

/* ------------------------------------------------------------------ agreement before the first step */

static uint64_t digest_flags(const TrainFlags* f) {
    char* buf = NULL;
    size_t len = 0;
    FILE* mem = open_memstream(&buf, &len);
    if (mem == NULL) die("open_memstream failed: %s", strerror(errno));
    flags_write_json(mem, f);
    fclose(mem);
    const uint64_t h = dist_digest(buf, len, 0);
    free(buf);
    return h;
}
static uint64_t digest_shards(const DataLoader* dl, uint64_t h) {
    if (dl == NULL) return dist_digest("none", 4, h);
    for (int i = 0; i < dataloader_num_shards(dl); i++) {
        const char* path = dataloader_shard_path(dl, i);
        struct stat sb;
        const int64_t size = stat(path, &sb) == 0 ? (int64_t)sb.st_size : -1;
        h = dist_digest(path, strlen(path) + 1, h);
        h = dist_digest(&size, sizeof size, h);
    }
    const int64_t tokens = dataloader_num_tokens(dl);
    return dist_digest(&tokens, sizeof tokens, h);
}
static void check_agreement(Comm* comm, uint64_t digest, const char* what) {
    char err[1024];
    if (comm_check_agreement(comm, digest, what, err, sizeof(err)) != 0) die("%s", err);
}

/* ------------------------------------------------------------------ main */

int main(int argc, char** argv) {
    char err[1024];
    TrainFlags f;
    flags_init(&f);
    const int parsed = flags_parse(&f, argc, argv, err, sizeof(err));
    if (parsed == 1) {
        flags_print_help(stdout, "train_gpt",
                         "GPT-2 pretraining on NVIDIA GPUs (one process per GPU: mpirun, or RANK/WORLD_SIZE), "
                         "attention numerics switchable with --attn.", 1);
        return 0;
    }
    if (parsed != 0) run_flag_error("train_gpt", err);
    /* GEMM algorithms chosen by timing can differ from run to run; --deterministic 1 promises the same bits on
       every run */
    if (f.attn_deterministic && f.matmul_tune > 0)
        run_flag_error("train_gpt", "--deterministic 1 repeats a run bit for bit, and --matmul-tune N > 0 picks "
                       "GEMM algorithms by timing, which can choose differently from run to run: drop --matmul-tune "
                       "(or give 0) with it (a --resume reuses the saved choice either way)");

    /* ---- who am I: launcher, GPU, communicator ---- */
    DistInfo dist;
    if (dist_detect(&dist, err, sizeof(err)) != 0) die("%s", err);
    g_dist = dist;
    on_exit(rank_exit_hook, NULL);
    const int world_size = dist.world_size, rank = dist.rank, master_rank = rank == 0;
    if (!master_rank && freopen("/dev/null", "w", stdout) == NULL) die("cannot silence stdout of rank %d", rank);
    /* launch problems that need no GPU to find (checked before anything waits on another rank) */
    if (world_size > 1 && !comm_multi_process_capable())
        die("this build has no NCCL, so it runs one process only (%d were started)\n  hint: install NCCL's "
            "development files and rebuild (make prints what it found)", world_size);
    if (world_size > 1 && dist.launch == LAUNCH_MPI && !dist_mpi_available())
        die("started by mpirun with %d processes, but this build has no MPI\n  hint: install OpenMPI's development "
            "files and rebuild, or launch with RANK/WORLD_SIZE/LOCAL_RANK and --nccl-id-file", world_size);
    if (world_size > 1 && dist.launch == LAUNCH_ENV && !f.nccl_id_file[0])
        die("a launch through RANK/WORLD_SIZE with %d processes needs --nccl-id-file PATH on a path every rank "
            "shares (rank 0 writes the NCCL id there)", world_size);
    if (world_size > 1 && !f.out_dir[0])
        die("with %d processes give --out-dir (a path every rank sees the same)", world_size);

    /* ---- run folder, the state to resume, model shape and weights, batch arithmetic, diagnostics flags
       (train/run_driver.c, train/run_diag.h); the attention mode is settled (the saved one on resume unless
       --attn is given) before memory is planned ---- */
    RunDriver run;
    /* --attn cudnn in a build without cuDNN stops here, before the run folder is touched */
    if (f.attn && strcmp(f.attn, "cudnn") == 0) attention_cudnn_require("train_gpt --attn cudnn");
    run_driver_init(&run, "train_gpt", argc, argv, &f, master_rank);
    run_driver_load_model(&run);
    if (gpt_cuda_options_error(&run.cfg, err, sizeof(err))) /* the kernels' shape needs (head size, --mlp-hidden) */
        run_flag_error("train_gpt", err);
    const GPTConfig cfg = run.cfg;
    float* init_params = run.params;
    run.params = NULL;
    const AttnMode attn_mode = run.attn_mode;
    if (attn_mode == ATTN_CUDNN) attention_cudnn_require("train_gpt (resumed run in attention mode cudnn)");
    run_driver_batch(&run, world_size);
    const int B = run.B, T = run.T;
    const long long tokens_per_micro = (long long)B * T * world_size; /* over all ranks */
    const int grad_accum = run.grad_accum;
    /* diagnostics, probe, captures; the probe runs with the diagnostics unless told otherwise */
    RunDiagPlan diag_plan;
    run_diag_plan(&run, &diag_plan);
    const int probe_every = diag_plan.probe_every;

    /* ---- the GPU of this rank and the communicator ---- */
    int device_count = 0;
    if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0)
        die("no CUDA GPU found; train on the CPU with build/train_gpt_cpu");
    if (dist.local_rank >= device_count)
        die("rank %d has local rank %d but this node shows %d GPU(s)\n  hint: start at most one process per GPU "
            "(mpirun -np N with N <= GPUs per node; check CUDA_VISIBLE_DEVICES)", rank, dist.local_rank, device_count);
    cudaCheck(cudaSetDevice(dist.local_rank));
    Comm* comm = comm_create(&dist, f.nccl_id_file, err, sizeof(err));
    if (comm == NULL) die("starting the communicator (rank %d of %d, %s): %s", rank, world_size,
                          dist_launch_name(dist.launch), err);
    g_comm = comm;

    /* ---- data-parallel layout and the memory check, before anything large is allocated ---- */
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, dist.local_rank));
    const size_t num_params = gpt_num_parameters(&cfg);
    /* shard alignment: 128 elements (256 bytes) keeps every shard start aligned for vector loads and NCCL */
    const ZeroShard shard = zero_shard(num_params, world_size, rank, 128);
    const size_t opt_offset = f.zero_stage == 1 ? shard.offset : 0;
    const size_t opt_count = f.zero_stage == 1 ? shard.shard_size : num_params;
    AttnOptions attn_opt = {};
    attn_opt.tile_max_shift = f.attn_tile_max_shift;
    attn_opt.force_portable = strcmp(f.attn_kernels, "portable") == 0;
    attn_opt.deterministic = f.attn_deterministic;
    const GpuMemoryPlan plan =
        gpt_cuda_memory_plan_dist(&cfg, B, T, f.recompute, shard.padded_total, opt_count, 0, attn_opt);
    size_t free_bytes = 0, total_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    const double GiB = 1024.0 * 1024.0 * 1024.0;
    if (gpt_cuda_memory_check(&plan, free_bytes, B, T, f.recompute, prop.name, err, sizeof(err)) != 0)
        die("rank %d: %s%s", rank, err, f.zero_stage == 0 && world_size > 1 ? ", or --zero-stage 1" : "");
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    GPTCuda model;
    gpt_cuda_init_dist(&model, &cfg, B, T, f.recompute, attn_mode, attn_opt, stream, shard.padded_total, opt_offset,
                       opt_count);

    DataParallel dp;
    dp_init(&dp, &dist, comm, f.zero_stage, shard, &model);

    float* host_params = (float*)mallocCheck(num_params * sizeof(float));
    if (init_params) {
        memcpy(host_params, init_params, num_params * sizeof(float));
        free(init_params);
    } else {
        gpt_init_params(&cfg, host_params, f.seed);
    }

    /* ---- data, tokenizer ---- */
    DataLoader *train_loader, *val_loader;
    run_driver_open_data(&run, rank, &train_loader, &val_loader);
    Tokenizer* tok = NULL;
    if (master_rank && tokenizer_load(&tok, f.vocab, err, sizeof(err)) != 0) {
        printf("note: no tokenizer (%s); samples are printed as token ids\n", err);
        tok = NULL;
    }

    /* ---- resume ---- */
    ResumeState st;
    run_driver_state_shape(&run, num_params, &st);
    run_driver_check_resume(&run, &st);
    st.m = (float*)mallocCheck(num_params * sizeof(float));
    st.v = (float*)mallocCheck(num_params * sizeof(float));
    SamplerRng rng;
    sampler_seed(&rng, f.seed);
    const int start_step = run.start_step;
    int64_t tokens_seen = 0;
    int64_t adam_t = 0; /* AdamW's step count: the steps whose update was applied */
    gpt_cuda_set_params(&model, host_params);
    run_driver_restore(&run, train_loader, &rng, &adam_t, &tokens_seen);
    if (run.resuming) {
        gpt_cuda_set_optimizer_state(&model, run.saved.m, run.saved.v);
        run_driver_release_saved(&run);
        printf("resumed from %s (step %d)\n", run.state_path, start_step);
    }
    const char* out_dir = run.out_dir;

    /* ---- every rank must run the same thing: compare digests before the first step ---- */
    if (world_size > 1) {
        check_agreement(comm, digest_flags(&f), "the flags");
        const int32_t shape[] = {B, T, grad_accum, f.zero_stage, (int32_t)attn_mode, start_step};
        check_agreement(comm, dist_digest(shape, sizeof shape, dist_digest(&cfg, sizeof cfg, 0)),
                        "the model config and batch shape");
        check_agreement(comm, digest_shards(val_loader, digest_shards(train_loader, 1)),
                        "the data shards (names, sizes, token counts)");
        const DataPosition pos = dataloader_position(train_loader);
        check_agreement(comm, resume_hash(host_params, num_params * sizeof(float), dist_digest(&pos, sizeof pos, 2)),
                        "the initial weights and data position");
    }

    run_driver_start(&run, val_loader != NULL);
    RunLog* log = &run.log;
    {
        FILE* rec = runlog_begin(log, run.resuming ? "resume" : "config");
        if (rec) {
            fprintf(rec, ", \"trainer\": \"train_gpt\", \"device\": ");
            json_write_string(rec, prop.name);
            fprintf(rec, ", \"step\": %d, \"grad_accum\": %d, \"num_params\": %zu, \"world_size\": %d, "
                    "\"launch\": ", start_step, grad_accum, num_params, world_size);
            json_write_string(rec, dist_launch_name(dist.launch));
            fprintf(rec, ", ");
            flags_write_json(rec, &f);
        }
        runlog_end(log);
    }

    /* ---- the GEMM algorithms: the resumed run's, or chosen now (before any step, graph or evaluation) ---- */
    const int64_t cublaslt_version = choose_matmul_algos(&model, &dp, &run.saved, run.resuming, f.matmul_tune, log);

    /* ---- diagnostics (rank 0 measures its own micro-batch; all ranks join the collectives) ---- */
    TrainDiag td;
    memset(&td, 0, sizeof td);
    td.capture = diag_plan.capture;
    td.mode = attn_mode;
    td.opt = model.attn_opt;
    td.out_dir = out_dir;
    td.probe_layer = -1;
    td.capture_step = -1;
    diag_warn_init(&td.warn, f.warn_rho, f.warn_dq_err, attn_mode);
    diag_warn_set_trained_under(&td.warn, run.attn_switched_from, run.attn_switch_step);
    const int want_diag = diag_plan.diag_every > 0 || probe_every > 0 || diag_plan.capture.num_steps > 0;
    if (master_rank && want_diag) {
        diag_cuda_init(&td.diag, &cfg, B, T, DIAG_DEFAULT_ROWS_PER_HEAD);
        td.active = 1;
        td.host_layers = (LayerDiag*)mallocCheck((size_t)cfg.num_layers * sizeof(LayerDiag));
        td.json = (char*)mallocCheck(diag_json_bytes(cfg.num_layers));
        cudaEvent_t* tevs[] = {&td.ev_a, &td.ev_b, &td.ev_pa, &td.ev_pb};
        for (size_t i = 0; i < sizeof(tevs) / sizeof(tevs[0]); i++) cudaCheck(cudaEventCreate(tevs[i]));
    }

    /* ---- banner ---- */
    const double peak = device_peak_flops(prop.name);
    const double flops_per_token = training_flops_per_token(&cfg, T);
    printf("train_gpt: %s, %.1f GiB free of %.1f\n", prop.name, free_bytes / GiB, total_bytes / GiB);
    flags_print_settings(stdout, &f, 1);
    printf("processes: %d (%s launch, %s)%s\n", world_size, dist_launch_name(dist.launch),
           comm_multi_process_capable() ? "NCCL" : "no NCCL in this build: one GPU only",
           world_size > 1 ? (f.zero_stage == 1 ? ", ZeRO-1: optimizer state sharded, gradients reduced to owners"
                                               : ", gradients all-reduced, optimizer state replicated")
                          : "");
    printf("model: L%d C%d NH%d T%d V%d (padded %d), %zu parameters\n", cfg.num_layers, cfg.channels, cfg.num_heads,
           T, cfg.vocab_size, cfg.padded_vocab_size, num_params);
    printf("batch: %d x %d tokens x %d processes x %d accumulation steps = %lld tokens per step\n", B, T, world_size,
           grad_accum, tokens_per_micro * grad_accum);
    printf("memory plan (per GPU): %.2f GiB (weights+grads %.2f, optimizer %.2f, activations %.2f + %.2f, "
           "workspaces %.2f)\n", plan.total_bytes / GiB, plan.params_bytes / GiB, plan.optimizer_bytes / GiB,
           plan.acts_bytes / GiB, plan.stats_bytes / GiB, plan.workspace_bytes / GiB);
    printf("attention: %s | data: %lld train tokens in %d shard(s)%s | out: %s\n", attn_mode_name(attn_mode),
           (long long)dataloader_num_tokens(train_loader), dataloader_num_shards(train_loader),
           val_loader ? "" : " (no validation)", out_dir);
    if (want_diag)
        printf("diagnostics: every %d steps | probe every %d steps | %d capture step(s) | gauge arm %s\n",
               diag_plan.diag_every, probe_every, diag_plan.capture.num_steps, f.zero_key_bias_grad ? "on" : "off");
    if (peak == 0.0) printf("note: no peak FLOP/s entry for '%s': MFU not reported\n", prop.name);
    /* --cuda-graph: each training micro-step's forward+backward replayed from one graph (GpuStepGraph), except
       the first step of this process (the eager warm-up before the capture), steps whose last backward runs
       the probe or a capture (attn_hook), and every step of a multi-GPU run (the NCCL grad hooks) */
    const int use_cuda_graph = f.cuda_graph && world_size == 1;
    GpuStepGraph step_graph;
    memset(&step_graph, 0, sizeof step_graph);
    if (!f.cuda_graph) printf("cuda graph: off (--cuda-graph 0)\n");
    else if (!use_cuda_graph)
        printf("cuda graph: off: multi-GPU run (backward hands each layer's gradients to NCCL as it goes)\n");
    else
        printf("cuda graph: on (forward+backward of each micro-step, captured after the first step%s; "
               "evaluation and sampling eager)\n",
               probe_every > 0 || diag_plan.capture.num_steps > 0 ? "; probe/capture steps eager" : "");

    /* ---- training loop ---- */
    const LRSchedule sched = run.sched;
    int* inputs = (int*)mallocCheck(sizeof(int) * (size_t)B * T);
    int* targets = (int*)mallocCheck(sizeof(int) * (size_t)B * T);
    const float dloss = 1.0f / (float)((double)B * T * grad_accum * world_size);
    double time_sum = 0.0;
    int timed_steps = 0;
    SaveCtx save = {&model, &dp, &st, host_params, strcmp(f.checkpoint_dtype, "bf16") == 0};
    double last_val = NAN;
    int stopped_at = -1;
    /* A step's time runs from the previous step's loss read to its own: the host does not wait for AdamW, so
       the step's logging, the next boundary, batch and launches overlap the update on the GPU, and the period
       between the two reads is what a step costs. A boundary that saved, evaluated or sampled starts the
       clock again after its work. */
    double t_mark = 0.0;
    /* The boundary order of train_gpt_cpu.c (run_driver_boundary): checkpoint, signal or --stop-at, evaluation,
       sample; then train the step. */
    for (int step = start_step;; step++) {
        const int what = run_driver_boundary(&run, step);
        if (what & RUN_SAVE) {
            st.adam_t = adam_t;
            st.tokens_seen = tokens_seen;
            st.rng_state = rng.state;
            st.data_pos = dataloader_position(train_loader);
            st.num_matmul_algos = matmul_records_export(&model.matmul, st.matmul_algos, MATMUL_MAX_RECORDS);
            st.matmul_lib = cublaslt_version;
            run_driver_save(&run, step, save_checkpoint, &save);
        }
        if (what & RUN_INTERRUPT) run_driver_interrupt(&run, step); /* every rank exits here, at the same step */
        if (what & RUN_STOP_AT) {
            stopped_at = step;
            break;
        }
        if (what & RUN_EVAL) {
            last_val = evaluate(&model, &dp, val_loader, f.val_batches, B, T, inputs, targets);
            printf("val loss %.6f (step %d, %d batches)\n", last_val, step, f.val_batches);
            runlog_eval(log, step, last_val, f.val_batches);
        }
        if (master_rank && (what & RUN_SAMPLE)) sample_text(&model, tok, &rng, f.sample_tokens, f.sample_temperature, T, log, step);
        if (what & RUN_LAST) break;

        /* what this step measures (decided the same way on every rank) */
        const RunDiagStep measures = run_diag_step(&diag_plan, step, cfg.num_layers);
        const int diag_step = measures.diag;
        const int probe_step = measures.probe_layer >= 0;
        const int capture_step = measures.capture;
        if (td.active) {
            td.probe_layer = measures.probe_layer;
            td.capture_step = capture_step ? step : -1;
            td.step_ms = 0.0;
            td.probed = 0;
            if (diag_step || probe_step) diag_cuda_clear(&td.diag, stream);
        }

        if (step == start_step || (what & (RUN_SAVE | RUN_EVAL | RUN_SAMPLE))) t_mark = runlog_now_s();
        gpt_cuda_zero_grad(&model);
        gpt_cuda_loss_reset(&model);
        dp.comm_started = 0;
        for (int micro = 0; micro < grad_accum; micro++) {
            const int last_micro = micro + 1 == grad_accum;
            if (dataloader_next(train_loader, inputs, targets, err, sizeof(err)) != 0) die("training data: %s", err);
            const int hooked = last_micro && td.active && (probe_step || capture_step);
            if (use_cuda_graph && !hooked && step > start_step) {
                if (gpt_cuda_graph_micro_step(&model, &step_graph, inputs, targets, B, T, dloss))
                    printf("cuda graph: captured at step %d: %zu nodes, %.1f ms to capture and instantiate\n", step,
                           step_graph.num_nodes, step_graph.capture_ms);
                continue;
            }
            gpt_cuda_forward(&model, inputs, targets, B, T, dloss);
            dp.reduce_now = last_micro;
            if (last_micro && world_size > 1) cudaCheck(cudaEventRecord(dp.ev_bwd_start, stream));
            if (hooked) {
                model.attn_hook = diag_attn_hook;
                model.attn_hook_ctx = &td;
            }
            gpt_cuda_backward(&model);
            model.attn_hook = NULL;
        }
        dp_wait_gradients(&dp, stream);
        if (f.zero_key_bias_grad) diag_zero_key_bias_grad_cuda(&cfg, model.params_info, model.grads, stream);
        if (diag_step) {
            if (td.active) cudaCheck(cudaEventRecord(td.ev_a, stream)); /* the cost includes the gather below */
            /* the per-layer gradient norms need every reduced gradient on rank 0 */
            if (f.zero_stage == 1 && world_size > 1) comm_all_gather_bf16(comm, model.grads, shard.shard_size, stream);
            if (td.active) {
                for (int l = 0; l < cfg.num_layers; l++)
                    diag_attention_cuda(&td.diag, l, gpu_act(&model, GA_QKV, l), B, T, stream);
                diag_params_cuda(&td.diag, model.params, model.grads, stream);
                cudaCheck(cudaEventRecord(td.ev_b, stream));
            }
        }
        const double lr = schedule_lr(&sched, step);
        gpt_cuda_grad_norm_sq_enqueue(&model, shard.offset, shard.shard_size);
        /* one sum over ranks: [0] loss sum, [1] squared norm, [2..] run_driver_poll's flags (ranks signalled,
           ranks whose --checkpoint-minutes are up, ranks that saw the first attention warning), so every rank
           takes the same decision at the next boundary */
        double local_flags[RUN_POLL_FLAGS], sums[kDpSumDoubles];
        run_driver_poll(&run, local_flags);
        cudaCheck(cudaMemcpyAsync(dp.d_sums, model.scalars_dev, 2 * sizeof(double), cudaMemcpyDeviceToDevice, stream));
        cudaCheck(cudaMemcpyAsync(dp.d_sums + 2, local_flags, RUN_POLL_FLAGS * sizeof(double), cudaMemcpyHostToDevice,
                                  stream));
        dp_sum_doubles(&dp, dp.d_sums, kDpSumDoubles, sums, stream); /* waits for the step's GPU work */
        const double t_read = runlog_now_s();
        const double dt = t_read - t_mark;
        t_mark = t_read;
        run_driver_agree(&run, sums + 2);
        const double loss = sums[0] / ((double)tokens_per_micro * grad_accum);
        const double norm = isfinite(loss) ? sqrt(sums[1]) : NAN;
        /* divergence stops every rank here, before the update; --skip-update-z may skip it (same on all ranks:
           loss and norm are the summed ones) */
        const int skip = run_driver_check_step(&run, step, loss, norm);
        if (!skip) {
            adam_t++;
            AdamWHyper h = {(float)lr, f.beta1, f.beta2, f.adam_eps, f.weight_decay, (int)adam_t};
            gpt_cuda_update_with_norm(&model, h, f.grad_clip, norm);
            dp_gather_params(&dp, stream);
        }
        /* one GPU: no wait here (the next blocking call, a loss read or a save's copy, orders after AdamW);
           several: wait, so that the peers' failures are watched and the ZeRO-1 gather's events can be read */
        if (world_size > 1) comm_synchronize(comm, stream);
        dp_account_timing(&dp);
        tokens_seen += tokens_per_micro * grad_accum;
        if (step > start_step) { time_sum += dt; timed_steps++; } /* the first step includes warm-up */
        if (step == start_step && attn_mode == ATTN_CUDNN && master_rank) /* the plans the first step built */
            printf("attention cudnn: %s\n", attention_cudnn_describe(AttnShape{B, cfg.num_heads, T, cfg.channels / cfg.num_heads}));
        StepRecord r = {step, f.steps, loss, lr, norm, tokens_per_micro * grad_accum / dt, dt * 1e3,
                        attn_mode_name(attn_mode)};
        runlog_step(log, &r);
        if (td.active && (diag_step || probe_step)) {
            float ms = 0;
            if (diag_step) {
                cudaCheck(cudaEventElapsedTime(&ms, td.ev_a, td.ev_b));
                td.step_ms += ms;
            }
            if (td.probed) {
                cudaCheck(cudaEventElapsedTime(&ms, td.ev_pa, td.ev_pb));
                td.step_ms += ms;
            }
            if (td.steps_with_diag++ > 0) {
                td.sum_ms += td.step_ms;
                td.steps_summed++;
            }
            DiagProbe probe;
            diag_cuda_fetch(&td.diag, td.host_layers, &probe, NULL, stream);
            diag_write_json(td.json, diag_json_bytes(cfg.num_layers), td.host_layers, cfg.num_layers, &probe);
            diag_warn_check(&td.warn, td.host_layers, cfg.num_layers, &probe);
            runlog_diag(log, step, td.json, td.step_ms, &td.warn); /* the diag record, then its warnings */
            if (td.warn.num_pending > 0) run_driver_note_warning(&run, step); /* --checkpoint-on-warning */
        }
        if (run_driver_log_due(&run, step)) {
            const double mean_dt = timed_steps ? time_sum / timed_steps : dt;
            runlog_console_step(stdout, &r, mean_dt * (f.steps - step - 1));
            if (peak > 0) printf("      MFU %.1f%% (per GPU)\n", 100.0 * flops_per_token * r.tokens_per_s / world_size / peak);
        }
    }
    if (timed_steps > 0)
        report_timing(log, timed_steps, time_sum, tokens_per_micro * grad_accum, world_size, flops_per_token, peak,
                      &dp, &td);
    if (stopped_at >= 0) run_driver_stop_at(&run, stopped_at);
    else run_driver_done(&run, f.steps, last_val);
    free(inputs); free(targets); free(host_params); free(st.m); free(st.v);
    if (tok) tokenizer_free(tok);
    dataloader_close(train_loader);
    dataloader_close(val_loader);
    if (td.active) {
        diag_cuda_free(&td.diag);
        free(td.host_layers);
        free(td.json);
    }
    if (step_graph.replays > 0)
        printf("cuda graph: %lld micro-steps replayed from the graph\n", step_graph.replays);
    gpt_cuda_graph_free(&step_graph);
    gpt_cuda_free(&model);
    cudaCheck(cudaFree(dp.d_split));
    cudaCheck(cudaFree(dp.d_sums));
    cudaCheck(cudaStreamDestroy(dp.comm_stream));
    cudaCheck(cudaStreamDestroy(stream));
    g_comm = NULL;
    comm_destroy(comm);
    return 0;
}
