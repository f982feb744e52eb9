/* Byte strings that are not C strings: a template's rendering, a prompt's
 * text, a Jinja string value may hold NULs, so these take lengths. glibc's
 * memmem finds the first occurrence; nothing in libc finds the last. */
#ifndef TOKI_UTIL_BYTES_H
#define TOKI_UTIL_BYTES_H

#include <stddef.h>

/* The last occurrence of needle (nl bytes) in hay (hl bytes): where it
 * starts, or NULL. An empty needle is found at hay's end. */
const char *bytes_rfind(const char *hay, size_t hl, const char *needle, size_t nl);

/* raw's n bytes as 2n lowercase hex digits and a NUL, in out (2n + 1
 * bytes): tokens, secrets, digests. */
void bytes_hex(const unsigned char *raw, size_t n, char *out);

/* The SHA-256 of data's n bytes, as 64 hex digits and a NUL: what a
 * fingerprint or a verdict's bits are keyed by. */
void bytes_sha256_hex(const void *data, size_t n, char out[65]);

#endif
