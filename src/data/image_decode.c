/* image_decode.c — PNG through libpng's simplified API, JPEG through libjpeg-turbo's classic API.
 *
 * libpng's simplified API catches its own errors (png_image.message), so nothing here longjmps
 * for PNG. libjpeg reports errors through error_exit, which by default prints and exits: here it
 * longjmps back to decode_jpeg instead, and warnings (corrupt data that libjpeg would paper over)
 * do the same, so a damaged file is an error naming it. Dimensions are checked against
 * CREW_IMAGE_MAX_PIXELS before any pixel buffer is allocated. */
#include "data/image_decode.h"

#include <stdio.h> /* before jpeglib.h, which uses FILE without including it */
#include <jpeglib.h>
#include <png.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>

#include "core/mapped_file.h"
#include "core/status.h"

/* More scans than any encoder writes; a hostile progressive file could otherwise take ages. */
#define MAX_JPEG_SCANS 1000

static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};

static crew_status too_large(const char *what, int64_t w, int64_t h)
{
    return crew_errorf(CREW_CODE_BAD_INPUT, "%s: a %lldx%lld image is larger than the %lld pixels crew decodes", what,
                       (long long)w, (long long)h, (long long)CREW_IMAGE_MAX_PIXELS);
}

/* [h][w][from] with from = 2 or 4 (an alpha channel last) into [h][w][from - 1], in place. */
static void drop_alpha(uint8_t *px, int64_t pixels, int from)
{
    for (int64_t i = 0; i < pixels; i++)
        for (int c = 0; c < from - 1; c++) px[i * (from - 1) + c] = px[i * from + c];
}

crew_status crew_image_decode_png(const void *buf, size_t len, const char *what, crew_image *out)
{
    if (!out || (!buf && len)) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_image_decode_png: NULL argument");
    if (!what) what = "PNG image";
    memset(out, 0, sizeof *out);
    png_image im;
    memset(&im, 0, sizeof im);
    im.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_memory(&im, buf, len)) {
        crew_status s = crew_errorf(CREW_CODE_BAD_INPUT, "%s: not a readable PNG: %s", what, im.message);
        png_image_free(&im);
        return s;
    }
    if ((int64_t)im.width * im.height > CREW_IMAGE_MAX_PIXELS) {
        png_image_free(&im);
        return too_large(what, im.width, im.height);
    }
    /* 8-bit sRGB output with alpha is not premultiplied, so dropping alpha keeps the colours as
     * stored (what PIL's convert("RGB") does). */
    int color = (im.format & PNG_FORMAT_FLAG_COLOR) != 0, stored = color ? 4 : 2;
    im.format = color ? PNG_FORMAT_RGBA : PNG_FORMAT_GA;
    uint8_t *px = malloc(PNG_IMAGE_SIZE(im));
    if (!px) {
        png_image_free(&im);
        return CREW_OOM();
    }
    if (!png_image_finish_read(&im, NULL, px, 0, NULL)) { /* frees im's internals itself */
        crew_status s = crew_errorf(CREW_CODE_BAD_INPUT, "%s: corrupt PNG: %s", what, im.message);
        free(px);
        return s;
    }
    drop_alpha(px, (int64_t)im.width * im.height, stored);
    out->height = (int)im.height;
    out->width = (int)im.width;
    out->channels = stored - 1;
    out->pixels = px;
    return CREW_OK;
}

/* ---------------------------------------------------------------- JPEG */

typedef struct jpeg_guard {
    struct jpeg_error_mgr mgr; /* first, so libjpeg's pointer to it is a pointer to the guard */
    jmp_buf jump;
    const char *what; /* the file, for the message after a longjmp */
    char message[JMSG_LENGTH_MAX];
} jpeg_guard;

static void jpeg_fail(j_common_ptr cinfo)
{
    jpeg_guard *g = (jpeg_guard *)(void *)cinfo->err;
    g->mgr.format_message(cinfo, g->message);
    longjmp(g->jump, 1);
}

/* Level -1 is a warning about corrupt data: an error here. Higher levels are traces: ignored. */
static void jpeg_message(j_common_ptr cinfo, int level)
{
    if (level < 0) jpeg_fail(cinfo);
}

static void jpeg_quiet(j_common_ptr cinfo) { (void)cinfo; }

static void jpeg_progress(j_common_ptr cinfo)
{
    j_decompress_ptr d = (j_decompress_ptr)(void *)cinfo;
    if (cinfo->is_decompressor && d->input_scan_number > MAX_JPEG_SCANS) {
        jpeg_guard *g = (jpeg_guard *)(void *)cinfo->err;
        snprintf(g->message, sizeof g->message, "more than %d scans", MAX_JPEG_SCANS);
        longjmp(g->jump, 1);
    }
}

/* Header and sizes; the caller has set up the error guard. */
static crew_status jpeg_setup(j_decompress_ptr d, const char *what)
{
    jpeg_read_header(d, TRUE);
    if ((int64_t)d->image_width * d->image_height > CREW_IMAGE_MAX_PIXELS)
        return too_large(what, d->image_width, d->image_height);
    if (d->num_components == 1) {
        d->out_color_space = JCS_GRAYSCALE;
    } else if (d->jpeg_color_space == JCS_CMYK || d->jpeg_color_space == JCS_YCCK) {
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: CMYK JPEGs are not supported (convert it to RGB)", what);
    } else {
        d->out_color_space = JCS_RGB;
    }
    jpeg_start_decompress(d);
    if (d->output_components != 1 && d->output_components != 3)
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: JPEG decodes to %d channels, not 1 or 3", what, d->output_components);
    return CREW_OK;
}

crew_status crew_image_decode_jpeg(const void *buf, size_t len, const char *what, crew_image *out)
{
    if (!out || (!buf && len)) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_image_decode_jpeg: NULL argument");
    memset(out, 0, sizeof *out);
    struct jpeg_decompress_struct d;
    struct jpeg_progress_mgr progress = {.progress_monitor = jpeg_progress};
    jpeg_guard g;
    uint8_t *volatile px = NULL; /* volatile: assigned between setjmp and a possible longjmp */
    memset(&d, 0, sizeof d);     /* so destroying after an early longjmp finds no memory manager */
    d.err = jpeg_std_error(&g.mgr);
    g.mgr.error_exit = jpeg_fail;
    g.mgr.emit_message = jpeg_message;
    g.mgr.output_message = jpeg_quiet;
    g.message[0] = '\0';
    g.what = what ? what : "JPEG image";
    if (setjmp(g.jump)) {
        jpeg_destroy_decompress(&d);
        free(px);
        return crew_errorf(CREW_CODE_BAD_INPUT, "%s: corrupt JPEG: %s", g.what, g.message);
    }
    what = g.what;
    jpeg_create_decompress(&d);
    d.progress = &progress;
    jpeg_mem_src(&d, buf, (unsigned long)len);
    crew_status s = jpeg_setup(&d, what);
    if (!s) {
        size_t stride = (size_t)d.output_width * (size_t)d.output_components, size = stride * d.output_height;
        px = malloc(size > 0 ? size : 1);
        if (!px) s = CREW_OOM();
        while (!s && d.output_scanline < d.output_height) {
            JSAMPROW row = px + stride * d.output_scanline;
            if (jpeg_read_scanlines(&d, &row, 1) != 1)
                s = crew_errorf(CREW_CODE_BAD_INPUT, "%s: corrupt JPEG: no data for row %u", what, d.output_scanline);
        }
        if (!s) jpeg_finish_decompress(&d);
    }
    if (!s) {
        out->height = (int)d.output_height;
        out->width = (int)d.output_width;
        out->channels = d.output_components;
        out->pixels = px;
        px = NULL;
    }
    jpeg_destroy_decompress(&d);
    free(px);
    return s;
}

/* ---------------------------------------------------------------- either */

static int is_jpeg(const uint8_t *p, size_t len) { return len >= 3 && p[0] == 0xff && p[1] == 0xd8 && p[2] == 0xff; }

crew_status crew_image_decode(const void *buf, size_t len, const char *what, crew_image *out)
{
    if (!out || (!buf && len)) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_image_decode: NULL argument");
    if (!what) what = "image";
    memset(out, 0, sizeof *out);
    const uint8_t *p = buf;
    if (len == 0) return crew_errorf(CREW_CODE_BAD_INPUT, "%s: empty file", what);
    if (len >= sizeof png_sig && !memcmp(p, png_sig, sizeof png_sig)) return crew_image_decode_png(buf, len, what, out);
    if (is_jpeg(p, len)) return crew_image_decode_jpeg(buf, len, what, out);
    return crew_errorf(CREW_CODE_BAD_INPUT, "%s: neither a PNG nor a JPEG file (unknown signature)", what);
}

crew_status crew_image_read(const char *path, crew_image *out)
{
    if (!path || !out) return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_image_read: NULL argument");
    memset(out, 0, sizeof *out);
    uint8_t *buf;
    size_t len;
    CREW_TRY(crew_read_file(path, CREW_IMAGE_MAX_FILE_BYTES, "an image file", &buf, &len));
    crew_status s = crew_image_decode(buf, len, path, out);
    free(buf);
    return s;
}

void crew_image_free(crew_image *img)
{
    if (!img) return;
    free(img->pixels);
    memset(img, 0, sizeof *img);
}

crew_status crew_image_convert(crew_image *img, int channels)
{
    if (!img || !img->pixels || (channels != 1 && channels != 3) || (img->channels != 1 && img->channels != 3))
        return crew_errorf(CREW_CODE_INVALID_ARGUMENT, "crew_image_convert: needs a decoded image and 1 or 3 channels");
    if (channels == img->channels) return CREW_OK;
    int64_t n = (int64_t)img->height * img->width;
    if (channels == 1) { /* shrinks: in place, front to back */
        uint8_t *p = img->pixels;
        for (int64_t i = 0; i < n; i++) p[i] = (uint8_t)((299u * p[3 * i] + 587u * p[3 * i + 1] + 114u * p[3 * i + 2] + 500u) / 1000u);
        img->channels = 1;
        return CREW_OK;
    }
    size_t size = (size_t)n * 3;
    uint8_t *rgb = malloc(size > 0 ? size : 1);
    if (!rgb) return CREW_OOM();
    for (int64_t i = 0; i < n; i++) rgb[3 * i] = rgb[3 * i + 1] = rgb[3 * i + 2] = img->pixels[i];
    free(img->pixels);
    img->pixels = rgb;
    img->channels = 3;
    return CREW_OK;
}
