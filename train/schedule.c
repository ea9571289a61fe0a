/*
 * train/schedule.c - warmup + cosine/linear/constant learning rate (see schedule.h).
 */
#include "train/schedule.h"

#include <math.h>
#include <string.h>

int schedule_parse(const char* name, ScheduleKind* kind) {
    if (strcmp(name, "cosine") == 0) { *kind = SCHEDULE_COSINE; return 0; }
    if (strcmp(name, "linear") == 0) { *kind = SCHEDULE_LINEAR; return 0; }
    if (strcmp(name, "constant") == 0) { *kind = SCHEDULE_CONSTANT; return 0; }
    return -1;
}

const char* schedule_name(ScheduleKind kind) {
    switch (kind) {
        case SCHEDULE_COSINE: return "cosine";
        case SCHEDULE_LINEAR: return "linear";
        case SCHEDULE_CONSTANT: return "constant";
    }
    return "?";
}

double schedule_lr(const LRSchedule* s, int step) {
    const double peak = s->max_lr;
    if (step < s->warmup_steps) return peak * (double)(step + 1) / (double)s->warmup_steps;
    if (s->kind == SCHEDULE_CONSTANT) return peak;
    const double floor_lr = peak * s->min_lr_frac;
    int span = s->total_steps - 1 - s->warmup_steps;
    if (span < 1) span = 1;
    double r = (double)(step - s->warmup_steps) / (double)span;
    if (r < 0.0) r = 0.0;
    if (r > 1.0) r = 1.0;
    if (s->kind == SCHEDULE_LINEAR) return peak - (peak - floor_lr) * r;
    return floor_lr + (peak - floor_lr) * 0.5 * (1.0 + cos(M_PI * r));
}
