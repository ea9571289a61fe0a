/*
 * train/schedule.h - the learning rate at each optimizer step: linear warmup,
 * then cosine, linear or constant decay to a floor.
 *
 * Why: both trainers, the resume logic and the tests must agree on the lr of
 * step s exactly (a resumed run recomputes it from s alone; nothing about the
 * schedule is stored). One pure function, computed in double, is that
 * agreement.
 *
 * Definition, for step s in [0, total_steps) with W warmup steps,
 * peak lr L and floor m = min_lr_frac * L:
 *   s <  W: lr = L * (s + 1) / W                        (reaches L at s = W-1)
 *   s >= W: r = (s - W) / max(1, total_steps - 1 - W)   (0 at s = W, 1 at the last step)
 *     cosine:   lr = m + (L - m) * 0.5 * (1 + cos(pi * r))
 *     linear:   lr = L - (L - m) * r
 *     constant: lr = L
 * r is clamped to [0, 1], so steps past total_steps stay at the floor.
 *
 * Offers: ScheduleKind, LRSchedule, schedule_parse, schedule_name, schedule_lr.
 */
#ifndef TRAIN_SCHEDULE_H
#define TRAIN_SCHEDULE_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { SCHEDULE_COSINE = 0, SCHEDULE_LINEAR = 1, SCHEDULE_CONSTANT = 2 } ScheduleKind;

typedef struct {
    ScheduleKind kind;
    double max_lr;
    double min_lr_frac;
    int warmup_steps;
    int total_steps;
} LRSchedule;

/* "cosine" | "linear" | "constant" -> kind; 0, or -1 for another name. */
int schedule_parse(const char* name, ScheduleKind* kind);
const char* schedule_name(ScheduleKind kind);

/* Learning rate of optimizer step `step` (0-based). */
double schedule_lr(const LRSchedule* s, int step);

#ifdef __cplusplus
}
#endif

#endif /* TRAIN_SCHEDULE_H */
