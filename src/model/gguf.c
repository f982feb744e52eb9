/* GGUF reader: metadata only, with every count and length from the file
 * checked against the bytes actually left before it is used.
 *
 * Layout of a GGUF file (little-endian):
 *   "GGUF" u32 version, u64 n_tensors, u64 n_kv,
 *   n_kv × { string key, u32 type, value },
 *   n_tensors × { string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset },
 *   padding to general.alignment, tensor data.
 * A string is u64 length + bytes (no NUL). An array value is u32 element type,
 * u64 count, elements. v1 used u32 counts and is not supported.
 */
#include "model/gguf.h"
#include "util/grow.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A bound on everything the reader allocates for one file, on top of the
 * bound by file size: real metadata (a 256k-token vocabulary with merges) is
 * tens of MB, so this only stops a huge hostile file from costing GBs. */
#define GGUF_MAX_METADATA_ALLOC (512ull << 20)
/* The spec caps keys at 65535 bytes; tensor names get the same generous cap
 * (llama.cpp itself wants < 64). */
#define GGUF_MAX_NAME_LEN 65535u
/* The smallest encodings, used to bound counts by the bytes left:
 * a kv is at least key length (8) + type (4) + a 1-byte value;
 * a tensor info is at least name length (8) + n_dims (4) + type (4) + offset (8). */
#define GGUF_MIN_KV_BYTES 13u
#define GGUF_MIN_TENSOR_INFO_BYTES 24u

/* --- Arena: one owner for all the small allocations of a parse ----------- */

struct arena_block {
	struct arena_block *next;
	size_t used;
	size_t cap;
	max_align_t data[];
};

#define ARENA_BLOCK_SIZE (64u * 1024u)

struct arena {
	struct arena_block *head; /* the block being filled */
	uint64_t total;           /* bytes obtained from malloc, for the cap */
};

static void arena_free(struct arena *a)
{
	struct arena_block *b = a->head;
	while (b) {
		struct arena_block *next = b->next;
		free(b);
		b = next;
	}
	a->head = NULL;
	a->total = 0;
}

/* Returns NULL on failure or when the cap would be passed. */
static void *arena_alloc(struct arena *a, uint64_t n)
{
	const size_t align = sizeof(max_align_t);
	if (n > GGUF_MAX_METADATA_ALLOC)
		return NULL;
	size_t need = ((size_t)n + align - 1) / align * align;
	if (need == 0)
		need = align;
	if (a->head && a->head->cap - a->head->used >= need) {
		void *p = (char *)a->head->data + a->head->used;
		a->head->used += need;
		return p;
	}
	size_t cap = need > ARENA_BLOCK_SIZE / 2 ? need : ARENA_BLOCK_SIZE;
	if (a->total + cap + sizeof(struct arena_block) > GGUF_MAX_METADATA_ALLOC)
		return NULL;
	struct arena_block *b = malloc(sizeof(*b) + cap);
	if (!b)
		return NULL;
	a->total += cap + sizeof(*b);
	b->cap = cap;
	b->used = need;
	if (cap == need && a->head) {
		/* A dedicated block for a big object: keep filling the current one. */
		b->next = a->head->next;
		a->head->next = b;
	} else {
		b->next = a->head;
		a->head = b;
	}
	return b->data;
}

/* --- The parsed file ----------------------------------------------------- */

struct gguf {
	struct arena arena; /* owns keys, strings, arrays, names */
	uint32_t version;
	uint64_t file_size;
	uint32_t alignment;
	uint64_t data_offset;
	struct gguf_kv *kv; /* malloc'd, n_kv entries, file order */
	size_t n_kv;
	const struct gguf_kv **kv_sorted; /* malloc'd, by key, for lookup */
	struct gguf_tensor_info *tensors; /* malloc'd, file order */
	size_t n_tensors;
	const struct gguf_tensor_info **tensors_sorted; /* malloc'd, by name */
};

/* --- Bounded reader over a file or a memory buffer ----------------------- */

#define READER_BUF_SIZE (64u * 1024u)

struct reader {
	int fd; /* -1 when reading from mem */
	const uint8_t *mem;
	uint64_t size; /* bytes in the file */
	uint64_t pos;  /* next byte to read */
	uint8_t *buf;  /* fd only: a window of the file at [buf_start, buf_start + buf_len) */
	uint64_t buf_start;
	size_t buf_len;
	struct gguf_error *err;
	bool failed;
};

static void fail(struct reader *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fail(struct reader *r, const char *fmt, ...)
{
	/* Keep the first error: later ones are usually consequences of it. */
	if (r->failed)
		return;
	r->failed = true;
	if (!r->err)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(r->err->text, sizeof r->err->text, fmt, ap);
	va_end(ap);
}

/* Names from the file go into error messages: make them short and harmless
 * for a terminal (no escape sequences). */
static const char *printable(const char *s, uint64_t len, char *out, size_t outlen)
{
	size_t o = 0;
	for (uint64_t i = 0; i < len && o + 4 < outlen; i++) {
		unsigned char c = (unsigned char)s[i];
		out[o++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
	}
	if (len > 0 && o + 4 >= outlen) {
		memcpy(out + o, "...", 3);
		o += 3;
	}
	out[o] = '\0';
	return out;
}

static uint64_t remaining(const struct reader *r)
{
	return r->size - r->pos;
}

/* Reads exactly n bytes into dst, or fails with a truncation error. */
static bool read_bytes(struct reader *r, void *dst, uint64_t n, const char *what)
{
	if (r->failed)
		return false;
	if (n > remaining(r)) {
		fail(r, "truncated file: %s at offset %llu needs %llu bytes, %llu left", what,
		     (unsigned long long)r->pos, (unsigned long long)n,
		     (unsigned long long)remaining(r));
		return false;
	}
	if (r->fd < 0) {
		memcpy(dst, r->mem + r->pos, n);
		r->pos += n;
		return true;
	}
	uint8_t *out = dst;
	while (n > 0) {
		if (r->pos >= r->buf_start && r->pos < r->buf_start + r->buf_len) {
			size_t off = (size_t)(r->pos - r->buf_start);
			size_t take = r->buf_len - off;
			if (take > n)
				take = (size_t)n;
			memcpy(out, r->buf + off, take);
			out += take;
			n -= take;
			r->pos += take;
			continue;
		}
		/* Refill the window at pos; the size check above guarantees the
		 * bytes exist unless the file shrank under us. */
		ssize_t got;
		do {
			got = pread(r->fd, r->buf, READER_BUF_SIZE, (off_t)r->pos);
		} while (got < 0 && errno == EINTR);
		if (got < 0) {
			fail(r, "read error at offset %llu: %s", (unsigned long long)r->pos,
			     strerror(errno));
			return false;
		}
		if (got == 0) {
			fail(r,
			     "unexpected end of file at offset %llu (file changed while reading?)",
			     (unsigned long long)r->pos);
			return false;
		}
		r->buf_start = r->pos;
		r->buf_len = (size_t)got;
	}
	return true;
}

/* Little-endian decoding, independent of the host's byte order. */
static uint16_t le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p)
{
	return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

static bool read_u32(struct reader *r, uint32_t *v, const char *what)
{
	uint8_t b[4];
	if (!read_bytes(r, b, 4, what))
		return false;
	*v = le32(b);
	return true;
}

static bool read_u64(struct reader *r, uint64_t *v, const char *what)
{
	uint8_t b[8];
	if (!read_bytes(r, b, 8, what))
		return false;
	*v = le64(b);
	return true;
}

/* Reads a GGUF string into the arena, NUL-terminated. max_len bounds keys and
 * names; the length is always bounded by the bytes left in the file first. */
static bool read_string(struct reader *r, struct arena *a, struct gguf_str *s, uint64_t max_len,
                        const char *what)
{
	uint64_t len;
	if (!read_u64(r, &len, what))
		return false;
	if (len > remaining(r)) {
		fail(r,
		     "truncated or corrupt file: %s: string length %llu at offset %llu exceeds the "
		     "%llu bytes left",
		     what, (unsigned long long)len, (unsigned long long)(r->pos - 8),
		     (unsigned long long)remaining(r));
		return false;
	}
	if (len > max_len) {
		fail(r, "%s: string length %llu exceeds the limit of %llu", what,
		     (unsigned long long)len, (unsigned long long)max_len);
		return false;
	}
	char *p = arena_alloc(a, len + 1);
	if (!p) {
		fail(r, "%s: out of memory (metadata larger than %llu MiB?)", what,
		     GGUF_MAX_METADATA_ALLOC >> 20);
		return false;
	}
	if (!read_bytes(r, p, len, what))
		return false;
	p[len] = '\0';
	s->len = len;
	s->data = p;
	return true;
}

/* Size of a scalar in the file; 0 for string/array (variable). */
static size_t type_file_size(enum gguf_type t)
{
	switch (t) {
	case GGUF_TYPE_UINT8:
	case GGUF_TYPE_INT8:
	case GGUF_TYPE_BOOL:
		return 1;
	case GGUF_TYPE_UINT16:
	case GGUF_TYPE_INT16:
		return 2;
	case GGUF_TYPE_UINT32:
	case GGUF_TYPE_INT32:
	case GGUF_TYPE_FLOAT32:
		return 4;
	case GGUF_TYPE_UINT64:
	case GGUF_TYPE_INT64:
	case GGUF_TYPE_FLOAT64:
		return 8;
	default:
		return 0;
	}
}

/* Size of an array element in memory (host layout). */
static size_t type_host_size(enum gguf_type t)
{
	if (t == GGUF_TYPE_STRING)
		return sizeof(struct gguf_str);
	return type_file_size(t);
}

/* Decodes one scalar of type t from its little-endian bytes into dst (host
 * layout, dst sized by type_host_size). */
static void decode_scalar(enum gguf_type t, const uint8_t *src, void *dst)
{
	switch (type_file_size(t)) {
	case 1: {
		uint8_t v = src[0];
		if (t == GGUF_TYPE_BOOL)
			v = v != 0;
		memcpy(dst, &v, 1);
		break;
	}
	case 2: {
		uint16_t v = le16(src);
		memcpy(dst, &v, 2);
		break;
	}
	case 4: {
		uint32_t v = le32(src);
		memcpy(dst, &v, 4);
		break;
	}
	case 8: {
		uint64_t v = le64(src);
		memcpy(dst, &v, 8);
		break;
	}
	}
}

static bool valid_type(uint32_t t)
{
	return t < GGUF_TYPE_COUNT;
}

static bool read_array(struct reader *r, struct arena *a, struct gguf_kv *kv, const char *key)
{
	uint32_t et;
	uint64_t n;
	char kb[64];
	if (!read_u32(r, &et, "array element type") || !read_u64(r, &n, "array length"))
		return false;
	if (!valid_type(et)) {
		fail(r, "key '%s': unknown array element type %u",
		     printable(key, strlen(key), kb, sizeof kb), et);
		return false;
	}
	if (et == GGUF_TYPE_ARRAY) {
		fail(r, "key '%s': nested arrays are not supported",
		     printable(key, strlen(key), kb, sizeof kb));
		return false;
	}
	/* Every element takes at least min_elem bytes in the file: the count
	 * must fit in what is left before anything is allocated for it. */
	uint64_t min_elem = et == GGUF_TYPE_STRING ? 8 : type_file_size(et);
	if (n > remaining(r) / min_elem) {
		fail(r,
		     "truncated or corrupt file: key '%s': an array of %llu elements cannot fit in "
		     "the %llu bytes left",
		     printable(key, strlen(key), kb, sizeof kb), (unsigned long long)n,
		     (unsigned long long)remaining(r));
		return false;
	}
	kv->arr_type = (enum gguf_type)et;
	kv->arr_n = n;
	size_t hs = type_host_size(kv->arr_type);
	/* n * hs cannot overflow: n <= file size / 1 and hs <= 16, and the
	 * arena refuses anything past its cap. */
	void *arr = arena_alloc(a, n * hs);
	if (!arr) {
		fail(r, "key '%s': out of memory for an array of %llu elements",
		     printable(key, strlen(key), kb, sizeof kb), (unsigned long long)n);
		return false;
	}
	if (et == GGUF_TYPE_STRING) {
		struct gguf_str *s = arr;
		for (uint64_t i = 0; i < n; i++)
			if (!read_string(r, a, &s[i], UINT64_MAX, "array string"))
				return false;
	} else {
		/* Read in chunks through a stack buffer and decode in place. */
		uint8_t tmp[4096];
		size_t fs = type_file_size(kv->arr_type);
		size_t per = sizeof tmp / fs;
		uint8_t *out = arr;
		for (uint64_t i = 0; i < n;) {
			size_t k = (n - i) < per ? (size_t)(n - i) : per;
			if (!read_bytes(r, tmp, (uint64_t)k * fs, "array data"))
				return false;
			for (size_t j = 0; j < k; j++)
				decode_scalar(kv->arr_type, tmp + j * fs, out + (i + j) * hs);
			i += k;
		}
	}
	kv->val.arr = arr;
	return true;
}

static bool read_kv(struct reader *r, struct arena *a, struct gguf_kv *kv)
{
	struct gguf_str key;
	char kb[64];
	if (!read_string(r, a, &key, GGUF_MAX_NAME_LEN, "metadata key"))
		return false;
	if (memchr(key.data, '\0', key.len)) {
		fail(r, "metadata key '%s' contains a NUL byte",
		     printable(key.data, key.len, kb, sizeof kb));
		return false;
	}
	kv->key = key.data;
	uint32_t t;
	if (!read_u32(r, &t, "metadata value type"))
		return false;
	if (!valid_type(t)) {
		fail(r, "key '%s': unknown value type %u",
		     printable(key.data, key.len, kb, sizeof kb), t);
		return false;
	}
	kv->type = (enum gguf_type)t;
	if (t == GGUF_TYPE_ARRAY)
		return read_array(r, a, kv, kv->key);
	if (t == GGUF_TYPE_STRING)
		return read_string(r, a, &kv->val.str, UINT64_MAX, "metadata string value");
	uint8_t b[8];
	if (!read_bytes(r, b, type_file_size(kv->type), "metadata value"))
		return false;
	decode_scalar(kv->type, b, &kv->val);
	return true;
}

/* --- ggml tensor types --------------------------------------------------- */

struct ggml_type_desc {
	const char *name;
	uint32_t block_size;
	uint32_t type_size;
};

/* From ggml.c's type_traits; gaps are types that were removed from ggml. */
static const struct ggml_type_desc ggml_types[] = {
    [0] = {"f32", 1, 4},         [1] = {"f16", 1, 2},         [2] = {"q4_0", 32, 18},
    [3] = {"q4_1", 32, 20},      [6] = {"q5_0", 32, 22},      [7] = {"q5_1", 32, 24},
    [8] = {"q8_0", 32, 34},      [9] = {"q8_1", 32, 36},      [10] = {"q2_K", 256, 84},
    [11] = {"q3_K", 256, 110},   [12] = {"q4_K", 256, 144},   [13] = {"q5_K", 256, 176},
    [14] = {"q6_K", 256, 210},   [15] = {"q8_K", 256, 292},   [16] = {"iq2_xxs", 256, 66},
    [17] = {"iq2_xs", 256, 74},  [18] = {"iq3_xxs", 256, 98}, [19] = {"iq1_s", 256, 50},
    [20] = {"iq4_nl", 32, 18},   [21] = {"iq3_s", 256, 110},  [22] = {"iq2_s", 256, 82},
    [23] = {"iq4_xs", 256, 136}, [24] = {"i8", 1, 1},         [25] = {"i16", 1, 2},
    [26] = {"i32", 1, 4},        [27] = {"i64", 1, 8},        [28] = {"f64", 1, 8},
    [29] = {"iq1_m", 256, 56},   [30] = {"bf16", 1, 2},       [34] = {"tq1_0", 256, 54},
    [35] = {"tq2_0", 256, 66},   [39] = {"mxfp4", 32, 17},
};

#define N_GGML_TYPES (sizeof ggml_types / sizeof ggml_types[0])

const char *gguf_tensor_type_name(uint32_t t)
{
	return t < N_GGML_TYPES ? ggml_types[t].name : NULL;
}

bool gguf_tensor_type_size(uint32_t t, uint32_t *block_size, uint32_t *type_size)
{
	if (t >= N_GGML_TYPES || !ggml_types[t].name)
		return false;
	if (block_size)
		*block_size = ggml_types[t].block_size;
	if (type_size)
		*type_size = ggml_types[t].type_size;
	return true;
}

static bool read_tensor_info(struct reader *r, struct arena *a, uint32_t alignment,
                             struct gguf_tensor_info *ti)
{
	struct gguf_str name;
	char nb[64];
	if (!read_string(r, a, &name, GGUF_MAX_NAME_LEN, "tensor name"))
		return false;
	const char *pn = printable(name.data, name.len, nb, sizeof nb);
	if (memchr(name.data, '\0', name.len)) {
		fail(r, "tensor name '%s' contains a NUL byte", pn);
		return false;
	}
	ti->name = name.data;
	if (!read_u32(r, &ti->n_dims, "tensor n_dims"))
		return false;
	if (ti->n_dims > GGUF_MAX_DIMS) {
		fail(r, "tensor '%s': %u dimensions (at most %d supported)", pn, ti->n_dims,
		     GGUF_MAX_DIMS);
		return false;
	}
	uint64_t n_el = 1;
	for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
		ti->ne[d] = 1;
		if (d >= ti->n_dims)
			continue;
		if (!read_u64(r, &ti->ne[d], "tensor dimension"))
			return false;
		/* ggml keeps dimensions as int64: the product must fit too. */
		if (ti->ne[d] > (uint64_t)INT64_MAX ||
		    __builtin_mul_overflow(n_el, ti->ne[d], &n_el) || n_el > (uint64_t)INT64_MAX) {
			fail(r, "tensor '%s': element count overflows", pn);
			return false;
		}
	}
	ti->n_elements = n_el;
	if (!read_u32(r, &ti->type, "tensor type") || !read_u64(r, &ti->offset, "tensor offset"))
		return false;
	uint32_t bs, ts;
	ti->type_known = gguf_tensor_type_size(ti->type, &bs, &ts);
	ti->nbytes = 0;
	if (ti->type_known) {
		if (ti->ne[0] % bs != 0) {
			fail(r,
			     "tensor '%s': row of %llu elements is not a multiple of the %s block "
			     "size %u",
			     pn, (unsigned long long)ti->ne[0], ggml_types[ti->type].name, bs);
			return false;
		}
		/* n_el / bs * ts < 2^63 / 1 * 292 might overflow for absurd shapes. */
		if (__builtin_mul_overflow(n_el / bs, (uint64_t)ts, &ti->nbytes)) {
			fail(r, "tensor '%s': byte size overflows", pn);
			return false;
		}
	}
	if (ti->offset % alignment != 0) {
		fail(r, "tensor '%s': offset %llu is not a multiple of the alignment %u", pn,
		     (unsigned long long)ti->offset, alignment);
		return false;
	}
	return true;
}

/* --- Lookup tables ------------------------------------------------------- */

static int cmp_kv(const void *x, const void *y)
{
	const struct gguf_kv *a = *(const struct gguf_kv *const *)x;
	const struct gguf_kv *b = *(const struct gguf_kv *const *)y;
	return strcmp(a->key, b->key);
}

static int cmp_tensor(const void *x, const void *y)
{
	const struct gguf_tensor_info *a = *(const struct gguf_tensor_info *const *)x;
	const struct gguf_tensor_info *b = *(const struct gguf_tensor_info *const *)y;
	return strcmp(a->name, b->name);
}

/* --- Open ---------------------------------------------------------------- */

static struct gguf *parse(struct reader *r)
{
	struct gguf *g = calloc(1, sizeof(*g));
	if (!g) {
		fail(r, "out of memory");
		return NULL;
	}
	g->file_size = r->size;
	g->alignment = GGUF_DEFAULT_ALIGNMENT;

	uint8_t magic[4];
	if (r->size < 4) {
		fail(r, "not a GGUF file (only %llu bytes)", (unsigned long long)r->size);
		goto fail;
	}
	if (!read_bytes(r, magic, 4, "magic"))
		goto fail;
	if (memcmp(magic, GGUF_MAGIC, 4) != 0) {
		fail(r, "not a GGUF file (bad magic %02x %02x %02x %02x)", magic[0], magic[1],
		     magic[2], magic[3]);
		goto fail;
	}
	if (!read_u32(r, &g->version, "version"))
		goto fail;
	if (g->version == 1) {
		fail(r, "GGUF version 1 is not supported (re-convert the model)");
		goto fail;
	}
	if (g->version == 0x02000000u || g->version == 0x03000000u) {
		fail(r, "big-endian GGUF files are not supported");
		goto fail;
	}
	if (g->version != 2 && g->version != 3) {
		fail(r, "unsupported GGUF version %u", g->version);
		goto fail;
	}

	uint64_t n_tensors, n_kv;
	if (!read_u64(r, &n_tensors, "tensor count") || !read_u64(r, &n_kv, "metadata count"))
		goto fail;
	if (n_kv > remaining(r) / GGUF_MIN_KV_BYTES) {
		fail(r,
		     "truncated or corrupt file: metadata count %llu cannot fit in the %llu bytes "
		     "left",
		     (unsigned long long)n_kv, (unsigned long long)remaining(r));
		goto fail;
	}
	if (n_tensors > remaining(r) / GGUF_MIN_TENSOR_INFO_BYTES) {
		fail(r,
		     "truncated or corrupt file: tensor count %llu cannot fit in the %llu bytes "
		     "left",
		     (unsigned long long)n_tensors, (unsigned long long)remaining(r));
		goto fail;
	}

	size_t kv_cap = 0;
	for (uint64_t i = 0; i < n_kv; i++) {
		/* The caller checked the count against the file, so growth follows
		 * what was actually parsed, not what the header claims. */
		if (GROW(g->kv, kv_cap, g->n_kv + 1, 16) != 0) {
			fail(r, "out of memory");
			goto fail;
		}
		struct gguf_kv *kv = &g->kv[g->n_kv];
		memset(kv, 0, sizeof(*kv));
		if (!read_kv(r, &g->arena, kv))
			goto fail;
		g->n_kv++;
	}

	if (g->n_kv) {
		g->kv_sorted = malloc(g->n_kv * sizeof(*g->kv_sorted));
		if (!g->kv_sorted) {
			fail(r, "out of memory");
			goto fail;
		}
		for (size_t i = 0; i < g->n_kv; i++)
			g->kv_sorted[i] = &g->kv[i];
		qsort(g->kv_sorted, g->n_kv, sizeof(*g->kv_sorted), cmp_kv);
		for (size_t i = 1; i < g->n_kv; i++) {
			if (!strcmp(g->kv_sorted[i - 1]->key, g->kv_sorted[i]->key)) {
				char kb[64];
				const char *k = g->kv_sorted[i]->key;
				fail(r, "duplicate metadata key '%s'",
				     printable(k, strlen(k), kb, sizeof kb));
				goto fail;
			}
		}
	}

	const struct gguf_kv *al = gguf_find_key(g, "general.alignment");
	if (al) {
		uint64_t v;
		if (!gguf_kv_to_u64(al, &v) || v == 0 || v > UINT32_MAX || (v & (v - 1)) != 0) {
			fail(r, "general.alignment must be a power of two that fits in u32");
			goto fail;
		}
		g->alignment = (uint32_t)v;
	}

	size_t t_cap = 0;
	for (uint64_t i = 0; i < n_tensors; i++) {
		if (GROW(g->tensors, t_cap, g->n_tensors + 1, 16) != 0) {
			fail(r, "out of memory");
			goto fail;
		}
		struct gguf_tensor_info *ti = &g->tensors[g->n_tensors];
		memset(ti, 0, sizeof(*ti));
		if (!read_tensor_info(r, &g->arena, g->alignment, ti))
			goto fail;
		g->n_tensors++;
	}
	if (g->n_tensors) {
		g->tensors_sorted = malloc(g->n_tensors * sizeof(*g->tensors_sorted));
		if (!g->tensors_sorted) {
			fail(r, "out of memory");
			goto fail;
		}
		for (size_t i = 0; i < g->n_tensors; i++)
			g->tensors_sorted[i] = &g->tensors[i];
		qsort(g->tensors_sorted, g->n_tensors, sizeof(*g->tensors_sorted), cmp_tensor);
		for (size_t i = 1; i < g->n_tensors; i++) {
			if (!strcmp(g->tensors_sorted[i - 1]->name, g->tensors_sorted[i]->name)) {
				char nb[64];
				const char *n = g->tensors_sorted[i]->name;
				fail(r, "duplicate tensor name '%s'",
				     printable(n, strlen(n), nb, sizeof nb));
				goto fail;
			}
		}
	}

	/* The data section starts at the next multiple of the alignment. r->pos
	 * <= size < 2^64 - 2^32, so rounding up cannot overflow in practice;
	 * check anyway. */
	uint64_t pad = (g->alignment - r->pos % g->alignment) % g->alignment;
	if (__builtin_add_overflow(r->pos, pad, &g->data_offset)) {
		fail(r, "data offset overflows");
		goto fail;
	}
	if (g->n_tensors > 0) {
		if (g->data_offset > r->size) {
			fail(r,
			     "truncated file: tensor data would start at %llu, past the end (%llu)",
			     (unsigned long long)g->data_offset, (unsigned long long)r->size);
			goto fail;
		}
		uint64_t data_size = r->size - g->data_offset;
		for (size_t i = 0; i < g->n_tensors; i++) {
			const struct gguf_tensor_info *ti = &g->tensors[i];
			if (!ti->type_known)
				continue;
			if (ti->offset > data_size || ti->nbytes > data_size - ti->offset) {
				char nb[64];
				fail(r,
				     "truncated file: tensor '%s' (%llu bytes at data offset %llu) "
				     "extends past the end of the file",
				     printable(ti->name, strlen(ti->name), nb, sizeof nb),
				     (unsigned long long)ti->nbytes,
				     (unsigned long long)ti->offset);
				goto fail;
			}
		}
	}
	return g;

fail:
	gguf_close(g);
	return NULL;
}

struct gguf *gguf_open(const char *path, struct gguf_error *err)
{
	struct reader r = {.fd = -1, .err = err};
	if (err)
		err->text[0] = '\0';
	r.fd = open(path, O_RDONLY | O_CLOEXEC);
	if (r.fd < 0) {
		fail(&r, "cannot open: %s", strerror(errno));
		return NULL;
	}
	struct stat st;
	if (fstat(r.fd, &st) != 0) {
		fail(&r, "cannot stat: %s", strerror(errno));
		close(r.fd);
		return NULL;
	}
	if (!S_ISREG(st.st_mode)) {
		/* A FIFO or device has no size to bound counts against. */
		fail(&r, "not a regular file");
		close(r.fd);
		return NULL;
	}
	r.size = (uint64_t)st.st_size;
	r.buf = malloc(READER_BUF_SIZE);
	if (!r.buf) {
		fail(&r, "out of memory");
		close(r.fd);
		return NULL;
	}
	struct gguf *g = parse(&r);
	free(r.buf);
	close(r.fd);
	return g;
}

struct gguf *gguf_open_memory(const void *data, size_t size, struct gguf_error *err)
{
	struct reader r = {.fd = -1, .mem = data, .size = size, .err = err};
	if (err)
		err->text[0] = '\0';
	if (!data && size) {
		fail(&r, "no data");
		return NULL;
	}
	return parse(&r);
}

void gguf_close(struct gguf *g)
{
	if (!g)
		return;
	arena_free(&g->arena);
	free(g->kv);
	free(g->kv_sorted);
	free(g->tensors);
	free(g->tensors_sorted);
	free(g);
}

/* --- Accessors ----------------------------------------------------------- */

uint32_t gguf_version(const struct gguf *g)
{
	return g->version;
}

uint64_t gguf_file_size(const struct gguf *g)
{
	return g->file_size;
}

uint32_t gguf_alignment(const struct gguf *g)
{
	return g->alignment;
}

uint64_t gguf_data_offset(const struct gguf *g)
{
	return g->data_offset;
}

size_t gguf_n_kv(const struct gguf *g)
{
	return g->n_kv;
}

const struct gguf_kv *gguf_kv_at(const struct gguf *g, size_t i)
{
	return i < g->n_kv ? &g->kv[i] : NULL;
}

const struct gguf_kv *gguf_find_key(const struct gguf *g, const char *key)
{
	if (!g->kv_sorted || !key)
		return NULL;
	struct gguf_kv probe = {.key = key};
	const struct gguf_kv *pp = &probe;
	const struct gguf_kv **hit =
	    bsearch(&pp, g->kv_sorted, g->n_kv, sizeof(*g->kv_sorted), cmp_kv);
	return hit ? *hit : NULL;
}

size_t gguf_n_tensors(const struct gguf *g)
{
	return g->n_tensors;
}

const struct gguf_tensor_info *gguf_tensor_at(const struct gguf *g, size_t i)
{
	return i < g->n_tensors ? &g->tensors[i] : NULL;
}

const struct gguf_tensor_info *gguf_find_tensor(const struct gguf *g, const char *name)
{
	if (!g->tensors_sorted || !name)
		return NULL;
	struct gguf_tensor_info probe = {.name = name};
	const struct gguf_tensor_info *pp = &probe;
	const struct gguf_tensor_info **hit =
	    bsearch(&pp, g->tensors_sorted, g->n_tensors, sizeof(*g->tensors_sorted), cmp_tensor);
	return hit ? *hit : NULL;
}

const char *gguf_type_name(enum gguf_type t)
{
	static const char *const names[GGUF_TYPE_COUNT] = {
	    "u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
	    "bool", "string", "array", "u64", "i64", "f64",
	};
	return (unsigned)t < GGUF_TYPE_COUNT ? names[t] : "unknown";
}

/* Reads an integer (or bool) of type t at p as a signed/unsigned pair:
 * *neg tells whether it is negative, *mag is its magnitude. */
static bool int_value(enum gguf_type t, const void *p, bool *neg, uint64_t *mag)
{
	int64_t s;
	switch (t) {
	case GGUF_TYPE_UINT8:
	case GGUF_TYPE_BOOL: {
		uint8_t v;
		memcpy(&v, p, 1);
		*neg = false;
		*mag = v;
		return true;
	}
	case GGUF_TYPE_UINT16: {
		uint16_t v;
		memcpy(&v, p, 2);
		*neg = false;
		*mag = v;
		return true;
	}
	case GGUF_TYPE_UINT32: {
		uint32_t v;
		memcpy(&v, p, 4);
		*neg = false;
		*mag = v;
		return true;
	}
	case GGUF_TYPE_UINT64: {
		uint64_t v;
		memcpy(&v, p, 8);
		*neg = false;
		*mag = v;
		return true;
	}
	case GGUF_TYPE_INT8: {
		int8_t v;
		memcpy(&v, p, 1);
		s = v;
		break;
	}
	case GGUF_TYPE_INT16: {
		int16_t v;
		memcpy(&v, p, 2);
		s = v;
		break;
	}
	case GGUF_TYPE_INT32: {
		int32_t v;
		memcpy(&v, p, 4);
		s = v;
		break;
	}
	case GGUF_TYPE_INT64: {
		memcpy(&s, p, 8);
		break;
	}
	default:
		return false;
	}
	*neg = s < 0;
	/* -(INT64_MIN) overflows int64, not uint64. */
	*mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
	return true;
}

static bool to_u64(bool neg, uint64_t mag, uint64_t *out)
{
	if (neg)
		return false;
	*out = mag;
	return true;
}

static bool to_i64(bool neg, uint64_t mag, int64_t *out)
{
	if (!neg) {
		if (mag > (uint64_t)INT64_MAX)
			return false;
		*out = (int64_t)mag;
		return true;
	}
	if (mag > (uint64_t)INT64_MAX + 1)
		return false;
	*out = mag == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)mag;
	return true;
}

bool gguf_kv_to_u64(const struct gguf_kv *kv, uint64_t *out)
{
	bool neg;
	uint64_t mag;
	if (!kv || kv->type == GGUF_TYPE_BOOL || !int_value(kv->type, &kv->val, &neg, &mag))
		return false;
	return to_u64(neg, mag, out);
}

bool gguf_kv_to_i64(const struct gguf_kv *kv, int64_t *out)
{
	bool neg;
	uint64_t mag;
	if (!kv || kv->type == GGUF_TYPE_BOOL || !int_value(kv->type, &kv->val, &neg, &mag))
		return false;
	return to_i64(neg, mag, out);
}

bool gguf_get_u64(const struct gguf *g, const char *key, uint64_t *out)
{
	return gguf_kv_to_u64(gguf_find_key(g, key), out);
}

bool gguf_get_i64(const struct gguf *g, const char *key, int64_t *out)
{
	return gguf_kv_to_i64(gguf_find_key(g, key), out);
}

bool gguf_get_u32(const struct gguf *g, const char *key, uint32_t *out)
{
	uint64_t v;
	if (!gguf_get_u64(g, key, &v) || v > UINT32_MAX)
		return false;
	*out = (uint32_t)v;
	return true;
}

bool gguf_get_i32(const struct gguf *g, const char *key, int32_t *out)
{
	int64_t v;
	if (!gguf_get_i64(g, key, &v) || v < INT32_MIN || v > INT32_MAX)
		return false;
	*out = (int32_t)v;
	return true;
}

bool gguf_get_f64(const struct gguf *g, const char *key, double *out)
{
	const struct gguf_kv *kv = gguf_find_key(g, key);
	if (!kv)
		return false;
	if (kv->type == GGUF_TYPE_FLOAT32) {
		*out = kv->val.f32;
		return true;
	}
	if (kv->type == GGUF_TYPE_FLOAT64) {
		*out = kv->val.f64;
		return true;
	}
	int64_t i;
	uint64_t u;
	if (gguf_kv_to_i64(kv, &i)) {
		*out = (double)i;
		return true;
	}
	if (gguf_kv_to_u64(kv, &u)) {
		*out = (double)u;
		return true;
	}
	return false;
}

bool gguf_get_f32(const struct gguf *g, const char *key, float *out)
{
	double d;
	if (!gguf_get_f64(g, key, &d))
		return false;
	*out = (float)d;
	return true;
}

bool gguf_get_bool(const struct gguf *g, const char *key, bool *out)
{
	const struct gguf_kv *kv = gguf_find_key(g, key);
	if (!kv || kv->type != GGUF_TYPE_BOOL)
		return false;
	*out = kv->val.b;
	return true;
}

const char *gguf_get_string(const struct gguf *g, const char *key)
{
	const struct gguf_kv *kv = gguf_find_key(g, key);
	return kv && kv->type == GGUF_TYPE_STRING ? kv->val.str.data : NULL;
}

uint64_t gguf_kv_arr_n(const struct gguf_kv *kv)
{
	return kv && kv->type == GGUF_TYPE_ARRAY ? kv->arr_n : 0;
}

static const void *arr_elem(const struct gguf_kv *kv, uint64_t i)
{
	if (!kv || kv->type != GGUF_TYPE_ARRAY || i >= kv->arr_n)
		return NULL;
	return (const uint8_t *)kv->val.arr + i * type_host_size(kv->arr_type);
}

bool gguf_kv_arr_i64(const struct gguf_kv *kv, uint64_t i, int64_t *out)
{
	const void *p = arr_elem(kv, i);
	bool neg;
	uint64_t mag;
	return p && int_value(kv->arr_type, p, &neg, &mag) && to_i64(neg, mag, out);
}

bool gguf_kv_arr_u64(const struct gguf_kv *kv, uint64_t i, uint64_t *out)
{
	const void *p = arr_elem(kv, i);
	bool neg;
	uint64_t mag;
	return p && int_value(kv->arr_type, p, &neg, &mag) && to_u64(neg, mag, out);
}

bool gguf_kv_arr_f64(const struct gguf_kv *kv, uint64_t i, double *out)
{
	const void *p = arr_elem(kv, i);
	if (!p)
		return false;
	if (kv->arr_type == GGUF_TYPE_FLOAT32) {
		float f;
		memcpy(&f, p, sizeof f);
		*out = f;
		return true;
	}
	if (kv->arr_type == GGUF_TYPE_FLOAT64) {
		memcpy(out, p, sizeof *out);
		return true;
	}
	bool neg;
	uint64_t mag;
	if (kv->arr_type == GGUF_TYPE_STRING || !int_value(kv->arr_type, p, &neg, &mag))
		return false;
	*out = neg ? -(double)mag : (double)mag;
	return true;
}

const struct gguf_str *gguf_kv_arr_str(const struct gguf_kv *kv, uint64_t i)
{
	const void *p = arr_elem(kv, i);
	return p && kv->arr_type == GGUF_TYPE_STRING ? p : NULL;
}

const char *gguf_file_type_name(int64_t ft)
{
	/* llama_ftype from llama.h; gaps are removed types. */
	static const char *const names[] = {
	    [0] = "F32",        [1] = "F16",     [2] = "Q4_0",    [3] = "Q4_1",
	    [7] = "Q8_0",       [8] = "Q5_0",    [9] = "Q5_1",    [10] = "Q2_K",
	    [11] = "Q3_K_S",    [12] = "Q3_K_M", [13] = "Q3_K_L", [14] = "Q4_K_S",
	    [15] = "Q4_K_M",    [16] = "Q5_K_S", [17] = "Q5_K_M", [18] = "Q6_K",
	    [19] = "IQ2_XXS",   [20] = "IQ2_XS", [21] = "Q2_K_S", [22] = "IQ3_XS",
	    [23] = "IQ3_XXS",   [24] = "IQ1_S",  [25] = "IQ4_NL", [26] = "IQ3_S",
	    [27] = "IQ3_M",     [28] = "IQ2_S",  [29] = "IQ2_M",  [30] = "IQ4_XS",
	    [31] = "IQ1_M",     [32] = "BF16",   [36] = "TQ1_0",  [37] = "TQ2_0",
	    [38] = "MXFP4_MOE",
	};
	/* The "guessed" flag (1024) marks a file type llama.cpp inferred. */
	ft &= ~(int64_t)1024;
	if (ft < 0 || (uint64_t)ft >= sizeof names / sizeof names[0])
		return NULL;
	return names[ft];
}

/* --- Model info ---------------------------------------------------------- */

/* Copies src into dst, truncating (a name longer than the field is still
 * useful cut short). */
static void copy_str(char *dst, size_t dstlen, const char *src)
{
	size_t n = src ? strlen(src) : 0;
	if (n >= dstlen)
		n = dstlen - 1;
	if (n)
		memcpy(dst, src, n);
	dst[n] = '\0';
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
	uint64_t r;
	return __builtin_add_overflow(a, b, &r) ? UINT64_MAX : r;
}

static uint64_t sat_mul(uint64_t a, uint64_t b)
{
	uint64_t r;
	return __builtin_mul_overflow(a, b, &r) ? UINT64_MAX : r;
}

/* A hyperparameter that may be a scalar or an array with one value per layer
 * (head counts of some models, e.g. OpenELM, or hybrid models whose
 * recurrent layers have no KV heads). Gives the max, the first value, and the
 * sum over n_layers layers. */
struct per_layer {
	bool present;
	bool is_array;
	uint64_t max;
	uint64_t first;
	uint64_t sum;
};

static struct per_layer read_per_layer(const struct gguf *g, const char *key, uint64_t n_layers)
{
	struct per_layer pl = {0};
	const struct gguf_kv *kv = gguf_find_key(g, key);
	uint64_t v;
	if (!kv)
		return pl;
	if (kv->type == GGUF_TYPE_ARRAY) {
		uint64_t n = kv->arr_n;
		bool any = false;
		for (uint64_t i = 0; i < n && (n_layers == 0 || i < n_layers); i++) {
			if (!gguf_kv_arr_u64(kv, i, &v))
				continue;
			if (!any)
				pl.first = v;
			any = true;
			if (v > pl.max)
				pl.max = v;
			pl.sum = sat_add(pl.sum, v);
		}
		pl.present = any;
		pl.is_array = true;
		return pl;
	}
	if (!gguf_kv_to_u64(kv, &v))
		return pl;
	pl.present = true;
	pl.max = pl.first = v;
	pl.sum = sat_mul(v, n_layers);
	return pl;
}

static uint64_t arch_u64(const struct gguf *g, const char *arch, const char *suffix)
{
	char key[160];
	uint64_t v = 0;
	snprintf(key, sizeof key, "%s.%s", arch, suffix);
	if (!gguf_get_u64(g, key, &v))
		return 0;
	return v;
}

bool gguf_model_info_read(const struct gguf *g, struct gguf_model_info *mi)
{
	memset(mi, 0, sizeof(*mi));
	mi->version = g->version;
	mi->file_size = g->file_size;
	mi->n_tensors = g->n_tensors;
	mi->n_kv = g->n_kv;
	mi->alignment = g->alignment;
	mi->file_type = -1;
	mi->main_tensor_type = -1;

	int64_t ft;
	if (gguf_get_i64(g, "general.file_type", &ft))
		mi->file_type = ft;
	copy_str(mi->name, sizeof mi->name, gguf_get_string(g, "general.name"));
	copy_str(mi->tokenizer_model, sizeof mi->tokenizer_model,
	         gguf_get_string(g, "tokenizer.ggml.model"));
	mi->has_chat_template = gguf_get_string(g, "tokenizer.chat_template") != NULL;

	/* Tensor totals; bytes per type to find the type that dominates. */
	uint64_t by_type[N_GGML_TYPES] = {0};
	for (size_t i = 0; i < g->n_tensors; i++) {
		const struct gguf_tensor_info *ti = &g->tensors[i];
		mi->n_params = sat_add(mi->n_params, ti->n_elements);
		mi->tensor_data_bytes = sat_add(mi->tensor_data_bytes, ti->nbytes);
		if (ti->type_known)
			by_type[ti->type] = sat_add(by_type[ti->type], ti->nbytes);
	}
	uint64_t best = 0;
	for (size_t t = 0; t < N_GGML_TYPES; t++) {
		if (by_type[t] > best) {
			best = by_type[t];
			mi->main_tensor_type = (int64_t)t;
		}
	}

	const struct gguf_kv *toks = gguf_find_key(g, "tokenizer.ggml.tokens");
	if (toks && toks->type == GGUF_TYPE_ARRAY)
		mi->n_vocab = toks->arr_n;

	const char *arch = gguf_get_string(g, "general.architecture");
	/* Keys are "<arch>.<name>"; an architecture name with odd bytes would
	 * still only ever produce a key that is not found. */
	if (!arch || strlen(arch) > 100)
		return false;
	copy_str(mi->architecture, sizeof mi->architecture, arch);

	mi->n_layers = arch_u64(g, arch, "block_count");
	mi->n_embd = arch_u64(g, arch, "embedding_length");
	mi->context_length = arch_u64(g, arch, "context_length");

	char key[160];
	snprintf(key, sizeof key, "%s.feed_forward_length", arch);
	mi->n_ff = read_per_layer(g, key, mi->n_layers).max;

	snprintf(key, sizeof key, "%s.attention.head_count", arch);
	struct per_layer head = read_per_layer(g, key, mi->n_layers);
	snprintf(key, sizeof key, "%s.attention.head_count_kv", arch);
	struct per_layer head_kv = read_per_layer(g, key, mi->n_layers);
	/* llama.cpp: no head_count_kv means one KV head per query head. */
	if (!head_kv.present)
		head_kv = head;
	mi->n_head = head.max;
	mi->n_head_per_layer = head.is_array;
	mi->n_head_kv = head_kv.max;
	mi->n_head_kv_sum = head_kv.sum;
	mi->n_head_kv_per_layer = head_kv.is_array;

	/* llama.cpp derives the head size from layer 0's head count. */
	uint64_t head_dim = head.first ? mi->n_embd / head.first : 0;
	mi->key_length = arch_u64(g, arch, "attention.key_length");
	if (!mi->key_length)
		mi->key_length = head_dim;
	mi->value_length = arch_u64(g, arch, "attention.value_length");
	if (!mi->value_length)
		mi->value_length = head_dim;

	if (!mi->n_vocab)
		mi->n_vocab = arch_u64(g, arch, "vocab_size");
	if (!mi->n_vocab) {
		const struct gguf_tensor_info *te = gguf_find_tensor(g, "token_embd.weight");
		if (te && te->n_dims >= 2)
			mi->n_vocab = te->ne[1];
	}
	return true;
}

uint64_t gguf_kv_bytes_per_token(const struct gguf_model_info *mi, double elem_bytes)
{
	uint64_t elems = sat_mul(mi->n_head_kv_sum, sat_add(mi->key_length, mi->value_length));
	if (elems == UINT64_MAX || !(elem_bytes >= 0))
		return UINT64_MAX;
	double b = ceil((double)elems * elem_bytes);
	/* 2^64 as a double; anything at or past it saturates. */
	if (b >= 18446744073709551616.0)
		return UINT64_MAX;
	return (uint64_t)b;
}

/* Bytes of n elements of a ggml type, rounding partial blocks up. */
static uint64_t type_bytes(uint32_t type, uint64_t n)
{
	uint32_t bs, ts;
	if (!gguf_tensor_type_size(type, &bs, &ts))
		return 0;
	return sat_mul(n / bs + (n % bs != 0), ts);
}

uint64_t gguf_kv_bytes_per_token_type(const struct gguf_model_info *mi, uint32_t type_k,
                                      uint32_t type_v)
{
	if (!gguf_tensor_type_size(type_k, NULL, NULL) ||
	    !gguf_tensor_type_size(type_v, NULL, NULL))
		return 0;
	/* Exact when each layer's K/V row (heads * head size) is a whole number
	 * of blocks, which holds for every real head size (multiples of 32). */
	uint64_t k = type_bytes(type_k, sat_mul(mi->n_head_kv_sum, mi->key_length));
	uint64_t v = type_bytes(type_v, sat_mul(mi->n_head_kv_sum, mi->value_length));
	return sat_add(k, v);
}
