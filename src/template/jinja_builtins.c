/* Filters, methods, tests and global functions, with llama.cpp's names,
 * argument rules and results (common/jinja/value.cpp): for example
 * select(x) is selectattr(x), map() takes only attribute=, split() without a
 * separator splits on " ", indent() indents only the first line, and an
 * undefined value answers most filters with an empty result. */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/jinja_impl.h"
#include "util/bytes.h"

#define FAIL(...) jinja_fail(&rt->err, __VA_ARGS__)

/* ---- arguments ---- */

struct jval *jinja_kwarg(struct jval **args, size_t n, const char *key)
{
	for (size_t i = 0; i < n; i++)
		if (args[i]->t == JT_KWARG && !strcmp(args[i]->kw, key))
			return args[i]->kwval;
	return NULL;
}

struct jval *jinja_kwarg_or_pos(struct rt *rt, struct jval **args, size_t n, const char *key,
                                size_t pos)
{
	struct jval *v = jinja_kwarg(args, n, key);
	if (v && v->t != JT_UNDEF)
		return v;
	if (pos < n && args[pos]->t != JT_KWARG)
		return args[pos];
	return v ? v : jv_undef(rt, NULL);
}

void jinja_need(struct rt *rt, const char *fn, size_t n, size_t min, size_t max)
{
	if (n < min || n > max)
		FAIL("Function '%s' expected between %zu and %zu arguments, got %zu", fn, min, max,
		     n);
}

static struct jval *arg(struct rt *rt, struct jval **args, size_t n, size_t i, const char *fn)
{
	if (i >= n)
		FAIL("Function '%s' expected at least %zu arguments, got %zu", fn, i + 1, n);
	return args[i];
}

static struct jval *arg_or(struct rt *rt, struct jval **args, size_t n, size_t i)
{
	return i < n ? args[i] : jv_undef(rt, NULL);
}

static void want(struct rt *rt, const struct jval *v, enum jtype t, const char *fn)
{
	int ok = v->t == t || (t == JT_ARRAY && v->t == JT_TUPLE);
	if (!ok)
		FAIL("Function '%s' expected a value of another type, got %s", fn, jv_type_name(v));
}

static struct jval *as_str(struct rt *rt, struct jval *v)
{
	return jv_as_string(rt, v);
}

/* ---- shared ---- */

static struct jval *b_tojson(struct rt *rt, struct jval **a, size_t n)
{
	jinja_need(rt, "tojson", n, 1, 5);
	struct jval *ascii = jinja_kwarg_or_pos(rt, a, n, "ensure_ascii", 1);
	struct jval *indent_v = jinja_kwarg_or_pos(rt, a, n, "indent", 2);
	struct jval *seps = jinja_kwarg_or_pos(rt, a, n, "separators", 3);
	struct jval *sort = jinja_kwarg_or_pos(rt, a, n, "sort_keys", 4);
	int indent = indent_v->t == JT_INT ? (int)indent_v->i : -1;
	if (jv_truthy(rt, ascii))
		FAIL("NotImplemented: tojson ensure_ascii=true not implemented");
	if (jv_truthy(rt, sort))
		FAIL("NotImplemented: tojson sort_keys=true not implemented");
	const char *item_sep = indent < 0 ? ", " : ",", *key_sep = ": ";
	if (jv_is_array(seps)) {
		if (seps->n > 0) {
			struct jval *s = as_str(rt, seps->items[0]);
			char *c = arena_alloc(&rt->arena, s->len + 1);
			if (!c)
				FAIL("out of memory");
			memcpy(c, s->s, s->len);
			item_sep = c;
		}
		if (seps->n > 1) {
			struct jval *s = as_str(rt, seps->items[1]);
			char *c = arena_alloc(&rt->arena, s->len + 1);
			if (!c)
				FAIL("out of memory");
			memcpy(c, s->s, s->len);
			key_sep = c;
		}
	}
	return jv_to_json(rt, arg(rt, a, n, 0, "tojson"), indent, item_sep, key_sep);
}

static struct jval *b_default(struct rt *rt, struct jval **a, size_t n)
{
	jinja_need(rt, "default", n, 2, 3);
	int check_bool = jv_truthy(rt, jinja_kwarg_or_pos(rt, a, n, "boolean", 2));
	int none = check_bool ? !jv_truthy(rt, a[0]) : jv_is_none(a[0]);
	return none ? a[1] : a[0];
}

static struct jval *empty_array(struct rt *rt, struct jval **a, size_t n)
{
	(void)a;
	(void)n;
	return jv_array(rt, JT_ARRAY);
}

static struct jval *empty_string(struct rt *rt, struct jval **a, size_t n)
{
	(void)a;
	(void)n;
	return jv_str(rt, "", 0, 0);
}

static struct jval *empty_int(struct rt *rt, struct jval **a, size_t n)
{
	(void)a;
	(void)n;
	return jv_int(rt, 0);
}

static struct jval *empty_undef(struct rt *rt, struct jval **a, size_t n)
{
	(void)a;
	(void)n;
	return jv_undef(rt, NULL);
}

static struct jval *none_string(struct rt *rt, struct jval **a, size_t n)
{
	(void)a;
	(void)n;
	return jv_strz(rt, "None");
}

/* Python-style slicing as llama.cpp does it (a negative step ignores the
 * bounds and walks the whole sequence backwards). */
struct slice_spec {
	int64_t start, stop, step;
};

static struct slice_spec slice_args(struct rt *rt, struct jval **a, size_t n, const char *fn)
{
	jinja_need(rt, fn, n, 2, 4);
	struct jval *a0 = arg(rt, a, n, 1, fn), *a1 = arg_or(rt, a, n, 2),
	            *a2 = arg_or(rt, a, n, 3);
	if (a0->t != JT_INT)
		FAIL("Function '%s' expected an integer", fn);
	struct slice_spec s;
	if (n == 3) {
		s.start = jv_as_int(rt, a0);
		s.stop = jv_as_int(rt, a1);
		s.step = 1;
	} else if (n == 4) {
		s.start = jv_as_int(rt, a0);
		s.stop = jv_as_int(rt, a1);
		s.step = jv_as_int(rt, a2);
	} else {
		s.start = jv_as_int(rt, a0);
		s.stop = jv_as_int(rt, a1); /* undefined: fails, as in llama.cpp */
		s.step = 1;
	}
	if (s.step == 0)
		FAIL("slice step cannot be zero");
	return s;
}

/* Calls visit(i) for each index the slice selects over len elements. */
static size_t slice_indices(struct slice_spec s, int64_t len, int64_t *out)
{
	int64_t dir = s.step > 0 ? 1 : -1, start, stop;
	if (dir > 0) {
		start = s.start < 0 ? (len + s.start > 0 ? len + s.start : 0)
		                    : (s.start < len ? s.start : len);
		stop = s.stop < 0 ? (len + s.stop > 0 ? len + s.stop : 0)
		                  : (s.stop < len ? s.stop : len);
	} else {
		start = len - 1;
		stop = -1;
	}
	size_t k = 0;
	for (int64_t i = start; dir * i < dir * stop; i += s.step)
		if (i >= 0 && i < len)
			out[k++] = i;
	return k;
}

/* ---- int, float, bool ---- */

static struct jval *int_abs(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "abs"), JT_INT, "abs");
	return jv_int(rt, a[0]->i < 0 ? -a[0]->i : a[0]->i);
}

static struct jval *int_float(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "float"), JT_INT, "float");
	return jv_float(rt, (double)a[0]->i);
}

static struct jval *float_abs(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "abs"), JT_FLOAT, "abs");
	return jv_float(rt, a[0]->f < 0 ? -a[0]->f : a[0]->f);
}

static struct jval *float_int(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "int"), JT_FLOAT, "int");
	return jv_int(rt, (int64_t)a[0]->f);
}

static struct jval *bool_int(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "int"), JT_BOOL, "int");
	return jv_int(rt, a[0]->i ? 1 : 0);
}

static struct jval *bool_float(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "float"), JT_BOOL, "float");
	return jv_float(rt, a[0]->i ? 1.0 : 0.0);
}

static struct jval *bool_string(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "string"), JT_BOOL, "string");
	return jv_strz(rt, a[0]->i ? "True" : "False");
}

/* ---- strings ---- */

/* A new string with each part transformed (the unit llama.cpp's string
 * transforms work on). */
static struct jval *per_part(struct rt *rt, struct jval *s, void (*fn)(char *, size_t))
{
	char *c = arena_alloc(&rt->arena, s->len + 1);
	if (!c)
		FAIL("out of memory");
	if (s->len)
		memcpy(c, s->s, s->len);
	if (!s->n_parts) {
		fn(c, s->len);
	} else {
		size_t off = 0;
		for (size_t i = 0; i < s->n_parts; i++) {
			fn(c + off, s->parts[i]);
			off += s->parts[i];
		}
	}
	struct jval *v = jv_str(rt, c, s->len, 0);
	v->parts = s->parts;
	v->n_parts = s->n_parts;
	return v;
}

static void upper_fn(char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		s[i] = (char)toupper((unsigned char)s[i]);
}

static void lower_fn(char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		s[i] = (char)tolower((unsigned char)s[i]);
}

static void capitalize_fn(char *s, size_t n)
{
	if (!n)
		return;
	s[0] = (char)toupper((unsigned char)s[0]);
	lower_fn(s + 1, n - 1);
}

static void title_fn(char *s, size_t n)
{
	int next = 1;
	for (size_t i = 0; i < n; i++) {
		if (isspace((unsigned char)s[i])) {
			next = 1;
		} else if (next) {
			s[i] = (char)toupper((unsigned char)s[i]);
			next = 0;
		} else {
			s[i] = (char)tolower((unsigned char)s[i]);
		}
	}
}

static struct jval *str_upper(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "upper"), JT_STR, "upper");
	return per_part(rt, a[0], upper_fn);
}

static struct jval *str_lower(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "lower"), JT_STR, "lower");
	return per_part(rt, a[0], lower_fn);
}

static struct jval *str_capitalize(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "capitalize"), JT_STR, "capitalize");
	return per_part(rt, a[0], capitalize_fn);
}

static struct jval *str_title(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "title"), JT_STR, "title");
	return per_part(rt, a[0], title_fn);
}

static int strip_match(const struct jval *chars, unsigned char c)
{
	if (!chars)
		return isspace(c);
	return chars->len && memchr(chars->s, c, chars->len) != NULL;
}

/* strip over the parts: empty parts at either end go, the rest keep their
 * boundaries. */
static struct jval *do_strip(struct rt *rt, struct jval *s, int left, int right,
                             const struct jval *chars)
{
	size_t start = 0, end = s->len;
	if (left)
		while (start < end && strip_match(chars, (unsigned char)s->s[start]))
			start++;
	if (right)
		while (end > start && strip_match(chars, (unsigned char)s->s[end - 1]))
			end--;
	struct jval *v = jv_str(rt, s->s + start, end - start, 0);
	if (s->n_parts) {
		struct jbuf b = {0};
		size_t off = 0;
		for (size_t i = 0; i < s->n_parts; i++) {
			size_t ps = off, pe = off + s->parts[i];
			size_t cs = ps > start ? ps : start, ce = pe < end ? pe : end;
			if (ce > cs)
				jbuf_append(rt, &b, s->s + cs, ce - cs);
			off = pe;
		}
		struct jval *w = jbuf_value(rt, &b);
		v->parts = w->parts;
		v->n_parts = w->n_parts;
	}
	return v;
}

static struct jval *strip_chars(struct rt *rt, struct jval **a, size_t n)
{
	struct jval *c = jinja_kwarg_or_pos(rt, a, n, "chars", 1);
	return c->t == JT_UNDEF ? NULL : as_str(rt, c);
}

static struct jval *str_strip(struct rt *rt, struct jval **a, size_t n)
{
	if (arg(rt, a, n, 0, "strip")->t != JT_STR)
		FAIL("strip() first argument must be a string");
	return do_strip(rt, a[0], 1, 1, strip_chars(rt, a, n));
}

static struct jval *str_rstrip(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "rstrip"), JT_STR, "rstrip");
	return do_strip(rt, a[0], 0, 1, strip_chars(rt, a, n));
}

static struct jval *str_lstrip(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "lstrip"), JT_STR, "lstrip");
	return do_strip(rt, a[0], 1, 0, strip_chars(rt, a, n));
}

static struct jval *str_length(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "length"), JT_STR, "length");
	return jv_int(rt, (int64_t)a[0]->len);
}

static struct jval *str_startswith(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "startswith"), JT_STR, "startswith");
	want(rt, arg(rt, a, n, 1, "startswith"), JT_STR, "startswith");
	return jv_bool(rt, a[0]->len >= a[1]->len &&
	                       (!a[1]->len || !memcmp(a[0]->s, a[1]->s, a[1]->len)));
}

static struct jval *str_endswith(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "endswith"), JT_STR, "endswith");
	want(rt, arg(rt, a, n, 1, "endswith"), JT_STR, "endswith");
	return jv_bool(
	    rt, a[0]->len >= a[1]->len &&
	            (!a[1]->len || !memcmp(a[0]->s + a[0]->len - a[1]->len, a[1]->s, a[1]->len)));
}

static const char *find_bytes(const char *h, size_t hl, const char *nd, size_t nl)
{
	if (nl == 0)
		return h;
	return memmem(h, hl, nd, nl);
}

static struct jval *str_split(struct rt *rt, struct jval **a, size_t n)
{
	jinja_need(rt, "split", n, 1, 3);
	if (a[0]->t != JT_STR)
		FAIL("split() first argument must be a string");
	struct jval *delim = n > 1 ? as_str(rt, a[1]) : jv_strz(rt, " ");
	int64_t max = n > 2 ? jv_as_int(rt, a[2]) : -1;
	if (!delim->len)
		FAIL("split() with an empty separator"); /* llama.cpp loops forever */
	struct jval *out = jv_array(rt, JT_ARRAY);
	const char *s = a[0]->s;
	size_t len = a[0]->len;
	const char *hit;
	while (max != 0 && (hit = find_bytes(s, len, delim->s, delim->len))) {
		jv_push(rt, out, jv_str(rt, s, (size_t)(hit - s), 0));
		len -= (size_t)(hit - s) + delim->len;
		s = hit + delim->len;
		max--;
	}
	jv_push(rt, out, jv_str(rt, s, len, 0));
	return out;
}

static struct jval *str_rsplit(struct rt *rt, struct jval **a, size_t n)
{
	jinja_need(rt, "rsplit", n, 1, 3);
	if (a[0]->t != JT_STR)
		FAIL("rsplit() first argument must be a string");
	struct jval *delim = n > 1 ? as_str(rt, a[1]) : jv_strz(rt, " ");
	int64_t max = n > 2 ? jv_as_int(rt, a[2]) : -1;
	if (!delim->len)
		FAIL("rsplit() with an empty separator");
	struct jval *rev = jv_array(rt, JT_ARRAY);
	const char *s = a[0]->s;
	size_t len = a[0]->len;
	const char *hit;
	while (max != 0 && (hit = bytes_rfind(s, len, delim->s, delim->len))) {
		size_t after = (size_t)(hit - s) + delim->len;
		jv_push(rt, rev, jv_str(rt, s + after, len - after, 0));
		len = (size_t)(hit - s);
		max--;
	}
	jv_push(rt, rev, jv_str(rt, s, len, 0));
	struct jval *out = jv_array(rt, JT_ARRAY);
	for (size_t i = rev->n; i-- > 0;)
		jv_push(rt, out, rev->items[i]);
	return out;
}

static struct jval *str_replace(struct rt *rt, struct jval **a, size_t n)
{
	jinja_need(rt, "replace", n, 3, 999);
	for (int i = 0; i < 3; i++)
		want(rt, a[i], JT_STR, "replace");
	int64_t count = n > 3 ? jv_as_int(rt, a[3]) : -1;
	if (count > 0)
		FAIL("NotImplemented: String replace with count argument not implemented");
	if (!a[1]->len)
		FAIL("replace() of an empty string"); /* llama.cpp never ends */
	struct jbuf b = {0};
	const char *s = a[0]->s;
	size_t len = a[0]->len;
	const char *hit;
	jbuf_append(rt, &b, "", 0);
	while ((hit = find_bytes(s, len, a[1]->s, a[1]->len))) {
		jbuf_append(rt, &b, s, (size_t)(hit - s));
		jbuf_append(rt, &b, a[2]->s, a[2]->len);
		len -= (size_t)(hit - s) + a[1]->len;
		s = hit + a[1]->len;
	}
	jbuf_append(rt, &b, s, len);
	return jv_str(rt, b.p, b.len, 0);
}

/* std::stoi / std::stod: leading spaces, a prefix that parses, else failure. */
static struct jval *str_int(struct rt *rt, struct jval **a, size_t n)
{
	struct jval *in = arg(rt, a, n, 0, "int");
	struct jval *def = jinja_kwarg_or_pos(rt, a, n, "default", 1);
	struct jval *base_v = jinja_kwarg_or_pos(rt, a, n, "base", 2);
	int base = base_v->t == JT_UNDEF ? 10 : (int)jv_as_int(rt, base_v);
	if (in->t != JT_STR)
		FAIL("int() first argument must be a string");
	char *c = arena_alloc(&rt->arena, in->len + 1);
	if (!c)
		FAIL("out of memory");
	memcpy(c, in->s, in->len);
	char *end;
	errno = 0;
	long v = strtol(c, &end, base);
	if (end == c || errno || v > INT_MAX || v < INT_MIN)
		return jv_int(rt, def->t == JT_UNDEF ? 0 : jv_as_int(rt, def));
	return jv_int(rt, v);
}

static struct jval *str_float(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "float"), JT_STR, "float");
	struct jval *def = jinja_kwarg_or_pos(rt, a, n, "default", 1);
	char *c = arena_alloc(&rt->arena, a[0]->len + 1);
	if (!c)
		FAIL("out of memory");
	memcpy(c, a[0]->s, a[0]->len);
	char *end;
	errno = 0;
	double v = strtod(c, &end);
	if (end == c || errno == ERANGE)
		return jv_float(rt, def->t == JT_UNDEF ? 0.0 : jv_as_float(rt, def));
	return jv_float(rt, v);
}

static struct jval *str_string(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "string"), JT_STR, "string");
	return a[0];
}

/* Build 11669's format filter gives the string back as it is, whatever the
 * arguments ('%s'|format(1) is "%s"). */
static struct jval *str_format(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "format"), JT_STR, "format");
	return a[0];
}

static struct jval *str_slice(struct rt *rt, struct jval **a, size_t n)
{
	struct slice_spec s = slice_args(rt, a, n, "slice");
	want(rt, a[0], JT_STR, "slice");
	int64_t *idx = arena_alloc(&rt->arena, (a[0]->len + 1) * sizeof *idx);
	if (!idx)
		FAIL("out of memory");
	size_t k = slice_indices(s, (int64_t)a[0]->len, idx);
	char *c = arena_alloc(&rt->arena, k + 1);
	if (!c)
		FAIL("out of memory");
	for (size_t i = 0; i < k; i++)
		c[i] = a[0]->s[idx[i]];
	return jv_str(rt, c, k, 0);
}

static struct jval *str_indent(struct rt *rt, struct jval **a, size_t n)
{
	jinja_need(rt, "indent", n, 2, 4);
	want(rt, a[0], JT_STR, "indent");
	want(rt, a[1], JT_INT, "indent");
	int64_t count = a[1]->i;
	if (count <= 0)
		FAIL("indent must be a positive number");
	struct jbuf b = {0};
	for (int64_t i = 0; i < count; i++)
		jbuf_append(rt, &b, " ", 1);
	jbuf_append(rt, &b, a[0]->s, a[0]->len);
	return jv_str(rt, b.p, b.len, 0);
}

static struct jval *not_implemented(struct rt *rt, struct jval **a, size_t n)
{
	(void)a;
	(void)n;
	FAIL("NotImplemented: this filter is not implemented in llama.cpp's engine");
}

/* ---- arrays ---- */

static struct jval *copy_array(struct rt *rt, struct jval *src, enum jtype t)
{
	struct jval *out = jv_array(rt, t);
	for (size_t i = 0; i < src->n; i++)
		jv_push(rt, out, src->items[i]);
	return out;
}

static struct jval *arr_list(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "list"), JT_ARRAY, "list");
	return copy_array(rt, a[0], JT_ARRAY);
}

static struct jval *arr_first(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "first"), JT_ARRAY, "first");
	return a[0]->n ? a[0]->items[0] : jv_undef(rt, NULL);
}

static struct jval *arr_last(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "last"), JT_ARRAY, "last");
	return a[0]->n ? a[0]->items[a[0]->n - 1] : jv_undef(rt, NULL);
}

static struct jval *arr_length(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "length"), JT_ARRAY, "length");
	return jv_int(rt, (int64_t)a[0]->n);
}

static struct jval *arr_slice(struct rt *rt, struct jval **a, size_t n)
{
	struct slice_spec s = slice_args(rt, a, n, "slice");
	want(rt, a[0], JT_ARRAY, "slice");
	int64_t *idx = arena_alloc(&rt->arena, (a[0]->n + 1) * sizeof *idx);
	if (!idx)
		FAIL("out of memory");
	size_t k = slice_indices(s, (int64_t)a[0]->n, idx);
	struct jval *out = jv_array(rt, a[0]->t);
	for (size_t i = 0; i < k; i++)
		jv_push(rt, out, a[0]->items[idx[i]]);
	return out;
}

static struct jval *member_or(struct rt *rt, struct jval *item, struct jval *key, struct jval *dflt)
{
	struct jval *v = jv_get(rt, item, key);
	return v ? v : dflt;
}

static struct jval *selectattr_impl(struct rt *rt, struct jval **a, size_t n, int reject)
{
	jinja_need(rt, "selectattr", n, 2, 4);
	want(rt, a[0], JT_ARRAY, "selectattr");
	want(rt, a[1], JT_STR, "selectattr");
	struct jval *arr = a[0], *out = jv_array(rt, JT_ARRAY), *undef = jv_undef(rt, NULL);
	if (n == 2) {
		for (size_t i = 0; i < arr->n; i++) {
			struct jval *item = arr->items[i];
			if (item->t != JT_OBJECT)
				FAIL("selectattr: item is not an object");
			int sel = jv_truthy(rt, member_or(rt, item, a[1], undef));
			if (sel != reject)
				jv_push(rt, out, item);
		}
		return out;
	}
	struct jval *test_name = as_str(rt, a[n == 3 ? 1 : 2]);
	char name[128];
	snprintf(name, sizeof name, "test_is_%.*s", (int)test_name->len, test_name->s);
	jbuiltin test = jinja_global_builtin(name);
	if (!test)
		FAIL("selectattr: unknown test '%.*s'", (int)test_name->len, test_name->s);
	for (size_t i = 0; i < arr->n; i++) {
		struct jval *item = arr->items[i];
		struct jval *targs[2];
		if (n == 3) {
			targs[0] = item;
			targs[1] = a[2];
		} else {
			if (item->t != JT_OBJECT)
				FAIL("selectattr: item is not an object");
			targs[0] = member_or(rt, item, a[1], undef);
			targs[1] = a[3];
		}
		int sel = jv_truthy(rt, test(rt, targs, 2));
		if (sel != reject)
			jv_push(rt, out, item);
	}
	return out;
}

static struct jval *arr_select(struct rt *rt, struct jval **a, size_t n)
{
	return selectattr_impl(rt, a, n, 0);
}

static struct jval *arr_reject(struct rt *rt, struct jval **a, size_t n)
{
	return selectattr_impl(rt, a, n, 1);
}

static struct jval *arr_join(struct rt *rt, struct jval **a, size_t n)
{
	jinja_need(rt, "join", n, 1, 3);
	if (!jv_is_array(a[0]))
		FAIL("join() first argument must be an array");
	struct jval *d = jinja_kwarg_or_pos(rt, a, n, "d", 1);
	struct jval *attr = jinja_kwarg_or_pos(rt, a, n, "attribute", 2);
	int attr_int = attr->t == JT_INT;
	if (attr->t != JT_UNDEF && attr->t != JT_STR && !attr_int)
		FAIL("join() attribute must be string or integer");
	struct jval *delim = d->t == JT_UNDEF ? jv_strz(rt, "") : as_str(rt, d);
	struct jbuf b = {0};
	jbuf_append(rt, &b, "", 0);
	for (size_t i = 0; i < a[0]->n; i++) {
		struct jval *v = a[0]->items[i];
		if (attr->t != JT_UNDEF) {
			if (attr_int && jv_is_array(v)) {
				int64_t k = attr->i < 0 ? attr->i + (int64_t)v->n : attr->i;
				if (k < 0 || k >= (int64_t)v->n)
					FAIL("Index out of bounds");
				v = v->items[k];
			} else if (!attr_int && v->t == JT_OBJECT) {
				struct jval *m = jv_get(rt, v, attr);
				if (!m)
					FAIL("Key not found");
				v = m;
			}
		}
		if (v->t != JT_STR && v->t != JT_INT && v->t != JT_FLOAT)
			FAIL("join() can only join arrays of strings or numerics");
		struct jval *s = as_str(rt, v);
		jbuf_append(rt, &b, s->s, s->len);
		if (i + 1 < a[0]->n)
			jbuf_append(rt, &b, delim->s, delim->len);
	}
	return jv_str(rt, b.p, b.len, 0);
}

static struct jval *any_string(struct rt *rt, struct jval **a, size_t n)
{
	return as_str(rt, arg(rt, a, n, 0, "string"));
}

static struct jval *arr_map(struct rt *rt, struct jval **a, size_t n)
{
	jinja_need(rt, "map", n, 2, 999);
	if (!jv_is_array(a[0]))
		FAIL("map: first argument must be an array");
	if (a[1]->t != JT_KWARG)
		FAIL("NotImplemented: map: filter-mapping not implemented");
	struct jval *attr = jinja_kwarg_or_pos(rt, a, n, "attribute", 1);
	int attr_int = attr->t == JT_INT;
	if (attr->t != JT_STR && !attr_int)
		FAIL("map: attribute must be string or integer");
	struct jval *dflt = jinja_kwarg(a, n, "default");
	if (!dflt)
		dflt = jv_undef(rt, NULL);
	struct jval *out = jv_array(rt, a[0]->t);
	for (size_t i = 0; i < a[0]->n; i++) {
		struct jval *item = a[0]->items[i], *v = dflt;
		if (attr_int) {
			if (jv_is_array(item)) {
				int64_t k = attr->i < 0 ? attr->i + (int64_t)item->n : attr->i;
				if (k >= 0 && k < (int64_t)item->n)
					v = item->items[k];
			}
		} else if (item->t == JT_OBJECT) {
			v = member_or(rt, item, attr, dflt);
		}
		jv_push(rt, out, v);
	}
	return out;
}

static struct jval *arr_append(struct rt *rt, struct jval **a, size_t n)
{
	jinja_need(rt, "append", n, 2, 999);
	if (!jv_is_array(a[0]))
		FAIL("append: first argument must be an array");
	if (a[0]->t == JT_TUPLE)
		FAIL("Attempting to modify immutable type");
	jv_push(rt, a[0], a[1]);
	return a[0];
}

static struct jval *arr_pop(struct rt *rt, struct jval **a, size_t n)
{
	jinja_need(rt, "pop", n, 1, 2);
	want(rt, a[0], JT_ARRAY, "pop");
	if (a[0]->t == JT_TUPLE)
		FAIL("Attempting to modify immutable type");
	int64_t idx = n == 2 ? jv_as_int(rt, a[1]) : -1;
	if (idx < 0)
		idx += (int64_t)a[0]->n;
	if (idx < 0 || idx >= (int64_t)a[0]->n)
		FAIL("Index %" PRId64 " out of bounds for array of size %zu", idx, a[0]->n);
	struct jval *v = a[0]->items[idx];
	memmove(a[0]->items + idx, a[0]->items + idx + 1,
	        (a[0]->n - (size_t)idx - 1) * sizeof *a[0]->items);
	a[0]->n--;
	return v;
}

struct sort_ctx {
	struct rt *rt;
	struct jval *attr;
	int reverse, by_value;
};

static struct jval *sort_key(struct sort_ctx *c, struct jval *v, struct jval *other)
{
	if (c->attr->t == JT_UNDEF)
		return v;
	if (c->attr->t == JT_INT && jv_is_array(v) && jv_is_array(other)) {
		int64_t k = c->attr->i < 0 ? c->attr->i + (int64_t)v->n : c->attr->i;
		if (k < 0 || k >= (int64_t)v->n)
			jinja_fail(&c->rt->err, "Index out of bounds");
		return v->items[k];
	}
	if (c->attr->t != JT_INT && v->t == JT_OBJECT && other->t == JT_OBJECT) {
		struct jval *m = jv_get(c->rt, v, c->attr);
		if (!m)
			jinja_fail(&c->rt->err, "Key not found in value of type Object");
		return m;
	}
	jinja_fail(&c->rt->err, "sort: unsupported object attribute comparison");
}

/* A stable merge sort by llama.cpp's value_compare (std::sort leaves equal
 * items in an unspecified order; equal items rarely matter in templates). */
static void merge_sort(struct jval **v, struct jval **tmp, size_t n,
                       int (*less)(struct sort_ctx *, struct jval *, struct jval *),
                       struct sort_ctx *c)
{
	if (n < 2)
		return;
	size_t h = n / 2;
	merge_sort(v, tmp, h, less, c);
	merge_sort(v + h, tmp, n - h, less, c);
	size_t i = 0, j = h, k = 0;
	while (i < h && j < n)
		tmp[k++] = less(c, v[j], v[i]) ? v[j++] : v[i++];
	while (i < h)
		tmp[k++] = v[i++];
	while (j < n)
		tmp[k++] = v[j++];
	memcpy(v, tmp, n * sizeof *v);
}

static int value_less(struct sort_ctx *c, struct jval *x, struct jval *y)
{
	struct jval *kx = sort_key(c, x, y), *ky = sort_key(c, y, x);
	return jv_compare(c->rt, kx, ky, c->reverse ? JCMP_GT : JCMP_LT);
}

static struct jval *arr_sort(struct rt *rt, struct jval **a, size_t n)
{
	jinja_need(rt, "sort", n, 1, 4);
	if (!jv_is_array(a[0]))
		FAIL("sort: first argument must be an array");
	struct sort_ctx c = {rt, jinja_kwarg_or_pos(rt, a, n, "attribute", 3),
	                     jv_truthy(rt, jinja_kwarg_or_pos(rt, a, n, "reverse", 1)), 0};
	struct jval *out = copy_array(rt, a[0], a[0]->t);
	struct jval **tmp = arena_alloc(&rt->arena, (out->n + 1) * sizeof *tmp);
	if (!tmp)
		FAIL("out of memory");
	merge_sort(out->items, tmp, out->n, value_less, &c);
	return out;
}

static struct jval *arr_reverse(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "reverse"), JT_ARRAY, "reverse");
	struct jval *out = jv_array(rt, a[0]->t);
	for (size_t i = a[0]->n; i-- > 0;)
		jv_push(rt, out, a[0]->items[i]);
	return out;
}

/* ---- objects ---- */

static struct jval *obj_get(struct rt *rt, struct jval **a, size_t n)
{
	jinja_need(rt, "get", n, 2, 3);
	if (a[0]->t != JT_OBJECT)
		FAIL("get: first argument must be an object");
	if (a[1]->t != JT_STR)
		FAIL("get: second argument must be a string (key)");
	struct jval *v = jv_get(rt, a[0], a[1]);
	return v ? v : (n == 3 ? a[2] : jv_none(rt));
}

static struct jval *obj_keys(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "keys"), JT_OBJECT, "keys");
	struct jval *out = jv_array(rt, JT_ARRAY);
	for (size_t i = 0; i < a[0]->n; i++)
		jv_push(rt, out, a[0]->keys[i]);
	return out;
}

static struct jval *obj_values(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "values"), JT_OBJECT, "values");
	struct jval *out = jv_array(rt, JT_ARRAY);
	for (size_t i = 0; i < a[0]->n; i++)
		jv_push(rt, out, a[0]->items[i]);
	return out;
}

static struct jval *pair(struct rt *rt, struct jval *k, struct jval *v)
{
	struct jval *t = jv_array(rt, JT_TUPLE);
	jv_push(rt, t, k);
	jv_push(rt, t, v);
	return t;
}

static struct jval *obj_items(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "items"), JT_OBJECT, "items");
	struct jval *out = jv_array(rt, JT_ARRAY);
	for (size_t i = 0; i < a[0]->n; i++)
		jv_push(rt, out, pair(rt, a[0]->keys[i], a[0]->items[i]));
	return out;
}

static struct jval *obj_length(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "length"), JT_OBJECT, "length");
	return jv_int(rt, (int64_t)a[0]->n);
}

static int pair_less(struct sort_ctx *c, struct jval *x, struct jval *y)
{
	struct jval *kx = c->by_value ? x->items[1] : x->items[0];
	struct jval *ky = c->by_value ? y->items[1] : y->items[0];
	return jv_compare(c->rt, kx, ky, c->reverse ? JCMP_GT : JCMP_LT);
}

static struct jval *obj_dictsort(struct rt *rt, struct jval **a, size_t n)
{
	struct jval *in = arg(rt, a, n, 0, "dictsort");
	want(rt, in, JT_OBJECT, "dictsort");
	struct jval *by = jinja_kwarg_or_pos(rt, a, n, "by", 2);
	struct sort_ctx c = {rt, NULL, jv_truthy(rt, jinja_kwarg_or_pos(rt, a, n, "reverse", 3)),
	                     by->t == JT_STR && by->len == 5 && !memcmp(by->s, "value", 5)};
	struct jval *pairs = jv_array(rt, JT_ARRAY);
	for (size_t i = 0; i < in->n; i++)
		jv_push(rt, pairs, pair(rt, in->keys[i], in->items[i]));
	struct jval **tmp = arena_alloc(&rt->arena, (pairs->n + 1) * sizeof *tmp);
	if (!tmp)
		FAIL("out of memory");
	merge_sort(pairs->items, tmp, pairs->n, pair_less, &c);
	struct jval *out = jv_object(rt);
	for (size_t i = 0; i < pairs->n; i++)
		jv_insert(rt, out, pairs->items[i]->items[0], pairs->items[i]->items[1]);
	return out;
}

/* ---- tests ---- */

static struct jval *test_type(struct rt *rt, struct jval **a, size_t n, unsigned mask)
{
	jinja_need(rt, "test", n, 1, 999);
	return jv_bool(rt, (mask >> a[0]->t) & 1);
}

#define TYPE_TEST(name, mask)                                                                      \
	static struct jval *name(struct rt *rt, struct jval **a, size_t n)                         \
	{                                                                                          \
		return test_type(rt, a, n, (mask));                                                \
	}
TYPE_TEST(t_boolean, 1u << JT_BOOL)
TYPE_TEST(t_callable, 1u << JT_FUNC)
TYPE_TEST(t_string, 1u << JT_STR)
TYPE_TEST(t_integer, 1u << JT_INT)
TYPE_TEST(t_float, 1u << JT_FLOAT)
TYPE_TEST(t_number, (1u << JT_INT) | (1u << JT_FLOAT))
TYPE_TEST(t_iterable, (1u << JT_ARRAY) | (1u << JT_TUPLE) | (1u << JT_STR) | (1u << JT_UNDEF))
TYPE_TEST(t_mapping, 1u << JT_OBJECT)
TYPE_TEST(t_none, 1u << JT_NONE)
TYPE_TEST(t_undefined, 1u << JT_UNDEF)

static struct jval *t_defined(struct rt *rt, struct jval **a, size_t n)
{
	jinja_need(rt, "defined", n, 1, 999);
	return jv_bool(rt, a[0]->t != JT_UNDEF);
}

static struct jval *t_odd(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "odd"), JT_INT, "odd");
	return jv_bool(rt, a[0]->i % 2 != 0);
}

static struct jval *t_even(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "even"), JT_INT, "even");
	return jv_bool(rt, a[0]->i % 2 == 0);
}

static struct jval *t_false(struct rt *rt, struct jval **a, size_t n)
{
	jinja_need(rt, "false", n, 1, 999);
	return jv_bool(rt, a[0]->t == JT_BOOL && !a[0]->i);
}

static struct jval *t_true(struct rt *rt, struct jval **a, size_t n)
{
	jinja_need(rt, "true", n, 1, 999);
	return jv_bool(rt, a[0]->t == JT_BOOL && a[0]->i);
}

static struct jval *t_divisibleby(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "divisibleby"), JT_INT, "divisibleby");
	want(rt, arg(rt, a, n, 1, "divisibleby"), JT_INT, "divisibleby");
	if (!a[1]->i)
		FAIL("division by zero");
	return jv_bool(rt, a[0]->i % a[1]->i == 0);
}

static int all_bytes(const struct jval *s, int (*bad)(int))
{
	for (size_t i = 0; i < s->len; i++)
		if (bad((unsigned char)s->s[i]))
			return 0;
	return 1;
}

static struct jval *t_lower(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "lower"), JT_STR, "lower");
	return jv_bool(rt, all_bytes(a[0], isupper));
}

static struct jval *t_upper(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "upper"), JT_STR, "upper");
	return jv_bool(rt, all_bytes(a[0], islower));
}

static struct jval *t_compare(struct rt *rt, struct jval **a, size_t n, enum jcmp op)
{
	jinja_need(rt, "compare", n, 2, 2);
	return jv_bool(rt, jv_compare(rt, a[0], a[1], op));
}
#define CMP_TEST(name, op)                                                                         \
	static struct jval *name(struct rt *rt, struct jval **a, size_t n)                         \
	{                                                                                          \
		return t_compare(rt, a, n, op);                                                    \
	}
CMP_TEST(t_eq, JCMP_EQ)
CMP_TEST(t_ge, JCMP_GE)
CMP_TEST(t_gt, JCMP_GT)
CMP_TEST(t_lt, JCMP_LT)
CMP_TEST(t_ne, JCMP_NE)

static struct jval *t_in(struct rt *rt, struct jval **a, size_t n)
{
	jinja_need(rt, "in", n, 2, 999);
	struct jval *needle = a[0], *hay = a[1];
	if (hay->t == JT_UNDEF)
		return jv_bool(rt, 0);
	if (jv_is_array(hay)) {
		for (size_t i = 0; i < hay->n; i++)
			if (jv_equal(needle, hay->items[i]))
				return jv_bool(rt, 1);
		return jv_bool(rt, 0);
	}
	if (hay->t == JT_STR) {
		if (needle->t != JT_STR)
			FAIL("'in' test expects a string needle in a string");
		return jv_bool(rt, find_bytes(hay->s, hay->len, needle->s, needle->len) != NULL);
	}
	if (hay->t == JT_OBJECT)
		return jv_bool(rt, jv_get(rt, hay, needle) != NULL);
	FAIL("'in' test expects iterable as first argument, got %s", jv_type_name(hay));
}

static struct jval *t_test(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "test"), JT_STR, "test");
	char name[128];
	snprintf(name, sizeof name, "test_is_%.*s", (int)a[0]->len, a[0]->s);
	return jv_bool(rt, jinja_global_builtin(name) != NULL);
}

/* ---- globals ---- */

static struct jval *g_raise(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "raise_exception"), JT_STR, "raise_exception");
	FAIL("Jinja Exception: %.*s", (int)(a[0]->len > 400 ? 400 : a[0]->len), a[0]->s);
}

static struct jval *g_namespace(struct rt *rt, struct jval **a, size_t n)
{
	struct jval *out = jv_object(rt);
	for (size_t i = 0; i < n; i++) {
		if (a[i]->t != JT_KWARG)
			FAIL("namespace() arguments must be kwargs");
		jv_insert_str(rt, out, a[i]->kw, a[i]->kwval);
	}
	return out;
}

static struct jval *g_strftime_now(struct rt *rt, struct jval **a, size_t n)
{
	want(rt, arg(rt, a, n, 0, "strftime_now"), JT_STR, "strftime_now");
	char fmt[256], out[100];
	snprintf(fmt, sizeof fmt, "%.*s", (int)a[0]->len, a[0]->s);
	struct tm tm;
	localtime_r(&rt->now, &tm);
	size_t len = strftime(out, sizeof out, fmt, &tm);
	if (!len)
		FAIL("strftime_now: failed to format time");
	return jv_str(rt, out, len, 1);
}

static struct jval *g_range(struct rt *rt, struct jval **a, size_t n)
{
	jinja_need(rt, "range", n, 1, 3);
	want(rt, a[0], JT_INT, "range");
	int64_t start = 0, stop, step = 1;
	if (n == 1) {
		stop = jv_as_int(rt, a[0]);
	} else {
		start = jv_as_int(rt, a[0]);
		stop = jv_as_int(rt, a[1]);
		if (n == 3)
			step = jv_as_int(rt, a[2]);
	}
	if (!step)
		FAIL("range() step argument must not be zero");
	struct jval *out = jv_array(rt, JT_ARRAY);
	if ((stop - start) / step > 10000000)
		FAIL("range() too long");
	if (step > 0)
		for (int64_t i = start; i < stop; i += step)
			jv_push(rt, out, jv_int(rt, i));
	else
		for (int64_t i = start; i > stop; i += step)
			jv_push(rt, out, jv_int(rt, i));
	return out;
}

/* ---- the tables ---- */

struct entry {
	const char *name;
	jbuiltin fn;
};

static jbuiltin lookup(const struct entry *t, const char *name)
{
	for (; t->name; t++)
		if (!strcmp(t->name, name))
			return t->fn;
	return NULL;
}

static const struct entry globals[] = {
    {"raise_exception", g_raise},
    {"namespace", g_namespace},
    {"strftime_now", g_strftime_now},
    {"range", g_range},
    {"tojson", b_tojson},
    {"test_is_boolean", t_boolean},
    {"test_is_callable", t_callable},
    {"test_is_odd", t_odd},
    {"test_is_even", t_even},
    {"test_is_false", t_false},
    {"test_is_true", t_true},
    {"test_is_divisibleby", t_divisibleby},
    {"test_is_string", t_string},
    {"test_is_integer", t_integer},
    {"test_is_float", t_float},
    {"test_is_number", t_number},
    {"test_is_iterable", t_iterable},
    {"test_is_sequence", t_iterable},
    {"test_is_mapping", t_mapping},
    {"test_is_lower", t_lower},
    {"test_is_upper", t_upper},
    {"test_is_none", t_none},
    {"test_is_defined", t_defined},
    {"test_is_undefined", t_undefined},
    {"test_is_eq", t_eq},
    {"test_is_equalto", t_eq},
    {"test_is_ge", t_ge},
    {"test_is_gt", t_gt},
    {"test_is_greaterthan", t_gt},
    {"test_is_lt", t_lt},
    {"test_is_lessthan", t_lt},
    {"test_is_ne", t_ne},
    {"test_is_in", t_in},
    {"test_is_test", t_test},
    {"test_is_sameas", not_implemented},
    {"test_is_escaped", not_implemented},
    {"test_is_filter", not_implemented},
    {NULL, NULL},
};

static const struct entry int_methods[] = {
    {"default", b_default}, {"abs", int_abs},     {"float", int_float},
    {"tojson", b_tojson},   {"string", b_tojson}, {NULL, NULL},
};

static const struct entry float_methods[] = {
    {"default", b_default}, {"abs", float_abs},   {"int", float_int},
    {"tojson", b_tojson},   {"string", b_tojson}, {NULL, NULL},
};

static const struct entry string_methods[] = {
    {"default", b_default},         {"upper", str_upper},           {"lower", str_lower},
    {"strip", str_strip},           {"rstrip", str_rstrip},         {"lstrip", str_lstrip},
    {"title", str_title},           {"capitalize", str_capitalize}, {"length", str_length},
    {"startswith", str_startswith}, {"endswith", str_endswith},     {"split", str_split},
    {"rsplit", str_rsplit},         {"replace", str_replace},       {"int", str_int},
    {"float", str_float},           {"string", str_string},         {"slice", str_slice},
    {"safe", str_string},           {"tojson", b_tojson},           {"indent", str_indent},
    {"format", str_format},         {"join", not_implemented},      {NULL, NULL},
};

static const struct entry bool_methods[] = {
    {"default", b_default},  {"int", bool_int},    {"float", bool_float},
    {"string", bool_string}, {"tojson", b_tojson}, {NULL, NULL},
};

static const struct entry array_methods[] = {
    {"default", b_default},      {"list", arr_list},
    {"first", arr_first},        {"last", arr_last},
    {"length", arr_length},      {"slice", arr_slice},
    {"selectattr", arr_select},  {"select", arr_select},
    {"rejectattr", arr_reject},  {"reject", arr_reject},
    {"join", arr_join},          {"string", any_string},
    {"tojson", b_tojson},        {"map", arr_map},
    {"append", arr_append},      {"pop", arr_pop},
    {"sort", arr_sort},          {"reverse", arr_reverse},
    {"unique", not_implemented}, {NULL, NULL},
};

static const struct entry object_methods[] = {
    {"get", obj_get},       {"keys", obj_keys},         {"values", obj_values},
    {"items", obj_items},   {"tojson", b_tojson},       {"string", any_string},
    {"length", obj_length}, {"dictsort", obj_dictsort}, {"join", not_implemented},
    {NULL, NULL},
};

static const struct entry none_methods[] = {
    {"default", b_default},
    {"tojson", b_tojson},
    {"string", none_string},
    {"safe", none_string},
    {"strip", none_string},
    {"items", empty_array},
    {"map", empty_array},
    {"reject", empty_array},
    {"rejectattr", empty_array},
    {"select", empty_array},
    {"selectattr", empty_array},
    {"unique", empty_array},
    {NULL, NULL},
};

static const struct entry undefined_methods[] = {
    {"default", b_default},
    {"capitalize", empty_string},
    {"first", empty_undef},
    {"items", empty_array},
    {"join", empty_string},
    {"last", empty_undef},
    {"length", empty_int},
    {"list", empty_array},
    {"lower", empty_string},
    {"map", empty_array},
    {"max", empty_undef},
    {"min", empty_undef},
    {"reject", empty_array},
    {"rejectattr", empty_array},
    {"replace", empty_string},
    {"reverse", empty_array},
    {"safe", empty_string},
    {"select", empty_array},
    {"selectattr", empty_array},
    {"sort", empty_array},
    {"string", empty_string},
    {"strip", empty_string},
    {"sum", empty_int},
    {"title", empty_string},
    {"truncate", empty_string},
    {"unique", empty_array},
    {"upper", empty_string},
    {"wordcount", empty_int},
    {NULL, NULL},
};

jbuiltin jinja_global_builtin(const char *name)
{
	return lookup(globals, name);
}

jbuiltin jinja_type_builtin(const struct jval *v, const char *name)
{
	switch (v->t) {
	case JT_INT:
		return lookup(int_methods, name);
	case JT_FLOAT:
		return lookup(float_methods, name);
	case JT_STR:
		return lookup(string_methods, name);
	case JT_BOOL:
		return lookup(bool_methods, name);
	case JT_ARRAY:
	case JT_TUPLE:
		return lookup(array_methods, name);
	case JT_OBJECT:
		return v->no_builtins ? NULL : lookup(object_methods, name);
	case JT_NONE:
		return lookup(none_methods, name);
	case JT_UNDEF:
		return lookup(undefined_methods, name);
	default:
		return NULL;
	}
}
