/* version.c — the library's version string. */
#include "crew.h"

const char *crew_version(void) { return "0.1.0"; }
