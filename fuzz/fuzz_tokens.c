/* fuzz_tokens.c — crew_tokens_parse on arbitrary bytes: no crash and no read past the input; an
 * accepted shard is exactly header + 2 bytes per token, and every token can be read. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/tokens.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* A copy of exactly size bytes (2-aligned, as a mapping would be): ASan flags any read past it. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);
    crew_token_shard sh;
    crew_status s = crew_tokens_parse(buf, size, "fuzz.bin", &sh);
    if (!s) {
        if (sh.count < 0 || (size_t)CREW_TOKENS_HEADER_BYTES + 2 * (size_t)sh.count != size || sh.map) __builtin_trap();
        volatile uint16_t acc = 0;
        for (int64_t i = 0; i < sh.count; i++) acc ^= sh.tokens[i];
        (void)acc;
        crew_tokens_close(&sh);
    }
    crew_status_free(s);
    free(buf);
    return 0;
}
