// scaler.c: dynamic loss scaling, for fp16. What you write is marked TODO:
//
//   TODO 3a  scaler_found_inf  one rank's inf is every rank's skip
//   TODO 3b  scaler_update     the scale's state machine: back off on an overflow, grow after a run of good steps
//
// Why: fp16's smallest subnormal is 2^-24 (about 6e-8), and many gradients of a deep net are smaller. They round
// to 0 in backward (underflow) and those weights stop learning. Multiplying the loss by S multiplies every
// gradient by S (backward is linear), lifting them into fp16's range; the step divides S out again in fp32 before
// the update. Too large an S overflows (65504 is fp16's largest): the gradient holds inf, the step is SKIPPED and
// S halves. After growth_interval good steps in a row S doubles, to probe upwards again. bf16 has float32's
// exponent range: it needs no scaling.
// PyTorch: scaler = torch.amp.GradScaler("cuda"); scaler.scale(loss).backward(); scaler.step(opt); scaler.update()
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lesson.h"
#include "kit/check.h"

// Given: --loss-scale dynamic (the default) scales fp16 only, from 2^16 as GradScaler(init_scale=65536.0);
// bf16 and fp32 get a static 1 (nothing to scale). --loss-scale none: a static 1; a number: that static scale.
LossScaler scaler_init(const TrainOptions *o) {
    LossScaler s = {.scale = 1.0f, .growth_interval = o->scale_window, .good_steps = 0, .growth = 2.0f,
                    .backoff = 0.5f, .dynamic = false, .skipped = 0};
    LowpFormat f = LOWP_FP32;
    if (o->precision && !lowp_parse(o->precision, &f)) die("--precision %s: fp32, bf16 or fp16", o->precision);
    const char *ls = o->loss_scale ? o->loss_scale : "dynamic";
    if (strcmp(ls, "none") == 0) return s;
    if (strcmp(ls, "dynamic") == 0) {
        if (f == LOWP_FP16) s.dynamic = true, s.scale = 65536.0f;
        return s;
    }
    char *end;
    double v = strtod(ls, &end);
    if (*ls == '\0' || *end != '\0' || !(v > 0) || !isfinite((float)v))
        die("--loss-scale %s: dynamic, none or a positive number", ls);
    s.scale = (float)v;
    return s;
}

// TODO 3a: each rank checked its own gradient for inf/NaN (before the all-reduce). If one rank skips the step
//   and another does not, the replicas are no longer equal and never will be again: the decision must be the
//   same everywhere. Agree with ONE collective on the host (kit/dist.h: a sum of doubles) and return the same
//   answer on every rank.
// PyTorch: under DDP the gradients are all-reduced in backward, before GradScaler.unscale_ looks for an inf, so
//   an inf on one rank is an inf on all; FSDP's ShardedGradScaler, whose ranks each see a shard, all-reduces
//   found_inf as here.
bool scaler_found_inf(ProcessGroup *pg, bool local_inf) {
    (void)pg;
    return local_inf;
}

// TODO 3b: after every step, with what the ranks agreed in 3a:
//   found_inf: the step was skipped (count it in s->skipped); a dynamic scale backs off (x backoff) and the run
//     of good steps starts again from 0
//   otherwise: one good step more; the growth_interval-th good step in a row grows the scale (x growth, unless
//     that overflows float32: then it stays) and starts the count again
//   A static scale (s->dynamic false) never changes; its skipped steps are still counted.
// PyTorch: torch._amp_update_scale_ (what GradScaler.update() calls)
void scaler_update(LossScaler *s, bool found_inf) {
    (void)s, (void)found_inf;
}
