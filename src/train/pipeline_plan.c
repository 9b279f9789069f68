/* pipeline_plan.c — where a pipeline cuts a model, and the order in which each stage runs its
 * passes (GPipe and 1F1B). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/status.h"
#include "train/pipeline.h"

/* ------------------------------------------------------------------ schedules */

void crew_pipeline_ops(crew_pipeline_schedule schedule, int stages, int stage, int micro, crew_pipe_op *ops)
{
    int n = 0;
    if (schedule == CREW_PIPELINE_GPIPE) {
        for (int j = 0; j < micro; j++) ops[n++] = (crew_pipe_op){0, j};
        for (int j = 0; j < micro; j++) ops[n++] = (crew_pipe_op){1, j};
        return;
    }
    /* 1F1B (PipeDream-flush, as Megatron-LM): the stages after this one need K − 1 − s forwards
     * before the first backward comes back; then one forward, one backward; then the rest of the
     * backwards. */
    int warmup = stages - 1 - stage < micro ? stages - 1 - stage : micro;
    for (int j = 0; j < warmup; j++) ops[n++] = (crew_pipe_op){0, j};
    for (int i = 0; i < micro - warmup; i++) {
        ops[n++] = (crew_pipe_op){0, warmup + i};
        ops[n++] = (crew_pipe_op){1, i};
    }
    for (int j = micro - warmup; j < micro; j++) ops[n++] = (crew_pipe_op){1, j};
}

int crew_pipeline_slots(crew_pipeline_schedule schedule, int stages, int stage, int micro)
{
    if (schedule == CREW_PIPELINE_GPIPE) return micro;
    return stages - stage < micro ? stages - stage : micro;
}

double crew_pipeline_ideal_bubble(int stages, int micro)
{
    return (double)(stages - 1) / (double)(micro + stages - 1);
}

/* ------------------------------------------------------------------ splits */

/* Layers a split must cover: a trailing softmax is fused into the loss and rides with the last stage. */
static int covered_layers(const crew_model *m) { return m->n_compute; }

crew_status crew_pipeline_split_parse(const crew_model *m, const char *text, int first[CREW_MAX_PIPELINE_STAGES + 1],
                                      int *stages)
{
    const int n = covered_layers(m);
    int k = 0, next = 0;
    const char *p = text;
    while (*p) {
        char *end;
        long a = strtol(p, &end, 10), b;
        if (end == p || a < 0) goto bad;
        p = end;
        if (*p == '-') {
            b = strtol(p + 1, &end, 10);
            if (end == p + 1) goto bad;
            p = end;
        } else {
            b = a;
        }
        if (a != next || b < a || b >= (m->n_layers))
            return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "--stages '%s': stage %d must start at layer %d and end at or "
                               "before layer %d, got %ld-%ld", text, k, next, m->n_layers - 1, a, b);
        if (k == CREW_MAX_PIPELINE_STAGES)
            return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "--stages '%s': more than %d stages", text,
                               CREW_MAX_PIPELINE_STAGES);
        first[k++] = (int)a;
        next = (int)b + 1;
        if (*p == ',') {
            p++;
            if (!*p) goto bad;
        } else if (*p) {
            goto bad;
        }
    }
    if (k == 0) goto bad;
    if (next < n)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "--stages '%s': layers %d-%d are in no stage (the model has %d "
                           "layers)", text, next, n - 1, n);
    if (first[k - 1] >= n)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "--stages '%s': the last stage holds only the trailing softmax, "
                           "which the loss computes; end the stage before it at layer %d", text, m->n_layers - 1);
    first[k] = m->n_layers;
    *stages = k;
    return CREW_OK;
bad:
    return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "--stages '%s': expected ranges of layers such as 0-3,4-9", text);
}

/* A layer's share of a step: its GEMMs' FLOPs, and its output's size for the passes that are not
 * GEMMs (activations, pooling, norms), which cost memory traffic in proportion. */
static double layer_cost(const crew_model *m, int i)
{
    return crew_model_layer_flops(m, i) + 8.0 * (double)crew_shape_size(&m->layers[i]->out);
}

/* The fewest stages, each of cost at most `limit`, that the layers pack into from the front. */
static int pack(const double *cost, int n, double limit, int *first)
{
    int k = 0;
    double used = 0.0;
    for (int i = 0; i < n; i++) {
        if (k == 0 || used + cost[i] > limit) {
            if (first && k < CREW_MAX_PIPELINE_STAGES) first[k] = i;
            k++;
            used = 0.0;
        }
        used += cost[i];
    }
    return k;
}

crew_status crew_pipeline_split_balanced(const crew_model *m, int stages, int first[CREW_MAX_PIPELINE_STAGES + 1])
{
    const int n = covered_layers(m);
    if (stages < 2 || stages > CREW_MAX_PIPELINE_STAGES || stages > n)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "a pipeline of %d stages: the model has %d layers to share "
                           "(2 to %d stages)", stages, n, n < CREW_MAX_PIPELINE_STAGES ? n : CREW_MAX_PIPELINE_STAGES);
    double *cost = malloc((size_t)n * sizeof *cost), lo = 0.0, hi = 0.0;
    if (!cost) return CREW_OOM();
    for (int i = 0; i < n; i++) {
        cost[i] = layer_cost(m, i);
        if (cost[i] > lo) lo = cost[i];
        hi += cost[i];
    }
    /* the smallest limit that packs into at most `stages` stages (bisection on the cost) */
    for (int it = 0; it < 100 && hi - lo > 1e-9 * hi; it++) {
        double mid = 0.5 * (lo + hi);
        if (pack(cost, n, mid, NULL) <= stages)
            hi = mid;
        else
            lo = mid;
    }
    int k = pack(cost, n, hi, first);
    free(cost);
    /* fewer stages than asked (layers too uneven to share): split the widest stages further */
    while (k < stages) {
        int widest = -1;
        for (int s = 0; s < k; s++) {
            int len = (s + 1 < k ? first[s + 1] : n) - first[s];
            if (len > 1 && (widest < 0 || len > (widest + 1 < k ? first[widest + 1] : n) - first[widest])) widest = s;
        }
        if (widest < 0) break;
        int len = (widest + 1 < k ? first[widest + 1] : n) - first[widest];
        memmove(first + widest + 2, first + widest + 1, (size_t)(k - widest - 1) * sizeof *first);
        first[widest + 1] = first[widest] + len / 2;
        k++;
    }
    first[k] = m->n_layers;
    return CREW_OK;
}

crew_status crew_pipeline_plan(const crew_model *m, const crew_fit_options *o, const crew_compile_options *c,
                               crew_fit_plan *p)
{
    p->stages = 1;
    p->pipeline_processes = 1;
    p->stage_first[0] = 0;
    p->stage_first[1] = m->n_layers;
    p->pipeline_schedule = o->pipeline_schedule;
    if (o->pipeline_schedule != CREW_PIPELINE_1F1B && o->pipeline_schedule != CREW_PIPELINE_GPIPE)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "pipeline schedule %d: expected 1f1b or gpipe",
                           o->pipeline_schedule);
    if (o->pipeline_stages < 0 || o->pipeline_stages > CREW_MAX_PIPELINE_STAGES)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "pipeline stages must be in [1, %d], got %d",
                           CREW_MAX_PIPELINE_STAGES, o->pipeline_stages);
    if (o->pipeline_stages <= 1 && !o->pipeline_split) {
        if (o->pipeline_processes > 1)
            return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "pipeline_processes %d without a pipeline (pipeline_stages)",
                               o->pipeline_processes);
        return CREW_OK;
    }
    int k = 0;
    if (o->pipeline_split) {
        CREW_TRY(crew_pipeline_split_parse(m, o->pipeline_split, p->stage_first, &k));
        if (o->pipeline_stages > 1 && k != o->pipeline_stages)
            return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "--stages '%s' names %d stages, --pipeline asks for %d",
                               o->pipeline_split, k, o->pipeline_stages);
    } else {
        k = o->pipeline_stages;
        CREW_TRY(crew_pipeline_split_balanced(m, k, p->stage_first));
    }
    p->stages = k;
    const int span = o->pipeline_processes > 1 ? o->pipeline_processes : 1;
    if (span > 1 && crew_group_size(o->group) < 2)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "a pipeline spanning %d processes per replica needs a process "
                           "group (mpirun)", span);
    if (k == 1) {
        if (span > 1)
            return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "one pipeline stage cannot span %d processes", span);
        return CREW_OK;
    }
    if (k % span)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "%d pipeline stages cannot be shared evenly by %d processes per "
                           "replica: give a multiple of %d stages", k, span, span);
    p->pipeline_processes = span;
    if (crew_group_size(o->group) > 1 && p->unordered_allreduce)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "a pipeline across processes sums each stage's gradients with "
                           "crew's ordered all-reduce: drop --allreduce fast");
    if (c->optimizer.clip_norm > 0.0f)
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "a pipeline cannot clip gradients by their global norm yet "
                           "(clip_norm %g): the norm spans every stage", (double)c->optimizer.clip_norm);
    for (int s = 0; s < k; s++) {
        for (int i = p->stage_first[s]; i < p->stage_first[s + 1]; i++)
            for (int j = 0; j < m->layers[i]->n_params; j++) {
                const crew_param *q = &m->layers[i]->params[j];
                if (q->tied && q->tie_layer < p->stage_first[s])
                    return crew_errorf(CREW_CODE_INVALID_ARGUMENT,
                                       "layer %d (%s) of stage %d shares '%s' with layer %d (%s) of an earlier stage: "
                                       "tied layers must be in one stage", i, m->layers[i]->name, s, q->name,
                                       q->tie_layer, m->layers[q->tie_layer]->name);
            }
    }
    return CREW_OK;
}

void crew_pipeline_describe(const crew_model *m, const crew_fit_plan *p, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int s = 0; s < p->stages && used < len; s++) {
        int a = p->stage_first[s], b = p->stage_first[s + 1] - 1;
        double cost = 0.0;
        for (int i = a; i <= b && i < m->n_compute; i++) cost += crew_model_layer_flops(m, i);
        used += (size_t)snprintf(buf + used, len - used, "%sstage %d: layers %d-%d (%s .. %s, %.3g MFLOP/sample)",
                                 s ? "; " : "", s, a, b, m->layers[a]->name, m->layers[b]->name, cost / 1e6);
    }
}
