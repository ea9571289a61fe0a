/*
 * train/runlog.h - the run's machine-readable log (JSON lines) and the
 * human-readable console progress line.
 *
 * Why: the comparison and plotting scripts read one file per run, and a
 * person watching a run wants one line per step with speed and time left.
 * Both trainers write the same records through this module, so every run's
 * log has the same keys whatever produced it.
 *
 * log.jsonl: one JSON object per line, flushed after each line (a crash loses
 * nothing written before it). Records:
 *   {"event": "config", ...every flag..., "model": {...}, ...}      at start
 *   {"event": "resume", "step": S, "state": PATH}                   on --resume
 *   {"step": S, "loss": X, "lr": X, "grad_norm": X, "tokens_per_s": X,
 *    "ms": X, "attn": "gproj"}                                     per step
 *   {"step": S, "val_loss": X, "val_batches": N}                   per eval
 *   {"step": S, "sample": "text", "tokens": [ids...]}              per sample
 *   {"event": "checkpoint", "step": S, "model": PATH, "state": PATH}
 *   {"event": "stop", "step": S, "reason": "..."}                  at the end
 * "step" of a training record is the 0-based index of the optimizer step it
 * made; eval/sample records carry the number of steps done before them.
 * Every write is checked: when a line cannot be written or flushed (a full
 * disk, a file-size limit), the log's error handler is called with a message
 * naming the file and the system's reason, and must not return (the default
 * handler prints it and exits 1): a run never trains on into a log that is
 * silently empty.
 * Numbers are printed in full precision: the shortest decimal that reads back
 * as exactly the same double (so logs of two runs compare bit for bit); a
 * non-finite value is written as null (JSON has no NaN). After a resume the
 * file is appended to, so a step may appear twice: readers keep the last.
 *
 * Offers: RunLog, runlog_open/close, runlog_set_error_handler, runlog_step, runlog_eval, runlog_sample,
 * runlog_begin/runlog_end (free-form records), runlog_console_step,
 * runlog_now_s, runlog_format_duration.
 */
#ifndef TRAIN_RUNLOG_H
#define TRAIN_RUNLOG_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Called with a message when a log write fails; must not return. */
typedef void (*RunLogErrorFn)(void* ctx, const char* msg);

typedef struct {
    FILE* fp;  /* NULL: no log file (records are dropped; the console still prints) */
    char path[4096];
    RunLogErrorFn on_error; /* NULL: print the message and exit(1) */
    void* error_ctx;
} RunLog;

typedef struct {
    int step;            /* 0-based optimizer step */
    int total_steps;
    double loss;         /* mean training loss over the step's micro-batches */
    double lr;
    double grad_norm;    /* global norm before clipping */
    double tokens_per_s;
    double ms;           /* wall time of the step */
    const char* attn;    /* attention mode name */
} StepRecord;

/* Opens path for appending (append=1) or as a new file (append=0; an
   existing file is truncated). path NULL: a log that writes nothing. The
   error handler starts as the default; runlog_set_error_handler replaces it.
   0, or -1 with a message naming the file. */
int runlog_open(RunLog* log, const char* path, int append, char* err, size_t errlen);
void runlog_set_error_handler(RunLog* log, RunLogErrorFn fn, void* ctx);
/* Closes the file; a failed close (buffered bytes not written) goes to the error handler. */
void runlog_close(RunLog* log);

void runlog_step(RunLog* log, const StepRecord* r);
void runlog_eval(RunLog* log, int step, double val_loss, int val_batches);
void runlog_sample(RunLog* log, int step, const char* text, const int* ids, int n);

/* Starts a record `{"event": "<event>"` and returns the FILE to add
   `, "key": value` pairs to (NULL when there is no log file); runlog_end
   closes the object, ends the line, flushes and checks that every byte of
   the line was written (the error handler is called when not). */
FILE* runlog_begin(RunLog* log, const char* event);
void runlog_end(RunLog* log);

/* Writes a double as JSON: the shortest exact decimal, or null when not finite. */
void runlog_write_number(FILE* out, double x);

/* "step   12/200 | loss 5.123456 | lr 1.00e-03 | norm 1.2345 | 12.3 ms | 4567 tok/s | ETA 1m23s" */
void runlog_console_step(FILE* out, const StepRecord* r, double eta_s);

/* Monotonic wall clock in seconds. */
double runlog_now_s(void);
/* 83 -> "1m23s", 4000 -> "1h06m40s". */
void runlog_format_duration(double seconds, char* buf, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* TRAIN_RUNLOG_H */
