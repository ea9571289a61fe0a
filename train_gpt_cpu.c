/*
 * train_gpt_cpu.c - GPT-2 pretraining on the CPU: the reference trainer.
 *
 * Why: it runs the project's whole training pipeline (flags, data, model in
 * any attention mode, AdamW, schedule, eval, sampling, checkpoints, bit-exact
 * resume) on any machine, without a GPU, so the pipeline is tested in CI and
 * the GPU trainer (train_gpt.cu) has a reference to be compared against. It
 * is thin: every piece lives in its module; this file wires them together in
 * the order that makes a resumed run identical to an uninterrupted one.
 *
 * Loop, for step = start .. steps (start = 0, or the resumed state's step):
 *   1. checkpoint (model_S.bin + state_S.bin) if due, and not at the resume
 *      point; after a SIGTERM/SIGINT/SIGHUP or at --stop-at, stop here
 *   2. validation loss if due                 (touches no training state)
 *   3. sample if due                          (advances only the sampler RNG)
 *   4. stop if step == steps
 *   5. one optimizer step: grad_accum micro-batches (forward + backward),
 *      grads averaged, [gauge arm: key-bias gradient zeroed], global norm,
 *      [diagnostics, probe, captures: read-only], the divergence test (stops
 *      before anything is applied), [--skip-update-z], clip, lr from the
 *      schedule, AdamW.
 * The state saved at (1) is the state before (2)-(5) of that step, so a run
 * resumed from it replays exactly the same sequence. The diagnostics
 * (--diag-every, --probe-every, --capture-attn; model/diagnostics.h,
 * docs/diagnostics.md) only read the model's buffers and write the log and
 * capture files: they touch no weights, gradients, RNG or data position, so
 * a run with them on trains bit-identically to one without.
 *
 * Flag conflicts, run folder, data, lr schedule, resume, checkpoint schedule
 * and retention, signals (SIGTERM, SIGINT), divergence and --skip-update-z
 * live in train/run_driver.c, the diagnostics' step plan and records in
 * train/run_diag.h, both shared with the GPU trainer; this file supplies the
 * model, one optimizer step, evaluation, sampling and the checkpoint writer.
 *
 * Flags: train/flags.c (run with --help). Run folder and file formats:
 * docs/training.md.
 */
#include "attention/attention.h"
#include "common/utils.h"
#include "dataloader/dataloader.h"
#include "dataloader/tokenizer.h"
#include "model/checkpoint.h"
#include "model/diagnostics.h"
#include "model/gpt_config.h"
#include "model/gpt_cpu.h"
#include "train/adamw_cpu.h"
#include "train/dist.h"
#include "train/flags.h"
#include "train/resume_state.h"
#include "train/run_diag.h"
#include "train/run_driver.h"
#include "train/runlog.h"
#include "train/sampler.h"
#include "train/schedule.h"

#include <math.h>
#include <omp.h>

#define PROGRAM "train_gpt_cpu"

/* ---------------------------------------------------------------- helpers */

static void describe_config(const GPTConfig* c, size_t num_params, char* buf, size_t n) {
    snprintf(buf, n, "L%d C%d NH%d (head size %d), context %d, vocab %d (padded %d), %zu parameters",
             c->num_layers, c->channels, c->num_heads, c->channels / c->num_heads, c->max_seq_len, c->vocab_size,
             c->padded_vocab_size, num_params);
}

/* Mean validation loss over the first n batches of the validation stream. */
static double evaluate(GPTCpu* model, DataLoader* val, int n, int* inputs, int* targets) {
    char err[512];
    dataloader_reset(val);
    double sum = 0.0;
    for (int i = 0; i < n; i++) {
        if (dataloader_next(val, inputs, targets, err, sizeof(err)) != 0) die("validation data: %s", err);
        gpt_cpu_forward(model, inputs, targets, model->B, model->T);
        sum += model->mean_loss;
    }
    return sum / n;
}

/* Generates up to n tokens after <|endoftext|> into ids (n+1 slots; ids[0] = EOT) at the given temperature
   (0 = greedy); returns the count. */
static int generate(GPTCpu* model, SamplerRng* rng, int* ids, int n, float temperature) {
    const GPTConfig* c = &model->config;
    ids[0] = GPT2_EOT_TOKEN;
    int len = 1;
    for (int i = 0; i < n && len < model->T; i++) {
        gpt_cpu_forward(model, ids, NULL, 1, len);
        const gpt_real* row = model->logits + (size_t)(len - 1) * (size_t)c->padded_vocab_size;
        int next = sampler_draw(row, c->vocab_size, temperature, rng);
        if (next < 0) break; /* no finite logit: nothing sensible to draw */
        ids[len++] = next;
    }
    return len - 1;
}

typedef struct {
    const TrainFlags* flags;
    const GPTCpu* model;
    const float* m;
    const float* v;
    int64_t adam_t, tokens_seen;
    const ResumeState* shape; /* run_driver_state_shape: what every state of this run records unchanged */
    const SamplerRng* rng;
    DataLoader* train;
} SaveArgs;

/* RunSaveFn: model_S.bin, then state_S.bin (the state names its model by the step, and a resume starts
   from the newest state, so a crash between the two is harmless). */
static int save_checkpoint(void* ctx, int step, const char* model_path, const char* state_path, char* err,
                           size_t errlen) {
    const SaveArgs* a = (const SaveArgs*)ctx;
    const int bf16 = strcmp(a->flags->checkpoint_dtype, "bf16") == 0;
    if (checkpoint_write_model(model_path, &a->model->config, a->model->params, bf16, err, errlen) != 0) return -1;
    ResumeState s = *a->shape;
    s.step = step;
    s.adam_t = a->adam_t;
    s.tokens_seen = a->tokens_seen;
    s.rng_state = a->rng->state;
    if (bf16) { /* the digest of the weights as saved (rounded), which a --resume reads back */
        float* rounded = (float*)mallocCheck(a->model->num_params * sizeof(float));
        for (size_t i = 0; i < a->model->num_params; i++) rounded[i] = bf16_round(a->model->params[i]);
        s.params_hash = resume_hash(rounded, a->model->num_params * sizeof(float), RESUME_HASH_INIT);
        free(rounded);
    } else {
        s.params_hash = resume_hash(a->model->params, a->model->num_params * sizeof(float), RESUME_HASH_INIT);
    }
    s.data_pos = dataloader_position(a->train);
    s.num_params = a->model->num_params;
    s.m = (float*)a->m;
    s.v = (float*)a->v;
    return resume_state_write(state_path, &s, err, errlen);
}

/* ---------------------------------------------------------------- diagnostics */

typedef struct {
    RunDiagPlan plan;             /* which steps measure what (train/run_diag.h) */
    LayerDiag* layers;            /* [L] */
    char* json;                   /* diag_json_bytes(L) */
    int pending;                  /* json holds this step's record, not yet logged */
    double pending_ms;            /* its wall time (captures excluded) */
    double sum_ms;                /* over every measured step */
    int measured_steps;
    DiagWarn warn;                /* --warn-rho, --warn-dq-err: what this step's record crossed */
} CpuDiag;

/* The diagnostics of one step, after backward (the activations are the last
   micro-batch's) and after the gauge arm, before clipping and the optimizer:
   per-layer attention statistics and gradient/key-bias norms (diag step), one
   layer's backward replayed against the fp64 reference (probe step, round
   robin over layers), the attention captures asked for at this step. Reads
   the model only; writes the capture files now and leaves the "diag" record
   in d->json for log_diagnostics (after the step record, as the GPU trainer). */
static void run_diagnostics(CpuDiag* d, GPTCpu* model, AttnMode mode, int step, const char* out_dir) {
    const GPTConfig* cfg = &model->config;
    const int L = cfg->num_layers, NH = cfg->num_heads, HS = cfg->channels / cfg->num_heads;
    const AttnShape shape = {.B = model->cur_B, .NH = NH, .T = model->cur_T, .HS = HS};
    const RunDiagStep what = run_diag_step(&d->plan, step, L);
    d->pending = 0;
    if (what.diag || what.probe_layer >= 0) {
        const double t0 = runlog_now_s();
        diag_layers_clear(d->layers, L);
        if (what.diag) {
            for (int l = 0; l < L; l++)
                diag_attention_cpu(gpt_cpu_attn_qkv(model, l), shape.B, shape.T, NH, HS,
                                   DIAG_DEFAULT_ROWS_PER_HEAD, &d->layers[l]);
            diag_params_cpu(cfg, model->params_info, model->params, model->grads, d->layers, NULL);
        }
        DiagProbe probe;
        diag_probe_clear(&probe);
        if (what.probe_layer >= 0) {
            const int pl = what.probe_layer;
            diag_probe_cpu(mode, model->attn_opt, ATTN_IO_FP32, shape, pl, gpt_cpu_attn_qkv(model, pl),
                           gpt_act_ptr(model, model->acts, A_ATTY, pl),
                           gpt_act_ptr(model, model->acts, A_ATT_STATS, pl),
                           gpt_act_ptr(model, model->grads_acts, A_ATTY, pl), NULL, NULL, &probe);
        }
        diag_write_json(d->json, diag_json_bytes(L), d->layers, L, &probe);
        diag_warn_check(&d->warn, d->layers, L, &probe);
        d->pending_ms = 1000.0 * (runlog_now_s() - t0);
        d->pending = 1;
        d->sum_ms += d->pending_ms;
        d->measured_steps++;
    }
    if (what.capture)
        for (int l = 0; l < L; l++)
            if (diag_capture_wanted(&d->plan.capture, step, l))
                diag_capture_write_cpu(out_dir, step, l, mode, shape, gpt_cpu_attn_qkv(model, l),
                                       gpt_act_ptr(model, model->acts, A_ATTY, l),
                                       gpt_act_ptr(model, model->acts, A_ATT_STATS, l),
                                       gpt_act_ptr(model, model->grads_acts, A_ATTY, l));
}

/* The step's "diag" record and warnings (runlog_diag) when this step measured anything; a warning also goes
   to the run driver (--checkpoint-on-warning). */
static void log_diagnostics(CpuDiag* d, int step, RunDriver* run) {
    if (!d->pending) return;
    runlog_diag(&run->log, step, d->json, d->pending_ms, &d->warn);
    if (d->warn.num_pending > 0) run_driver_note_warning(run, step);
    d->pending = 0;
}

/* ---------------------------------------------------------------- main */

int main(int argc, char** argv) {
    char err[2048];
    /* CPU-sized defaults (the table's are the GPU trainer's). */
    const struct { FlagId id; const char* value; } cpu_defaults[] = {
        {FLAG_MODEL, "tiny"},       {FLAG_BATCH_SIZE, "4"},     {FLAG_STEPS, "200"},
        {FLAG_LR, "1e-3"},          {FLAG_VAL_EVERY, "50"},     {FLAG_VAL_BATCHES, "10"},
        {FLAG_SAMPLE_EVERY, "100"}, {FLAG_SAMPLE_TOKENS, "32"}, {FLAG_LOG_EVERY, "10"},
    };
    for (size_t i = 0; i < sizeof(cpu_defaults) / sizeof(cpu_defaults[0]); i++)
        if (flags_set_default(cpu_defaults[i].id, cpu_defaults[i].value, err, sizeof(err)) != 0) die("%s", err);
    TrainFlags f;
    flags_init(&f);
    int rc = flags_parse(&f, argc, argv, err, sizeof(err));
    if (rc == 1) {
        flags_print_help(stdout, PROGRAM,
                         "GPT-2 pretraining on the CPU (the reference trainer; see docs/training.md).", 0);
        return 0;
    }
    if (rc != 0) run_flag_error(PROGRAM, err);
    if (flags_reject_gpu_only(&f, PROGRAM, err, sizeof(err)) != 0) run_flag_error(PROGRAM, err);

    /* ---- run folder, model source, batch arithmetic, diagnostics flags (train/run_driver.c, run_diag.h) ---- */
    RunDriver run;
    run_driver_init(&run, PROGRAM, argc, argv, &f, 1);
    run_driver_load_model(&run);
    const GPTConfig cfg = run.cfg;
    const AttnMode attn_mode = run.attn_mode;
    run_driver_batch(&run, 1);
    const int B = run.B, T = run.T;
    const int grad_accum = run.grad_accum;
    const int64_t total_tokens = run.tokens_per_step;
    CpuDiag diag;
    memset(&diag, 0, sizeof(diag));
    run_diag_plan(&run, &diag.plan);
    diag_warn_init(&diag.warn, f.warn_rho, f.warn_dq_err, attn_mode);
    diag_warn_set_trained_under(&diag.warn, run.attn_switched_from, run.attn_switch_step);

    GPTCpu model;
    gpt_cpu_init(&model, &cfg, B, T, attn_mode);
    model.attn_opt.tile_max_shift = f.attn_tile_max_shift;
    const size_t n = model.num_params;
    if (run.params) {
        memcpy(model.params, run.params, n * sizeof(float));
        free(run.params);
        run.params = NULL;
    } else {
        gpt_cpu_init_weights(&model, f.seed);
    }

    /* ---- data ---- */
    DataLoader *train, *val;
    run_driver_open_data(&run, 0, &train, &val);
    int val_batches = f.val_batches;
    if (val) {
        int64_t avail = dataloader_batches_per_epoch(val);
        if (val_batches > avail) {
            printf("note: --val-batches %d lowered to %lld (all the validation data)\n", val_batches,
                   (long long)avail);
            val_batches = (int)avail;
        }
    }
    Tokenizer* tok = NULL;
    if (f.vocab[0] && tokenizer_load(&tok, f.vocab, err, sizeof(err)) != 0) {
        if (flags_was_set(&f, FLAG_VOCAB)) die("--vocab: %s", err);
        printf("note: samples are printed as token ids (%s)\n", err);
        tok = NULL;
    }
    int sample_tokens = f.sample_tokens;
    if (f.sample_every > 0 && sample_tokens > T - 1) {
        printf("note: --sample-tokens %d lowered to %d (a sample must fit the sequence length %d after its "
               "<|endoftext|>)\n", sample_tokens, T - 1, T);
        sample_tokens = T - 1;
    }

    /* ---- optimizer and run state ---- */
    float* m = (float*)callocCheck(n, sizeof(float));
    float* v = (float*)callocCheck(n, sizeof(float));
    int64_t adam_t = 0, tokens_seen = 0;
    SamplerRng rng;
    sampler_seed(&rng, f.seed);
    ResumeState run_shape;
    run_driver_state_shape(&run, n, &run_shape);
    run_driver_check_resume(&run, &run_shape);
    run_driver_restore(&run, train, &rng, &adam_t, &tokens_seen);
    if (run.resuming) {
        memcpy(m, run.saved.m, n * sizeof(float));
        memcpy(v, run.saved.v, n * sizeof(float));
        run_driver_release_saved(&run);
    }
    const int start_step = run.start_step;

    /* ---- log and banner ---- */
    run_driver_start(&run, val != NULL);
    RunLog* log = &run.log;
    const char* out_dir = run.out_dir;
    const LRSchedule sched = run.sched;
    char shape[256];
    describe_config(&cfg, n, shape, sizeof(shape));
    char options[256];
    gpt_config_describe_options(&cfg, options, sizeof(options));
    printf("+-- " PROGRAM ": GPT pretraining on the CPU\n");
    printf("| model      %s\n|            %s\n|            options: %s\n", shape, run.model_source,
           options[0] ? options : "GPT-2's (learned positions, LayerNorm, GELU 4C, biases, tied head)");
    printf("| train data %s: %d shard(s), %lld tokens, %lld batches per epoch, shuffle %d (seed %llu)\n",
           f.train_data, dataloader_num_shards(train), (long long)dataloader_num_tokens(train),
           (long long)dataloader_batches_per_epoch(train), f.shuffle, (unsigned long long)f.seed);
    if (val) printf("| val data   %s: %lld tokens, %d batches per evaluation, every %d steps and at the end\n",
                    f.val_data, (long long)dataloader_num_tokens(val), val_batches, f.val_every);
    else printf("| val data   none\n");
    printf("| batch      B %d x T %d = %d tokens per micro-batch, x %d accumulation = %lld tokens per step\n", B, T,
           B * T, grad_accum, (long long)total_tokens);
    printf("| steps      %d to %d (%lld tokens)\n", start_step, f.steps,
           (long long)(f.steps - start_step) * total_tokens);
    printf("| schedule   %s, peak lr %g, warmup %d steps, floor %g x lr\n", schedule_name(sched.kind), f.lr,
           f.warmup_steps, f.min_lr_frac);
    printf("| optimizer  AdamW beta1 %g beta2 %g eps %g, weight decay %g (2-D weights), grad clip %g\n", f.beta1,
           f.beta2, f.adam_eps, f.weight_decay, f.grad_clip);
    printf("| attention  %s%s\n", attn_mode_name(attn_mode), f.attn_tile_max_shift ? " + tile-max shift" : "");
    const RunDiagPlan* plan = &diag.plan;
    if (plan->diag_every > 0 || plan->probe_every > 0 || plan->capture.num_steps > 0 || f.zero_key_bias_grad)
        printf("| diagnostics every %d steps | probe (fp64 reference) every %d steps | %d capture step(s) | gauge "
               "arm (--zero-key-bias-grad) %s\n", plan->diag_every, plan->probe_every, plan->capture.num_steps,
               f.zero_key_bias_grad ? "on" : "off");
    char minutes[64] = "";
    if (f.checkpoint_minutes > 0)
        snprintf(minutes, sizeof(minutes), ", every %g minutes of wall time", f.checkpoint_minutes);
    printf("| run folder %s (log.jsonl; checkpoints %s%s, and on SIGTERM/SIGINT/SIGHUP)\n", out_dir,
           f.checkpoint_every ? "every --checkpoint-every steps and at the end" : "at the end", minutes);
    printf("| threads    %d (OpenMP)\n| all flags:\n", omp_get_max_threads());
    flags_print_settings(stdout, &f, 0);
    printf("+--\n");
    fflush(stdout);

    FILE* lf = runlog_begin(log, run.resuming ? "resume" : "config");
    if (lf) {
        fprintf(lf, ", \"start_step\": %d, \"program\": \"" PROGRAM "\", \"model_config\": {\"max_seq_len\": %d, "
                "\"vocab_size\": %d, \"padded_vocab_size\": %d, \"num_layers\": %d, \"num_heads\": %d, "
                "\"channels\": %d, \"num_params\": %zu}, \"B\": %d, \"T\": %d, \"grad_accum\": %d, "
                "\"tokens_per_step\": %lld, \"world_size\": 1, \"flags\": {",
                start_step, cfg.max_seq_len, cfg.vocab_size, cfg.padded_vocab_size, cfg.num_layers, cfg.num_heads,
                cfg.channels, n, B, T, grad_accum, (long long)total_tokens);
        flags_write_json(lf, &f);
        fputs("}", lf);
        if (run.resuming) {
            fputs(", \"state\": ", lf);
            json_write_string(lf, run.state_path);
        }
    }
    runlog_end(log);

    /* ---- training loop ---- */
    int* inputs = (int*)mallocCheck((size_t)B * T * sizeof(int));
    int* targets = (int*)mallocCheck((size_t)B * T * sizeof(int));
    int* sample_ids = (int*)mallocCheck((size_t)(T + 1) * sizeof(int));
    char* sample_text = (char*)mallocCheck(65536);
    SaveArgs save = {&f, &model, m, v, 0, 0, &run_shape, &rng, train};
    double ema_step_s = -1.0;
    diag.layers = (LayerDiag*)mallocCheck((size_t)cfg.num_layers * sizeof(LayerDiag));
    diag.json = (char*)mallocCheck(diag_json_bytes(cfg.num_layers));
    double last_val = NAN;
    for (int step = start_step;; step++) {
        /* one process: its own signal and clock are the agreed ones */
        double flags_now[RUN_POLL_FLAGS];
        run_driver_poll(&run, flags_now);
        run_driver_agree(&run, flags_now);
        const int what = run_driver_boundary(&run, step);
        if (what & RUN_SAVE) {
            save.adam_t = adam_t;
            save.tokens_seen = tokens_seen;
            run_driver_save(&run, step, save_checkpoint, &save);
        }
        if (what & RUN_INTERRUPT) run_driver_interrupt(&run, step); /* exits */
        if (what & RUN_STOP_AT) {
            run_driver_stop_at(&run, step);
            return 0;
        }
        if (what & RUN_EVAL) {
            last_val = evaluate(&model, val, val_batches, inputs, targets);
            runlog_eval(log, step, last_val, val_batches);
            printf("val loss %.6f (step %d, %d batches)\n", last_val, step, val_batches);
        }
        if (what & RUN_SAMPLE) {
            int got = generate(&model, &rng, sample_ids, sample_tokens, f.sample_temperature);
            sampler_decode(tok, sample_ids + 1, got, sample_text, 65536);
            runlog_sample(log, step, sample_text, sample_ids + 1, got);
            printf("sample (step %d): %s\n---\n", step, sample_text);
        }
        if (what & RUN_LAST) break;

        const double t0 = runlog_now_s();
        gpt_cpu_zero_grad(&model);
        double loss = 0.0;
        for (int micro = 0; micro < grad_accum; micro++) {
            if (dataloader_next(train, inputs, targets, err, sizeof(err)) != 0) die("training data: %s", err);
            gpt_cpu_forward(&model, inputs, targets, B, T);
            loss += model.mean_loss;
            gpt_cpu_backward(&model);
        }
        loss /= grad_accum;
        if (grad_accum > 1) {
            const float scale = 1.0f / (float)grad_accum;
            for (size_t i = 0; i < n; i++) model.grads[i] *= scale;
        }
        /* the gauge arm: the key bias's exact gradient is zero; drop the rounding noise before Adam sees it */
        if (f.zero_key_bias_grad) diag_zero_key_bias_grad_cpu(&cfg, model.params_info, model.grads);
        const float norm = grad_global_norm_cpu(model.grads, n);
        /* diagnostics read the gradients before clipping and the weights before the update (as the GPU trainer) */
        run_diagnostics(&diag, &model, attn_mode, step, out_dir);
        /* divergence stops here (nothing of this step is applied); --skip-update-z may skip the update */
        const int skip = run_driver_check_step(&run, step, loss, norm);
        const double lr = schedule_lr(&sched, step);
        if (!skip) {
            grad_clip_cpu(model.grads, n, norm, f.grad_clip);
            AdamWParams hp = {(float)lr, f.beta1, f.beta2, f.adam_eps, f.weight_decay};
            adam_t++;
            adamw_cpu_step(model.params, model.grads, m, v, n, (int)adam_t, hp, model.params_info);
        }
        tokens_seen += total_tokens;
        const double dt = runlog_now_s() - t0;
        ema_step_s = ema_step_s < 0 ? dt : 0.9 * ema_step_s + 0.1 * dt;
        StepRecord rec = {step, f.steps, loss, lr, norm, (double)total_tokens / dt, 1000.0 * dt, f.attn};
        runlog_step(log, &rec);
        log_diagnostics(&diag, step, &run);
        if (run_driver_log_due(&run, step))
            runlog_console_step(stdout, &rec, ema_step_s * (f.steps - step - 1));
    }
    run_driver_done(&run, f.steps, last_val);
    if (diag.measured_steps > 0)
        printf("diagnostics: %.1f ms per measured step (%d steps; captures not counted)\n",
               diag.sum_ms / diag.measured_steps, diag.measured_steps);

    free(diag.layers);
    free(diag.json);
    free(sample_text);
    free(sample_ids);
    free(inputs);
    free(targets);
    free(m);
    free(v);
    tokenizer_free(tok);
    dataloader_close(train);
    dataloader_close(val);
    gpt_cpu_free(&model);
    return 0;
}
