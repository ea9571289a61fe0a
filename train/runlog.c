/*
 * train/runlog.c - JSON-lines run log and console progress line (see runlog.h).
 */
#include "train/runlog.h"
#include "train/flags.h"

#include <errno.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <time.h>

int runlog_open(RunLog* log, const char* path, int append, char* err, size_t errlen) {
    log->fp = NULL;
    log->path[0] = '\0';
    log->on_error = NULL;
    log->error_ctx = NULL;
    if (path == NULL) return 0;
    snprintf(log->path, sizeof(log->path), "%s", path);
    log->fp = fopen(path, append ? "ab" : "wb");
    if (log->fp == NULL) {
        snprintf(err, errlen, "cannot open the run log '%s' for writing: %s (is the run folder writable?)", path,
                 strerror(errno));
        return -1;
    }
    return 0;
}

void runlog_set_error_handler(RunLog* log, RunLogErrorFn fn, void* ctx) {
    log->on_error = fn;
    log->error_ctx = ctx;
}

/* A write to the log failed (errno says why): hand a message to the handler, which does not return. */
static void write_failed(RunLog* log, int saved_errno) {
    char msg[4400];
    snprintf(msg, sizeof(msg), "writing the run log '%s' failed: %s\n  hint: %s", log->path,
             saved_errno ? strerror(saved_errno) : "write error",
             saved_errno == EFBIG ? "a file-size limit (ulimit -f) stops the log from growing; raise it"
                                  : "free disk space (or fix the folder's permissions), then continue with --resume");
    FILE* fp = log->fp;
    log->fp = NULL; /* the handler may log nothing more to a broken file */
    if (fp) fclose(fp);
    if (log->on_error) log->on_error(log->error_ctx, msg);
    fflush(stdout);
    fprintf(stderr, "error: %s\n", msg);
    exit(EXIT_FAILURE);
}

void runlog_close(RunLog* log) {
    if (log->fp == NULL) return;
    errno = 0;
    const int bad = ferror(log->fp) || fflush(log->fp) != 0;
    const int saved_errno = errno;
    if (bad) write_failed(log, saved_errno);
    if (fclose(log->fp) != 0) {
        log->fp = NULL;
        write_failed(log, errno);
    }
    log->fp = NULL;
}

void runlog_write_number(FILE* out, double x) {
    if (!isfinite(x)) {
        fputs("null", out);
        return;
    }
    /* The shortest text that reads back as exactly x (0.001, not 0.0010000000000000000208). */
    char buf[40];
    if (x == floor(x) && fabs(x) < 1e15) {
        fprintf(out, "%.0f", x); /* integers as integers: 1000, not 1e+03 */
        return;
    }
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(buf, sizeof(buf), "%.*g", digits, x);
        if (strtod(buf, NULL) == x) break;
    }
    fputs(buf, out);
}

/* Ends the record and pushes it to the file; any failed write of the line (the stream's error flag is
   sticky, so a failure inside fprintf is seen here too) goes to the error handler. */
static void end_line(RunLog* log) {
    errno = 0;
    fputs("}\n", log->fp);
    const int bad = fflush(log->fp) != 0 || ferror(log->fp);
    if (bad) write_failed(log, errno);
}

void runlog_step(RunLog* log, const StepRecord* r) {
    if (log->fp == NULL) return;
    FILE* f = log->fp;
    fprintf(f, "{\"step\": %d, \"loss\": ", r->step);
    runlog_write_number(f, r->loss);
    fputs(", \"lr\": ", f);
    runlog_write_number(f, r->lr);
    fputs(", \"grad_norm\": ", f);
    runlog_write_number(f, r->grad_norm);
    fputs(", \"tokens_per_s\": ", f);
    runlog_write_number(f, r->tokens_per_s);
    fputs(", \"ms\": ", f);
    runlog_write_number(f, r->ms);
    fputs(", \"attn\": ", f);
    json_write_string(f, r->attn ? r->attn : "");
    end_line(log);
}

void runlog_eval(RunLog* log, int step, double val_loss, int val_batches) {
    if (log->fp == NULL) return;
    fprintf(log->fp, "{\"step\": %d, \"val_loss\": ", step);
    runlog_write_number(log->fp, val_loss);
    fprintf(log->fp, ", \"val_batches\": %d", val_batches);
    end_line(log);
}

void runlog_sample(RunLog* log, int step, const char* text, const int* ids, int n) {
    if (log->fp == NULL) return;
    fprintf(log->fp, "{\"step\": %d, \"sample\": ", step);
    json_write_string(log->fp, text ? text : "");
    fputs(", \"tokens\": [", log->fp);
    for (int i = 0; i < n; i++) fprintf(log->fp, "%s%d", i ? ", " : "", ids[i]);
    fputs("]", log->fp);
    end_line(log);
}

FILE* runlog_begin(RunLog* log, const char* event) {
    if (log->fp == NULL) return NULL;
    fputs("{\"event\": ", log->fp);
    json_write_string(log->fp, event);
    return log->fp;
}

void runlog_end(RunLog* log) {
    if (log->fp == NULL) return;
    end_line(log);
}

double runlog_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void runlog_format_duration(double seconds, char* buf, size_t n) {
    if (!isfinite(seconds) || seconds < 0) {
        snprintf(buf, n, "?");
        return;
    }
    long s = (long)(seconds + 0.5);
    if (s >= 3600) snprintf(buf, n, "%ldh%02ldm%02lds", s / 3600, (s / 60) % 60, s % 60);
    else if (s >= 60) snprintf(buf, n, "%ldm%02lds", s / 60, s % 60);
    else snprintf(buf, n, "%lds", s);
}

void runlog_console_step(FILE* out, const StepRecord* r, double eta_s) {
    char eta[32];
    runlog_format_duration(eta_s, eta, sizeof(eta));
    int width = 1;
    for (int t = r->total_steps; t >= 10; t /= 10) width++;
    fprintf(out, "step %*d/%d | loss %.6f | lr %.2e | norm %.4f | %.1f ms | %.0f tok/s | ETA %s\n", width,
            r->step + 1, r->total_steps, r->loss, r->lr, r->grad_norm, r->ms, r->tokens_per_s, eta);
    fflush(out);
}
