/* fuzz_npy.c — crew_npy_parse on arbitrary bytes: it must never crash, hang or read outside the
 * input, and what it accepts must describe data lying wholly inside the input. */
#include <stddef.h>
#include <stdint.h>

#include "data/npy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    crew_npy a;
    crew_status s = crew_npy_parse(data, size, "fuzz.npy", &a);
    if (!s) {
        size_t n = (size_t)a.count * crew_npy_dtype_size(a.dtype);
        const uint8_t *p = a.data;
        if (a.count < 0 || p < data || n > size || p + n != data + size) __builtin_trap();
        volatile uint8_t acc = 0;
        for (size_t i = 0; i < n; i++) acc ^= p[i]; /* ASan checks every byte is in bounds */
        (void)acc;
        crew_npy_close(&a);
    }
    crew_status_free(s);
    return 0;
}
