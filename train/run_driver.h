/*
 * train/run_driver.h - the run driver both trainers share: everything about a
 * run that is not the model's arithmetic.
 *
 * Why: the CPU trainer (train_gpt_cpu.c) and the GPU trainer (train_gpt.cu)
 * must treat run folders, resumes, checkpoints, interruptions and divergence
 * the same way; written once here, they cannot drift apart. The trainers keep
 * only what is model- or device-specific (building the model, one optimizer
 * step, writing their weights) and hand it to the driver through plain data
 * and one save callback.
 *
 * What it owns:
 *   - the flag-conflict checks (--resume with --overwrite or --init-from,
 *     --init-from with --model, --attn-tile-max-shift outside repair, the
 *     batch arithmetic: --seq-len within the model's context, the
 *     accumulation count must divide exactly and fit);
 *   - the lr schedule the flags describe;
 *   - the data: opening --train-data and --val-data, and on resume the
 *     saved data position, sampler RNG and step counters;
 *   - the run folder: --out-dir or a new runs/run_DATE_TIME; a folder that
 *     already holds a run is refused unless --overwrite, which deletes the old
 *     run's log and every model_/state_NNNNNNNN.bin (nothing else) once every
 *     setting has been checked;
 *   - --resume: bare (= latest) takes the newest state of --out-dir; a folder
 *     takes the newest state in that folder; a file is that state. The model
 *     file of the same step beside it must be the one saved with it. The
 *     attention mode is the saved one unless --attn is given explicitly;
 *   - the model's source (resume, --init-from, preset) and a check that loaded
 *     weights are all finite (tensor name and index when not);
 *   - the run's shape as a resume state records it, and its check against
 *     the state being resumed;
 *   - the schedule of each step boundary: checkpoint (every --checkpoint-every
 *     steps, every --checkpoint-minutes of wall time, at --stop-at, at the end,
 *     on a signal), evaluation, sample, stop;
 *   - checkpoint naming, saving (through the trainer's callback), logging and
 *     retention: a checkpoint written only for --checkpoint-minutes is deleted
 *     once the same invocation has written a newer checkpoint and the step
 *     after that one trained sanely; every other checkpoint is kept;
 *   - SIGTERM/SIGINT: the current step finishes, every rank saves at the same
 *     step boundary (the trainer sums run_driver_poll's values over ranks),
 *     and the program exits with 128 + the signal number, printing the exact
 *     command that continues the run. Later signals do not interrupt the save;
 *   - divergence: a non-finite loss or gradient norm, or a loss more than
 *     --diverge-margin nats above the lowest loss of this invocation, stops
 *     the run before the update; a checkpoint written at that step boundary
 *     (it holds the weights that gave the bad loss) is deleted, and the
 *     message names the newest checkpoint left on disk;
 *   - --skip-update-z Z: a step whose loss or gradient norm lies more than Z
 *     standard deviations above the mean of the last RUN_Z_WINDOW steps
 *     (once RUN_Z_MIN_HISTORY are known) skips its optimizer update, with a
 *     console line and a "skip_update" log record;
 *   - the final messages, which name only checkpoints that exist on disk.
 *
 * Multi-process use: every rank calls every function in the same order; only
 * the rank with is_master = 1 touches the run folder and the log.
 */
#ifndef TRAIN_RUN_DRIVER_H
#define TRAIN_RUN_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#include "attention/attention.h"
#include "dataloader/dataloader.h"
#include "model/gpt_config.h"
#include "train/flags.h"
#include "train/resume_state.h"
#include "train/runlog.h"
#include "train/sampler.h"
#include "train/schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RUN_PATH_CAP 4096
#define RUN_Z_WINDOW 128     /* steps the --skip-update-z statistics look back over */
#define RUN_Z_MIN_HISTORY 16 /* steps needed before --skip-update-z judges a step */

/* Writes the checkpoint of `step` to model_path and state_path (every rank is
   called; ranks other than the master may only take part in gathers).
   0, or -1 with a message. */
typedef int (*RunSaveFn)(void* ctx, int step, const char* model_path, const char* state_path, char* err,
                         size_t errlen);

/* What a step boundary does (run_driver_boundary), in this order. */
enum {
    RUN_SAVE = 1,      /* write a checkpoint (run_driver_save) */
    RUN_INTERRUPT = 2, /* then stop for a signal (run_driver_interrupt) */
    RUN_STOP_AT = 4,   /* then stop at --stop-at (run_driver_stop_at) */
    RUN_EVAL = 8,      /* validation loss (when the run has validation data) */
    RUN_SAMPLE = 16,   /* a sample */
    RUN_LAST = 32      /* then stop: --steps reached (run_driver_done) */
};

typedef struct {
    const char* program;
    int argc;
    char** argv;
    TrainFlags* f;
    int is_master;
    int resuming;
    LRSchedule sched;              /* --schedule, --lr, --min-lr-frac, --warmup-steps, --steps */
    char out_dir[RUN_PATH_CAP];
    char state_path[RUN_PATH_CAP]; /* the state being resumed */
    int existing;                  /* files of an old run in out_dir (--overwrite deletes them) */
    int auto_dir;                  /* 1: out_dir is runs/run_<date>_<time>, claimed (with a suffix if taken) with
                                      mkdir at start; 0: the folder was given */
    /* run_driver_load_model */
    GPTConfig cfg;
    float* params;                 /* loaded weights (resume, --init-from); NULL: initialise. Caller frees */
    ResumeState saved;             /* when resuming: the state read (run_driver_release_saved frees it) */
    char model_source[RUN_PATH_CAP + 64];
    AttnMode attn_mode;
    int attn_switched_from;        /* resumed with another --attn: the checkpoint's mode, else -1 */
    int64_t attn_switch_step;      /* ... and the step it was saved at */
    /* run_driver_batch */
    int B, T, world;               /* micro-batch per process (T: --seq-len, or the model's context) */
    int grad_accum;
    int64_t tokens_per_step;
    /* the run */
    int start_step;
    int has_val;
    RunLog log;
    int newest_saved;   /* step of the newest checkpoint on disk from this run (-1: none known) */
    int written_at;     /* step of the checkpoint written at the current boundary, -1 */
    int rolling;        /* a --checkpoint-minutes-only checkpoint of this invocation, -1: none */
    int pending_delete; /* a superseded rolling checkpoint, deleted after the next sane step, -1: none */
    double last_save_s;
    int stop_signal;    /* agreed: a rank got this signal (0: none) */
    int time_due;       /* agreed: --checkpoint-minutes elapsed on some rank */
    int warn_wanted;    /* this rank saw the run's first attention warning, its checkpoint not written yet */
    int warn_due;       /* agreed: some rank saw it; the next boundary writes a kept checkpoint */
    int warn_saved;     /* that checkpoint is written (once per invocation) */
    /* divergence guard and --skip-update-z */
    double loss_min;
    int losses_seen;
    double win_loss[RUN_Z_WINDOW], win_norm[RUN_Z_WINDOW];
    int win_count, win_next;
    int skipped;
} RunDriver;

/* A flag the run cannot take: "error: MSG" and a pointer to PROGRAM --help on
   stderr, exit status 2 (every flag refusal of both trainers goes here). */
void run_flag_error(const char* program, const char* msg) __attribute__((noreturn));

/* Checks flag conflicts, resolves the run folder and the state to resume, and
   refuses an occupied folder without --overwrite (master only). Touches
   nothing on disk. Exits with a message on any problem. */
void run_driver_init(RunDriver* d, const char* program, int argc, char** argv, TrainFlags* f, int is_master);

/* The model: shape and weights from the resumed checkpoint, --init-from, or
   the --model preset (d->params NULL: the trainer initialises). Loaded
   weights must be finite. Resolves the attention mode and the gauge arm on
   resume (f->attn, f->attn_tile_max_shift, f->zero_key_bias_grad updated). */
void run_driver_load_model(RunDriver* d);

/* Batch arithmetic for world processes: B = --batch-size, T = --seq-len (0:
   the model's context; longer than the context is refused), the tokens per
   step (--total-batch-tokens, 0 = one micro-batch on every process) and the
   accumulation count, which must be a whole number that fits an int. */
void run_driver_batch(RunDriver* d, int world);

/* The run's shape as a resume state records it (model, batch, process count,
   shuffle, seed, attention mode and arms): what run_driver_check_resume
   compares and what each checkpoint's state starts from. */
void run_driver_state_shape(const RunDriver* d, size_t num_params, ResumeState* s);

/* Opens --train-data (this rank's slice, shuffled as --shuffle says) and
   --val-data (sequential; *val NULL when it is ""), B x T each. Exits with
   the loader's message and a hint when either does not open. */
void run_driver_open_data(const RunDriver* d, int rank, DataLoader** train, DataLoader** val);

/* When resuming (after run_driver_check_resume): the training data's
   position, the sampler RNG, AdamW's step count and the tokens seen, from
   the saved state. The moments (d->saved.m, .v) are the trainer's to load. */
void run_driver_restore(RunDriver* d, DataLoader* train, SamplerRng* rng, int64_t* adam_t, int64_t* tokens_seen);

/* Whether step's record goes to the console: the first step of this
   invocation, every --log-every steps, the last step. */
int run_driver_log_due(const RunDriver* d, int step);

/* Resume compatibility (cur: the run's shape; resume_state_check), the step
   to start from, and --steps / --stop-at against it. A different process
   count with the same tokens per step is accepted with a note. */
void run_driver_check_resume(RunDriver* d, const ResumeState* cur);
void run_driver_release_saved(RunDriver* d);

/* Creates the folder, deletes the old run's files for --overwrite, opens the
   log (master), installs the SIGTERM/SIGINT handlers (every rank). */
void run_driver_start(RunDriver* d, int has_val);

/* The number of flags run_driver_poll and run_driver_agree exchange. */
#define RUN_POLL_FLAGS 3
/* This rank's view, to be summed over ranks: [0] 1 if a signal arrived,
   [1] 1 if --checkpoint-minutes have passed since the last checkpoint, [2] 1 if this rank asks for the
   checkpoint of the run's first attention warning (--checkpoint-on-warning, not written yet). */
void run_driver_poll(const RunDriver* d, double local[RUN_POLL_FLAGS]);
/* The sums over ranks of run_driver_poll (one process: its own values). */
void run_driver_agree(RunDriver* d, const double agreed[RUN_POLL_FLAGS]);
/* The trainer's diagnostics raised an attention warning at `step` (diag_warn_check > 0): with
   --checkpoint-on-warning, the first one asks for a kept checkpoint at the first boundary after the ranks
   have agreed on it (the next poll): step + 1 in the CPU trainer, which polls at the boundary, step + 2 in
   the GPU trainer, which polls inside the step. */
void run_driver_note_warning(RunDriver* d, int step);

/* What the boundary before optimizer step `step` does (RUN_* bits). */
int run_driver_boundary(RunDriver* d, int step);

/* Writes the checkpoint of `step` through fn (every rank), then logs it,
   prints it and applies the retention rule (master). A failed save stops the
   run, naming the checkpoints that exist on disk. */
void run_driver_save(RunDriver* d, int step, RunSaveFn fn, void* ctx);

/* Ends the run for a signal (after run_driver_save), exits 128 + signal. */
void run_driver_interrupt(RunDriver* d, int step);
/* Ends this invocation at --stop-at (after its checkpoint); returns. */
void run_driver_stop_at(RunDriver* d, int step);
/* Ends the run at --steps; returns. */
void run_driver_done(RunDriver* d, int step, double last_val_loss);

/* After the step's loss and gradient norm are known, before the update:
   stops the run on divergence (does not return), returns 1 when
   --skip-update-z skips this update, 0 to update. */
int run_driver_check_step(RunDriver* d, int step, double loss, double grad_norm);

/* 1 once the driver is ending every rank on purpose (a signal, divergence),
   so the trainer's exit hook does not treat the exit as a failing rank. */
int run_driver_exiting_together(void);

/* --- helpers the driver is built from (tested in tests/test_train_cpu.c) --- */

/* Is name a run file (log.jsonl, model_/state_NNNNNNNN.bin, or a .tmp of those)? */
int run_is_run_file(const char* name);
/* "DIR/state_NNNNNNNN.bin (newest of N on disk)" or a sentence that none exists. */
void run_describe_checkpoints(const char* dir, char* buf, size_t n);
/* Newest step with both model_ and state_ files on disk, at most max_step (-1: none). */
int run_newest_checkpoint(const char* dir, int max_step);
/* The command that continues the run: argv without --resume/--overwrite/--init-from/--model
   (and their values), with --resume [state] --out-dir DIR, shell-quoted. */
void run_resume_command(int argc, char** argv, const char* out_dir, const char* state, char* buf, size_t n);
/* 0 when all n weights are finite; else -1 with "tensor NAME element I (layer L) is nan|inf". */
int run_check_finite_params(const GPTConfig* cfg, const float* params, char* err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif /* TRAIN_RUN_DRIVER_H */
