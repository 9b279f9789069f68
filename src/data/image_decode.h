/* image_decode.h — PNG (libpng) and JPEG (libjpeg-turbo) files into 8-bit pixels.
 *
 * Decoding yields the image's own colour model with any alpha channel dropped: 1 channel for
 * greyscale files, 3 (RGB) for colour ones. crew_image_convert then gives the channels a dataset
 * asks for. Everything a decoder would print or exit on is an error naming the file instead,
 * JPEG "corrupt data" warnings included (a truncated JPEG is not silently padded with grey). */
#ifndef CREW_DATA_IMAGE_DECODE_H
#define CREW_DATA_IMAGE_DECODE_H

#include <stddef.h>
#include <stdint.h>

#include "crew.h"

/* No photo a dataset holds comes near 64 megapixels; the cap stops a hostile header from making
 * the decoder allocate absurdly. */
#define CREW_IMAGE_MAX_PIXELS ((int64_t)1 << 26)
/* Files over 256 MiB are refused before reading them. */
#define CREW_IMAGE_MAX_FILE_BYTES ((int64_t)256 << 20)

typedef struct crew_image {
    int height, width;
    int channels;    /* 1 (grey) or 3 (RGB) */
    uint8_t *pixels; /* [height][width][channels], row-major, malloc'd; crew_image_free releases */
} crew_image;

/* PNG or JPEG, told apart by their signatures; anything else is an error. `what` names the
 * source in messages (a file name). */
crew_status crew_image_decode(const void *buf, size_t len, const char *what, crew_image *out);
crew_status crew_image_decode_png(const void *buf, size_t len, const char *what, crew_image *out);
crew_status crew_image_decode_jpeg(const void *buf, size_t len, const char *what, crew_image *out);
/* Reads a whole file and decodes it; an empty file is an error naming it. */
crew_status crew_image_read(const char *path, crew_image *out);
void crew_image_free(crew_image *img);

/* 1 or 3 channels, in place: grey → RGB repeats the value; RGB → grey is ITU-R BT.601 luma,
 * (299·R + 587·G + 114·B + 500) / 1000 — what PIL's convert("L") computes. */
crew_status crew_image_convert(crew_image *img, int channels);

#endif
