/* fuzz_checkpoint_state.c — crew_checkpoint_state_parse (a checkpoint's state.json, outside data
 * a resume reads) on arbitrary text, and on a valid state whose plan's "conv" and "conv_choice"
 * come from the input: no crash or leak, and an accepted state keeps the invariants a resume
 * relies on (a plan with batches and steps, the convolutions' ways only 'l' and 'i'). */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/checkpoint.h"
#include "train/checkpoint_json.h"

/* A state.json as crew writes it, its two convolution values left to the input. */
static const char *const head =
    "{\"format\":\"crew-checkpoint\",\"version\":1,\"step\":2,\"plan\":{\"devices\":2,\"batch_per_device\":128,"
    "\"accumulation\":1,\"global_batch\":256,\"train_samples\":60000,\"steps_per_epoch\":234,\"epochs\":1,"
    "\"total_steps\":2,\"seed\":\"1\",\"base_lr\":0.001,\"base_batch\":128,\"scaling\":2,\"lr_factor\":1.4,"
    "\"threads_per_device\":1,\"augment\":{\"crop_padding\":0,\"flip\":false},\"pad_last_batch\":false,"
    "\"sync_batch_norm\":true,\"on_nan\":\"stop\",\"precision\":\"fp32\",\"conv\":";
static const char *const tail =
    "},\"lr\":{\"schedule\":2,\"start_lr\":0.001,\"peak_lr\":0.0014,\"min_lr\":0,\"warmup_steps\":1,"
    "\"total_steps\":2,\"step_size\":0,\"gamma\":0.1},\"files\":{\"model.safetensors\":{\"bytes\":1077872,"
    "\"xxh3\":\"abb001ad8a78d09d\"},\"optimizer.safetensors\":{\"bytes\":2154840,\"xxh3\":\"27a847d429f324c5\"}}}";

static void check(const char *text)
{
    crew_checkpoint_state st;
    crew_checkpoint_file_sum sums[CREW_CHECKPOINT_FILES];
    crew_status s = crew_checkpoint_state_parse(text, "state.json", &st, sums);
    if (!s) {
        const crew_fit_plan *p = &st.plan;
        size_t n = strnlen(p->conv_choice, sizeof p->conv_choice);
        if (p->global_batch <= 0 || p->steps_per_epoch <= 0 || st.step > p->total_steps || n > CREW_MAX_CONV_LAYERS ||
            strspn(p->conv_choice, "li") != n || p->conv < CREW_CONV_AUTO || p->conv > CREW_CONV_LIBRARY)
            abort();
    }
    crew_status_free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    check(text);
    /* the input's first line as "conv", the rest as "conv_choice", each a JSON value as given */
    char *nl = strchr(text, '\n');
    if (nl) {
        *nl = '\0';
        size_t len = strlen(head) + strlen(text) + strlen(",\"conv_choice\":") + strlen(nl + 1) + strlen(tail) + 1;
        char *state = malloc(len);
        if (state) {
            snprintf(state, len, "%s%s,\"conv_choice\":%s%s", head, text, nl + 1, tail);
            check(state);
            free(state);
        }
    }
    free(text);
    return 0;
}
