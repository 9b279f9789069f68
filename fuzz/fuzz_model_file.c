/* fuzz_model_file.c — libFuzzer target for model files: any bytes given to the parser (crew's
 * format and the Keras import alike) must give a model or an error, never a crash, a leak or a
 * hang. Seed it with the JSON files in examples/ and tests/fixtures/keras/. */
#include <stddef.h>
#include <stdint.h>

#include "crew.h"
#include "io/model_file.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    crew_model *m = NULL;
    crew_status s = crew_model_parse_json((const char *)data, size, "fuzz.json", &m);
    if (s) {
        /* An error must leave no model behind and carry a message. */
        if (m || !crew_status_message(s)[0]) __builtin_trap();
        crew_status_free(s);
        return 0;
    }
    char summary[4096];
    crew_model_summary(m, summary, sizeof summary);
    (void)crew_model_param_count(m);
    (void)crew_model_output_size(m);
    crew_model_free(m);
    return 0;
}
