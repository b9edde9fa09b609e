/* Base64 codec (RFC 4648 §4). */
#include "core/base64.h"

#include <stdint.h>
#include <stdlib.h>

static const char ALPHABET[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

size_t luna_base64_encoded_length(size_t n) { return (n + 2) / 3 * 4; }

luna_status luna_base64_encode(const void *data, size_t n, char **out, size_t *len) {
    const unsigned char *in = data;
    size_t m = luna_base64_encoded_length(n);
    char *s = malloc(m + 1);
    if (!s) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "out of memory encoding %zu bytes", n);
    size_t j = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16;
        if (i + 1 < n) v |= (uint32_t)in[i + 1] << 8;
        if (i + 2 < n) v |= in[i + 2];
        s[j++] = ALPHABET[(v >> 18) & 63];
        s[j++] = ALPHABET[(v >> 12) & 63];
        s[j++] = i + 1 < n ? ALPHABET[(v >> 6) & 63] : '=';
        s[j++] = i + 2 < n ? ALPHABET[v & 63] : '=';
    }
    s[j] = '\0';
    *out = s;
    if (len) *len = j;
    return LUNA_OK;
}

static int value_of(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

luna_status luna_base64_decode(const char *text, size_t len, unsigned char **out, size_t *n,
                               const char *what) {
    if (len % 4 != 0)
        return luna_error(LUNA_ERR_FORMAT, "%s: base64 length %zu is not a multiple of 4", what,
                          len);
    size_t pad = 0;
    if (len >= 4 && text[len - 1] == '=') pad = text[len - 2] == '=' ? 2 : 1;
    size_t m = len / 4 * 3 - pad;
    unsigned char *buf = malloc(m ? m : 1);
    if (!buf) return luna_error(LUNA_ERR_OUT_OF_MEMORY, "%s: out of memory (%zu bytes)", what, m);
    size_t j = 0;
    for (size_t i = 0; i < len; i += 4) {
        uint32_t v = 0;
        size_t used = (i + 4 == len) ? 4 - pad : 4;
        for (size_t k = 0; k < 4; k++) {
            int x = k < used ? value_of(text[i + k]) : 0;
            if (k >= used && text[i + k] != '=') x = -1;
            if (x < 0) {
                free(buf);
                return luna_error(LUNA_ERR_FORMAT, "%s: invalid base64 character at offset %zu",
                                  what, i + k);
            }
            v = v << 6 | (uint32_t)x;
        }
        if ((pad == 1 && used == 3 && (v & 0xff)) || (pad == 2 && used == 2 && (v & 0xffff))) {
            free(buf);
            return luna_error(LUNA_ERR_FORMAT, "%s: non-canonical base64 padding at offset %zu",
                              what, i);
        }
        buf[j++] = (unsigned char)(v >> 16);
        if (used > 2) buf[j++] = (unsigned char)(v >> 8);
        if (used > 3) buf[j++] = (unsigned char)v;
    }
    *out = buf;
    *n = m;
    return LUNA_OK;
}
