/* test_lr_plan.c — batch size and learning rate as a pair: the scaling rules, gradual warmup
 * (its automatic length, and from where it starts), the schedules, and the flags that override
 * the model's settings. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "optim/optimizer.h"
#include "synthetic.h"

static crew_model *mlp(crew_lr_scaling rule, int64_t base_batch, crew_schedule_type sched)
{
    crew_model *m = NULL;
    CHECK_OK(crew_model_create((int64_t[]){SYN_SIDE, SYN_SIDE, 1}, 3, &m));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_FLATTEN}));
    CHECK_OK(crew_model_add(m, &(crew_layer_spec){.type = CREW_LAYER_DENSE, .units = SYN_CLASSES}));
    CHECK_OK(crew_model_compile(m, &(crew_compile_options){
        .loss = CREW_LOSS_SOFTMAX_CROSS_ENTROPY,
        .optimizer = {.type = CREW_OPT_SGD, .lr = 0.1f, .momentum = 0.9f, .base_batch = base_batch, .scaling = rule,
                      .schedule = sched, .step_size = 10, .gamma = 0.5f}}));
    return m;
}

static crew_fit_plan plan_of(crew_model *m, const crew_dataset *d, int devices, int64_t batch, int epochs,
                             void (*tweak)(crew_fit_options *))
{
    crew_fit_options o;
    crew_model_default_fit(m, &o);
    o.devices = devices;
    o.batch_per_device = batch;
    o.epochs = epochs;
    if (tweak) tweak(&o);
    crew_fit_plan p;
    memset(&p, 0, sizeof p);
    CHECK_OK(crew_model_plan_fit(m, d, &o, &p));
    return p;
}

static void no_warmup(crew_fit_options *o) { o->warmup_steps = 0; }
static void half_epoch_warmup(crew_fit_options *o) { o->warmup_epochs = 0.5; }
static void linear_flag(crew_fit_options *o) { o->lr_scaling = CREW_SCALE_LINEAR; o->base_batch = 16; }

static void test_rules(const crew_dataset *d)
{
    /* 512 samples; base batch 16. */
    crew_model *lin = mlp(CREW_SCALE_LINEAR, 16, CREW_SCHED_CONSTANT);
    crew_fit_plan p = plan_of(lin, d, 4, 16, 20, NULL); /* global 64: factor 4 */
    CHECK(p.global_batch == 64 && p.steps_per_epoch == 8 && p.total_steps == 160);
    CHECK(fabsf(p.lr_factor - 4.0f) < 1e-6f && fabsf(p.scaled_lr - 0.4f) < 1e-6f);
    CHECK_MSG(p.warmup_steps == 40, "automatic warmup: 5 epochs of 8 steps, got %lld", (long long)p.warmup_steps);
    CHECK(fabsf(p.warmup_start_lr - 0.1f) < 1e-7f); /* from the base rate, as Goyal et al. */
    p = plan_of(lin, d, 4, 16, 4, NULL);              /* a short run: at most half of it */
    CHECK_MSG(p.warmup_steps == 16, "warmup capped at half of 32 steps, got %lld", (long long)p.warmup_steps);
    p = plan_of(lin, d, 4, 16, 20, no_warmup);
    CHECK(p.warmup_steps == 0);
    p = plan_of(lin, d, 4, 16, 20, half_epoch_warmup);
    CHECK(p.warmup_steps == 4);
    p = plan_of(lin, d, 1, 16, 20, NULL); /* the batch it was tuned for: nothing to scale or warm */
    CHECK(p.lr_factor == 1.0f && p.warmup_steps == 0);
    crew_model_free(lin);

    crew_model *sq = mlp(CREW_SCALE_SQRT, 16, CREW_SCHED_CONSTANT);
    p = plan_of(sq, d, 4, 16, 20, NULL);
    CHECK(fabsf(p.lr_factor - 2.0f) < 1e-6f);
    p = plan_of(sq, d, 1, 8, 20, NULL); /* a smaller batch lowers the rate, with no warmup */
    CHECK(fabsf(p.lr_factor - sqrtf(0.5f)) < 1e-6f && p.warmup_steps == 0 && p.warmup_start_lr == 0.0f);
    crew_model_free(sq);

    crew_model *none = mlp(CREW_SCALE_NONE, 0, CREW_SCHED_CONSTANT);
    p = plan_of(none, d, 4, 16, 20, NULL);
    CHECK(p.lr_factor == 1.0f && p.base_batch == 64 && p.warmup_steps == 0);
    p = plan_of(none, d, 4, 16, 20, linear_flag); /* flags override the compiled rule */
    CHECK(fabsf(p.lr_factor - 4.0f) < 1e-6f && p.base_batch == 16);
    crew_model_free(none);
}

static void test_schedules(void)
{
    crew_lr_plan warm = {.schedule = CREW_SCHED_CONSTANT, .start_lr = 0.1f, .peak_lr = 0.4f, .warmup_steps = 4,
                         .total_steps = 100};
    CHECK(fabsf(crew_lr_at(&warm, 0) - 0.175f) < 1e-6f); /* rises linearly from start to peak */
    CHECK(fabsf(crew_lr_at(&warm, 3) - 0.4f) < 1e-6f);
    CHECK(fabsf(crew_lr_at(&warm, 50) - 0.4f) < 1e-6f);
    crew_lr_plan step = {.schedule = CREW_SCHED_STEP, .peak_lr = 1.0f, .step_size = 10, .gamma = 0.5f,
                         .total_steps = 100};
    CHECK(crew_lr_at(&step, 9) == 1.0f && crew_lr_at(&step, 10) == 0.5f && crew_lr_at(&step, 25) == 0.25f);
    crew_lr_plan cos = {.schedule = CREW_SCHED_COSINE, .peak_lr = 1.0f, .min_lr = 0.1f, .warmup_steps = 10,
                        .total_steps = 110};
    CHECK(fabsf(crew_lr_at(&cos, 10) - 1.0f) < 1e-6f);  /* the schedule starts after warmup */
    CHECK(fabsf(crew_lr_at(&cos, 60) - 0.55f) < 1e-6f); /* half way: the mean of peak and floor */
    CHECK(fabsf(crew_lr_at(&cos, 110) - 0.1f) < 1e-6f);
    CHECK(crew_lr_at(&cos, 5) < crew_lr_at(&cos, 6));
}

int main(void)
{
    char dir[64] = "/tmp/crew-test-lr-XXXXXX", data[300];
    CHECK(syn_make_dataset(dir, 512, data, sizeof data) == 0);
    crew_dataset *d = NULL;
    CHECK_OK(crew_dataset_open(data, "train", &d));
    if (d) test_rules(d);
    test_schedules();
    crew_dataset_free(d);
    syn_remove(dir);
    return check_report();
}
