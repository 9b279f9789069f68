/* fuzz_safetensors.c — libFuzzer target for the safetensors reader: any bytes must give either
 * a checked file whose tensors lie inside the input, or an error; never a crash or a read out
 * of bounds. Touches every accepted tensor's bytes so AddressSanitizer sees a bad offset. */
#include <stdint.h>
#include <string.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    crew_st_file f;
    crew_status s = crew_st_parse(data, size, "fuzz", &f);
    if (s) {
        /* An error always carries a message naming the input. */
        if (!strstr(crew_status_message(s), "fuzz") && crew_status_code(s) != CREW_CODE_OUT_OF_MEMORY)
            __builtin_trap();
        crew_status_free(s);
        return 0;
    }
    volatile uint8_t sink = 0;
    for (int i = 0; i < f.n_tensors; i++) {
        const crew_st_tensor *t = &f.tensors[i];
        size_t bytes = (size_t)t->count * crew_st_dtype_size(t->dtype);
        const uint8_t *p = t->data;
        if (bytes && (p < data || p + bytes > data + size)) __builtin_trap();
        for (size_t k = 0; k < bytes; k++) sink ^= p[k];
        if (crew_st_find(&f, t->name) == NULL) __builtin_trap();
    }
    for (int i = 0; i < f.n_metadata; i++) (void)crew_st_metadata(&f, f.metadata[2 * i]);
    (void)sink;
    crew_st_free(&f);
    return 0;
}
