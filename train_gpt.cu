/*
 * train_gpt.cu - the GPU trainer: GPT-2 pretraining on one NVIDIA GPU with
 * the attention numerics switchable at run time (--attn fp32|bf16|repair|gproj).
 *
 * Why: this is the program users run. It is thin wiring: flags
 * (train/flags.h, the table shared with the CPU trainer), model presets and
 * checkpoints (model/), the data loader and tokenizer (dataloader/), the lr
 * schedule, run log, resume state and sampler (train/), and the GPU model
 * (model/gpt_cuda.cuh). The loop mirrors train_gpt_cpu.c step for step, so a
 * run's log reads the same whichever trainer made it.
 *
 * One optimizer step = grad_accum micro-steps of B x T tokens
 * (grad_accum = --total-batch-tokens / (B*T)), a gradient norm, clipping,
 * AdamW on FP32 master weights. Before the first step the memory the run
 * needs is added up and compared with the GPU's free memory; if it does not
 * fit, the run stops with what to lower. Checkpoints: model_NNNNNNNN.bin
 * (llm.c layout, FP32 master weights, exact) + state_NNNNNNNN.bin (moments,
 * data position, RNG, attention mode) in --out-dir; --resume continues
 * bit-exactly.
 *
 * Multi-GPU seam: dist rank/world size are fixed at 0/1 here; the gradient
 * reduce point is reduce_gradients() between backward and update, and the
 * optimizer already updates per contiguous range (the ZeRO-1 shard shape).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "model/gpt_cuda.cuh"
extern "C" {
#include "model/checkpoint.h"
#include "model/gpt_cpu.h"
#include "dataloader/dataloader.h"
#include "dataloader/tokenizer.h"
#include "train/flags.h"
#include "train/schedule.h"
#include "train/runlog.h"
#include "train/resume_state.h"
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

static void make_dirs(const char* path) {
    char buf[4096];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char* p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0755) != 0 && errno != EEXIST) die("cannot create folder '%s': %s", buf, strerror(errno));
        *p = '/';
    }
    if (mkdir(buf, 0755) != 0 && errno != EEXIST) die("cannot create folder '%s': %s", buf, strerror(errno));
}
static int file_exists(const char* path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* The gradient reduce point of data parallelism: a no-op on one GPU. */
static void reduce_gradients(GPTCuda* model, int world_size) {
    if (world_size != 1) die("this build of train_gpt drives one GPU; multi-GPU data parallelism is not wired in yet");
    (void)model;
}

/* Mean loss over val_batches batches of the validation loader. */
static double evaluate(GPTCuda* model, DataLoader* val, int batches, int B, int T, int* inputs, int* targets) {
    char err[512];
    dataloader_reset(val);
    gpt_cuda_loss_reset(model);
    for (int i = 0; i < batches; i++) {
        if (dataloader_next(val, inputs, targets, err, sizeof(err)) != 0) die("validation data: %s", err);
        gpt_cuda_forward(model, inputs, targets, B, T, 0.0f);
    }
    return gpt_cuda_loss_read(model) / ((double)batches * B * T);
}

/* Draws n tokens after <|endoftext|>, one forward per token over the growing
   context (capped at T), batch 1. */
static void sample_text(GPTCuda* model, Tokenizer* tok, SamplerRng* rng, int n, int T, RunLog* log, int step) {
    const int V = model->config.vocab_size;
    int* ids = (int*)mallocCheck(sizeof(int) * (size_t)(n + 1));
    float* logits = (float*)mallocCheck(sizeof(float) * (size_t)V);
    ids[0] = GPT2_EOT_TOKEN;
    int len = 1;
    for (int i = 0; i < n; i++) {
        const int start = len > T ? len - T : 0, ctx = len - start;
        gpt_cuda_forward(model, ids + start, NULL, 1, ctx, 0.0f);
        gpt_cuda_logits_row(model, 0, ctx - 1, logits);
        const int next = sampler_draw(logits, V, 1.0f, rng);
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

static void save_checkpoint(GPTCuda* model, const char* out_dir, int step, ResumeState* st, float* host_params,
                            RunLog* log) {
    char model_path[4096], state_path[4096], err[1024];
    run_file_path(model_path, sizeof(model_path), out_dir, "model", step);
    run_file_path(state_path, sizeof(state_path), out_dir, "state", step);
    gpt_cuda_get_params(model, host_params);
    if (checkpoint_write_model(model_path, &model->config, host_params, 0, err, sizeof(err)) != 0)
        die("saving the checkpoint: %s", err);
    st->params_hash = resume_hash(host_params, model->num_params * sizeof(float), RESUME_HASH_INIT);
    gpt_cuda_get_optimizer_state(model, st->m, st->v);
    if (resume_state_write(state_path, st, err, sizeof(err)) != 0) die("saving the resume state: %s", err);
    FILE* rec = runlog_begin(log, "checkpoint");
    if (rec) {
        fprintf(rec, ", \"step\": %d, \"model\": ", step);
        json_write_string(rec, model_path);
        fprintf(rec, ", \"state\": ");
        json_write_string(rec, state_path);
    }
    runlog_end(log);
    printf("saved %s and %s\n", model_path, state_path);
}

int main(int argc, char** argv) {
    char err[1024];
    TrainFlags f;
    flags_init(&f);
    const int parsed = flags_parse(&f, argc, argv, err, sizeof(err));
    if (parsed == 1) {
        flags_print_help(stdout, "train_gpt",
                         "GPT-2 pretraining on one NVIDIA GPU, attention numerics switchable with --attn.", 1);
        return 0;
    }
    if (parsed != 0) die("%s\n  hint: train_gpt --help lists every flag", err);
    /* ZeRO-1 on one GPU: the single shard is the whole buffer, i.e. the unsharded optimizer. */
    if (f.zero_stage != 0) printf("note: --zero-stage %d on one GPU: one shard holds all optimizer state\n", f.zero_stage);
    if (f.diag_every != 0 || f.capture_steps[0] || f.capture_layers[0])
        die("--diag-every / --capture-steps / --capture-layers are not implemented in train_gpt yet; leave them unset");

    /* ---- model shape and weights source ---- */
    GPTConfig cfg;
    float* init_params = NULL;
    if (f.init_from[0]) {
        if (checkpoint_read_model(f.init_from, &cfg, &init_params, err, sizeof(err)) != 0) die("--init-from: %s", err);
    } else if (gpt_config_from_descriptor(f.model, &cfg, err, sizeof(err)) != 0) {
        die("--model: %s", err);
    }
    const int B = f.batch_size;
    const int T = f.seq_len ? f.seq_len : cfg.max_seq_len;
    if (T > cfg.max_seq_len) die("--seq-len %d exceeds the model's context length %d; lower --seq-len", T, cfg.max_seq_len);
    AttnMode attn_mode;
    if (attn_mode_parse(f.attn, &attn_mode) != 0) die("--attn '%s': choose one of %s", f.attn, attn_mode_choices());
    ScheduleKind sched_kind;
    if (schedule_parse(f.schedule, &sched_kind) != 0) die("--schedule '%s': choose cosine|linear|constant", f.schedule);
    const int world_size = 1, rank = 0;
    const long long tokens_per_micro = (long long)B * T * world_size;
    int grad_accum = 1;
    if (f.total_batch_tokens > 0) {
        if (f.total_batch_tokens % tokens_per_micro != 0)
            die("--total-batch-tokens %lld is not a multiple of batch-size x seq-len = %lld; pick a multiple",
                (long long)f.total_batch_tokens, tokens_per_micro);
        grad_accum = (int)(f.total_batch_tokens / tokens_per_micro);
    }

    /* ---- GPU and the memory check, before anything large is allocated ---- */
    int device_count = 0;
    if (cudaGetDeviceCount(&device_count) != cudaSuccess || device_count == 0)
        die("no CUDA GPU found; train on the CPU with build/train_gpt_cpu");
    cudaCheck(cudaSetDevice(0));
    cudaDeviceProp prop;
    cudaCheck(cudaGetDeviceProperties(&prop, 0));
    const GpuMemoryPlan plan = gpt_cuda_memory_plan(&cfg, B, T, f.recompute);
    size_t free_bytes = 0, total_bytes = 0;
    cudaCheck(cudaMemGetInfo(&free_bytes, &total_bytes));
    const double GiB = 1024.0 * 1024.0 * 1024.0;
    if (gpt_cuda_memory_check(&plan, free_bytes, B, T, f.recompute, prop.name, err, sizeof(err)) != 0) die("%s", err);
    cudaStream_t stream;
    cudaCheck(cudaStreamCreate(&stream));
    GPTCuda model;
    gpt_cuda_init(&model, &cfg, B, T, f.recompute, attn_mode, stream);
    model.attn_opt.tile_max_shift = f.attn_tile_max_shift;
    float* host_params = (float*)mallocCheck(model.num_params * sizeof(float));
    if (init_params) {
        memcpy(host_params, init_params, model.num_params * sizeof(float));
        free(init_params);
    } else {
        gpt_init_params(&cfg, host_params, f.seed);
    }
    gpt_cuda_set_params(&model, host_params);

    /* ---- data, tokenizer ---- */
    DataLoader* train_loader = NULL;
    DataLoader* val_loader = NULL;
    if (dataloader_open(&train_loader, f.train_data, B, T, rank, world_size, f.shuffle, f.seed, cfg.vocab_size, err,
                        sizeof(err)) != 0)
        die("--train-data: %s\n  hint: make setup creates the default data", err);
    if (f.val_data[0] && dataloader_open(&val_loader, f.val_data, B, T, rank, world_size, 0, f.seed, cfg.vocab_size,
                                         err, sizeof(err)) != 0)
        die("--val-data: %s\n  hint: pass --val-data '' to train without validation", err);
    Tokenizer* tok = NULL;
    if (tokenizer_load(&tok, f.vocab, err, sizeof(err)) != 0) {
        printf("note: no tokenizer (%s); samples are printed as token ids\n", err);
        tok = NULL;
    }

    /* ---- output folder, log, resume ---- */
    char out_dir[2048];
    if (f.out_dir[0]) {
        snprintf(out_dir, sizeof(out_dir), "%s", f.out_dir);
    } else {
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        strftime(out_dir, sizeof(out_dir), "runs/run_%Y%m%d_%H%M%S", &tmv);
    }
    make_dirs(out_dir);
    char log_path[4096];
    snprintf(log_path, sizeof(log_path), "%s/log.jsonl", out_dir);
    const int resuming = f.resume[0] != 0;
    if (!resuming && file_exists(log_path) && !f.overwrite)
        die("'%s' already holds a run (%s)\n  hint: --resume latest to continue it, --overwrite 1 to start over, "
            "or another --out-dir", out_dir, log_path);

    ResumeState st;
    memset(&st, 0, sizeof(st));
    st.config = cfg;
    st.config_hash = gpt_config_hash(&cfg);
    st.batch_size = B; st.seq_len = T; st.grad_accum = grad_accum; st.world_size = world_size;
    st.shuffle = f.shuffle; st.attn_mode = attn_mode; st.attn_tile_max_shift = f.attn_tile_max_shift;
    st.seed = f.seed; st.num_params = model.num_params;
    st.m = (float*)mallocCheck(model.num_params * sizeof(float));
    st.v = (float*)mallocCheck(model.num_params * sizeof(float));
    SamplerRng rng;
    sampler_seed(&rng, f.seed);
    int start_step = 0;
    long long tokens_seen = 0;
    if (resuming) {
        char state_path[4096];
        int64_t found_step = 0;
        if (strcmp(f.resume, "latest") == 0) {
            const int r = run_find_latest_state(out_dir, state_path, sizeof(state_path), &found_step, err, sizeof(err));
            if (r < 0) die("--resume latest: %s", err);
            if (r > 0) die("--resume latest: no state_*.bin in '%s'\n  hint: pass --out-dir of the run to continue", out_dir);
        } else {
            snprintf(state_path, sizeof(state_path), "%s", f.resume);
        }
        ResumeState saved;
        if (resume_state_read(state_path, &saved, err, sizeof(err)) != 0) die("--resume: %s", err);
        if (resume_state_check(&saved, &st, err, sizeof(err)) != 0) die("--resume: %s", err);
        char model_path[4096], dir[4096];
        snprintf(dir, sizeof(dir), "%s", state_path);
        char* slash = strrchr(dir, '/');
        if (slash) *slash = 0; else snprintf(dir, sizeof(dir), ".");
        run_file_path(model_path, sizeof(model_path), dir, "model", saved.step);
        GPTConfig saved_cfg;
        float* saved_params = NULL;
        if (checkpoint_read_model(model_path, &saved_cfg, &saved_params, err, sizeof(err)) != 0)
            die("--resume: the model file beside the state: %s", err);
        if (resume_hash(saved_params, model.num_params * sizeof(float), RESUME_HASH_INIT) != saved.params_hash)
            die("--resume: '%s' is not the model saved with '%s' (parameter hash differs)", model_path, state_path);
        gpt_cuda_set_params(&model, saved_params);
        gpt_cuda_set_optimizer_state(&model, saved.m, saved.v);
        if (dataloader_seek(train_loader, &saved.data_pos, err, sizeof(err)) != 0) die("--resume: %s", err);
        rng.state = saved.rng_state;
        start_step = (int)saved.step;
        tokens_seen = saved.tokens_seen;
        if (saved.attn_mode != (int32_t)attn_mode)
            printf("note: resuming a run trained with --attn %s under --attn %s\n",
                   attn_mode_name((AttnMode)saved.attn_mode), attn_mode_name(attn_mode));
        free(saved_params);
        resume_state_free(&saved);
        printf("resumed from %s (step %d)\n", state_path, start_step);
    }
    if (resuming && start_step >= f.steps)
        die("--resume: the run already has %d steps and --steps is %d\n  hint: raise --steps to train longer",
            start_step, f.steps);
    if (f.stop_at > 0 && (f.stop_at >= f.steps || f.stop_at <= start_step))
        die("--stop-at %d must lie between the first step of this invocation (%d) and --steps (%d)", f.stop_at,
            start_step, f.steps);
    RunLog log;
    if (runlog_open(&log, log_path, resuming, err, sizeof(err)) != 0) die("%s", err);
    {
        FILE* rec = runlog_begin(&log, resuming ? "resume" : "config");
        if (rec) {
            fprintf(rec, ", \"trainer\": \"train_gpt\", \"device\": ");
            json_write_string(rec, prop.name);
            fprintf(rec, ", \"step\": %d, \"grad_accum\": %d, \"num_params\": %zu, ", start_step, grad_accum,
                    model.num_params);
            flags_write_json(rec, &f);
        }
        runlog_end(&log);
    }

    /* ---- banner ---- */
    const double peak = device_peak_flops(prop.name);
    const double flops_per_token = training_flops_per_token(&cfg, T);
    printf("train_gpt: %s, %.1f GiB free of %.1f\n", prop.name, free_bytes / GiB, total_bytes / GiB);
    flags_print_settings(stdout, &f, 1);
    printf("model: L%d C%d NH%d T%d V%d (padded %d), %zu parameters\n", cfg.num_layers, cfg.channels, cfg.num_heads,
           T, cfg.vocab_size, cfg.padded_vocab_size, model.num_params);
    printf("batch: %d x %d tokens x %d accumulation steps = %lld tokens per step\n", B, T, grad_accum,
           tokens_per_micro * grad_accum);
    printf("memory plan: %.2f GiB (weights+grads %.2f, optimizer %.2f, activations %.2f + %.2f, workspaces %.2f)\n",
           plan.total_bytes / GiB, plan.params_bytes / GiB, plan.optimizer_bytes / GiB, plan.acts_bytes / GiB,
           plan.stats_bytes / GiB, plan.workspace_bytes / GiB);
    printf("attention: %s | data: %lld train tokens in %d shard(s)%s | out: %s\n", attn_mode_name(attn_mode),
           (long long)dataloader_num_tokens(train_loader), dataloader_num_shards(train_loader),
           val_loader ? "" : " (no validation)", out_dir);
    if (peak == 0.0) printf("note: no peak FLOP/s entry for '%s': MFU not reported\n", prop.name);

    /* ---- training loop ---- */
    LRSchedule sched = {sched_kind, f.lr, f.min_lr_frac, f.warmup_steps, f.steps};
    int* inputs = (int*)mallocCheck(sizeof(int) * (size_t)B * T);
    int* targets = (int*)mallocCheck(sizeof(int) * (size_t)B * T);
    const float dloss = 1.0f / (float)((double)B * T * grad_accum);
    double time_sum = 0.0;
    int timed_steps = 0;
    /* Same boundary order as train_gpt_cpu.c: at each step boundary, checkpoint (not at the start of this
       invocation), --stop-at, evaluation, sample; then train the step. */
    for (int step = start_step;; step++) {
        const int last = step == f.steps;
        const int stop_here = f.stop_at > 0 && step == f.stop_at;
        if (step != start_step && (last || stop_here || (f.checkpoint_every > 0 && step % f.checkpoint_every == 0))) {
            st.step = step;
            st.adam_t = step;
            st.tokens_seen = tokens_seen;
            st.rng_state = rng.state;
            st.data_pos = dataloader_position(train_loader);
            save_checkpoint(&model, out_dir, step, &st, host_params, &log);
        }
        if (stop_here) {
            FILE* pf = runlog_begin(&log, "stop");
            if (pf) fprintf(pf, ", \"step\": %d, \"reason\": \"--stop-at\"", step);
            runlog_end(&log);
            printf("stopped at step %d (--stop-at); continue with: --resume --out-dir %s\n", step, out_dir);
            break;
        }
        if (val_loader && (last || (f.val_every > 0 && step % f.val_every == 0))) {
            const double vl = evaluate(&model, val_loader, f.val_batches, B, T, inputs, targets);
            printf("val loss %.6f (step %d, %d batches)\n", vl, step, f.val_batches);
            runlog_eval(&log, step, vl, f.val_batches);
        }
        if (f.sample_every > 0 && step > 0 && (last || step % f.sample_every == 0))
            sample_text(&model, tok, &rng, f.sample_tokens, T, &log, step);
        if (last) {
            FILE* pf = runlog_begin(&log, "stop");
            if (pf) fprintf(pf, ", \"step\": %d, \"reason\": \"done\"", step);
            runlog_end(&log);
            break;
        }

        const double t0 = runlog_now_s();
        gpt_cuda_zero_grad(&model);
        gpt_cuda_loss_reset(&model);
        for (int micro = 0; micro < grad_accum; micro++) {
            if (dataloader_next(train_loader, inputs, targets, err, sizeof(err)) != 0) die("training data: %s", err);
            gpt_cuda_forward(&model, inputs, targets, B, T, dloss);
            gpt_cuda_backward(&model);
        }
        reduce_gradients(&model, world_size);
        const double lr = schedule_lr(&sched, step);
        AdamWHyper h = {(float)lr, f.beta1, f.beta2, f.adam_eps, f.weight_decay, step + 1};
        const double loss = gpt_cuda_loss_read(&model) / ((double)B * T * grad_accum);
        /* gpt_cuda_update leaves the weights alone when the gradient norm is not finite */
        const double norm = isfinite(loss) ? gpt_cuda_update(&model, h, f.grad_clip) : NAN;
        const double dt = runlog_now_s() - t0;
        tokens_seen += tokens_per_micro * grad_accum;
        if (step > start_step) { time_sum += dt; timed_steps++; } /* the first step includes warm-up */
        if (!isfinite(loss) || !isfinite(norm)) {
            FILE* rec = runlog_begin(&log, "stop");
            if (rec) fprintf(rec, ", \"step\": %d, \"reason\": \"non-finite %s\"", step, isfinite(loss) ? "gradient" : "loss");
            runlog_end(&log);
            die("step %d: the %s is not finite; training stopped before updating the weights\n"
                "  hint: lower --lr or raise --warmup-steps, then --resume from the last checkpoint in %s",
                step, isfinite(loss) ? "gradient norm" : "loss", out_dir);
        }
        StepRecord r = {step, f.steps, loss, lr, norm, tokens_per_micro * grad_accum / dt, dt * 1e3,
                        attn_mode_name(attn_mode)};
        runlog_step(&log, &r);
        if (step == start_step || (step + 1) % f.log_every == 0 || step + 1 == f.steps) {
            const double mean_dt = timed_steps ? time_sum / timed_steps : dt;
            runlog_console_step(stdout, &r, mean_dt * (f.steps - step - 1));
            if (peak > 0) printf("      MFU %.1f%%\n", 100.0 * flops_per_token * r.tokens_per_s / peak);
        }
    }
    if (timed_steps > 0) {
        const double tps = tokens_per_micro * grad_accum / (time_sum / timed_steps);
        printf("mean over %d steps (first excluded): %.1f ms/step, %.0f tokens/s", timed_steps,
               1e3 * time_sum / timed_steps, tps);
        if (peak > 0) printf(", MFU %.1f%%", 100.0 * flops_per_token * tps / peak);
        printf("\n");
    }
    runlog_close(&log);
    free(inputs); free(targets); free(host_params); free(st.m); free(st.v);
    if (tok) tokenizer_free(tok);
    dataloader_close(train_loader);
    dataloader_close(val_loader);
    gpt_cuda_free(&model);
    cudaCheck(cudaStreamDestroy(stream));
    return 0;
}
