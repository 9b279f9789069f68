/* cli_output.c — printing shared by the verbs: the training plan and JSON values. */
#include <math.h>
#include <stdio.h>

#include "cli.h"

const char *cli_json_number(double v, char *buf, size_t len)
{
    if (!isfinite(v))
        snprintf(buf, len, "null");
    else
        snprintf(buf, len, "%.6g", v);
    return buf;
}

void cli_print_plan(const crew_fit_plan *p, const char *devices)
{
    char text[8192];
    crew_fit_plan_text(p, devices, text, sizeof text);
    fputs(text, stdout);
}
