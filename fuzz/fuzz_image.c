/* fuzz_image.c — the PNG and JPEG decoders on arbitrary bytes: no crash, no exit, no print, no
 * read past the input; a decoded image has sane dimensions and readable pixels, and converting
 * and resizing it works. Both decoders see every input (each checks its own signature), and
 * crew_image_decode the dispatch between them. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/image_decode.h"
#include "data/resize.h"

static void exercise(const crew_image *in)
{
    if (in->height < 1 || in->width < 1 || (in->channels != 1 && in->channels != 3) || !in->pixels
        || (int64_t)in->height * in->width > CREW_IMAGE_MAX_PIXELS)
        __builtin_trap();
    volatile uint8_t acc = 0;
    for (int64_t i = 0; i < (int64_t)in->height * in->width * in->channels; i++) acc ^= in->pixels[i];
    (void)acc;
    crew_image img = *in;
    crew_status s = crew_image_convert(&img, img.channels == 1 ? 3 : 1);
    uint8_t out[7 * 5 * 3];
    if (!s) s = crew_resize_u8(img.pixels, img.height, img.width, img.channels, out, 7, 5);
    if (s) __builtin_trap(); /* neither can fail on a decoded image short of memory */
    crew_image_free(&img);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    crew_status (*const decoders[3])(const void *, size_t, const char *, crew_image *) = {
        crew_image_decode_png, crew_image_decode_jpeg, crew_image_decode};
    for (int k = 0; k < 3; k++) {
        crew_image img;
        crew_status s = decoders[k](data, size, "fuzz.img", &img);
        if (!s) exercise(&img);
        crew_status_free(s);
    }
    return 0;
}
