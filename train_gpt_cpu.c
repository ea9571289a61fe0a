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
 *   1. checkpoint (model_S.bin + state_S.bin) if due, and not at the resume point
 *   2. validation loss if due                 (touches no training state)
 *   3. sample if due                          (advances only the sampler RNG)
 *   4. stop if step == steps
 *   5. one optimizer step: grad_accum micro-batches (forward + backward),
 *      grads averaged, [gauge arm: key-bias gradient zeroed], global norm,
 *      [diagnostics, probe, captures: read-only], clip, lr from the schedule,
 *      AdamW.
 * The state saved at (1) is the state before (2)-(5) of that step, so a run
 * resumed from it replays exactly the same sequence. The diagnostics
 * (--diag-every, --probe-every, --capture-attn; model/diagnostics.h,
 * docs/diagnostics.md) only read the model's buffers and write the log and
 * capture files: they touch no weights, gradients, RNG or data position, so
 * a run with them on trains bit-identically to one without.
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
#include "train/runlog.h"
#include "train/sampler.h"
#include "train/schedule.h"

#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define PROGRAM "train_gpt_cpu"
#define PATH_CAP 4096
#define SAMPLE_TEMPERATURE 1.0f

/* ---------------------------------------------------------------- run folder */

/* mkdir -p; dies naming the folder. */
static void make_dirs(const char* path) {
    char buf[PATH_CAP];
    snprintf(buf, sizeof(buf), "%s", path);
    for (char* p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char saved = *p;
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                die("cannot create the folder '%s': %s\n  hint: choose another --out-dir", buf, strerror(errno));
            *p = saved;
            if (saved == '\0') break;
        }
    }
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        die("--out-dir '%s' exists but is not a folder\n  hint: choose another --out-dir", path);
}

/* Is name one of the files a run writes: log.jsonl, model_NNNNNNNN.bin, state_NNNNNNNN.bin (8 digits),
   or a .tmp of those? Nothing else in the folder is ever counted or deleted. */
static int is_run_file(const char* name) {
    if (strcmp(name, "log.jsonl") == 0) return 1;
    if (strncmp(name, "model_", 6) != 0 && strncmp(name, "state_", 6) != 0) return 0;
    for (int i = 6; i < 14; i++)
        if (name[i] < '0' || name[i] > '9') return 0;
    return strcmp(name + 14, ".bin") == 0 || strcmp(name + 14, ".bin.tmp") == 0;
}

/* Counts (and with remove_them deletes) the run files in dir. */
static int run_files_in(const char* dir, int remove_them) {
    DIR* d = opendir(dir);
    if (d == NULL) return 0;
    int count = 0;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        if (!is_run_file(e->d_name)) continue;
        count++;
        if (remove_them) {
            char p[PATH_CAP];
            snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
            if (remove(p) != 0) die("cannot delete '%s' for --overwrite: %s", p, strerror(errno));
        }
    }
    closedir(d);
    return count;
}

/* ---------------------------------------------------------------- helpers */

static void fatal_flag(const char* msg) {
    fflush(stdout);
    fprintf(stderr, "error: %s\n  (run '" PROGRAM " --help' for every flag)\n", msg);
    exit(2);
}

static uint64_t params_digest(const float* params, size_t n) {
    return resume_hash(params, n * sizeof(float), RESUME_HASH_INIT);
}

static void describe_config(const GPTConfig* c, size_t num_params, char* buf, size_t n) {
    snprintf(buf, n, "L%d C%d NH%d (head size %d), context %d, vocab %d (padded %d), %zu parameters",
             c->num_layers, c->channels, c->num_heads, c->channels / c->num_heads, c->max_seq_len, c->vocab_size,
             c->padded_vocab_size, num_params);
}

static int same_config(const GPTConfig* a, const GPTConfig* b) {
    return a->max_seq_len == b->max_seq_len && a->vocab_size == b->vocab_size &&
           a->padded_vocab_size == b->padded_vocab_size && a->num_layers == b->num_layers &&
           a->num_heads == b->num_heads && a->channels == b->channels;
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

/* Generates up to n tokens after <|endoftext|> into ids (n+1 slots; ids[0] = EOT); returns the count. */
static int generate(GPTCpu* model, SamplerRng* rng, int* ids, int n) {
    const GPTConfig* c = &model->config;
    ids[0] = GPT2_EOT_TOKEN;
    int len = 1;
    for (int i = 0; i < n && len < model->T; i++) {
        gpt_cpu_forward(model, ids, NULL, 1, len);
        const gpt_real* row = model->logits + (size_t)(len - 1) * (size_t)c->padded_vocab_size;
        int next = sampler_draw(row, c->vocab_size, SAMPLE_TEMPERATURE, rng);
        if (next < 0) break; /* no finite logit: nothing sensible to draw */
        ids[len++] = next;
    }
    return len - 1;
}

typedef struct {
    const char* out_dir;
    const TrainFlags* flags;
    const GPTCpu* model;
    const float* m;
    const float* v;
    int64_t adam_t, tokens_seen;
    int grad_accum;
    AttnMode attn_mode;
    const SamplerRng* rng;
    DataLoader* train;
} SaveArgs;

/* model_S.bin, then state_S.bin (the state names its model by the step, and a
   resume starts from the newest state, so a crash between the two is harmless). */
static void save_checkpoint(const SaveArgs* a, int64_t step, RunLog* log) {
    char model_path[PATH_CAP], state_path[PATH_CAP], err[1024];
    run_file_path(model_path, sizeof(model_path), a->out_dir, "model", step);
    run_file_path(state_path, sizeof(state_path), a->out_dir, "state", step);
    const int bf16 = strcmp(a->flags->checkpoint_dtype, "bf16") == 0;
    if (checkpoint_write_model(model_path, &a->model->config, a->model->params, bf16, err, sizeof(err)) != 0)
        die("saving the model at step %lld failed: %s\n  hint: earlier checkpoints in %s are intact; free disk "
            "space, then continue with --resume", (long long)step, err, a->out_dir);
    ResumeState s;
    memset(&s, 0, sizeof(s));
    s.step = step;
    s.adam_t = a->adam_t;
    s.tokens_seen = a->tokens_seen;
    s.config = a->model->config;
    s.config_hash = gpt_config_hash(&s.config);
    s.batch_size = a->model->B;
    s.seq_len = a->model->T;
    s.grad_accum = a->grad_accum;
    s.world_size = 1;
    s.shuffle = a->flags->shuffle;
    s.attn_mode = (int32_t)a->attn_mode;
    s.attn_tile_max_shift = a->flags->attn_tile_max_shift;
    s.zero_key_bias_grad = a->flags->zero_key_bias_grad;
    s.seed = a->flags->seed;
    s.rng_state = a->rng->state;
    if (bf16) { /* the digest of the weights as saved (rounded), which a --resume reads back */
        float* rounded = (float*)mallocCheck(a->model->num_params * sizeof(float));
        for (size_t i = 0; i < a->model->num_params; i++) rounded[i] = bf16_round(a->model->params[i]);
        s.params_hash = params_digest(rounded, a->model->num_params);
        free(rounded);
    } else {
        s.params_hash = params_digest(a->model->params, a->model->num_params);
    }
    s.data_pos = dataloader_position(a->train);
    s.num_params = a->model->num_params;
    s.m = (float*)a->m;
    s.v = (float*)a->v;
    if (resume_state_write(state_path, &s, err, sizeof(err)) != 0)
        die("saving the resume state at step %lld failed: %s\n  hint: earlier checkpoints in %s are intact; free "
            "disk space, then continue with --resume", (long long)step, err, a->out_dir);
    FILE* f = runlog_begin(log, "checkpoint");
    if (f) {
        fprintf(f, ", \"step\": %lld, \"model\": ", (long long)step);
        json_write_string(f, model_path);
        fputs(", \"state\": ", f);
        json_write_string(f, state_path);
    }
    runlog_end(log);
    printf("checkpoint: %s + %s\n", model_path, state_path);
}

/* ---------------------------------------------------------------- diagnostics */

typedef struct {
    int diag_every, probe_every;  /* 0: never */
    DiagCaptureSpec capture;
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
    const int diag_step = d->diag_every > 0 && step % d->diag_every == 0;
    const int probe_step = d->probe_every > 0 && step % d->probe_every == 0;
    d->pending = 0;
    if (diag_step || probe_step) {
        const double t0 = runlog_now_s();
        diag_layers_clear(d->layers, L);
        if (diag_step) {
            for (int l = 0; l < L; l++)
                diag_attention_cpu(gpt_act_ptr(model, model->acts, A_QKV, l), shape.B, shape.T, NH, HS,
                                   DIAG_DEFAULT_ROWS_PER_HEAD, &d->layers[l]);
            diag_params_cpu(cfg, model->params_info, model->params, model->grads, d->layers, NULL);
        }
        DiagProbe probe;
        diag_probe_clear(&probe);
        if (probe_step) {
            const int pl = (step / d->probe_every) % L;
            diag_probe_cpu(mode, model->attn_opt, ATTN_IO_FP32, shape, pl, gpt_act_ptr(model, model->acts, A_QKV, pl),
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
    if (diag_capture_step_wanted(&d->capture, step))
        for (int l = 0; l < L; l++)
            if (diag_capture_wanted(&d->capture, step, l))
                diag_capture_write_cpu(out_dir, step, l, mode, shape, gpt_act_ptr(model, model->acts, A_QKV, l),
                                       gpt_act_ptr(model, model->acts, A_ATTY, l),
                                       gpt_act_ptr(model, model->acts, A_ATT_STATS, l),
                                       gpt_act_ptr(model, model->grads_acts, A_ATTY, l));
}

/* {"event": "diag", "step": S, <diag_write_json body>, "diag_ms": ...} when this step measured anything. */
static void log_diagnostics(CpuDiag* d, int step, RunLog* log) {
    if (!d->pending) return;
    FILE* df = runlog_begin(log, "diag");
    if (df) {
        fprintf(df, ", \"step\": %d, %s, \"diag_ms\": ", step, d->json);
        runlog_write_number(df, d->pending_ms);
    }
    runlog_end(log);
    for (int i = 0; i < d->warn.num_pending; i++) {  /* {"event": "attn_warning", ...} after the diag record */
        char msg[1024], body[512];
        diag_warning_text(&d->warn, i, step, msg, sizeof(msg), body, sizeof(body));
        printf("%s\n", msg);
        FILE* wf = runlog_begin(log, "attn_warning");
        if (wf) fprintf(wf, ", %s", body);
        runlog_end(log);
    }
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
    if (rc != 0) fatal_flag(err);
    if (flags_reject_gpu_only(&f, PROGRAM, err, sizeof(err)) != 0) fatal_flag(err);

    AttnMode attn_mode;
    if (attn_mode_parse(f.attn, &attn_mode) != 0) fatal_flag("--attn: unknown mode");
    ScheduleKind sched_kind;
    if (schedule_parse(f.schedule, &sched_kind) != 0) fatal_flag("--schedule: unknown schedule");
    const int resuming = f.resume[0] != '\0';
    if (resuming && f.overwrite) fatal_flag("--resume continues a run and --overwrite starts one over: give one");
    if (resuming && f.init_from[0]) fatal_flag("--resume takes its weights from the run folder: drop --init-from");
    if (f.init_from[0] && flags_was_set(&f, FLAG_MODEL))
        fatal_flag("--init-from sets the model shape from the checkpoint: drop --model");

    /* ---- run folder ---- */
    char out_dir[PATH_CAP], state_path[PATH_CAP] = "";
    if (resuming && strcmp(f.resume, "latest") != 0) {
        snprintf(state_path, sizeof(state_path), "%s", f.resume);
        if (f.out_dir[0]) {
            snprintf(out_dir, sizeof(out_dir), "%s", f.out_dir);
        } else { /* the state's own folder */
            snprintf(out_dir, sizeof(out_dir), "%s", f.resume);
            char* slash = strrchr(out_dir, '/');
            if (slash) *slash = '\0';
            else snprintf(out_dir, sizeof(out_dir), ".");
        }
    } else if (f.out_dir[0]) {
        snprintf(out_dir, sizeof(out_dir), "%s", f.out_dir);
    } else if (resuming) {
        fatal_flag("--resume (latest) needs --out-dir: the run folder to continue");
    } else {
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        char stamp[64];
        strftime(stamp, sizeof(stamp), "%Y%m%d_%H%M%S", &tmv);
        snprintf(out_dir, sizeof(out_dir), "runs/run_%s", stamp);
        for (int k = 2; access(out_dir, F_OK) == 0; k++) snprintf(out_dir, sizeof(out_dir), "runs/run_%s_%d", stamp, k);
    }
    /* The folder is created (and with --overwrite emptied of the old run) only once every
       setting has been checked, so a refused command line changes nothing on disk. */
    const int existing = resuming ? 0 : run_files_in(out_dir, 0);
    if (existing > 0 && !f.overwrite)
        die("the run folder '%s' already holds a run (%d log/checkpoint files)\n  hint: continue it with "
            "--resume, start over in it with --overwrite (deletes those files), or choose another --out-dir",
            out_dir, existing);
    if (resuming && state_path[0] == '\0') {
        int64_t latest;
        if (access(out_dir, F_OK) != 0)
            die("--resume: the run folder '%s' does not exist: nothing to continue\n  hint: check --out-dir, or "
                "drop --resume to start a new run there", out_dir);
        int found = run_find_latest_state(out_dir, state_path, sizeof(state_path), &latest, err, sizeof(err));
        if (found < 0) die("--resume: %s", err);
        if (found > 0)
            die("--resume: no state_NNNNNNNN.bin in '%s': nothing to continue\n  hint: drop --resume to start a new "
                "run, or pass the state file's path to --resume", out_dir);
    }

    /* ---- model shape and initial weights ---- */
    GPTConfig cfg;
    float* loaded_params = NULL;
    ResumeState saved;
    memset(&saved, 0, sizeof(saved));
    char model_source[PATH_CAP + 64];
    if (resuming) {
        if (resume_state_read(state_path, &saved, err, sizeof(err)) != 0) die("--resume: %s", err);
        char model_path[PATH_CAP], dir[PATH_CAP];
        snprintf(dir, sizeof(dir), "%s", state_path);
        char* slash = strrchr(dir, '/');
        if (slash) *slash = '\0';
        else snprintf(dir, sizeof(dir), ".");
        run_file_path(model_path, sizeof(model_path), dir, "model", saved.step);
        if (checkpoint_read_model(model_path, &cfg, &loaded_params, err, sizeof(err)) != 0)
            die("--resume: the model saved with %s cannot be read: %s\n  hint: resume from an older "
                "state_NNNNNNNN.bin in the same folder", state_path, err);
        if (!same_config(&cfg, &saved.config) ||
            params_digest(loaded_params, gpt_num_parameters(&cfg)) != saved.params_hash)
            die("--resume: %s is not the model saved with %s (shape or weights differ)\n  hint: both files must "
                "come from the same checkpoint step of the same run", model_path, state_path);
        if (flags_was_set(&f, FLAG_MODEL)) {
            GPTConfig asked;
            if (gpt_config_from_descriptor(f.model, &asked, err, sizeof(err)) != 0) fatal_flag(err);
            if (!same_config(&asked, &cfg))
                fatal_flag("--model differs from the model of the run being resumed: drop --model");
        }
        snprintf(model_source, sizeof(model_source), "resumed from %s (step %lld)", model_path,
                 (long long)saved.step);
    } else if (f.init_from[0]) {
        if (checkpoint_read_model(f.init_from, &cfg, &loaded_params, err, sizeof(err)) != 0)
            die("--init-from: %s", err);
        snprintf(model_source, sizeof(model_source), "weights from %s", f.init_from);
    } else {
        if (gpt_config_from_descriptor(f.model, &cfg, err, sizeof(err)) != 0) {
            char msg[2200];
            snprintf(msg, sizeof(msg), "--model: %s", err);
            fatal_flag(msg);
        }
        snprintf(model_source, sizeof(model_source), "preset %s, initialised with seed %llu", f.model,
                 (unsigned long long)f.seed);
    }
    if (gpt_config_validate(&cfg, err, sizeof(err)) != 0) die("model shape: %s", err);
    const int B = f.batch_size;
    const int T = f.seq_len > 0 ? f.seq_len : cfg.max_seq_len;
    if (T > cfg.max_seq_len) {
        snprintf(err, sizeof(err), "--seq-len %d is longer than the model's context (%d)", T, cfg.max_seq_len);
        fatal_flag(err);
    }
    const int64_t total_tokens = f.total_batch_tokens > 0 ? f.total_batch_tokens : (int64_t)B * T;
    char accum_err[512];
    int64_t accum64 = dist_grad_accum_steps(total_tokens, B, T, 1, accum_err, sizeof(accum_err));
    if (accum64 < 1) {
        snprintf(err, sizeof(err), "--total-batch-tokens: %s", accum_err);
        fatal_flag(err);
    }
    const int grad_accum = (int)accum64;
    if (f.attn_tile_max_shift && attn_mode != ATTN_REPAIR)
        fatal_flag("--attn-tile-max-shift 1 is an arm of --attn repair only (it conflicts with the other modes)");

    /* Diagnostics (as in the GPU trainer): the probe runs with --diag-every unless --probe-every is given. */
    CpuDiag diag;
    memset(&diag, 0, sizeof(diag));
    diag.diag_every = f.diag_every;
    diag.probe_every = flags_was_set(&f, FLAG_PROBE_EVERY) ? f.probe_every : f.diag_every;
    diag_warn_init(&diag.warn, f.warn_rho, f.warn_dq_err, attn_mode);
    if (f.capture_attn[0] && (f.capture_steps[0] || f.capture_layers[0]))
        fatal_flag("--capture-attn and --capture-steps/--capture-layers say the same thing twice; give one of them");
    if ((f.capture_attn[0] ? diag_capture_spec_parse(f.capture_attn, cfg.num_layers, &diag.capture, err, sizeof(err))
                           : diag_capture_spec_from_flags(f.capture_steps, f.capture_layers, cfg.num_layers,
                                                          &diag.capture, err, sizeof(err))) != 0)
        fatal_flag(err);
    if (diag.capture.num_steps == 0 && f.capture_layers[0])
        fatal_flag("--capture-layers without --capture-steps captures nothing; add --capture-steps S1,S2,...");

    /* Attention mode on resume: the saved one unless --attn says otherwise. */
    if (resuming && !flags_was_set(&f, FLAG_ATTN)) {
        if (saved.attn_mode < 0 || saved.attn_mode >= ATTN_NUM_MODES) die("--resume: bad attention mode in state");
        attn_mode = (AttnMode)saved.attn_mode;
        f.attn = attn_mode_name(attn_mode);
        if (!flags_was_set(&f, FLAG_ATTN_TILE_MAX_SHIFT)) f.attn_tile_max_shift = saved.attn_tile_max_shift;
    }
    /* The gauge arm on resume: the saved one; a --zero-key-bias-grad that differs is refused. */
    if (resuming) {
        const int arm = resume_zero_key_bias_grad(&saved, f.zero_key_bias_grad,
                                                  flags_was_set(&f, FLAG_ZERO_KEY_BIAS_GRAD), err, sizeof(err));
        if (arm < 0) die("--resume %s: %s", state_path, err);
        f.zero_key_bias_grad = arm;
    }

    GPTCpu model;
    gpt_cpu_init(&model, &cfg, B, T, attn_mode);
    model.attn_opt.tile_max_shift = f.attn_tile_max_shift;
    const size_t n = model.num_params;
    if (loaded_params) {
        memcpy(model.params, loaded_params, n * sizeof(float));
        free(loaded_params);
    } else {
        gpt_cpu_init_weights(&model, f.seed);
    }

    /* ---- data ---- */
    DataLoader *train = NULL, *val = NULL;
    if (dataloader_open(&train, f.train_data, B, T, 0, 1, f.shuffle, f.seed, cfg.vocab_size, err, sizeof(err)) != 0)
        die("--train-data: %s\n  hint: 'make setup' creates the default shards; or point --train-data at llm.c "
            "shards", err);
    int val_batches = f.val_batches;
    if (f.val_data[0]) {
        if (dataloader_open(&val, f.val_data, B, T, 0, 1, 0, 0, cfg.vocab_size, err, sizeof(err)) != 0)
            die("--val-data: %s\n  hint: pass --val-data \"\" to train without validation", err);
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
    int start_step = 0;
    SamplerRng rng;
    sampler_seed(&rng, f.seed);
    if (resuming) {
        ResumeState cur;
        memset(&cur, 0, sizeof(cur));
        cur.config = cfg;
        cur.num_params = n;
        cur.batch_size = B;
        cur.seq_len = T;
        cur.grad_accum = grad_accum;
        cur.world_size = 1;
        cur.shuffle = f.shuffle;
        cur.seed = f.seed;
        if (resume_state_check(&saved, &cur, err, sizeof(err)) != 0) die("--resume %s: %s", state_path, err);
        if (dataloader_seek(train, &saved.data_pos, err, sizeof(err)) != 0)
            die("--resume: the saved data position does not fit --train-data: %s", err);
        memcpy(m, saved.m, n * sizeof(float));
        memcpy(v, saved.v, n * sizeof(float));
        adam_t = saved.adam_t;
        tokens_seen = saved.tokens_seen;
        rng.state = saved.rng_state;
        start_step = (int)saved.step;
        if (saved.attn_mode != (int32_t)attn_mode)
            printf("note: attention mode switched from %s (saved) to %s at step %d: from here on the run differs "
                   "from one that kept %s\n", attn_mode_name((AttnMode)saved.attn_mode), attn_mode_name(attn_mode),
                   start_step, attn_mode_name((AttnMode)saved.attn_mode));
        resume_state_free(&saved);
        if (start_step >= f.steps)
            die("--resume: the run already has %d steps and --steps is %d\n  hint: raise --steps to train longer",
                start_step, f.steps);
    }
    if (f.stop_at > 0 && (f.stop_at >= f.steps || f.stop_at <= start_step)) {
        snprintf(err, sizeof(err), "--stop-at %d must lie between the first step of this invocation (%d) and "
                 "--steps (%d)", f.stop_at, start_step, f.steps);
        fatal_flag(err);
    }

    /* ---- log and banner ---- */
    make_dirs(out_dir);
    if (existing > 0) {
        run_files_in(out_dir, 1);
        printf("--overwrite: deleted %d log/checkpoint files of the previous run in %s\n", existing, out_dir);
    }
    char log_path[PATH_CAP + 16];
    snprintf(log_path, sizeof(log_path), "%s/log.jsonl", out_dir);
    RunLog log;
    if (runlog_open(&log, log_path, resuming, err, sizeof(err)) != 0) die("%s", err);
    const LRSchedule sched = {sched_kind, f.lr, f.min_lr_frac, f.warmup_steps, f.steps};
    char shape[256];
    describe_config(&cfg, n, shape, sizeof(shape));
    printf("+-- " PROGRAM ": GPT-2 pretraining on the CPU\n");
    printf("| model      %s\n|            %s\n", shape, model_source);
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
    printf("| schedule   %s, peak lr %g, warmup %d steps, floor %g x lr\n", schedule_name(sched_kind), f.lr,
           f.warmup_steps, f.min_lr_frac);
    printf("| optimizer  AdamW beta1 %g beta2 %g eps %g, weight decay %g (2-D weights), grad clip %g\n", f.beta1,
           f.beta2, f.adam_eps, f.weight_decay, f.grad_clip);
    printf("| attention  %s%s\n", attn_mode_name(attn_mode), f.attn_tile_max_shift ? " + tile-max shift" : "");
    if (diag.diag_every > 0 || diag.probe_every > 0 || diag.capture.num_steps > 0 || f.zero_key_bias_grad)
        printf("| diagnostics every %d steps | probe (fp64 reference) every %d steps | %d capture step(s) | gauge "
               "arm (--zero-key-bias-grad) %s\n", diag.diag_every, diag.probe_every, diag.capture.num_steps,
               f.zero_key_bias_grad ? "on" : "off");
    printf("| run folder %s (log.jsonl; checkpoints %s)\n", out_dir,
           f.checkpoint_every ? "every --checkpoint-every steps and at the end" : "at the end");
    printf("| threads    %d (OpenMP)\n| all flags:\n", omp_get_max_threads());
    flags_print_settings(stdout, &f, 0);
    printf("+--\n");
    fflush(stdout);

    FILE* lf = runlog_begin(&log, resuming ? "resume" : "config");
    if (lf) {
        fprintf(lf, ", \"start_step\": %d, \"program\": \"" PROGRAM "\", \"model_config\": {\"max_seq_len\": %d, "
                "\"vocab_size\": %d, \"padded_vocab_size\": %d, \"num_layers\": %d, \"num_heads\": %d, "
                "\"channels\": %d, \"num_params\": %zu}, \"B\": %d, \"T\": %d, \"grad_accum\": %d, "
                "\"tokens_per_step\": %lld, \"world_size\": 1, \"flags\": {",
                start_step, cfg.max_seq_len, cfg.vocab_size, cfg.padded_vocab_size, cfg.num_layers, cfg.num_heads,
                cfg.channels, n, B, T, grad_accum, (long long)total_tokens);
        flags_write_json(lf, &f);
        fputs("}", lf);
        if (resuming) {
            fputs(", \"state\": ", lf);
            json_write_string(lf, state_path);
        }
    }
    runlog_end(&log);

    /* ---- training loop ---- */
    int* inputs = (int*)mallocCheck((size_t)B * T * sizeof(int));
    int* targets = (int*)mallocCheck((size_t)B * T * sizeof(int));
    int* sample_ids = (int*)mallocCheck((size_t)(T + 1) * sizeof(int));
    char* sample_text = (char*)mallocCheck(65536);
    SaveArgs save = {out_dir, &f, &model, m, v, 0, 0, grad_accum, attn_mode, &rng, train};
    double ema_step_s = -1.0;
    diag.layers = (LayerDiag*)mallocCheck((size_t)cfg.num_layers * sizeof(LayerDiag));
    diag.json = (char*)mallocCheck(diag_json_bytes(cfg.num_layers));
    int last_saved = resuming ? start_step : -1;
    double last_val = NAN;
    for (int step = start_step;; step++) {
        const int last = step == f.steps;
        /* --stop-at: checkpoint and end here; a --resume does the rest of the schedule. */
        const int stop_here = f.stop_at > 0 && step == f.stop_at;
        if (step != start_step &&
            (last || stop_here || (f.checkpoint_every > 0 && step % f.checkpoint_every == 0))) {
            save.adam_t = adam_t;
            save.tokens_seen = tokens_seen;
            save_checkpoint(&save, step, &log);
            last_saved = step;
        }
        if (stop_here) {
            FILE* pf = runlog_begin(&log, "stop");
            if (pf) fprintf(pf, ", \"step\": %d, \"reason\": \"--stop-at\"", step);
            runlog_end(&log);
            runlog_close(&log);
            printf("stopped at step %d (--stop-at); continue with: --resume --out-dir %s\n", step, out_dir);
            return 0;
        }
        if (val && (last || (f.val_every > 0 && step % f.val_every == 0))) {
            last_val = evaluate(&model, val, val_batches, inputs, targets);
            runlog_eval(&log, step, last_val, val_batches);
            printf("val loss %.6f (step %d, %d batches)\n", last_val, step, val_batches);
        }
        if (f.sample_every > 0 && step > 0 && (last || step % f.sample_every == 0)) {
            int got = generate(&model, &rng, sample_ids, sample_tokens);
            sampler_decode(tok, sample_ids + 1, got, sample_text, 65536);
            runlog_sample(&log, step, sample_text, sample_ids + 1, got);
            printf("sample (step %d): %s\n---\n", step, sample_text);
        }
        if (last) break;

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
        if (!isfinite(loss) || !isfinite(norm)) {
            FILE* sf = runlog_begin(&log, "stop");
            if (sf) {
                fprintf(sf, ", \"step\": %d, \"reason\": \"non-finite %s\"", step, isfinite(loss) ? "gradient" : "loss");
            }
            runlog_end(&log);
            char last_ckpt[PATH_CAP] = "none (no checkpoint was written in this run)";
            if (last_saved >= 0) run_file_path(last_ckpt, sizeof(last_ckpt), out_dir, "model", last_saved);
            die("step %d: the %s is %s; training stopped before updating the weights.\n"
                "  last good checkpoint: %s\n  hint: lower --lr or raise --warmup-steps, then --resume from it",
                step, isfinite(loss) ? "gradient norm" : "loss", isfinite(loss) ? "not finite" : "NaN or infinite",
                last_ckpt);
        }
        grad_clip_cpu(model.grads, n, norm, f.grad_clip);
        const double lr = schedule_lr(&sched, step);
        AdamWParams hp = {(float)lr, f.beta1, f.beta2, f.adam_eps, f.weight_decay};
        adam_t++;
        adamw_cpu_step(model.params, model.grads, m, v, n, (int)adam_t, hp, model.params_info);
        tokens_seen += total_tokens;
        const double dt = runlog_now_s() - t0;
        ema_step_s = ema_step_s < 0 ? dt : 0.9 * ema_step_s + 0.1 * dt;
        StepRecord rec = {step, f.steps, loss, lr, norm, (double)total_tokens / dt, 1000.0 * dt, f.attn};
        runlog_step(&log, &rec);
        log_diagnostics(&diag, step, &log);
        if (step == start_step || (step + 1) % f.log_every == 0 || step + 1 == f.steps)
            runlog_console_step(stdout, &rec, ema_step_s * (f.steps - step - 1));
    }
    FILE* sf = runlog_begin(&log, "stop");
    if (sf) {
        fprintf(sf, ", \"step\": %d, \"reason\": \"done\", \"val_loss\": ", f.steps);
        runlog_write_number(sf, last_val);
    }
    runlog_end(&log);
    runlog_close(&log);
    printf("done: %d steps; run folder %s\n", f.steps, out_dir);
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
