/*
 * train/run_driver.c - the run driver shared by both trainers (see run_driver.h):
 * run folder, resume, checkpoint schedule and retention, signals, divergence,
 * --skip-update-z and the final messages.
 */
#include "train/run_driver.h"

#include "common/utils.h"
#include "model/checkpoint.h"
#include "train/dist.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- signals */

static volatile sig_atomic_t g_signal = 0;  /* the first SIGTERM/SIGINT/SIGHUP received, 0: none */
static int g_exiting_together = 0;

static void write_stderr(const char* s) {
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = write(2, s, n);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

static const char* signal_name(int signo) {
    return signo == SIGINT ? "SIGINT" : signo == SIGTERM ? "SIGTERM" : signo == SIGHUP ? "SIGHUP" : "a signal";
}

/* Only async-signal-safe calls: remember the signal, say what happens next. Any thread (OpenMP's
   included) may take a signal, so the first one is claimed with a lock-free compare-and-swap. */
static void on_signal(int signo) {
    if (__sync_bool_compare_and_swap(&g_signal, 0, signo)) {
        write_stderr("\n");
        write_stderr(signal_name(signo));
        write_stderr(": finishing the current step, then saving a checkpoint and stopping\n");
    } else {
        write_stderr("\nalready stopping: the checkpoint is being written (SIGKILL aborts; the files already "
                     "on disk stay usable)\n");
    }
}

/* SIGTERM (schedulers), SIGINT (Ctrl-C) and SIGHUP (the terminal or ssh session closed; left ignored when the
   run was started under nohup) stop the run with a checkpoint. SIGXFSZ is ignored, so that a write past a
   file-size limit fails with EFBIG and gets the same clear error as a full disk instead of killing the run.
   SIGPIPE is ignored, so that a console pipe whose reader died (`| tee` killed by the same Ctrl-C) costs the
   console lines, not the run and its checkpoint. */
static void install_signal_handlers(void) {
    struct sigaction sa, old;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART; /* reads and writes in progress continue instead of failing with EINTR */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    if (sigaction(SIGHUP, NULL, &old) == 0 && old.sa_handler != SIG_IGN) sigaction(SIGHUP, &sa, NULL);
    signal(SIGXFSZ, SIG_IGN);
    signal(SIGPIPE, SIG_IGN);
}

int run_driver_exiting_together(void) { return g_exiting_together; }

/* ---------------------------------------------------------------- small helpers */

void run_flag_error(const char* program, const char* msg) {
    fflush(stdout);
    fprintf(stderr, "error: %s\n  (run '%s --help' for every flag)\n", msg, program);
    exit(2);
}

static void fatal_flag(const RunDriver* d, const char* msg) { run_flag_error(d->program, msg); }

static void copy_path(char* dst, const char* src) { snprintf(dst, RUN_PATH_CAP, "%s", src); }

/* dirname into dst ("." when path has no folder). */
static void dir_of(char* dst, const char* path) {
    copy_path(dst, path);
    char* slash = strrchr(dst, '/');
    if (slash == dst) dst[1] = '\0';
    else if (slash) *slash = '\0';
    else copy_path(dst, ".");
}

static void strip_trailing_slashes(char* p) {
    size_t n = strlen(p);
    while (n > 1 && p[n - 1] == '/') p[--n] = '\0';
}

static int is_dir(const char* path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int file_exists(const char* path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* mkdir -p; dies naming the folder. */
static void make_dirs(const char* path) {
    char buf[RUN_PATH_CAP];
    copy_path(buf, path);
    for (char* p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            const char saved = *p;
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                die("cannot create the folder '%s': %s\n  hint: choose another --out-dir", buf, strerror(errno));
            *p = saved;
            if (saved == '\0') break;
        }
    }
    if (!is_dir(path)) die("--out-dir '%s' exists but is not a folder\n  hint: choose another --out-dir", path);
}

int run_is_run_file(const char* name) {
    if (strcmp(name, "log.jsonl") == 0) return 1;
    if (strncmp(name, "model_", 6) != 0 && strncmp(name, "state_", 6) != 0) return 0;
    for (int i = 6; i < 14; i++)
        if (name[i] < '0' || name[i] > '9') return 0;
    return strcmp(name + 14, ".bin") == 0 || strcmp(name + 14, ".bin.tmp") == 0;
}

/* Counts (and with remove_them deletes) the run files in dir. */
static int run_files_in(const char* dir, int remove_them) {
    DIR* dp = opendir(dir);
    if (dp == NULL) return 0;
    int count = 0;
    struct dirent* e;
    while ((e = readdir(dp)) != NULL) {
        if (!run_is_run_file(e->d_name)) continue;
        count++;
        if (remove_them) {
            char p[RUN_PATH_CAP + 300];
            snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
            if (remove(p) != 0) die("cannot delete '%s' for --overwrite: %s", p, strerror(errno));
        }
    }
    closedir(dp);
    return count;
}

/* Steps that have both model_S.bin and state_S.bin in dir, at most max_step (max_step < 0: any):
   the newest into *newest (-1: none); returns how many. */
static int complete_checkpoints(const char* dir, int max_step, int* newest) {
    *newest = -1;
    DIR* dp = opendir(dir);
    if (dp == NULL) return 0;
    int count = 0;
    struct dirent* e;
    while ((e = readdir(dp)) != NULL) {
        const char* name = e->d_name;
        if (strlen(name) != 18 || strncmp(name, "state_", 6) != 0 || strcmp(name + 14, ".bin") != 0) continue;
        long long s = 0;
        int ok = 1;
        for (int i = 6; i < 14; i++) {
            if (name[i] < '0' || name[i] > '9') { ok = 0; break; }
            s = s * 10 + (name[i] - '0');
        }
        if (!ok || s > INT_MAX || (max_step >= 0 && s > max_step)) continue;
        char model[RUN_PATH_CAP];
        run_file_path(model, sizeof(model), dir, "model", s);
        if (!file_exists(model)) continue;
        count++;
        if ((int)s > *newest) *newest = (int)s;
    }
    closedir(dp);
    return count;
}

int run_newest_checkpoint(const char* dir, int max_step) {
    int newest;
    complete_checkpoints(dir, max_step, &newest);
    return newest;
}

void run_describe_checkpoints(const char* dir, char* buf, size_t n) {
    int newest;
    const int count = complete_checkpoints(dir, -1, &newest);
    if (count == 0) {
        snprintf(buf, n, "none (no model_/state_NNNNNNNN.bin pair in %s)", dir);
        return;
    }
    char state[RUN_PATH_CAP];
    run_file_path(state, sizeof(state), dir, "state", newest);
    snprintf(buf, n, "%s (newest of %d on disk)", state, count);
}

/* Appends s to buf, single-quoted for a POSIX shell when it holds anything but safe characters. */
static void append_quoted(char* buf, size_t n, const char* s) {
    size_t len = strlen(buf);
    int plain = *s != '\0';
    for (const char* p = s; *p; p++)
        if (!(isalnum((unsigned char)*p) || strchr("-_./=:,+@%", *p))) plain = 0;
    if (len > 0 && len + 1 < n) buf[len++] = ' ', buf[len] = '\0';
    if (plain) {
        snprintf(buf + len, n - len, "%s", s);
        return;
    }
    if (len + 1 < n) buf[len++] = '\'', buf[len] = '\0';
    for (const char* p = s; *p && len + 5 < n; p++) {
        if (*p == '\'') { memcpy(buf + len, "'\\''", 4); len += 4; }
        else buf[len++] = *p;
        buf[len] = '\0';
    }
    if (len + 1 < n) buf[len++] = '\'', buf[len] = '\0';
}

/* Flags the resume command leaves out, and whether each takes a value word. --stop-at goes too: the step it
   names is behind the continuation (which would refuse it); a later stop is the user's to add. */
static int dropped_flag(const char* arg, int* takes_value, int* optional) {
    static const struct { const char* name; int value, optional; } drop[] = {
        {"--resume", 1, 1},  {"--overwrite", 1, 2}, {"--init-from", 1, 0},
        {"--model", 1, 0},   {"--out-dir", 1, 0},   {"--stop-at", 1, 0},
    };
    for (size_t i = 0; i < sizeof(drop) / sizeof(drop[0]); i++) {
        const size_t k = strlen(drop[i].name);
        if (strncmp(arg, drop[i].name, k) != 0) continue;
        if (arg[k] == '=') { *takes_value = 0; *optional = 0; return 1; }
        if (arg[k] == '\0') { *takes_value = drop[i].value; *optional = drop[i].optional; return 1; }
    }
    return 0;
}

void run_resume_command(int argc, char** argv, const char* out_dir, const char* state, char* buf, size_t n) {
    buf[0] = '\0';
    append_quoted(buf, n, argc > 0 ? argv[0] : "train");
    for (int i = 1; i < argc; i++) {
        int takes_value = 0, optional = 0;
        if (dropped_flag(argv[i], &takes_value, &optional)) {
            if (takes_value && i + 1 < argc) {
                const char* next = argv[i + 1];
                /* optional 1: a value unless it is a flag; 2 (a boolean): only 0/1/true/false */
                const int is_bool = !strcmp(next, "0") || !strcmp(next, "1") || !strcmp(next, "true") ||
                                    !strcmp(next, "false");
                if (optional == 0 || (optional == 1 && strncmp(next, "--", 2) != 0) || (optional == 2 && is_bool))
                    i++;
            }
            continue;
        }
        append_quoted(buf, n, argv[i]);
    }
    append_quoted(buf, n, "--resume");
    if (state != NULL && state[0]) append_quoted(buf, n, state);
    append_quoted(buf, n, "--out-dir");
    append_quoted(buf, n, out_dir);
}

int run_check_finite_params(const GPTConfig* cfg, const float* params, char* err, size_t errlen) {
    ParamTensorInfo table[NUM_PARAM_TENSORS];
    gpt_param_table(cfg, table);
    for (int t = 0; t < NUM_PARAM_TENSORS; t++) {
        const float* p = params + table[t].offset;
        for (size_t i = 0; i < table[t].count; i++) {
            if (isfinite(p[i])) continue;
            const size_t per_layer = table[t].count / (size_t)(table[t].layers > 0 ? table[t].layers : 1);
            snprintf(err, errlen, "tensor '%s' element %zu (layer %zu, element %zu of the layer; flat parameter "
                     "index %zu) is %s", table[t].name, i, i / per_layer, i % per_layer, table[t].offset + i,
                     isnan(p[i]) ? "NaN" : "infinite");
            return -1;
        }
    }
    return 0;
}

static uint64_t params_digest(const float* params, size_t n) {
    return resume_hash(params, n * sizeof(float), RESUME_HASH_INIT);
}

static int same_config(const GPTConfig* a, const GPTConfig* b) {
    return a->max_seq_len == b->max_seq_len && a->vocab_size == b->vocab_size &&
           a->padded_vocab_size == b->padded_vocab_size && a->num_layers == b->num_layers &&
           a->num_heads == b->num_heads && a->channels == b->channels && a->pos == b->pos &&
           (a->pos != GPT_POS_ROPE || a->rope_base == b->rope_base) && a->norm == b->norm && a->mlp == b->mlp &&
           a->mlp_hidden == b->mlp_hidden && a->qk_norm == b->qk_norm && a->bias == b->bias &&
           a->tie_embeddings == b->tie_embeddings;
}

/* The architecture option flags applied to d->cfg. From a preset (from_checkpoint 0) a given flag
   overrides the preset's value; from a checkpoint each given flag must equal what the checkpoint
   holds, and every one that differs is named on its own line in one refusal. --mlp-hidden left out
   (or 0) means the default for the resulting --mlp. The resolved values are written back into f, so
   the banner and the log show what the run uses. */
static void resolve_model_options(RunDriver* d, int from_checkpoint, const char* source) {
    TrainFlags* f = d->f;
    GPTConfig want = d->cfg;
    char problems[2048] = "";
    size_t used = 0;
#define OPTION_PROBLEM(...)                                                                        \
    do {                                                                                           \
        if (used < sizeof(problems)) used += (size_t)snprintf(problems + used, sizeof(problems) - used, __VA_ARGS__); \
    } while (0)
    if (flags_was_set(f, FLAG_POS) && gpt_pos_parse(f->pos, &want.pos) != 0) fatal_flag(d, "--pos: choose learned|rope");
    if (flags_was_set(f, FLAG_NORM) && gpt_norm_parse(f->norm, &want.norm) != 0)
        fatal_flag(d, "--norm: choose layernorm|rmsnorm");
    if (flags_was_set(f, FLAG_MLP) && gpt_mlp_parse(f->mlp, &want.mlp) != 0) fatal_flag(d, "--mlp: choose gelu|swiglu");
    if (flags_was_set(f, FLAG_ROPE_BASE)) {
        if (want.pos != GPT_POS_ROPE) fatal_flag(d, "--rope-base applies to --pos rope only: drop it, or add --pos rope");
        want.rope_base = f->rope_base;
    }
    if (flags_was_set(f, FLAG_QK_NORM)) want.qk_norm = f->qk_norm;
    if (flags_was_set(f, FLAG_BIAS)) want.bias = f->bias;
    if (flags_was_set(f, FLAG_TIE_EMBEDDINGS)) want.tie_embeddings = f->tie_embeddings;
    if (flags_was_set(f, FLAG_MLP_HIDDEN) && f->mlp_hidden > 0) want.mlp_hidden = f->mlp_hidden;
    else if (!from_checkpoint || flags_was_set(f, FLAG_MLP_HIDDEN))
        want.mlp_hidden = gpt_config_default_mlp_hidden(want.mlp, want.channels);
    if (from_checkpoint) {
        const GPTConfig* have = &d->cfg;
        if (want.pos != have->pos)
            OPTION_PROBLEM("\n  --pos %s, but the checkpoint has --pos %s", gpt_pos_name(want.pos), gpt_pos_name(have->pos));
        if (want.pos == GPT_POS_ROPE && want.rope_base != have->rope_base)
            OPTION_PROBLEM("\n  --rope-base %g, but the checkpoint has --rope-base %g", (double)want.rope_base,
                           (double)have->rope_base);
        if (want.norm != have->norm)
            OPTION_PROBLEM("\n  --norm %s, but the checkpoint has --norm %s", gpt_norm_name(want.norm),
                           gpt_norm_name(have->norm));
        if (want.mlp != have->mlp)
            OPTION_PROBLEM("\n  --mlp %s, but the checkpoint has --mlp %s", gpt_mlp_name(want.mlp), gpt_mlp_name(have->mlp));
        if (want.mlp_hidden != have->mlp_hidden)
            OPTION_PROBLEM("\n  --mlp-hidden %d, but the checkpoint has --mlp-hidden %d", want.mlp_hidden,
                           have->mlp_hidden);
        if (want.qk_norm != have->qk_norm)
            OPTION_PROBLEM("\n  --qk-norm %d, but the checkpoint has --qk-norm %d", want.qk_norm, have->qk_norm);
        if (want.bias != have->bias)
            OPTION_PROBLEM("\n  --bias %d, but the checkpoint has --bias %d", want.bias, have->bias);
        if (want.tie_embeddings != have->tie_embeddings)
            OPTION_PROBLEM("\n  --tie-embeddings %d, but the checkpoint has --tie-embeddings %d", want.tie_embeddings,
                           have->tie_embeddings);
        if (problems[0]) {
            char msg[2600];
            snprintf(msg, sizeof(msg), "the model options given differ from those of %s (the options are part of the "
                     "checkpoint):%s\n  hint: drop those flags (the checkpoint's options are used), or start a new "
                     "run with --model to train another architecture", source, problems);
            fatal_flag(d, msg);
        }
    }
#undef OPTION_PROBLEM
    d->cfg = want;
    f->pos = gpt_pos_name(want.pos);
    f->rope_base = want.rope_base;
    f->norm = gpt_norm_name(want.norm);
    f->mlp = gpt_mlp_name(want.mlp);
    f->mlp_hidden = want.mlp_hidden;
    f->qk_norm = want.qk_norm;
    f->bias = want.bias;
    f->tie_embeddings = want.tie_embeddings;
}

/* The schedule and AdamW flags on resume: a flag left out takes the saved value; one given with another value
   is used and noted (from here on the run differs from one that kept the saved settings). A state written by
   an older version records none: the flags are used as given, and the note says so. */
static void resolve_schedule(RunDriver* d) {
    TrainFlags* f = d->f;
    const ResumeSchedule* s = &d->saved.sched;
    if (!s->recorded) {
        if (d->is_master)
            printf("note: %s does not record the learning-rate schedule and optimizer settings (an older version "
                   "wrote it): the flags of this command line are used\n", d->state_path);
        return;
    }
    char given[1024] = "", saved[1024] = "";
    size_t ng = 0, ns = 0;
#define SCHEDULE_DIFF(flag, name, fmt, cur, old)                                                             \
    do {                                                                                                      \
        if (!flags_was_set(f, flag)) cur = old;                                                               \
        else if (cur != old && ng < sizeof(given) && ns < sizeof(saved)) {                                   \
            ng += (size_t)snprintf(given + ng, sizeof(given) - ng, " --" name " " fmt, cur);                 \
            ns += (size_t)snprintf(saved + ns, sizeof(saved) - ns, " --" name " " fmt, old);                 \
        }                                                                                                     \
    } while (0)
    SCHEDULE_DIFF(FLAG_STEPS, "steps", "%d", f->steps, s->steps);
    SCHEDULE_DIFF(FLAG_LR, "lr", "%g", f->lr, s->lr);
    SCHEDULE_DIFF(FLAG_MIN_LR_FRAC, "min-lr-frac", "%g", f->min_lr_frac, s->min_lr_frac);
    SCHEDULE_DIFF(FLAG_WARMUP_STEPS, "warmup-steps", "%d", f->warmup_steps, s->warmup_steps);
    ScheduleKind kind = d->sched.kind;
    const ScheduleKind saved_kind = (ScheduleKind)s->schedule;
    if (!flags_was_set(f, FLAG_SCHEDULE)) kind = saved_kind;
    else if (kind != saved_kind && ng < sizeof(given) && ns < sizeof(saved)) {
        ng += (size_t)snprintf(given + ng, sizeof(given) - ng, " --schedule %s", schedule_name(kind));
        ns += (size_t)snprintf(saved + ns, sizeof(saved) - ns, " --schedule %s", schedule_name(saved_kind));
    }
    SCHEDULE_DIFF(FLAG_WEIGHT_DECAY, "weight-decay", "%g", f->weight_decay, s->weight_decay);
    SCHEDULE_DIFF(FLAG_BETA1, "beta1", "%g", f->beta1, s->beta1);
    SCHEDULE_DIFF(FLAG_BETA2, "beta2", "%g", f->beta2, s->beta2);
    SCHEDULE_DIFF(FLAG_ADAM_EPS, "adam-eps", "%g", f->adam_eps, s->adam_eps);
    SCHEDULE_DIFF(FLAG_GRAD_CLIP, "grad-clip", "%g", f->grad_clip, s->grad_clip);
#undef SCHEDULE_DIFF
    f->schedule = schedule_name(kind);
    d->sched = (LRSchedule){kind, f->lr, f->min_lr_frac, f->warmup_steps, f->steps};
    if (given[0] && d->is_master)
        printf("note: resuming with%s where the run was saved with%s: from step %lld on it differs from a run that "
               "kept them\n", given, saved, (long long)d->saved.step);
}

/* The newest state in dir into d->state_path; dies with what to do when there is none. */
static void find_latest(RunDriver* d, const char* dir, const char* how) {
    char err[RUN_PATH_CAP + 200];
    int64_t step;
    if (!file_exists(dir))
        die("%s: the run folder '%s' does not exist: nothing to continue\n  hint: check --out-dir, or drop "
            "--resume to start a new run there", how, dir);
    const int found = run_find_latest_state(dir, d->state_path, sizeof(d->state_path), &step, err, sizeof(err));
    if (found < 0) die("%s: %s", how, err);
    if (found > 0)
        die("%s: no state_NNNNNNNN.bin in '%s': nothing to continue\n  hint: drop --resume to start a new run, "
            "or pass a state file (or the folder holding it) to --resume", how, dir);
}

/* ---------------------------------------------------------------- set-up */

void run_driver_init(RunDriver* d, const char* program, int argc, char** argv, TrainFlags* f, int is_master) {
    memset(d, 0, sizeof(*d));
    d->program = program;
    d->argc = argc;
    d->argv = argv;
    d->f = f;
    d->is_master = is_master;
    d->newest_saved = d->written_at = d->rolling = d->pending_delete = -1;
    d->resuming = f->resume[0] != '\0';
    if (d->resuming && f->overwrite) fatal_flag(d, "--resume continues a run and --overwrite starts one over: give one");
    if (d->resuming && f->init_from[0]) fatal_flag(d, "--resume takes its weights from the run folder: drop --init-from");
    if (f->init_from[0] && flags_was_set(f, FLAG_MODEL))
        fatal_flag(d, "--init-from sets the model shape from the checkpoint: drop --model");
    ScheduleKind kind;
    if (schedule_parse(f->schedule, &kind) != 0) fatal_flag(d, "--schedule: choose cosine|linear|constant");
    d->sched = (LRSchedule){kind, f->lr, f->min_lr_frac, f->warmup_steps, f->steps};

    if (d->resuming && strcmp(f->resume, "latest") != 0) {
        char given[RUN_PATH_CAP];
        copy_path(given, f->resume);
        strip_trailing_slashes(given);
        if (is_dir(given)) { /* a run folder: its newest state */
            copy_path(d->out_dir, f->out_dir[0] ? f->out_dir : given);
            find_latest(d, given, "--resume");
        } else {
            copy_path(d->state_path, given);
            if (f->out_dir[0]) copy_path(d->out_dir, f->out_dir);
            else dir_of(d->out_dir, given); /* the state's own folder */
        }
    } else if (f->out_dir[0]) {
        copy_path(d->out_dir, f->out_dir);
    } else if (d->resuming) {
        fatal_flag(d, "--resume (latest) needs --out-dir: the run folder to continue");
    } else {
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        char stamp[64];
        strftime(stamp, sizeof(stamp), "%Y%m%d_%H%M%S", &tmv);
        snprintf(d->out_dir, sizeof(d->out_dir), "runs/run_%s", stamp);
        d->auto_dir = 1; /* the name is claimed, with a suffix if taken, at run_driver_start */
    }
    strip_trailing_slashes(d->out_dir);
    if (d->resuming && d->state_path[0] == '\0') find_latest(d, d->out_dir, "--resume");
    /* Only the master looks at (and later empties) the folder: the others would race its first writes. */
    if (!d->resuming && is_master && !d->auto_dir) {
        d->existing = run_files_in(d->out_dir, 0);
        if (d->existing > 0 && !f->overwrite)
            die("the run folder '%s' already holds a run (%d log/checkpoint files)\n  hint: continue it with "
                "--resume, start over in it with --overwrite (deletes those files), or choose another --out-dir",
                d->out_dir, d->existing);
    }
}

void run_driver_load_model(RunDriver* d) {
    TrainFlags* f = d->f;
    char err[2048];
    const char* source_flag;
    if (d->resuming) {
        source_flag = "--resume";
        if (resume_state_read(d->state_path, &d->saved, err, sizeof(err)) != 0) die("--resume: %s", err);
        char dir[RUN_PATH_CAP], model_path[RUN_PATH_CAP];
        dir_of(dir, d->state_path);
        run_file_path(model_path, sizeof(model_path), dir, "model", d->saved.step);
        if (checkpoint_read_model(model_path, &d->cfg, &d->params, err, sizeof(err)) != 0)
            die("--resume: the model saved with %s cannot be read: %s\n  hint: resume from an older "
                "state_NNNNNNNN.bin in the same folder", d->state_path, err);
        if (!same_config(&d->cfg, &d->saved.config) ||
            params_digest(d->params, gpt_num_parameters(&d->cfg)) != d->saved.params_hash)
            die("--resume: %s is not the model saved with %s (shape or weights differ)\n  hint: both files must "
                "come from the same checkpoint step of the same run", model_path, d->state_path);
        if (flags_was_set(f, FLAG_MODEL)) {
            GPTConfig asked;
            if (gpt_config_from_descriptor(f->model, &asked, err, sizeof(err)) != 0) fatal_flag(d, err);
            if (!same_config(&asked, &d->cfg))
                fatal_flag(d, "--model differs from the model of the run being resumed: drop --model");
        }
        snprintf(d->model_source, sizeof(d->model_source), "resumed from %s (step %lld)", model_path,
                 (long long)d->saved.step);
        resolve_model_options(d, 1, model_path);
        resolve_schedule(d);
    } else if (f->init_from[0]) {
        source_flag = "--init-from";
        if (checkpoint_read_model(f->init_from, &d->cfg, &d->params, err, sizeof(err)) != 0)
            die("--init-from: %s", err);
        snprintf(d->model_source, sizeof(d->model_source), "weights from %s", f->init_from);
        resolve_model_options(d, 1, f->init_from);
    } else {
        source_flag = "--model";
        if (gpt_config_from_descriptor(f->model, &d->cfg, err, sizeof(err)) != 0) {
            char msg[2200];
            snprintf(msg, sizeof(msg), "--model: %s", err);
            fatal_flag(d, msg);
        }
        resolve_model_options(d, 0, f->model);
        snprintf(d->model_source, sizeof(d->model_source), "preset %s, initialised with seed %llu", f->model,
                 (unsigned long long)f->seed);
    }
    if (gpt_config_validate(&d->cfg, err, sizeof(err)) != 0) {
        char msg[6400];
        snprintf(msg, sizeof(msg), "%s %s: %s", source_flag, d->resuming ? d->state_path : f->init_from[0] ? f->init_from : f->model, err);
        fatal_flag(d, msg);
    }
    if (d->params && run_check_finite_params(&d->cfg, d->params, err, sizeof(err)) != 0)
        die("%s %s: the weights are not all finite: %s\n  hint: this checkpoint comes from a diverged run; use an "
            "earlier one", source_flag, d->resuming ? d->state_path : f->init_from, err);

    /* The attention mode: the saved one unless --attn is given (a switch is allowed and noted). */
    if (attn_mode_parse(f->attn, &d->attn_mode) != 0) fatal_flag(d, "--attn: unknown mode");
    d->attn_switched_from = -1;
    if (d->resuming) {
        const int saved_mode = d->saved.attn_mode;
        if (saved_mode < 0 || saved_mode >= ATTN_NUM_MODES)
            die("--resume %s: the state names attention mode %d, which does not exist", d->state_path, saved_mode);
        if (!flags_was_set(f, FLAG_ATTN)) {
            d->attn_mode = (AttnMode)saved_mode;
            f->attn = attn_mode_name(d->attn_mode);
            if (!flags_was_set(f, FLAG_ATTN_TILE_MAX_SHIFT)) f->attn_tile_max_shift = d->saved.attn_tile_max_shift;
        } else if (saved_mode != (int)d->attn_mode) {
            d->attn_switched_from = saved_mode;
            d->attn_switch_step = d->saved.step;
            if (d->is_master)
                printf("note: attention mode switched from %s (saved) to %s at step %lld: from here on the run "
                       "differs from one that kept %s\n", attn_mode_name((AttnMode)saved_mode),
                       attn_mode_name(d->attn_mode), (long long)d->saved.step, attn_mode_name((AttnMode)saved_mode));
        }
        /* The gauge arm: the saved one; a --zero-key-bias-grad that differs is refused. */
        const int arm = resume_zero_key_bias_grad(&d->saved, f->zero_key_bias_grad,
                                                  flags_was_set(f, FLAG_ZERO_KEY_BIAS_GRAD), err, sizeof(err));
        if (arm < 0) die("--resume %s: %s", d->state_path, err);
        f->zero_key_bias_grad = arm;
    }
    if (f->attn_tile_max_shift && d->attn_mode != ATTN_REPAIR)
        fatal_flag(d, "--attn-tile-max-shift 1 is an arm of --attn repair only (it conflicts with the other modes)");
    /* The gauge arm zeroes a gradient that is exactly 0 only when a key bias shifts every key of a head
       alike: learned positions, no qk-norm, and a key bias to begin with. */
    if (f->zero_key_bias_grad && (!d->cfg.bias || d->cfg.pos == GPT_POS_ROPE || d->cfg.qk_norm)) {
        char msg[512];
        snprintf(msg, sizeof(msg), "--zero-key-bias-grad 1 needs a key bias whose exact gradient is 0, and this model "
                 "has %s; drop --zero-key-bias-grad (it applies to --bias 1 with --pos learned and --qk-norm 0)",
                 !d->cfg.bias ? "no key bias (--bias 0)"
                 : d->cfg.pos == GPT_POS_ROPE ? "--pos rope (RoPE turns a common key offset into a position-dependent one)"
                                              : "--qk-norm 1 (the norm is not shift invariant)");
        fatal_flag(d, msg);
    }
}

void run_driver_batch(RunDriver* d, int world) {
    char err[1024], msg[1200];
    const int B = d->f->batch_size;
    const int T = d->f->seq_len > 0 ? d->f->seq_len : d->cfg.max_seq_len;
    if (T > d->cfg.max_seq_len) {
        snprintf(msg, sizeof(msg), "--seq-len %d is longer than the model's context (%d)", T, d->cfg.max_seq_len);
        fatal_flag(d, msg);
    }
    d->B = B;
    d->T = T;
    d->world = world;
    const int64_t total = d->f->total_batch_tokens > 0 ? d->f->total_batch_tokens : (int64_t)B * T * world;
    const int64_t accum = dist_grad_accum_steps(total, B, T, world, err, sizeof(err));
    if (accum < 1) {
        snprintf(msg, sizeof(msg), "--total-batch-tokens: %s", err);
        fatal_flag(d, msg);
    }
    d->grad_accum = (int)accum;
    d->tokens_per_step = total;
}

void run_driver_state_shape(const RunDriver* d, size_t num_params, ResumeState* s) {
    const TrainFlags* f = d->f;
    memset(s, 0, sizeof(*s));
    s->config = d->cfg;
    s->config_hash = gpt_config_hash(&d->cfg);
    s->num_params = num_params;
    s->batch_size = d->B;
    s->seq_len = d->T;
    s->grad_accum = d->grad_accum;
    s->world_size = d->world;
    s->shuffle = f->shuffle;
    s->seed = f->seed;
    s->attn_mode = (int32_t)d->attn_mode;
    s->attn_tile_max_shift = f->attn_tile_max_shift;
    s->zero_key_bias_grad = f->zero_key_bias_grad;
    s->sched = (ResumeSchedule){1,       f->steps,    f->warmup_steps, (int32_t)d->sched.kind, f->lr,
                                f->min_lr_frac, f->weight_decay, f->beta1, f->beta2, f->adam_eps, f->grad_clip};
}

void run_driver_open_data(const RunDriver* d, int rank, DataLoader** train, DataLoader** val) {
    const TrainFlags* f = d->f;
    char err[1024];
    *train = *val = NULL;
    if (dataloader_open(train, f->train_data, d->B, d->T, rank, d->world, f->shuffle, f->seed, d->cfg.vocab_size, err,
                        sizeof(err)) != 0)
        die("--train-data: %s\n  hint: 'make setup' creates the default shards; or point --train-data at llm.c "
            "shards", err);
    if (f->val_data[0] && dataloader_open(val, f->val_data, d->B, d->T, rank, d->world, 0, 0, d->cfg.vocab_size, err,
                                          sizeof(err)) != 0)
        die("--val-data: %s\n  hint: pass --val-data \"\" to train without validation", err);
    if (f->val_data[0] && strcmp(f->val_data, f->train_data) == 0 && d->is_master && rank == 0)
        printf("note: --val-data is --train-data: the validation loss then measures the fit to the training "
               "text, not generalisation\n");
}

void run_driver_restore(RunDriver* d, DataLoader* train, SamplerRng* rng, int64_t* adam_t, int64_t* tokens_seen) {
    char err[1024];
    if (!d->resuming) return;
    if (dataloader_seek(train, &d->saved.data_pos, err, sizeof(err)) != 0)
        die("--resume: the saved data position does not fit --train-data: %s", err);
    rng->state = d->saved.rng_state;
    *adam_t = d->saved.adam_t;
    *tokens_seen = d->saved.tokens_seen;
}

int run_driver_log_due(const RunDriver* d, int step) {
    return step == d->start_step || (step + 1) % d->f->log_every == 0 || step + 1 == d->f->steps;
}

void run_driver_check_resume(RunDriver* d, const ResumeState* cur) {
    const TrainFlags* f = d->f;
    char err[2048];
    d->start_step = 0;
    if (d->resuming) {
        const ResumeState* s = &d->saved;
        /* Another process count continues the same run when the step's token count is unchanged: the data
           stream does not depend on the process count, only the order of the gradient sums does. */
        ResumeState expect = *cur;
        const long long saved_tokens = (long long)s->batch_size * s->seq_len * s->grad_accum * s->world_size;
        const int other_world = s->world_size != cur->world_size && s->batch_size == cur->batch_size &&
                                s->seq_len == cur->seq_len && saved_tokens == (long long)d->tokens_per_step;
        if (other_world) {
            expect.world_size = s->world_size;
            expect.grad_accum = s->grad_accum;
        }
        if (resume_state_check(s, &expect, err, sizeof(err)) != 0) die("--resume %s: %s", d->state_path, err);
        if (other_world && d->is_master)
            printf("note: resuming a run of %d process(es) x %d accumulation steps on %d x %d (same %lld tokens per "
                   "step; sums are ordered differently, so not bit-exact)\n", s->world_size, s->grad_accum,
                   cur->world_size, cur->grad_accum, saved_tokens);
        d->start_step = (int)s->step;
        d->newest_saved = d->start_step;
        if (d->start_step >= f->steps)
            die("--resume: the run already has %d steps and --steps is %d\n  hint: raise --steps to train longer",
                d->start_step, f->steps);
    }
    if (f->stop_at > 0 && (f->stop_at >= f->steps || f->stop_at <= d->start_step)) {
        snprintf(err, sizeof(err), "--stop-at %d must lie between the first step of this invocation (%d) and "
                 "--steps (%d)", f->stop_at, d->start_step, f->steps);
        fatal_flag(d, err);
    }
    /* Continuing from an older checkpoint in a folder that holds newer ones would overwrite them step by step
       and leave two runs' checkpoints mixed in one folder. */
    const int newest = d->resuming && d->is_master ? run_newest_checkpoint(d->out_dir, -1) : -1;
    if (newest > d->start_step) {
        char newest_state[RUN_PATH_CAP];
        run_file_path(newest_state, sizeof(newest_state), d->out_dir, "state", newest);
        die("--resume: the run folder '%s' holds checkpoints newer than step %d (up to step %d); continuing from "
            "step %d there would overwrite them\n  hint: continue from the newest (--resume %s), or branch into "
            "another folder (--out-dir NEW, keeping --resume %s)", d->out_dir, d->start_step, newest, d->start_step,
            newest_state, d->state_path);
    }
    if (f->warmup_steps >= f->steps && d->is_master)
        printf("note: --warmup-steps %d is not below --steps %d: the learning rate never reaches --lr %g\n",
               f->warmup_steps, f->steps, (double)f->lr);
}

void run_driver_release_saved(RunDriver* d) {
    if (d->resuming) resume_state_free(&d->saved);
}

/* The log's error handler: say which checkpoints really exist, then stop. */
static void log_failed(void* ctx, const char* msg) {
    RunDriver* d = (RunDriver*)ctx;
    char ck[RUN_PATH_CAP + 100];
    run_describe_checkpoints(d->out_dir, ck, sizeof(ck));
    die("%s\n  training stopped; checkpoint to continue from: %s", msg, ck);
}

/* A fresh runs/run_<date>_<time> folder, claimed with mkdir: a name already taken (an earlier run, or a second
   trainer started in the same second) gives way to the next free one (_2, _3, ...), so no two runs share one. */
static void claim_auto_dir(RunDriver* d) {
    char base[RUN_PATH_CAP], parent[RUN_PATH_CAP];
    copy_path(base, d->out_dir);
    dir_of(parent, base);
    make_dirs(parent);
    for (int k = 1;; k++) {
        if (k == 1) copy_path(d->out_dir, base);
        else snprintf(d->out_dir, sizeof(d->out_dir), "%.*s_%d", RUN_PATH_CAP - 16, base, k);
        if (mkdir(d->out_dir, 0755) == 0) return;
        if (errno != EEXIST)
            die("cannot create the run folder '%s': %s\n  hint: choose a folder with --out-dir", d->out_dir,
                strerror(errno));
    }
}

/* One trainer per run folder: the master holds an exclusive flock on <out_dir>/run.lock until it exits (the
   kernel drops it even on SIGKILL), so a second trainer, a resume started while the run still goes or a
   requeued job, is refused instead of overwriting the first one's checkpoints and log. The file holds the
   holder's pid, for the message. */
static void lock_run_folder(RunDriver* d) {
    char path[RUN_PATH_CAP + 16];
    snprintf(path, sizeof(path), "%s/run.lock", d->out_dir);
    const int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) die("cannot open the lock file '%s': %s\n  hint: is the run folder writable?", path, strerror(errno));
    const int locked = flock(fd, LOCK_EX | LOCK_NB) == 0;
    const int held_elsewhere = !locked && errno == EWOULDBLOCK;
    if (!locked && !held_elsewhere) {
        /* a file system without locks (some network mounts): say so, and go on as before */
        fprintf(stderr, "warning: cannot lock %s (%s): this file system does not enforce one trainer per run "
                "folder\n", path, strerror(errno));
        return;
    }
    if (held_elsewhere) {
        char pid[32] = "";
        const ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);
        pid[n > 0 ? n : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        die("the run folder '%s' is in use by another training process%s%s%s (it holds %s)\n  hint: wait for it "
            "to stop, stop it (kill -TERM <pid>: it saves a checkpoint), or choose another --out-dir",
            d->out_dir, pid[0] ? " (pid " : "", pid, pid[0] ? ")" : "", path);
    }
    char pid[32];
    const int len = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len)
        fprintf(stderr, "warning: cannot write the pid into %s: %s\n", path, strerror(errno));
    /* fd stays open (never closed): the lock lasts as long as the process */
}

void run_driver_start(RunDriver* d, int has_val) {
    char err[RUN_PATH_CAP + 200];
    d->has_val = has_val;
    install_signal_handlers(); /* before the first write: SIGXFSZ must not kill the run */
    if (d->is_master) {
        if (d->auto_dir) claim_auto_dir(d);
        else make_dirs(d->out_dir);
        lock_run_folder(d);
        /* under the lock: a run that appeared after start-up's look at the folder is not overwritten */
        if (!d->resuming && run_files_in(d->out_dir, 0) != d->existing)
            die("the run folder '%s' changed since start-up: another process wrote a run there\n  hint: choose "
                "another --out-dir", d->out_dir);
        if (d->existing > 0) {
            run_files_in(d->out_dir, 1);
            printf("--overwrite: deleted %d log/checkpoint files of the previous run in %s\n", d->existing,
                   d->out_dir);
        }
        char log_path[RUN_PATH_CAP + 16];
        snprintf(log_path, sizeof(log_path), "%s/log.jsonl", d->out_dir);
        if (runlog_open(&d->log, log_path, d->resuming, err, sizeof(err)) != 0) die("%s", err);
        runlog_set_error_handler(&d->log, log_failed, d);
    } else {
        runlog_open(&d->log, NULL, 0, err, sizeof(err));
    }
    d->last_save_s = runlog_now_s();
}

/* ---------------------------------------------------------------- the loop */

void run_driver_poll(const RunDriver* d, double local[RUN_POLL_FLAGS]) {
    const double minutes = d->f->checkpoint_minutes;
    local[0] = g_signal != 0 ? 1.0 : 0.0;
    local[1] = minutes > 0 && runlog_now_s() - d->last_save_s >= 60.0 * minutes ? 1.0 : 0.0;
    local[2] = d->warn_wanted ? 1.0 : 0.0;
}

void run_driver_agree(RunDriver* d, const double agreed[RUN_POLL_FLAGS]) {
    if (agreed[0] > 0 && d->stop_signal == 0) d->stop_signal = g_signal != 0 ? (int)g_signal : SIGTERM;
    d->time_due = agreed[1] > 0;
    d->warn_due = agreed[2] > 0;
}

void run_driver_note_warning(RunDriver* d, int step) {
    if (!d->f->checkpoint_on_warning || d->warn_wanted || d->warn_saved) return;
    d->warn_wanted = 1;
    if (d->is_master)
        printf("checkpoint: the attention warning of step %d gets a checkpoint that is kept, within the next two "
               "steps (--checkpoint-on-warning 0 turns this off)\n", step);
}

/* Is step a checkpoint the retention rule keeps (a step of --checkpoint-every, --stop-at or the end)? */
static int kept_step(const RunDriver* d, int step) {
    const TrainFlags* f = d->f;
    return step == f->steps || (f->stop_at > 0 && step == f->stop_at) ||
           (f->checkpoint_every > 0 && step % f->checkpoint_every == 0);
}

int run_driver_boundary(RunDriver* d, int step) {
    const TrainFlags* f = d->f;
    const int last = step == f->steps;
    const int stop_here = f->stop_at > 0 && step == f->stop_at;
    int what = 0;
    d->written_at = -1;
    /* never at the step just resumed from (an interrupt there included): its checkpoint is on disk already */
    const int at_resume_point = d->resuming && step == d->start_step;
    const int first = step == d->start_step;
    if (!at_resume_point && (d->stop_signal || (!first && (kept_step(d, step) || d->time_due || d->warn_due))))
        what |= RUN_SAVE;
    if (d->stop_signal && !last) return what | RUN_INTERRUPT; /* at --steps the run ends normally instead */
    if (stop_here) return what | RUN_STOP_AT;
    if (d->has_val && (last || (f->val_every > 0 && step % f->val_every == 0))) what |= RUN_EVAL;
    if (f->sample_every > 0 && step > 0 && (last || step % f->sample_every == 0)) what |= RUN_SAMPLE;
    if (last) what |= RUN_LAST;
    return what;
}

static void delete_checkpoint(RunDriver* d, int step, const char* why) {
    char model[RUN_PATH_CAP], state[RUN_PATH_CAP];
    run_file_path(model, sizeof(model), d->out_dir, "model", step);
    run_file_path(state, sizeof(state), d->out_dir, "state", step);
    /* the state first: a state without its model is never left as "the newest" */
    if (remove(state) != 0 && errno != ENOENT) fprintf(stderr, "warning: cannot delete %s: %s\n", state, strerror(errno));
    if (remove(model) != 0 && errno != ENOENT) fprintf(stderr, "warning: cannot delete %s: %s\n", model, strerror(errno));
    printf("deleted the checkpoint of step %d (%s)\n", step, why);
    FILE* rec = runlog_begin(&d->log, "checkpoint_deleted");
    if (rec) {
        fprintf(rec, ", \"step\": %d, \"reason\": ", step);
        json_write_string(rec, why);
    }
    runlog_end(&d->log);
}

static void resolve_pending(RunDriver* d) {
    if (d->pending_delete >= 0 && d->is_master)
        delete_checkpoint(d, d->pending_delete, "written for --checkpoint-minutes, superseded by a newer one");
    d->pending_delete = -1;
}

void run_driver_save(RunDriver* d, int step, RunSaveFn fn, void* ctx) {
    char model_path[RUN_PATH_CAP], state_path[RUN_PATH_CAP], err[2048];
    run_file_path(model_path, sizeof(model_path), d->out_dir, "model", step);
    run_file_path(state_path, sizeof(state_path), d->out_dir, "state", step);
    if (fn(ctx, step, model_path, state_path, err, sizeof(err)) != 0) {
        char ck[RUN_PATH_CAP + 100];
        run_describe_checkpoints(d->out_dir, ck, sizeof(ck));
        die("saving the checkpoint of step %d failed: %s\n  checkpoint to continue from: %s\n  hint: free disk "
            "space, then continue with --resume", step, err, ck);
    }
    d->last_save_s = runlog_now_s();
    d->time_due = 0;
    d->written_at = step;
    d->newest_saved = step;
    const int for_warning = d->warn_due;
    if (for_warning) { /* asked for once: a later warning asks for nothing */
        d->warn_due = d->warn_wanted = 0;
        d->warn_saved = 1;
    }
    if (!d->is_master) return;
    FILE* rec = runlog_begin(&d->log, "checkpoint");
    if (rec) {
        fprintf(rec, ", \"step\": %d, \"model\": ", step);
        json_write_string(rec, model_path);
        fputs(", \"state\": ", rec);
        json_write_string(rec, state_path);
    }
    runlog_end(&d->log);
    printf("checkpoint: %s + %s\n", model_path, state_path);
    if (for_warning)
        printf("checkpoint: kept for the attention warning; to branch from it under gproj: the same command with "
               "--resume %s --attn gproj --out-dir %s_gproj\n", state_path, d->out_dir);
    fflush(stdout);
    /* retention: an older --checkpoint-minutes-only checkpoint goes once this one has been followed by a sane step;
       the warning's checkpoint is kept like those of --checkpoint-every */
    if (d->rolling >= 0 && d->rolling != step) d->pending_delete = d->rolling;
    d->rolling = kept_step(d, step) || d->stop_signal || for_warning ? -1 : step;
}

static void log_stop(RunDriver* d, int step, const char* reason) {
    FILE* rec = runlog_begin(&d->log, "stop");
    if (rec) {
        fprintf(rec, ", \"step\": %d, \"reason\": ", step);
        json_write_string(rec, reason);
    }
    runlog_end(&d->log);
}

void run_driver_interrupt(RunDriver* d, int step) {
    const char* name = signal_name(d->stop_signal);
    resolve_pending(d);
    char reason[64];
    snprintf(reason, sizeof(reason), "signal %s", name);
    log_stop(d, step, reason);
    runlog_close(&d->log);
    if (d->is_master) {
        char cmd[3 * RUN_PATH_CAP], ck[RUN_PATH_CAP + 100];
        run_resume_command(d->argc, d->argv, d->out_dir, NULL, cmd, sizeof(cmd));
        run_describe_checkpoints(d->out_dir, ck, sizeof(ck));
        printf("stopped by %s at step %d; checkpoint: %s\ncontinue with:\n  %s\n", name, step, ck, cmd);
        fflush(stdout);
    }
    g_exiting_together = 1;
    exit(128 + d->stop_signal);
}

void run_driver_stop_at(RunDriver* d, int step) {
    resolve_pending(d);
    log_stop(d, step, "--stop-at");
    runlog_close(&d->log);
    if (d->is_master) {
        char cmd[3 * RUN_PATH_CAP];
        run_resume_command(d->argc, d->argv, d->out_dir, NULL, cmd, sizeof(cmd));
        printf("stopped at step %d (--stop-at; to stop again before step %d, add --stop-at N to the command "
               "below)\ncontinue with:\n  %s\n", step, d->f->steps, cmd);
    }
}

void run_driver_done(RunDriver* d, int step, double last_val_loss) {
    resolve_pending(d);
    FILE* rec = runlog_begin(&d->log, "stop");
    if (rec) {
        fprintf(rec, ", \"step\": %d, \"reason\": \"done\", \"val_loss\": ", step);
        runlog_write_number(rec, last_val_loss);
    }
    runlog_end(&d->log);
    runlog_close(&d->log);
    if (d->is_master) {
        char ck[RUN_PATH_CAP + 100];
        run_describe_checkpoints(d->out_dir, ck, sizeof(ck));
        printf("done: %d steps; run folder %s; final checkpoint %s\n", step, d->out_dir, ck);
    }
}

/* Mean and standard deviation of the window; 0 when too few values. */
static int window_stats(const double* w, int count, double* mean, double* sd) {
    if (count < RUN_Z_MIN_HISTORY) return 0;
    double s = 0.0;
    for (int i = 0; i < count; i++) s += w[i];
    *mean = s / count;
    double q = 0.0;
    for (int i = 0; i < count; i++) q += (w[i] - *mean) * (w[i] - *mean);
    *sd = sqrt(q / count);
    return 1;
}

/* Stops the run for a diverged step (does not return). */
static void stop_diverged(RunDriver* d, int step, const char* what) {
    char reason[256];
    snprintf(reason, sizeof(reason), "diverged: %s", what);
    /* the checkpoint written at this boundary holds the weights that gave this step's loss */
    if (d->is_master && d->written_at == step) {
        delete_checkpoint(d, step, "it holds the diverged weights");
        d->written_at = -1;
    }
    log_stop(d, step, reason);
    runlog_close(&d->log);
    if (d->is_master) {
        char last[RUN_PATH_CAP], cmd[3 * RUN_PATH_CAP];
        const int good = run_newest_checkpoint(d->out_dir, step - 1);
        if (good >= 0) {
            run_file_path(last, sizeof(last), d->out_dir, "state", good);
            run_resume_command(d->argc, d->argv, d->out_dir, last, cmd, sizeof(cmd));
        } else {
            snprintf(last, sizeof(last), "none (no checkpoint of this run before step %d is on disk)", step);
            snprintf(cmd, sizeof(cmd), "(start over with a lower --lr)");
        }
        char model[RUN_PATH_CAP];
        if (good >= 0) run_file_path(model, sizeof(model), d->out_dir, "model", good);
        fflush(stdout);
        fprintf(stderr, "error: step %d: %s; training stopped before updating the weights.\n"
                "  last good checkpoint: %s%s%s%s\n  hint: lower --lr or raise --warmup-steps, then continue from it "
                "(--diverge-margin 0 turns the loss-jump test off):\n  %s\n",
                step, what, good >= 0 ? model : last, good >= 0 ? " (resume state " : "", good >= 0 ? last : "",
                good >= 0 ? ")" : "", cmd);
    }
    g_exiting_together = 1;
    exit(EXIT_FAILURE);
}

int run_driver_check_step(RunDriver* d, int step, double loss, double grad_norm) {
    const TrainFlags* f = d->f;
    char what[256];
    if (!isfinite(loss) || !isfinite(grad_norm)) {
        snprintf(what, sizeof(what), "the %s is %s", isfinite(loss) ? "gradient norm" : "loss",
                 isfinite(loss) ? "not finite" : "NaN or infinite");
        stop_diverged(d, step, what);
    }
    if (f->diverge_margin > 0 && d->losses_seen > 0 && loss > d->loss_min + f->diverge_margin) {
        snprintf(what, sizeof(what), "the loss %.6g is more than --diverge-margin %g above the lowest loss of this "
                 "run so far (%.6g)", loss, f->diverge_margin, d->loss_min);
        stop_diverged(d, step, what);
    }
    if (d->losses_seen == 0 || loss < d->loss_min) d->loss_min = loss;
    d->losses_seen++;
    resolve_pending(d);

    int skip = 0;
    double ml, sl, mn, sn;
    if (f->skip_update_z > 0 && window_stats(d->win_loss, d->win_count, &ml, &sl) &&
        window_stats(d->win_norm, d->win_count, &mn, &sn)) {
        const double zl = sl > 0 ? (loss - ml) / sl : 0.0, zn = sn > 0 ? (grad_norm - mn) / sn : 0.0;
        if (zl > f->skip_update_z || zn > f->skip_update_z) {
            skip = 1;
            d->skipped++;
            FILE* rec = runlog_begin(&d->log, "skip_update");
            if (rec) {
                fprintf(rec, ", \"step\": %d, \"loss\": ", step);
                runlog_write_number(rec, loss);
                fputs(", \"loss_z\": ", rec);
                runlog_write_number(rec, zl);
                fputs(", \"grad_norm\": ", rec);
                runlog_write_number(rec, grad_norm);
                fputs(", \"grad_norm_z\": ", rec);
                runlog_write_number(rec, zn);
                fprintf(rec, ", \"window\": %d", d->win_count);
            }
            runlog_end(&d->log);
            if (d->is_master)
                printf("step %d: update skipped (--skip-update-z %g): loss %.6f z %.2f, grad norm %.4g z %.2f over "
                       "the last %d steps\n", step + 1, f->skip_update_z, loss, zl, grad_norm, zn, d->win_count);
        }
    }
    d->win_loss[d->win_next] = loss;
    d->win_norm[d->win_next] = grad_norm;
    d->win_next = (d->win_next + 1) % RUN_Z_WINDOW;
    if (d->win_count < RUN_Z_WINDOW) d->win_count++;
    return skip;
}
