/* fuzz_manifest.c — crew_manifest_parse on arbitrary text: no crash or leak, and an accepted
 * manifest keeps the invariants crew_dataset_open relies on. */
#include <stddef.h>
#include <stdint.h>

#include "data/manifest.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    crew_manifest m;
    crew_status s = crew_manifest_parse((const char *)data, size, "fuzz.json", &m);
    if (!s) {
        int ok = m.classes >= 1 && m.n_splits >= 1 && m.n_splits <= CREW_MANIFEST_MAX_SPLITS
              && m.sample_shape.ndim >= 1 && m.sample_shape.ndim <= CREW_MAX_DIMS && m.n_channels >= 1
              && m.n_channels <= CREW_MANIFEST_MAX_CHANNELS && m.scale > 0;
        for (int i = 0; ok && i < m.n_splits; i++) {
            const crew_manifest_split *sp = &m.splits[i];
            ok = sp->x.ndim == 1 + m.sample_shape.ndim && sp->x.shape[0] == sp->samples && sp->y.ndim == 1
              && sp->y.shape[0] == sp->samples && crew_manifest_find_split(&m, sp->name) == sp;
        }
        if (!ok) __builtin_trap();
        crew_manifest_free(&m);
    }
    crew_status_free(s);
    return 0;
}
