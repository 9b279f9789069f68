/* resize.h — resizing 8-bit images to a fixed height × width, separably, one axis at a time.
 *
 * Along an axis that shrinks, each output pixel is the average of the source pixels it covers,
 * weighted by how much of each it covers (area resampling, as OpenCV's INTER_AREA): every source
 * pixel counts, so downscaling does not alias. Along an axis that grows (or keeps its size), each
 * output pixel interpolates linearly between the two nearest source pixel centres, with
 * half-pixel centres and edges clamped (bilinear, as OpenCV's INTER_LINEAR and
 * tf.image.resize's "bilinear"); an unchanged size is an exact copy. The aspect ratio is not
 * kept: the image is stretched to height × width, as Keras' image_dataset_from_directory does.
 * The weights of every output pixel sum to one, so a constant image stays exactly constant.
 * Values are rounded to the nearest integer. */
#ifndef CREW_DATA_RESIZE_H
#define CREW_DATA_RESIZE_H

#include <stdint.h>

#include "crew.h"

/* src [src_h][src_w][channels] → dst [dst_h][dst_w][channels]; every size ≥ 1. */
crew_status crew_resize_u8(const uint8_t *src, int src_h, int src_w, int channels, uint8_t *dst, int dst_h, int dst_w);

#endif
