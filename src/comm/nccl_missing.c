/* nccl_missing.c — crew_nccl_describe in a build without NCCL (comm_nccl.h: src/comm/nccl/). */
#include <stdio.h>

#include "crew.h"

#ifndef CREW_HAVE_NCCL
void crew_nccl_describe(char *buf, size_t len)
{
    if (len) snprintf(buf, len, "not in this build (not found beside the CUDA toolkit)");
}
#endif
