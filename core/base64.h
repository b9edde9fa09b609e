/* Base64 (RFC 4648 §4, standard alphabet, '=' padding, no line breaks), used to store binary
 * blobs such as the SentencePiece model in a checkpoint's string-valued safetensors metadata. */
#ifndef LUNA_BASE64_H
#define LUNA_BASE64_H

#include <stddef.h>

#include "core/status.h"

/* Length of the encoding of n bytes (without the terminating NUL). */
size_t luna_base64_encoded_length(size_t n);

/* Encode data[0..n) into a malloc'ed NUL-terminated string (*len excludes the NUL; may be NULL). */
luna_status luna_base64_encode(const void *data, size_t n, char **out, size_t *len);

/* Decode text[0..len) strictly: only the standard alphabet, length a multiple of 4, padding only
 * at the end, unused bits zero. Errors name `what` and the offending offset. *out is malloc'ed
 * (at least one byte, so an empty input gives a valid pointer and *n == 0). */
luna_status luna_base64_decode(const char *text, size_t len, unsigned char **out, size_t *n,
                               const char *what);

#endif
