/* cmd_report.c — crew report RUN_DIR [--out FILE] */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static const char *usage_text =
    "usage: crew report RUN_DIR [--out FILE]\n"
    "\n"
    "Writes a self-contained HTML report of a training run from RUN_DIR/metrics.jsonl: the run's\n"
    "facts and bottleneck, loss and learning rate, throughput, where each step's time went,\n"
    "per-replica compute time with stragglers marked, and the events and epochs. The page needs\n"
    "no network and no script. By default it goes to RUN_DIR/report.html (crew train writes it\n"
    "at the end of every run); see docs/REPORT.md.\n";

int cli_report(int argc, char **argv)
{
    const char *run_dir = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int r = 0;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage_text, stdout);
            return 0;
        }
        if ((r = cli_flag(argc, argv, &i, "--out", &v))) out = v;
        else if (argv[i][0] == '-') return cli_usage_error("report", "unknown option '%s'", argv[i]);
        else if (!run_dir) run_dir = argv[i];
        else return cli_usage_error("report", "unexpected argument '%s'", argv[i]);
        if (r < 0) return cli_usage_error("report", "%s needs a value", argv[i]);
    }
    if (!run_dir) return cli_usage_error("report", "missing RUN_DIR");
    if (out && !*out) return cli_usage_error("report", "--out needs a file name");
    crew_status s = crew_report_write(run_dir, out);
    if (s) return cli_fail("report", s);
    if (out) printf("report: %s\n", out);
    else printf("report: %s/report.html\n", run_dir);
    return 0;
}
