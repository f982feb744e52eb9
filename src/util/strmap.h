/* A map from byte strings to int32 values, built once and read many times
 * (a tokenizer's vocabulary and merge ranks: up to a few hundred thousand
 * keys, looked up millions of times a second). Open addressing on XXH3
 * hashes; keys are copied into one arena the map owns. No removal. */
#ifndef TOKI_UTIL_STRMAP_H
#define TOKI_UTIL_STRMAP_H

#include <stddef.h>
#include <stdint.h>

struct strmap;

/* A map sized for about n keys (it grows past that); NULL when out of memory. */
struct strmap *strmap_new(size_t n);
void strmap_free(struct strmap *m);
/* Adds key -> value unless the key is present. Returns 1 when added, 0 when
 * the key was already there (*existing, if not NULL, gets its value), -1
 * when out of memory. */
int strmap_add(struct strmap *m, const char *key, size_t len, int32_t value, int32_t *existing);
/* The value of key, or -1 when absent (values are never negative here). */
int32_t strmap_get(const struct strmap *m, const char *key, size_t len);
size_t strmap_count(const struct strmap *m);

#endif
