/* Values of the Jinja engine: construction in the render's arena, and the
 * conversions whose exact output ends up in prompts (as_string, repr,
 * tojson), with llama.cpp's rules (common/jinja/value.h, value.cpp). */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/jinja_impl.h"
#include "util/dtoa.h"

/* ---- arena ---- */

struct arena_block {
	struct arena_block *next;
	size_t used, cap;
	max_align_t data[];
};

void *arena_alloc(struct arena *a, size_t n)
{
	n = (n + sizeof(max_align_t) - 1) / sizeof(max_align_t) * sizeof(max_align_t);
	if (!n)
		n = sizeof(max_align_t);
	struct arena_block *b = a->head;
	if (!b || b->cap - b->used < n) {
		/* Blocks start small and double (to 1 MB): a short render fits in
		 * one or two, and freeing a 64 KB block would make glibc
		 * consolidate its free lists on every render. */
		size_t grow = a->head ? a->head->cap * 2 : 8192;
		if (grow > (1u << 20))
			grow = 1u << 20;
		size_t cap = n > grow ? n : grow;
		if (a->limit && (cap > a->limit || a->total > a->limit - cap))
			return NULL;
		b = malloc(sizeof *b + cap);
		if (!b)
			return NULL;
		a->total += cap;
		b->used = 0;
		b->cap = cap;
		b->next = a->head;
		a->head = b;
	}
	void *p = (char *)b->data + b->used;
	b->used += n;
	memset(p, 0, n);
	return p;
}

void arena_free(struct arena *a)
{
	while (a->head) {
		struct arena_block *b = a->head;
		a->head = b->next;
		free(b);
	}
	a->total = 0;
}

_Noreturn void jinja_fail(struct jerr *e, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->msg, sizeof e->msg, fmt, ap);
	va_end(ap);
	longjmp(e->jb, 1);
}

static void *alloc(struct rt *rt, size_t n)
{
	void *p = arena_alloc(&rt->arena, n);
	if (!p)
		jinja_fail(&rt->err, "out of memory");
	return p;
}

/* ---- construction ---- */

struct jval *jv_new(struct rt *rt, enum jtype t)
{
	struct jval *v = alloc(rt, sizeof *v);
	v->t = t;
	return v;
}

struct jval *jv_undef(struct rt *rt, const char *hint)
{
	struct jval *v = jv_new(rt, JT_UNDEF);
	v->hint = hint;
	return v;
}

struct jval *jv_none(struct rt *rt)
{
	return jv_new(rt, JT_NONE);
}

struct jval *jv_bool(struct rt *rt, int b)
{
	struct jval *v = jv_new(rt, JT_BOOL);
	v->i = b ? 1 : 0;
	v->f = (double)v->i;
	return v;
}

struct jval *jv_int(struct rt *rt, int64_t i)
{
	struct jval *v = jv_new(rt, JT_INT);
	v->i = i;
	v->f = (double)i;
	/* An int a double cannot hold exactly compares as infinity. */
	if (v->f >= 9223372036854775808.0 || v->f < -9223372036854775808.0 || (int64_t)v->f != i)
		v->f = i < 0 ? -INFINITY : INFINITY;
	return v;
}

struct jval *jv_float(struct rt *rt, double f)
{
	struct jval *v = jv_new(rt, JT_FLOAT);
	v->f = f;
	v->i = isfinite(f) && f < 9223372036854775808.0 && f >= -9223372036854775808.0 ? (int64_t)f : 0;
	return v;
}

struct jval *jv_str(struct rt *rt, const char *s, size_t len, int copy)
{
	struct jval *v = jv_new(rt, JT_STR);
	if (copy) {
		char *c = alloc(rt, len + 1);
		if (len)
			memcpy(c, s, len);
		v->s = c;
	} else {
		v->s = s ? s : "";
	}
	v->len = len;
	return v;
}

struct jval *jv_strz(struct rt *rt, const char *s)
{
	return jv_str(rt, s, strlen(s), 0);
}

struct jval *jv_array(struct rt *rt, enum jtype t)
{
	return jv_new(rt, t);
}

struct jval *jv_object(struct rt *rt)
{
	return jv_new(rt, JT_OBJECT);
}

struct jval *jv_func(struct rt *rt, const char *name, jbuiltin fn, struct jval *arg0)
{
	struct jval *v = jv_new(rt, JT_FUNC);
	v->name = name;
	v->fn = fn;
	v->arg0 = arg0;
	return v;
}

static void grow(struct rt *rt, struct jval *a, int with_keys)
{
	size_t cap = a->cap ? a->cap * 2 : 8;
	struct jval **items = alloc(rt, cap * sizeof *items);
	if (a->n)
		memcpy(items, a->items, a->n * sizeof *items);
	a->items = items;
	if (with_keys) {
		struct jval **keys = alloc(rt, cap * sizeof *keys);
		if (a->n)
			memcpy(keys, a->keys, a->n * sizeof *keys);
		a->keys = keys;
	}
	a->cap = cap;
}

void jv_push(struct rt *rt, struct jval *arr, struct jval *v)
{
	if (arr->n == arr->cap)
		grow(rt, arr, 0);
	arr->items[arr->n++] = v;
}

/* ---- kinds and conversions ---- */

int jv_is_numeric(const struct jval *v)
{
	return v->t == JT_INT || v->t == JT_FLOAT || v->t == JT_BOOL;
}

int jv_is_array(const struct jval *v)
{
	return v->t == JT_ARRAY || v->t == JT_TUPLE;
}

int jv_is_none(const struct jval *v)
{
	return v->t == JT_NONE || v->t == JT_UNDEF;
}

const char *jv_type_name(const struct jval *v)
{
	static const char *const names[] = {"Undefined", "None",   "Boolean", "Integer",
					    "Float",	 "String", "Array",   "Tuple",
					    "Object",	 "Function", "KwArg"};
	return names[v->t];
}

int jv_truthy(struct rt *rt, const struct jval *v)
{
	switch (v->t) {
	case JT_UNDEF:
	case JT_NONE:
		return 0;
	case JT_BOOL:
	case JT_INT:
		return v->i != 0;
	case JT_FLOAT:
		return v->f != 0.0;
	case JT_STR:
		return v->len > 0;
	case JT_ARRAY:
	case JT_TUPLE:
	case JT_OBJECT:
		return v->n > 0;
	default:
		jinja_fail(&rt->err, "%s is not a bool value", jv_type_name(v));
	}
}

int64_t jv_as_int(struct rt *rt, const struct jval *v)
{
	if (v->t == JT_INT || v->t == JT_FLOAT || v->t == JT_BOOL)
		return v->i;
	jinja_fail(&rt->err, "%s is not an int value", jv_type_name(v));
}

double jv_as_float(struct rt *rt, const struct jval *v)
{
	if (v->t == JT_INT || v->t == JT_FLOAT)
		return v->f;
	jinja_fail(&rt->err, "%s is not a float value", jv_type_name(v));
}

/* ---- strings ---- */

static void buf_need(struct rt *rt, struct jbuf *b, size_t more)
{
	if (b->len + more + 1 <= b->cap)
		return;
	size_t cap = b->cap ? b->cap * 2 : 256;
	while (cap < b->len + more + 1)
		cap *= 2;
	char *p = alloc(rt, cap);
	if (b->len)
		memcpy(p, b->p, b->len);
	b->p = p;
	b->cap = cap;
}

static void parts_push(struct rt *rt, struct jbuf *b, size_t len)
{
	if (b->n_parts == b->cap_parts) {
		size_t cap = b->cap_parts ? b->cap_parts * 2 : 8;
		size_t *p = alloc(rt, cap * sizeof *p);
		if (b->n_parts)
			memcpy(p, b->parts, b->n_parts * sizeof *p);
		b->parts = p;
		b->cap_parts = cap;
	}
	b->parts[b->n_parts++] = len;
}

void jbuf_append(struct rt *rt, struct jbuf *b, const char *s, size_t len)
{
	buf_need(rt, b, len);
	if (len)
		memcpy(b->p + b->len, s, len);
	b->len += len;
	b->p[b->len] = 0;
	parts_push(rt, b, len);
}

void jbuf_append_value_parts(struct rt *rt, struct jbuf *b, const struct jval *s)
{
	if (!s->n_parts) {
		jbuf_append(rt, b, s->s, s->len);
		return;
	}
	size_t off = 0;
	for (size_t i = 0; i < s->n_parts; i++) {
		jbuf_append(rt, b, s->s + off, s->parts[i]);
		off += s->parts[i];
	}
}

/* Appends plain bytes to the last part (tojson, repr), not a new part. */
static void buf_raw(struct rt *rt, struct jbuf *b, const char *s, size_t len)
{
	buf_need(rt, b, len);
	if (len)
		memcpy(b->p + b->len, s, len);
	b->len += len;
	b->p[b->len] = 0;
}

static void buf_rawz(struct rt *rt, struct jbuf *b, const char *s)
{
	buf_raw(rt, b, s, strlen(s));
}

struct jval *jbuf_value(struct rt *rt, struct jbuf *b)
{
	struct jval *v = jv_str(rt, b->p ? b->p : "", b->len, 0);
	/* Empty parts carry no text; one part needs no list. */
	size_t k = 0;
	for (size_t i = 0; i < b->n_parts; i++)
		if (b->parts[i])
			b->parts[k++] = b->parts[i];
	if (k > 1) {
		v->parts = b->parts;
		v->n_parts = k;
	}
	return v;
}

struct jval *jv_concat(struct rt *rt, struct jval *a, struct jval *b)
{
	struct jbuf out = {0};
	jbuf_append_value_parts(rt, &out, a);
	jbuf_append_value_parts(rt, &out, b);
	return jbuf_value(rt, &out);
}

/* ---- printing ---- */

/* A float as llama.cpp's as_string: std::to_string (six decimals), trailing
 * zeros trimmed, one kept after the point. */
static void float_as_string(double f, char *out, size_t n)
{
	snprintf(out, n, "%f", f);
	size_t l = strlen(out);
	while (l > 0 && out[l - 1] == '0')
		l--;
	if (l > 0 && out[l - 1] == '.')
		out[l++] = '0';
	out[l] = 0;
}

static void as_string_into(struct rt *rt, struct jbuf *b, struct jval *v);

static int has_quote(const struct jval *s)
{
	return memchr(s->s, '\'', s->len) != NULL;
}

static void json_into(struct rt *rt, struct jbuf *b, struct jval *v, int lvl, int indent,
		      const char *item_sep, const char *key_sep);

/* value_to_string_repr: strings quoted ('x', or as JSON when they hold a
 * quote), everything else as its debug form. */
static void repr_into(struct rt *rt, struct jbuf *b, struct jval *v)
{
	if (v->t == JT_STR) {
		if (has_quote(v)) {
			json_into(rt, b, v, 0, -1, ", ", ": ");
		} else {
			buf_raw(rt, b, "'", 1);
			buf_raw(rt, b, v->s, v->len);
			buf_raw(rt, b, "'", 1);
		}
		return;
	}
	switch (v->t) {
	case JT_UNDEF:
		if (v->hint && *v->hint) {
			buf_rawz(rt, b, "Undefined (hint: '");
			buf_rawz(rt, b, v->hint);
			buf_rawz(rt, b, "')");
		} else {
			buf_rawz(rt, b, "Undefined");
		}
		return;
	case JT_NONE:
		buf_rawz(rt, b, "None");
		return;
	case JT_FUNC:
		buf_rawz(rt, b, "Function<");
		buf_rawz(rt, b, v->name ? v->name : "");
		buf_rawz(rt, b, ">(");
		if (v->arg0)
			repr_into(rt, b, v->arg0);
		buf_rawz(rt, b, ")");
		return;
	case JT_KWARG:
		buf_rawz(rt, b, "KwArg");
		return;
	default:
		as_string_into(rt, b, v);
	}
}

static void as_string_into(struct rt *rt, struct jbuf *b, struct jval *v)
{
	char num[400]; /* %f of the largest double has 309 digits before the point */
	switch (v->t) {
	case JT_INT:
		snprintf(num, sizeof num, "%" PRId64, v->i);
		buf_rawz(rt, b, num);
		return;
	case JT_FLOAT:
		float_as_string(v->f, num, sizeof num);
		buf_rawz(rt, b, num);
		return;
	case JT_BOOL:
		buf_rawz(rt, b, v->i ? "True" : "False");
		return;
	case JT_STR:
		buf_raw(rt, b, v->s, v->len);
		return;
	case JT_NONE:
		buf_rawz(rt, b, "None");
		return;
	case JT_ARRAY:
	case JT_TUPLE: {
		int tuple = v->t == JT_TUPLE;
		buf_rawz(rt, b, tuple ? "(" : "[");
		for (size_t i = 0; i < v->n; i++) {
			if (i)
				buf_rawz(rt, b, ", ");
			repr_into(rt, b, v->items[i]);
		}
		if (tuple && v->n == 1)
			buf_rawz(rt, b, ",");
		buf_rawz(rt, b, tuple ? ")" : "]");
		return;
	}
	case JT_OBJECT:
		buf_rawz(rt, b, "{");
		for (size_t i = 0; i < v->n; i++) {
			if (i)
				buf_rawz(rt, b, ", ");
			repr_into(rt, b, v->keys[i]);
			buf_rawz(rt, b, ": ");
			repr_into(rt, b, v->items[i]);
		}
		buf_rawz(rt, b, "}");
		return;
	default:
		jinja_fail(&rt->err, "%s is not a string value", jv_type_name(v));
	}
}

struct jval *jv_as_string(struct rt *rt, struct jval *v)
{
	if (v->t == JT_STR)
		return v;
	struct jbuf b = {0};
	buf_need(rt, &b, 0);
	as_string_into(rt, &b, v);
	return jv_str(rt, b.p, b.len, 0);
}

static void json_string_into(struct rt *rt, struct jbuf *b, const char *s, size_t len)
{
	buf_raw(rt, b, "\"", 1);
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		char esc[8];
		switch (c) {
		case '"': buf_raw(rt, b, "\\\"", 2); break;
		case '\\': buf_raw(rt, b, "\\\\", 2); break;
		case '\b': buf_raw(rt, b, "\\b", 2); break;
		case '\f': buf_raw(rt, b, "\\f", 2); break;
		case '\n': buf_raw(rt, b, "\\n", 2); break;
		case '\r': buf_raw(rt, b, "\\r", 2); break;
		case '\t': buf_raw(rt, b, "\\t", 2); break;
		default:
			if (c < 0x20) {
				snprintf(esc, sizeof esc, "\\u%04x", c);
				buf_raw(rt, b, esc, 6);
			} else {
				buf_raw(rt, b, (const char *)&s[i], 1);
			}
		}
	}
	buf_raw(rt, b, "\"", 1);
}

static void spaces(struct rt *rt, struct jbuf *b, int n)
{
	for (int i = 0; i < n; i++)
		buf_raw(rt, b, " ", 1);
}

/* value_to_json: nulls for None and undefined, ints as %lld, floats as
 * nlohmann writes them, strings escaped only below
 * U+0020 (no \u escapes for other characters), the given separators, and
 * with indent >= 0 newlines and indent spaces a level. */
static void json_into(struct rt *rt, struct jbuf *b, struct jval *v, int lvl, int indent,
		      const char *item_sep, const char *key_sep)
{
	char num[64];
	switch (v->t) {
	case JT_NONE:
	case JT_UNDEF:
		buf_rawz(rt, b, "null");
		return;
	case JT_BOOL:
		buf_rawz(rt, b, v->i ? "true" : "false");
		return;
	case JT_INT:
		snprintf(num, sizeof num, "%" PRId64, v->i);
		buf_rawz(rt, b, num);
		return;
	case JT_FLOAT:
		/* Build 11669 writes floats as nlohmann::json does (seen against
		 * the server: 2.0 -> "2.0", 0.1 + 0.2 -> "0.30000000000000004"). */
		dtoa_nlohmann(v->f, num);
		buf_rawz(rt, b, num);
		return;
	case JT_STR:
		json_string_into(rt, b, v->s, v->len);
		return;
	case JT_ARRAY:
	case JT_TUPLE:
		buf_rawz(rt, b, "[");
		if (v->n) {
			if (indent >= 0)
				buf_rawz(rt, b, "\n");
			for (size_t i = 0; i < v->n; i++) {
				if (indent > 0)
					spaces(rt, b, lvl * indent + indent);
				json_into(rt, b, v->items[i], lvl + 1, indent, item_sep, key_sep);
				if (i + 1 < v->n)
					buf_rawz(rt, b, item_sep);
				if (indent >= 0)
					buf_rawz(rt, b, "\n");
			}
			if (indent > 0)
				spaces(rt, b, lvl * indent);
		}
		buf_rawz(rt, b, "]");
		return;
	case JT_OBJECT:
		buf_rawz(rt, b, "{");
		if (v->n) {
			if (indent >= 0)
				buf_rawz(rt, b, "\n");
			for (size_t i = 0; i < v->n; i++) {
				if (indent > 0)
					spaces(rt, b, lvl * indent + indent);
				struct jval *k = jv_as_string(rt, v->keys[i]);
				json_string_into(rt, b, k->s, k->len);
				buf_rawz(rt, b, key_sep);
				json_into(rt, b, v->items[i], lvl + 1, indent, item_sep, key_sep);
				if (i + 1 < v->n)
					buf_rawz(rt, b, item_sep);
				if (indent >= 0)
					buf_rawz(rt, b, "\n");
			}
			if (indent > 0)
				spaces(rt, b, lvl * indent);
		}
		buf_rawz(rt, b, "}");
		return;
	default:
		buf_rawz(rt, b, "null");
	}
}

struct jval *jv_to_json(struct rt *rt, struct jval *v, int indent, const char *item_sep,
			const char *key_sep)
{
	struct jbuf b = {0};
	buf_need(rt, &b, 0);
	json_into(rt, &b, v, 0, indent, item_sep, key_sep);
	return jv_str(rt, b.p, b.len, 0);
}

/* ---- equality ---- */

static int is_immutable(const struct jval *v)
{
	return v->t != JT_ARRAY && v->t != JT_OBJECT;
}

static int is_hashable(const struct jval *v)
{
	switch (v->t) {
	case JT_UNDEF:
	case JT_FUNC:
		return 0;
	case JT_ARRAY:
	case JT_TUPLE:
		for (size_t i = 0; i < v->n; i++)
			if (!is_immutable(v->items[i]) || !is_hashable(v->items[i]))
				return 0;
		return 1;
	case JT_OBJECT:
		for (size_t i = 0; i < v->n; i++)
			if (!is_immutable(v->items[i]) || !is_hashable(v->items[i]))
				return 0;
		return 1;
	default:
		return 1;
	}
}

/* llama.cpp's operator== ("equivalent"): numbers (bools included) by value,
 * strings by bytes, arrays and objects element by element when hashable
 * (an array holding an array never equals anything), None only None,
 * undefined only undefined. */
int jv_equal(const struct jval *a, const struct jval *b)
{
	switch (a->t) {
	case JT_INT:
	case JT_FLOAT:
	case JT_BOOL:
		return jv_is_numeric(b) && a->i == b->i && a->f == b->f;
	case JT_STR:
		return b->t == JT_STR && a->len == b->len && (!a->len || !memcmp(a->s, b->s, a->len));
	case JT_NONE:
		return b->t == JT_NONE;
	case JT_UNDEF:
		return b->t == JT_UNDEF;
	case JT_ARRAY:
	case JT_TUPLE:
		if (b->t != a->t || !is_hashable(a) || !is_hashable(b) || b->n < a->n)
			return 0;
		for (size_t i = 0; i < a->n; i++)
			if (!jv_equal(a->items[i], b->items[i]))
				return 0;
		return 1;
	case JT_OBJECT:
		if (b->t != JT_OBJECT || !is_hashable(a) || !is_hashable(b) || b->n < a->n)
			return 0;
		for (size_t i = 0; i < a->n; i++)
			if (!jv_equal(a->keys[i], b->keys[i]) || !jv_equal(a->items[i], b->items[i]))
				return 0;
		return 1;
	case JT_FUNC:
		return b->t == JT_FUNC && a->fn == b->fn && a->macro == b->macro;
	case JT_KWARG:
		return b->t == JT_KWARG && !strcmp(a->kw, b->kw) && a->kwval == b->kwval;
	}
	return 0;
}

static int str_cmp(const struct jval *a, const struct jval *b)
{
	size_t n = a->len < b->len ? a->len : b->len;
	int c = n ? memcmp(a->s, b->s, n) : 0;
	if (c)
		return c;
	return a->len < b->len ? -1 : a->len > b->len;
}

int jv_compare(struct rt *rt, struct jval *a, struct jval *b, enum jcmp op)
{
	int an = a->t == JT_INT || a->t == JT_FLOAT, bn = b->t == JT_INT || b->t == JT_FLOAT;
	if (an && bn) {
		double x = a->f, y = b->f;
		switch (op) {
		case JCMP_EQ: return x == y;
		case JCMP_GE: return x >= y;
		case JCMP_GT: return x > y;
		case JCMP_LT: return x < y;
		case JCMP_NE: return x != y;
		}
	}
	if ((b->t == JT_STR && an) || (a->t == JT_STR && bn) || (a->t == JT_STR && b->t == JT_STR)) {
		int c = str_cmp(jv_as_string(rt, a), jv_as_string(rt, b));
		switch (op) {
		case JCMP_EQ: return c == 0;
		case JCMP_GE: return c >= 0;
		case JCMP_GT: return c > 0;
		case JCMP_LT: return c < 0;
		case JCMP_NE: return c != 0;
		}
	}
	if (a->t == JT_BOOL && b->t == JT_BOOL) {
		if (op == JCMP_EQ)
			return a->i == b->i;
		if (op == JCMP_NE)
			return a->i != b->i;
		jinja_fail(&rt->err, "Unsupported comparison operator for bool type");
	}
	return 0;
}

/* ---- objects ---- */

static int key_usable(const struct jval *k)
{
	return is_immutable(k) && is_hashable(k);
}

struct jval *jv_get(struct rt *rt, struct jval *obj, struct jval *key)
{
	if (!key_usable(key))
		jinja_fail(&rt->err, "Object key of unhashable type: %s", jv_type_name(key));
	for (size_t i = 0; i < obj->n; i++)
		if (jv_equal(obj->keys[i], key))
			return obj->items[i];
	return NULL;
}

struct jval *jv_get_str(struct jval *obj, const char *key)
{
	size_t len = strlen(key);
	for (size_t i = 0; i < obj->n; i++) {
		const struct jval *k = obj->keys[i];
		if (k->t == JT_STR && k->len == len && !memcmp(k->s, key, len))
			return obj->items[i];
	}
	return NULL;
}

void jv_insert(struct rt *rt, struct jval *obj, struct jval *key, struct jval *v)
{
	if (!key_usable(key))
		jinja_fail(&rt->err, "Object key of unhashable type: %s", jv_type_name(key));
	for (size_t i = 0; i < obj->n; i++)
		if (jv_equal(obj->keys[i], key)) {
			obj->items[i] = v;
			return;
		}
	if (obj->n == obj->cap)
		grow(rt, obj, 1);
	obj->keys[obj->n] = key;
	obj->items[obj->n] = v;
	obj->n++;
}

void jv_insert_str(struct rt *rt, struct jval *obj, const char *key, struct jval *v)
{
	for (size_t i = 0; i < obj->n; i++) {
		const struct jval *k = obj->keys[i];
		if (k->t == JT_STR && k->len == strlen(key) && !memcmp(k->s, key, k->len)) {
			obj->items[i] = v;
			return;
		}
	}
	jv_insert(rt, obj, jv_strz(rt, key), v);
}

/* ---- JSON in ---- */

struct jval *jv_from_json(struct rt *rt, json_t *j)
{
	switch (json_typeof(j)) {
	case JSON_NULL:
		return jv_none(rt);
	case JSON_TRUE:
		return jv_bool(rt, 1);
	case JSON_FALSE:
		return jv_bool(rt, 0);
	case JSON_INTEGER:
		return jv_int(rt, json_integer_value(j));
	case JSON_REAL:
		return jv_float(rt, json_real_value(j));
	case JSON_STRING:
		return jv_str(rt, json_string_value(j), json_string_length(j), 0);
	case JSON_ARRAY: {
		struct jval *a = jv_array(rt, JT_ARRAY);
		size_t i;
		json_t *e;
		json_array_foreach(j, i, e) jv_push(rt, a, jv_from_json(rt, e));
		return a;
	}
	case JSON_OBJECT: {
		struct jval *o = jv_object(rt);
		const char *k;
		json_t *e;
		/* jansson iterates in insertion (document) order, as nlohmann's
		 * ordered_json does. */
		json_object_foreach(j, k, e) jv_insert(rt, o, jv_strz(rt, k), jv_from_json(rt, e));
		return o;
	}
	}
	return jv_undef(rt, NULL);
}
