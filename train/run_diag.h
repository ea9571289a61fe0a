/*
 * train/run_diag.h - the diagnostics of model/diagnostics.h as both trainers run them: which steps measure
 * what (--diag-every, --probe-every, --capture-attn or --capture-steps/--capture-layers, resolved and
 * checked once here), the log.jsonl record of a measured step, and the early warnings after it (each
 * warning that diag_warn_check left pending becomes a console line, with the hint on how to continue under
 * gproj, and a record {"event": "attn_warning", ...}).
 *
 * Why a header of its own: it joins model/diagnostics.h with train/runlog.h and the run driver, and only
 * the trainers link both sides, so neither module's object depends on the other.
 *
 * Offers: RunDiagPlan, run_diag_plan, RunDiagStep, run_diag_step, runlog_diag, runlog_attn_warnings.
 */
#ifndef TRAIN_RUN_DIAG_H
#define TRAIN_RUN_DIAG_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "model/diagnostics.h"
#include "train/run_driver.h"
#include "train/runlog.h"

typedef struct {
    int diag_every;          /* per-layer statistics every N steps; 0: never */
    int probe_every;         /* the fp64 probe every N steps (--probe-every, else --diag-every); 0: never */
    DiagCaptureSpec capture; /* the steps and layers whose attention inputs are written to files */
} RunDiagPlan;

/* The diagnostics flags resolved against the model's layer count (after run_driver_load_model); a
   conflict or a bad step/layer list stops the run as the driver's other flag checks do. */
static inline void run_diag_plan(const RunDriver* d, RunDiagPlan* p) {
    const TrainFlags* f = d->f;
    const int L = d->cfg.num_layers;
    char err[1024];
    memset(p, 0, sizeof(*p));
    p->diag_every = f->diag_every;
    p->probe_every = flags_was_set(f, FLAG_PROBE_EVERY) ? f->probe_every : f->diag_every;
    if (f->capture_attn[0] && (f->capture_steps[0] || f->capture_layers[0]))
        run_flag_error(d->program,
                       "--capture-attn and --capture-steps/--capture-layers say the same thing twice; give one of them");
    if ((f->capture_attn[0] ? diag_capture_spec_parse(f->capture_attn, L, &p->capture, err, sizeof(err))
                            : diag_capture_spec_from_flags(f->capture_steps, f->capture_layers, L, &p->capture, err,
                                                           sizeof(err))) != 0)
        run_flag_error(d->program, err);
    if (p->capture.num_steps == 0 && f->capture_layers[0])
        run_flag_error(d->program,
                       "--capture-layers without --capture-steps captures nothing; add --capture-steps S1,S2,...");
}

/* What one step measures. */
typedef struct {
    int diag;        /* per-layer statistics and gradient norms */
    int probe_layer; /* the layer whose attention backward is replayed against fp64 (round robin); -1: none */
    int capture;     /* some layer's attention inputs are captured (diag_capture_wanted says which) */
} RunDiagStep;

static inline RunDiagStep run_diag_step(const RunDiagPlan* p, int step, int num_layers) {
    RunDiagStep s;
    s.diag = p->diag_every > 0 && step % p->diag_every == 0;
    s.probe_layer = p->probe_every > 0 && step % p->probe_every == 0 ? (step / p->probe_every) % num_layers : -1;
    s.capture = diag_capture_step_wanted(&p->capture, step);
    return s;
}

/* Each warning diag_warn_check left pending: a console line and an "attn_warning" record. */
static inline void runlog_attn_warnings(RunLog* log, const DiagWarn* w, int64_t step) {
    for (int i = 0; i < w->num_pending; i++) {
        char msg[1024], body[512];
        diag_warning_text(w, i, step, msg, sizeof(msg), body, sizeof(body));
        printf("%s\n", msg);
        FILE* wf = runlog_begin(log, "attn_warning");
        if (wf) fprintf(wf, ", %s", body);
        runlog_end(log);
    }
}

/* {"event": "diag", "step": S, <json: diag_write_json's body>, "diag_ms": ms}, then the step's warnings
   (w after diag_warn_check). */
static inline void runlog_diag(RunLog* log, int step, const char* json, double ms, const DiagWarn* w) {
    FILE* df = runlog_begin(log, "diag");
    if (df) {
        fprintf(df, ", \"step\": %d, %s, \"diag_ms\": ", step, json);
        runlog_write_number(df, ms);
    }
    runlog_end(log);
    runlog_attn_warnings(log, w, step);
}

#endif /* TRAIN_RUN_DIAG_H */
