#include "util/strmap.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

struct slot {
	uint64_t hash; /* 0: empty (a real hash of 0 is stored as 1) */
	uint32_t off, len;
	int32_t value;
};

struct strmap {
	struct slot *slots;
	size_t mask, count;
	char *arena;
	size_t arena_len, arena_cap;
};

static uint64_t hash_of(const char *key, size_t len)
{
	uint64_t h = XXH3_64bits(key, len);
	return h ? h : 1;
}

struct strmap *strmap_new(size_t n)
{
	struct strmap *m = calloc(1, sizeof *m);
	if (!m)
		return NULL;
	size_t cap = 16;
	while (cap < n * 2)
		cap *= 2;
	m->slots = calloc(cap, sizeof *m->slots);
	if (!m->slots) {
		free(m);
		return NULL;
	}
	m->mask = cap - 1;
	return m;
}

void strmap_free(struct strmap *m)
{
	if (!m)
		return;
	free(m->slots);
	free(m->arena);
	free(m);
}

size_t strmap_count(const struct strmap *m)
{
	return m->count;
}

static struct slot *find(const struct strmap *m, uint64_t h, const char *key, size_t len)
{
	for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
		struct slot *s = &m->slots[i];
		if (!s->hash || (s->hash == h && s->len == len &&
				 (len == 0 || !memcmp(m->arena + s->off, key, len))))
			return s;
	}
}

static int grow(struct strmap *m)
{
	size_t cap = (m->mask + 1) * 2;
	struct slot *fresh = calloc(cap, sizeof *fresh);
	if (!fresh)
		return -1;
	for (size_t i = 0; i <= m->mask; i++) {
		struct slot *s = &m->slots[i];
		if (!s->hash)
			continue;
		size_t k = s->hash & (cap - 1);
		while (fresh[k].hash)
			k = (k + 1) & (cap - 1);
		fresh[k] = *s;
	}
	free(m->slots);
	m->slots = fresh;
	m->mask = cap - 1;
	return 0;
}

int strmap_add(struct strmap *m, const char *key, size_t len, int32_t value, int32_t *existing)
{
	if (len > UINT32_MAX)
		return -1;
	if ((m->count + 1) * 2 > m->mask + 1 && grow(m) != 0)
		return -1;
	uint64_t h = hash_of(key, len);
	struct slot *s = find(m, h, key, len);
	if (s->hash) {
		if (existing)
			*existing = s->value;
		return 0;
	}
	if (m->arena_len + len > m->arena_cap) {
		size_t cap = m->arena_cap ? m->arena_cap * 2 : 4096;
		while (cap < m->arena_len + len)
			cap *= 2;
		if (cap > UINT32_MAX)
			return -1;
		char *a = realloc(m->arena, cap);
		if (!a)
			return -1;
		m->arena = a;
		m->arena_cap = cap;
	}
	if (len)
		memcpy(m->arena + m->arena_len, key, len);
	s->hash = h;
	s->off = (uint32_t)m->arena_len;
	s->len = (uint32_t)len;
	s->value = value;
	m->arena_len += len;
	m->count++;
	return 1;
}

int32_t strmap_get(const struct strmap *m, const char *key, size_t len)
{
	const struct slot *s = find(m, hash_of(key, len), key, len);
	return s->hash ? s->value : -1;
}
