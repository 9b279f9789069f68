/* json_text.c — finding a NUL, raw or escaped, in JSON text before it is parsed. */
#include "core/json_text.h"

size_t crew_json_find_nul(const char *text, size_t len, int *escaped)
{
    int in_string = 0;
    *escaped = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (c == '\0') return i;
        if (!in_string) {
            in_string = c == '"';
            continue;
        }
        if (c == '"') {
            in_string = 0;
        } else if (c == '\\' && i + 1 < len) {
            if (text[i + 1] == 'u' && i + 5 < len && text[i + 2] == '0' && text[i + 3] == '0' && text[i + 4] == '0' &&
                text[i + 5] == '0') {
                *escaped = 1;
                return i;
            }
            i++; /* the escaped character: \" does not end the string, \\ escapes nothing after it */
        }
    }
    return (size_t)-1;
}

void crew_json_locate(const char *text, size_t offset, int *line, int *col)
{
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < offset; i++) {
        if (text[i] == '\n') {
            ++*line;
            *col = 1;
        } else {
            ++*col;
        }
    }
}
