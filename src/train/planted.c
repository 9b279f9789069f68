/* planted.c — the names of the bugs that tests plant (train/hooks.h). */
#include "train/hooks.h"

const char *crew_planted_bug_name(crew_planted_bug b)
{
    static const char *const names[CREW_PLANT_COUNT] = {
        [CREW_PLANT_NONE] = "none",
        [CREW_PLANT_DROPOUT_BY_ROW] = "dropout mask keyed by the row, not the sample",
        [CREW_PLANT_LAST_BUCKET_UNREDUCED] = "last gradient bucket never all-reduced",
        [CREW_PLANT_ORDERED_DROPS_MICRO] = "ordered all-reduce drops a micro-batch (k > 1)",
        [CREW_PLANT_PLAIN_DROPS_RANK] = "a rank left out of the plain all-reduce",
        [CREW_PLANT_STALE_GRADIENT] = "one replica updates with the previous step's gradient",
        [CREW_PLANT_ACCUM_DROPS_MICRO] = "one replica accumulating drops a micro-batch",
        [CREW_PLANT_AVERAGED_TWICE] = "gradients averaged twice",
        [CREW_PLANT_SAME_MICRO_TWICE] = "the same micro-batch given to two replicas",
        [CREW_PLANT_LOCAL_BN_STATS] = "local instead of synchronised batch-norm statistics",
        [CREW_PLANT_WARMUP_SKIPPED] = "warmup skipped when N > 1",
        [CREW_PLANT_WRONG_LOADER_SLOT] = "a replica reads the wrong loader slot",
        [CREW_PLANT_AGAINST_LOW_PRECISION] = "--against: that device's GEMMs in lower precision",
    };
    return b >= 0 && b < CREW_PLANT_COUNT ? names[b] : "unknown";
}
