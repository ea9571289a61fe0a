/*
 * train/attn_warnings.h - how both trainers report the early warnings of model/diagnostics.h: after a
 * diagnostics record, each warning that diag_warn_check left pending becomes a console line (with the hint
 * on how to continue under gproj) and a log.jsonl record {"event": "attn_warning", ...}.
 *
 * Why a header of its own: it joins model/diagnostics.h and train/runlog.h, and only the trainers link
 * both, so neither module's object depends on the other.
 *
 * Offers: runlog_attn_warnings.
 */
#ifndef TRAIN_ATTN_WARNINGS_H
#define TRAIN_ATTN_WARNINGS_H

#include <stdint.h>
#include <stdio.h>

#include "model/diagnostics.h"
#include "train/runlog.h"

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

#endif /* TRAIN_ATTN_WARNINGS_H */
