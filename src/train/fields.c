/* fields.c — crew's structs described by name (crew_struct_fields): what a front end in another
 * language reads and sets without restating their layout. The Python package (python/crew) sets
 * crew_fit_options from keyword arguments and turns the plan, the result and the progress records
 * into dicts through this table, so that a field added to crew.h is a line here, not a second
 * copy of the struct to keep in step.
 *
 * The compiler checks each row: the member must exist (offsetof), and its type is taken from the
 * member itself (_Generic), never written by hand. That every member has a row is checked by the
 * Python package's test (test_fields.py), which reads the structs out of crew.h. */
#include <stddef.h>
#include <string.h>

#include "crew.h"

/* A member's type as a crew_field_type. Enums are compatible with int or unsigned int; function
 * pointers, data pointers and volatile ones are pointers. */
#define FIELD_TYPE(x)                                                                                 \
    _Generic((x), int: CREW_FIELD_INT, unsigned int: CREW_FIELD_INT, long: CREW_FIELD_INT64,          \
             long long: CREW_FIELD_INT64, unsigned long: CREW_FIELD_UINT64,                            \
             unsigned long long: CREW_FIELD_UINT64, float: CREW_FIELD_FLOAT, double: CREW_FIELD_DOUBLE, \
             const char *: CREW_FIELD_STRING, char *: CREW_FIELD_STRING, default: CREW_FIELD_POINTER)

#define MEMBER(S, f) (((S *)0)->f)
/* A scalar member (nested ones as "augment.flip"). */
#define F(S, f) {#f, FIELD_TYPE(MEMBER(S, f)), offsetof(S, f), 1}
/* An array of numbers: its element's type and how many. */
#define A(S, f) {#f, FIELD_TYPE(MEMBER(S, f)[0]), offsetof(S, f), (int)(sizeof MEMBER(S, f) / sizeof MEMBER(S, f)[0])}
/* Text in a char array. */
#define C(S, f) {#f, CREW_FIELD_CHARS, offsetof(S, f), (int)sizeof MEMBER(S, f)}

#define S crew_fit_options
static const crew_field fit_options[] = {
    F(S, struct_size), F(S, epochs), F(S, max_steps), F(S, batch_per_device), F(S, global_batch),
    F(S, device_kind), F(S, devices), F(S, threads_per_device), F(S, bucket_mb), F(S, sync_batch_norm),
    F(S, collective_timeout_s), F(S, seed), F(S, lr), F(S, base_batch), F(S, lr_scaling), F(S, warmup_steps),
    F(S, warmup_epochs), F(S, test), F(S, on_step), F(S, on_epoch), F(S, on_event), F(S, run_dir), F(S, on_nan),
    F(S, drift_check_every), F(S, straggler_threshold), F(S, straggler_window), F(S, loss_spike_z),
    F(S, loader_threads), F(S, prefetch), F(S, augment.crop_padding), F(S, augment.flip), F(S, pad_last_batch),
    F(S, checkpoint_dir), F(S, checkpoint_every), F(S, checkpoint_every_s), F(S, keep_checkpoints), F(S, resume),
    F(S, user), F(S, cancel), F(S, group), F(S, peak_gflops), F(S, unordered_allreduce), F(S, shard_optimizer),
    F(S, pipeline_stages), F(S, pipeline_schedule), F(S, pipeline_split), F(S, pipeline_processes),
    F(S, communicator), F(S, precision), F(S, conv), F(S, conv_choice), F(S, attention_recompute),
    F(S, noise_scale_every), F(S, shard), F(S, shard_unit_mb), F(S, shard_overlap), F(S, bind_cores),
    F(S, loader_inline),
};
#undef S
#define S crew_fit_plan
static const crew_field fit_plan[] = {
    C(S, device_kind), F(S, devices), F(S, threads_per_device), F(S, batch_per_device), F(S, accumulation),
    F(S, global_batch), F(S, train_samples), F(S, steps_per_epoch), F(S, epochs), F(S, total_steps), F(S, seed),
    F(S, base_lr), F(S, base_batch), F(S, scaling), F(S, lr_factor), F(S, scaled_lr), F(S, warmup_steps),
    F(S, warmup_start_lr), F(S, schedule), F(S, augment.crop_padding), F(S, augment.flip), F(S, pad_last_batch),
    F(S, sync_batch_norm), F(S, on_nan), F(S, processes), F(S, unordered_allreduce), F(S, nccl), F(S, precision),
    F(S, conv), C(S, conv_choice), F(S, shard_optimizer), F(S, flops_per_sample), F(S, peak_gflops), F(S, stages),
    F(S, pipeline_schedule), A(S, stage_first), F(S, pipeline_processes), F(S, attention_recompute),
    F(S, noise_scale_every), F(S, bucket_mb), F(S, buckets), F(S, bucket_auto), F(S, bucket_rule), F(S, shard), F(S, shard_unit_mb),
    F(S, shard_units), F(S, shard_pinned_unit), F(S, shard_tied_late),
    F(S, shard_overlap), F(S, bind_cores), F(S, loader_inline),
};
#undef S
#define S crew_fit_result
static const crew_field fit_result[] = {
    F(S, epochs), F(S, steps), F(S, train_loss), F(S, train_accuracy), F(S, test_loss), F(S, test_accuracy),
    F(S, wall_s), F(S, samples_per_s), F(S, skipped_updates), F(S, events), F(S, data_fraction),
    F(S, compute_fraction), F(S, comm_exposed_fraction), F(S, optimizer_fraction), F(S, comm_hidden_s),
    C(S, bottleneck), F(S, resumed_from_step), C(S, resume_note), C(S, last_checkpoint), F(S, gflops),
    F(S, peak_fraction), F(S, test_bits), F(S, stages), A(S, stage_peak_bytes), F(S, bubble_fraction),
    F(S, bottleneck_stage), F(S, noise_scale), C(S, noise_text),
};
#undef S
#define S crew_step_info
static const crew_field step_info[] = {
    F(S, step), F(S, steps_total), F(S, epoch), F(S, epoch_step), F(S, epoch_steps), F(S, loss), F(S, accuracy),
    F(S, lr), F(S, step_s), F(S, elapsed_s), F(S, data_s), F(S, forward_s), F(S, backward_s),
    F(S, comm_exposed_s), F(S, comm_hidden_s), F(S, optimizer_s), F(S, noise_scale),
};
#undef S
#define S crew_epoch_info
static const crew_field epoch_info[] = {
    F(S, epoch), F(S, epochs), F(S, steps), F(S, train_loss), F(S, train_accuracy), F(S, test_loss),
    F(S, test_accuracy), F(S, wall_s), F(S, samples_per_s), F(S, test_bits),
};
#undef S
#define S crew_event_info
static const crew_field event_info[] = {
    F(S, kind), F(S, kind_name), F(S, step), F(S, rank), F(S, value), F(S, message),
};
#undef S
#define S crew_eval_result
static const crew_field eval_result[] = {F(S, loss), F(S, accuracy), F(S, samples)};
#undef S
#define S crew_arrays
static const crew_field arrays[] = {
    F(S, x), F(S, x_type), F(S, sample_shape), F(S, sample_ndim), F(S, y), F(S, y_type), F(S, n), F(S, classes),
    F(S, name),
};
#undef S

#define S crew_run_config
static const crew_field run_config[] = {
    F(S, model_path), F(S, data_dir), F(S, devices), F(S, init_weights), F(S, front_end), F(S, plan),
};
#undef S

#define ROW(name, table) {#name, table, sizeof(name), (int)(sizeof table / sizeof table[0])}
static const struct {
    const char *name;
    const crew_field *fields;
    size_t size;
    int n;
} structs[] = {
    ROW(crew_fit_options, fit_options), ROW(crew_fit_plan, fit_plan),     ROW(crew_fit_result, fit_result),
    ROW(crew_step_info, step_info),     ROW(crew_epoch_info, epoch_info), ROW(crew_event_info, event_info),
    ROW(crew_eval_result, eval_result), ROW(crew_arrays, arrays),     ROW(crew_run_config, run_config),
};

const crew_field *crew_struct_fields(const char *name, size_t *size, int *n)
{
    for (size_t i = 0; name && i < sizeof structs / sizeof structs[0]; i++)
        if (!strcmp(structs[i].name, name)) {
            if (size) *size = structs[i].size;
            if (n) *n = structs[i].n;
            return structs[i].fields;
        }
    return NULL;
}

const char *crew_struct_name(int i)
{
    return i >= 0 && i < (int)(sizeof structs / sizeof structs[0]) ? structs[i].name : NULL;
}
