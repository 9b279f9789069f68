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
    "at the end of every run); see docs/REPORT.md. A run that is still going, or was killed, gives\n"
    "a report of what it recorded (a torn last line is left out); a run resumed from a checkpoint\n"
    "shows each step once, as the re-run logged it, and says which steps were run again.\n";

typedef struct report_args {
    const char *out;
} report_args;

static const cli_flag_spec report_flags[] = {
    CLI_STRING_FLAG(report_args, "--out", out),
};

int cli_report(int argc, char **argv)
{
    const char *run_dir = NULL;
    report_args a = {0};
    int parsed = cli_parse_args("report", usage_text, report_flags, CLI_COUNT(report_flags), argc, argv, &a, &run_dir);
    if (parsed) return parsed < 0 ? 0 : parsed;
    const char *out = a.out;
    if (!run_dir) return cli_usage_error("report", "missing RUN_DIR");
    if (out && !*out) return cli_usage_error("report", "--out needs a file name");
    crew_status s = crew_report_write(run_dir, out);
    if (s) return cli_fail("report", s);
    if (out) printf("report: %s\n", out);
    else printf("report: %s/report.html\n", run_dir);
    return 0;
}
