/* json_text.h — a check on JSON text before it is parsed, shared by the readers of JSON from
 * outside (model files, manifest.json, safetensors headers).
 *
 * cJSON decodes the escape \u0000 inside a string into a NUL byte and hands back a C string, so
 * "a\u0000b" reads as "a" and the rest silently disappears: a name that breaks a documented
 * character set would pass every check made on what cJSON returns. No crew format has a use for a
 * NUL, so a reader refuses the text before parsing it, and every string cJSON returns is then
 * exactly the decoded string. */
#ifndef CREW_CORE_JSON_TEXT_H
#define CREW_CORE_JSON_TEXT_H

#include <stdio.h>
#include <stddef.h>

/* The offset of the first NUL the text holds, raw (a 0 byte anywhere) or escaped (\u0000 inside
 * a string; "\\u0000", an escaped backslash before "u0000", is not one), or (size_t)-1 when there
 * is none. *escaped says which. Needs no valid JSON: text the parser would refuse is left to it. */
size_t crew_json_find_nul(const char *text, size_t len, int *escaped);

/* Line and column (both from 1) of offset in text, for messages. */
void crew_json_locate(const char *text, size_t offset, int *line, int *col);

/* How byte c stands inside a JSON string: itself, \" or \\, or \u00XX for a control character.
 * Writes it into out (with a NUL) and returns its length. The one rule crew_json_write_string and
 * the telemetry's text writer both follow. */
static inline int crew_json_escape_byte(unsigned char c, char out[8])
{
    if (c == '"' || c == '\\') return snprintf(out, 8, "\\%c", c);
    if (c < 0x20) return snprintf(out, 8, "\\u%04x", c);
    out[0] = (char)c;
    out[1] = '\0';
    return 1;
}

#endif
