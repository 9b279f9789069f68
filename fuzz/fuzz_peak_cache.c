/* fuzz_peak_cache.c — crew_peak_cache_find on arbitrary text (the peak cache is a file anyone
 * may have edited): no crash, no read past the text, and a figure found is finite and in range. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "advise/peak_cache.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The key is the text's first line (up to 40 bytes), so that matching lines are reachable. */
    char key[41];
    size_t k = 0;
    while (k < size && k < 40 && data[k] != '\n' && data[k] != ' ' && data[k] != '\0') {
        key[k] = (char)data[k];
        k++;
    }
    key[k] = '\0';
    char *copy = malloc(size ? size : 1); /* exactly size bytes: ASan sees any read past them */
    if (!copy) return 0;
    for (size_t i = 0; i < size; i++) copy[i] = (char)data[i];
    double g = -1.0;
    if (crew_peak_cache_find(copy, size, key, &g) && !(isfinite(g) && g > 0.0 && g < 1e9)) abort();
    free(copy);
    return 0;
}
