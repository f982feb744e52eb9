/* The error buffers the library's functions fill (char *err, size_t errlen). */
#ifndef TOKI_ERR_H
#define TOKI_ERR_H

#include <stddef.h>

/* Formats into err, when there is one. */
void err_set(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#endif
