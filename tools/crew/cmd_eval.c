/* cmd_eval.c — crew eval MODEL.json --weights FILE --data DIR [--split S] [--json] */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const char *usage_text =
    "usage: crew eval MODEL.json --weights FILE --data DIR [--split test] [--batch N] [--json]\n"
    "\n"
    "Evaluates saved weights on a split of a dataset directory and prints loss and accuracy.\n"
    "With --json the last line is {\"test_accuracy\":..,\"test_loss\":..,\"samples\":..}.\n";

int cli_eval(int argc, char **argv)
{
    const char *model = NULL, *weights = NULL, *data = NULL, *split = "test";
    int json = 0;
    int64_t batch = 256;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int r = 0;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage_text, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--json")) json = 1;
        else if ((r = cli_flag(argc, argv, &i, "--weights", &v))) weights = v;
        else if ((r = cli_flag(argc, argv, &i, "--data", &v))) data = v;
        else if ((r = cli_flag(argc, argv, &i, "--split", &v))) split = v;
        else if ((r = cli_flag(argc, argv, &i, "--batch", &v))) {
            if (r > 0 && !cli_parse_int("eval", "--batch", v, 1, 1 << 20, &batch)) return 2;
        } else if (argv[i][0] == '-') return cli_usage_error("eval", "unknown option '%s'", argv[i]);
        else if (!model) model = argv[i];
        else return cli_usage_error("eval", "unexpected argument '%s'", argv[i]);
        if (r < 0) return cli_usage_error("eval", "%s needs a value", argv[i]);
    }
    if (!model) return cli_usage_error("eval", "missing MODEL.json");
    if (!weights) return cli_usage_error("eval", "missing --weights FILE");
    if (!data) return cli_usage_error("eval", "missing --data DIR");

    crew_model *m = NULL;
    crew_dataset *d = NULL;
    crew_eval_result r;
    cli_warn_slow_blas("eval");
    crew_status s = crew_model_load_file(model, &m);
    if (!s) s = crew_model_load_weights(m, weights);
    if (!s) s = crew_dataset_open(data, split, &d);
    if (!s) s = crew_model_evaluate(m, d, batch, &r);
    int rc = 0;
    if (s) {
        rc = cli_fail("eval", s);
    } else {
        printf("%s: %lld samples, accuracy %.4f, loss %.4f\n", split, (long long)r.samples, (double)r.accuracy,
               (double)r.loss);
        if (json) {
            char a[32], l[32];
            printf("{\"test_accuracy\":%s,\"test_loss\":%s,\"samples\":%lld}\n", cli_json_number(r.accuracy, a, sizeof a),
                   cli_json_number(r.loss, l, sizeof l), (long long)r.samples);
        }
    }
    crew_dataset_free(d);
    crew_model_free(m);
    return rc;
}
