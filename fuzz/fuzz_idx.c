/* fuzz_idx.c — crew_idx_parse on arbitrary bytes, raw or gzip (inputs starting 1f 8b take the
 * inflate path): no crash, no hang, no allocation beyond what the input can hold. */
#include <stddef.h>
#include <stdint.h>

#include "data/idx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    crew_idx x;
    crew_status s = crew_idx_parse(data, size, "fuzz.idx", &x);
    if (!s) {
        int64_t count = 1;
        for (int i = 0; i < x.ndim; i++) count *= x.dims[i];
        if (x.ndim < 1 || x.ndim > CREW_IDX_MAX_DIMS || count != x.count || !x.data) __builtin_trap();
        volatile uint8_t acc = 0;
        for (int64_t i = 0; i < x.count; i++) acc ^= x.data[i];
        (void)acc;
        crew_idx_free(&x);
    }
    crew_status_free(s);
    return 0;
}
