/* Hand-crafting GGUF files in memory, for unit tests of the readers: a
 * growable byte buffer and little-endian writers of the format's fields.
 * Header-only (each test is its own executable). Needs cmocka included. */
#ifndef TOKI_TESTS_GGUF_CRAFT_H
#define TOKI_TESTS_GGUF_CRAFT_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A growable buffer to hand-craft GGUF files. */
struct buf {
	uint8_t *p;
	size_t len, cap;
};

static void b_put(struct buf *b, const void *d, size_t n)
{
	if (b->len + n > b->cap) {
		b->cap = (b->len + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
		assert_non_null(b->p);
	}
	memcpy(b->p + b->len, d, n);
	b->len += n;
}

static void b_u8(struct buf *b, uint8_t v)
{
	b_put(b, &v, 1);
}

static void b_u32(struct buf *b, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		b_u8(b, (uint8_t)(v >> (8 * i)));
}

static void b_u64(struct buf *b, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		b_u8(b, (uint8_t)(v >> (8 * i)));
}

static void b_str(struct buf *b, const char *s)
{
	b_u64(b, strlen(s));
	b_put(b, s, strlen(s));
}

static void b_header(struct buf *b, uint64_t n_tensors, uint64_t n_kv)
{
	b_put(b, "GGUF", 4);
	b_u32(b, 3);
	b_u64(b, n_tensors);
	b_u64(b, n_kv);
}

#endif
