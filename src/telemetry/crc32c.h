/* crc32c.h — CRC-32C (Castagnoli), the checksum TFRecord files (and so TensorBoard event files)
 * put on every record. zlib only has the IEEE CRC-32, whose polynomial differs.
 *
 *   crew_crc32c("123456789", 9) == 0xE3069283   (the standard check value)
 *
 * TFRecord stores checksums "masked" (rotated and offset) so that a CRC of data that itself
 * holds CRCs does not degenerate; crew_crc32c_mask/unmask convert. */
#ifndef CREW_TELEMETRY_CRC32C_H
#define CREW_TELEMETRY_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC-32C of n bytes. */
uint32_t crew_crc32c(const void *data, size_t n);
/* Continues a CRC-32C: crew_crc32c_extend(crew_crc32c(a, n), b, m) is the CRC of a then b. */
uint32_t crew_crc32c_extend(uint32_t crc, const void *data, size_t n);

/* ((crc >> 15) | (crc << 17)) + 0xa282ead8, as TensorFlow's crc32c::Mask. */
uint32_t crew_crc32c_mask(uint32_t crc);
/* The inverse of crew_crc32c_mask. */
uint32_t crew_crc32c_unmask(uint32_t masked);

#endif
