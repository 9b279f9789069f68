/* cmd_eval.c — crew eval MODEL.json --weights FILE --data DIR [--split S] [--json] */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const char *usage_text =
    "usage: crew eval MODEL.json --weights FILE --data DIR [--split test] [--batch N] [--json]\n"
    "\n"
    "Evaluates saved weights on a split of a dataset directory and prints loss and accuracy.\n"
    "With --json the last line is {\"test_accuracy\":..,\"test_loss\":..,\"samples\":..}.\n"
    "Weights of a run that did not finish (stopped by a signal; a checkpoint's model.safetensors)\n"
    "are evaluated too, with a warning on stderr saying how far the run got.\n";

typedef struct eval_args {
    const char *model, *weights, *data, *split;
    int json;
    int64_t batch;
} eval_args;

static const cli_flag_spec eval_flags[] = {
    CLI_SWITCH_FLAG(eval_args, "--json", json),
    CLI_STRING_FLAG(eval_args, "--weights", weights),
    CLI_STRING_FLAG(eval_args, "--data", data),
    CLI_STRING_FLAG(eval_args, "--split", split),
    CLI_INT_FLAG(eval_args, "--batch", batch, 1, 1 << 20),
};

/* A run's weights say how far it got (docs/WEIGHTS.md): an unfinished run's are not its result. */
static void warn_unfinished(const char *weights)
{
    int64_t steps, total;
    crew_status s = crew_weights_progress(weights, &steps, &total);
    if (!s && steps >= 0 && steps < total)
        fprintf(stderr, "crew eval: warning: %s holds the weights of an unfinished run, after %lld of its %lld steps\n",
                weights, (long long)steps, (long long)total);
    crew_status_free(s);
}

int cli_eval(int argc, char **argv)
{
    eval_args a = {.split = "test", .batch = 256};
    int parsed = cli_parse_args("eval", usage_text, eval_flags, CLI_COUNT(eval_flags), argc, argv, &a, &a.model);
    if (parsed) return parsed < 0 ? 0 : parsed;
    if (!a.model) return cli_usage_error("eval", "missing MODEL.json");
    if (!a.weights || !*a.weights) return cli_usage_error("eval", "missing --weights FILE");
    if (!a.data || !*a.data) return cli_usage_error("eval", "missing --data DIR");

    crew_model *m = NULL;
    crew_dataset *d = NULL;
    crew_eval_result r;
    cli_warn_slow_blas("eval");
    crew_status s = crew_model_load_file(a.model, &m);
    if (!s) s = crew_model_load_weights(m, a.weights);
    if (!s) warn_unfinished(a.weights);
    if (!s) s = crew_dataset_open_for(m, a.data, a.split, &d);
    if (!s) cli_note_dataset("eval", d);
    if (!s) s = crew_model_evaluate(m, d, a.batch, &r);
    int rc = 0;
    if (s) {
        rc = cli_fail("eval", s);
    } else {
        printf("%s: %lld samples, accuracy %.4f, loss %.4f\n", a.split, (long long)r.samples, (double)r.accuracy,
               (double)r.loss);
        if (a.json) {
            char acc[32], l[32];
            printf("{\"test_accuracy\":%s,\"test_loss\":%s,\"samples\":%lld}\n", cli_json_number(r.accuracy, acc, sizeof acc),
                   cli_json_number(r.loss, l, sizeof l), (long long)r.samples);
        }
    }
    crew_dataset_free(d);
    crew_model_free(m);
    return rc;
}
