#include "api/anthropic.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "util/err.h"

/* ---------------------------------------------------------------- strbuf */

/* ------------------------------------------------------- small helpers */

/* Sets key to a new reference; returns -1 (and drops v) on failure, so call
 * sites can chain without leaking. */
static int put(json_t *obj, const char *key, json_t *v)
{
	if (!v)
		return -1;
	return json_object_set_new(obj, key, v) ? -1 : 0;
}

static int put_copy(json_t *obj, const char *key, const json_t *v)
{
	/* json_deep_copy takes a const pointer; a shallow reference would tie
	 * the result's lifetime to the request's. */
	return put(obj, key, json_deep_copy(v));
}

/* Random ids for messages or tool calls the backend did not name: not secret,
 * only unique, so a weak fallback is fine when getrandom fails. */
static void random_hex(char *out, size_t nhex)
{
	unsigned char raw[32];
	size_t nraw = (nhex + 1) / 2;
	if (nraw > sizeof raw)
		nraw = sizeof raw;
	if (getrandom(raw, nraw, GRND_NONBLOCK) != (ssize_t)nraw) {
		static unsigned long long ctr;
		unsigned long long x =
		    (unsigned long long)time(NULL) ^ (++ctr * 0x9e3779b97f4a7c15ULL);
		for (size_t i = 0; i < nraw; i++) {
			x ^= x >> 33;
			x *= 0xff51afd7ed558ccdULL;
			raw[i] = (unsigned char)(x >> 56);
		}
	}
	static const char hex[] = "0123456789abcdef";
	size_t i;
	for (i = 0; i < nhex && i / 2 < nraw; i++)
		out[i] = hex[(raw[i / 2] >> ((i & 1) ? 0 : 4)) & 15];
	out[i] = '\0';
}

/* ------------------------------------------- nlohmann-compatible dumping */

static int dump_string(struct strbuf *b, const char *s, size_t n)
{
	if (strbuf_append(b, "\"", 1))
		return -1;
	size_t run = 0; /* bytes copied verbatim in one go */
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		const char *esc = NULL;
		char ubuf[8];
		switch (c) {
		case '"':
			esc = "\\\"";
			break;
		case '\\':
			esc = "\\\\";
			break;
		case '\b':
			esc = "\\b";
			break;
		case '\f':
			esc = "\\f";
			break;
		case '\n':
			esc = "\\n";
			break;
		case '\r':
			esc = "\\r";
			break;
		case '\t':
			esc = "\\t";
			break;
		default:
			if (c < 0x20) {
				/* nlohmann writes these in lower-case hex. */
				snprintf(ubuf, sizeof ubuf, "\\u%04x", c);
				esc = ubuf;
			}
		}
		if (!esc) {
			run++;
			continue;
		}
		if (strbuf_append(b, s + i - run, run) || strbuf_appends(b, esc))
			return -1;
		run = 0;
	}
	if (strbuf_append(b, s + n - run, run))
		return -1;
	return strbuf_append(b, "\"", 1);
}

/* nlohmann's to_chars: the shortest digits that read back as d, laid out by
 * its format_buffer (kMinExp -4, kMaxExp 15). printf's %.17g would say
 * 0.10000000000000001 where llama-server says 0.1. */
static int dump_real(struct strbuf *b, double d)
{
	if (!isfinite(d))
		return strbuf_appends(b, "null");
	if (d == 0)
		return strbuf_appends(b, signbit(d) ? "-0.0" : "0.0");
	char tmp[40];
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(tmp, sizeof tmp, "%.*e", prec - 1, d);
		if (strtod(tmp, NULL) == d)
			break;
	}
	/* tmp is [-]D[.DDD]e[+-]XX */
	char digits[24];
	int k = 0, neg = 0;
	const char *p = tmp;
	if (*p == '-') {
		neg = 1;
		p++;
	}
	for (; *p && *p != 'e'; p++)
		if (*p >= '0' && *p <= '9' && k < (int)sizeof digits - 1)
			digits[k++] = *p;
	int e10 = *p == 'e' ? atoi(p + 1) : 0;
	while (k > 1 && digits[k - 1] == '0')
		k--;
	digits[k] = '\0';
	int n = e10 + 1; /* the decimal point sits after n digits */
	char out[64];
	size_t o = 0;
	if (neg)
		out[o++] = '-';
	if (k <= n && n <= 15) {
		memcpy(out + o, digits, (size_t)k);
		o += (size_t)k;
		for (int i = k; i < n; i++)
			out[o++] = '0';
		out[o++] = '.';
		out[o++] = '0';
	} else if (0 < n && n <= 15) {
		memcpy(out + o, digits, (size_t)n);
		o += (size_t)n;
		out[o++] = '.';
		memcpy(out + o, digits + n, (size_t)(k - n));
		o += (size_t)(k - n);
	} else if (-4 < n && n <= 0) {
		out[o++] = '0';
		out[o++] = '.';
		for (int i = 0; i < -n; i++)
			out[o++] = '0';
		memcpy(out + o, digits, (size_t)k);
		o += (size_t)k;
	} else {
		out[o++] = digits[0];
		if (k > 1) {
			out[o++] = '.';
			memcpy(out + o, digits + 1, (size_t)(k - 1));
			o += (size_t)(k - 1);
		}
		int x = n - 1;
		o += (size_t)snprintf(out + o, sizeof out - o, "e%c%02d", x < 0 ? '-' : '+',
		                      x < 0 ? -x : x);
	}
	return strbuf_append(b, out, o);
}

static int dump_value(struct strbuf *b, const json_t *v, int depth)
{
	/* The request parser already bounds nesting; this only keeps a hostile
	 * structure from exhausting the stack here. */
	if (depth > 2048)
		return -1;
	char num[32];
	switch (json_typeof(v)) {
	case JSON_OBJECT: {
		const char *key;
		json_t *val;
		int first = 1;
		if (strbuf_append(b, "{", 1))
			return -1;
		json_object_foreach((json_t *)v, key, val)
		{
			if ((!first && strbuf_append(b, ",", 1)) ||
			    dump_string(b, key, strlen(key)) || strbuf_append(b, ":", 1) ||
			    dump_value(b, val, depth + 1))
				return -1;
			first = 0;
		}
		return strbuf_append(b, "}", 1);
	}
	case JSON_ARRAY: {
		size_t i;
		json_t *val;
		if (strbuf_append(b, "[", 1))
			return -1;
		json_array_foreach(v, i, val)
		{
			if ((i && strbuf_append(b, ",", 1)) || dump_value(b, val, depth + 1))
				return -1;
		}
		return strbuf_append(b, "]", 1);
	}
	case JSON_STRING:
		return dump_string(b, json_string_value(v), json_string_length(v));
	case JSON_INTEGER:
		snprintf(num, sizeof num, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
		return strbuf_appends(b, num);
	case JSON_REAL:
		return dump_real(b, json_real_value(v));
	case JSON_TRUE:
		return strbuf_appends(b, "true");
	case JSON_FALSE:
		return strbuf_appends(b, "false");
	case JSON_NULL:
		return strbuf_appends(b, "null");
	}
	return -1;
}

char *anthropic_dump_json(const json_t *v)
{
	struct strbuf b;
	strbuf_init(&b);
	if (!v || dump_value(&b, v, 0) || strbuf_append(&b, "", 0)) {
		strbuf_free(&b);
		return NULL;
	}
	return b.p;
}

/* ------------------------------------------------- request conversion */

/* Claude Code starts its system prompt with a billing line whose "cch=XXXXX"
 * stamp changes on every request; llama-server masks it to "fffff" so the
 * prefix cache can get past it. Toki must mask it the same way, or the prompt
 * it routes by would differ from the one llama-server computes. Same rule as
 * llama-server's normalize_anthropic_billing_header: only a text starting
 * with the header, only the first "cch=" after it, only when a ';' follows
 * the five stamp characters. */
static void normalize_billing_header(char *s, size_t len)
{
	static const char pfx[] = "x-anthropic-billing-header:";
	const size_t plen = sizeof pfx - 1;
	if (len < plen || memcmp(s, pfx, plen))
		return;
	const char *c = memmem(s + plen, len - plen, "cch=", 4);
	if (!c)
		return;
	size_t at = (size_t)(c - s) + 4;
	if (at + 5 < len && s[at + 5] == ';')
		memset(s + at, 'f', 5);
}

/* A string field that may be absent (or null): def then. NULL + err when it
 * has another type. */
static const char *opt_string(const json_t *obj, const char *key, const char *def, size_t *len,
                              const char *where, char *err, size_t errlen)
{
	const json_t *v = json_object_get(obj, key);
	if (!v || json_is_null(v)) {
		if (len)
			*len = strlen(def);
		return def;
	}
	if (!json_is_string(v)) {
		err_set(err, errlen, "%s.%s: must be a string", where, key);
		return NULL;
	}
	if (len)
		*len = json_string_length(v);
	return json_string_value(v);
}

/* Anthropic image source -> {"type":"image_url","image_url":{"url":...}}, or
 * *part = NULL for a source type llama-server drops (file ids and the like). */
static int image_part(const json_t *block, json_t **part, const char *where, char *err,
                      size_t errlen)
{
	*part = NULL;
	const json_t *src = json_object_get(block, "source");
	if (!src || json_is_null(src))
		return 0;
	if (!json_is_object(src)) {
		err_set(err, errlen, "%s.source: must be an object", where);
		return -1;
	}
	char w[160];
	snprintf(w, sizeof w, "%s.source", where);
	const char *st = opt_string(src, "type", "", NULL, w, err, errlen);
	if (!st)
		return -1;
	json_t *url = NULL;
	if (!strcmp(st, "base64")) {
		size_t mtl, dl;
		const char *mt = opt_string(src, "media_type", "image/jpeg", &mtl, w, err, errlen);
		if (!mt)
			return -1;
		const char *data = opt_string(src, "data", "", &dl, w, err, errlen);
		if (!data)
			return -1;
		struct strbuf b;
		strbuf_init(&b);
		if (strbuf_appends(&b, "data:") || strbuf_append(&b, mt, mtl) ||
		    strbuf_appends(&b, ";base64,") || strbuf_append(&b, data, dl)) {
			strbuf_free(&b);
			goto oom;
		}
		url = json_stringn(b.p, b.len);
		strbuf_free(&b);
	} else if (!strcmp(st, "url")) {
		size_t ul;
		const char *u = opt_string(src, "url", "", &ul, w, err, errlen);
		if (!u)
			return -1;
		url = json_stringn(u, ul);
	} else {
		return 0;
	}
	*part = json_pack("{s:s, s:{s:o}}", "type", "image_url", "image_url", "url", url);
	if (*part)
		return 0;
oom:
	err_set(err, errlen, "out of memory");
	return -1;
}

/* One tool_result block -> {"role":"tool","tool_call_id":...,"content":...}.
 * Text-only content collapses to one string (parts joined with no separator);
 * with an image the content stays a list of parts, as llama-server does. */
static json_t *tool_result_msg(const json_t *block, const char *where, char *err, size_t errlen)
{
	size_t idl;
	const char *id = opt_string(block, "tool_use_id", "", &idl, where, err, errlen);
	if (!id)
		return NULL;
	const json_t *rc = json_object_get(block, "content");
	json_t *content = NULL;
	if (!rc || json_is_null(rc)) {
		content = json_string("");
	} else if (json_is_string(rc)) {
		content = json_deep_copy(rc);
	} else if (json_is_array(rc)) {
		struct strbuf text;
		strbuf_init(&text);
		json_t *parts = json_array();
		int has_images = 0;
		size_t i;
		json_t *c;
		if (!parts)
			goto oom;
		json_array_foreach(rc, i, c)
		{
			char w[192];
			snprintf(w, sizeof w, "%s.content[%zu]", where, i);
			if (!json_is_object(c)) {
				err_set(err, errlen, "%s: must be an object", w);
				goto fail_arr;
			}
			const char *ct = opt_string(c, "type", "", NULL, w, err, errlen);
			if (!ct)
				goto fail_arr;
			if (!strcmp(ct, "text")) {
				size_t tl;
				const char *t = opt_string(c, "text", "", &tl, w, err, errlen);
				if (!t)
					goto fail_arr;
				if (strbuf_append(&text, t, tl) ||
				    json_array_append_new(parts, json_pack("{s:s, s:s%}", "type",
				                                           "text", "text", t, tl)))
					goto oom_arr;
			} else if (!strcmp(ct, "image")) {
				/* Even a source llama-server cannot use switches the
				 * result to parts: it sets has_images first. */
				has_images = 1;
				json_t *part;
				if (image_part(c, &part, w, err, errlen))
					goto fail_arr;
				if (part && json_array_append_new(parts, part))
					goto oom_arr;
			}
			/* Other types (documents, search results) are dropped. */
		}
		if (has_images) {
			content = parts;
			parts = NULL;
		} else {
			content = json_stringn(text.p ? text.p : "", text.len);
		}
		json_decref(parts);
		strbuf_free(&text);
		if (!content)
			goto oom;
		goto done;
	oom_arr:
		err_set(err, errlen, "out of memory");
	fail_arr:
		json_decref(parts);
		strbuf_free(&text);
		return NULL;
	} else {
		err_set(err, errlen, "%s.content: must be a string or an array", where);
		return NULL;
	}
done:
	if (!content)
		goto oom;
	json_t *msg = json_pack("{s:s, s:s%, s:o}", "role", "tool", "tool_call_id", id, idl,
	                        "content", content);
	if (msg)
		return msg;
oom:
	err_set(err, errlen, "out of memory");
	return NULL;
}

/* One message with a content array: the converted message (if it has any
 * text, image, tool call or reasoning) then its tool results, appended to
 * out. */
static int convert_blocks(json_t *out, const char *role, const json_t *content, size_t mi,
                          char *err, size_t errlen)
{
	json_t *parts = json_array(), *calls = json_array(), *results = json_array();
	struct strbuf reasoning;
	strbuf_init(&reasoning);
	int rc = -1;
	size_t i;
	json_t *block;
	if (!parts || !calls || !results)
		goto oom;
	json_array_foreach(content, i, block)
	{
		char w[96];
		snprintf(w, sizeof w, "messages[%zu].content[%zu]", mi, i);
		if (!json_is_object(block)) {
			err_set(err, errlen, "%s: must be an object", w);
			goto out;
		}
		const json_t *tv = json_object_get(block, "type");
		if (!json_is_string(tv)) {
			err_set(err, errlen, "%s.type: must be a string", w);
			goto out;
		}
		const char *type = json_string_value(tv);
		if (!strcmp(type, "text")) {
			const json_t *t = json_object_get(block, "text");
			if (!json_is_string(t)) {
				err_set(err, errlen, "%s.text: must be a string", w);
				goto out;
			}
			if (json_array_append_new(
			        parts, json_pack("{s:s, s:O}", "type", "text", "text", t)))
				goto oom;
		} else if (!strcmp(type, "thinking")) {
			size_t tl;
			const char *t = opt_string(block, "thinking", "", &tl, w, err, errlen);
			if (!t)
				goto out;
			if (strbuf_append(&reasoning, t, tl))
				goto oom;
		} else if (!strcmp(type, "image")) {
			json_t *part;
			if (image_part(block, &part, w, err, errlen))
				goto out;
			if (part && json_array_append_new(parts, part))
				goto oom;
		} else if (!strcmp(type, "tool_use")) {
			size_t idl, nl;
			const char *id = opt_string(block, "id", "", &idl, w, err, errlen);
			if (!id)
				goto out;
			const char *name = opt_string(block, "name", "", &nl, w, err, errlen);
			if (!name)
				goto out;
			const json_t *input = json_object_get(block, "input");
			char *args;
			if (!input || json_is_null(input)) {
				args = strdup("{}");
			} else {
				args = anthropic_dump_json(input);
			}
			if (!args)
				goto oom;
			json_t *call =
			    json_pack("{s:s%, s:s, s:{s:s%, s:s}}", "id", id, idl, "type",
			              "function", "function", "name", name, nl, "arguments", args);
			free(args);
			if (json_array_append_new(calls, call))
				goto oom;
		} else if (!strcmp(type, "tool_result")) {
			json_t *m = tool_result_msg(block, w, err, errlen);
			if (!m)
				goto out;
			if (json_array_append_new(results, m))
				goto oom;
		}
		/* Everything else (redacted_thinking, document, server tool
		 * blocks, ...) is dropped, as llama-server drops it. */
	}
	if (json_array_size(parts) || json_array_size(calls) || reasoning.len) {
		json_t *m = json_pack("{s:s}", "role", role);
		if (!m || json_array_append_new(out, m))
			goto oom;
		if (put(m, "content",
		        json_array_size(parts) ? json_incref(parts) : json_string("")))
			goto oom;
		if (json_array_size(calls) && put(m, "tool_calls", json_incref(calls)))
			goto oom;
		if (reasoning.len &&
		    put(m, "reasoning_content", json_stringn(reasoning.p, reasoning.len)))
			goto oom;
	}
	if (json_array_extend(out, results))
		goto oom;
	rc = 0;
	goto out;
oom:
	err_set(err, errlen, "out of memory");
out:
	json_decref(parts);
	json_decref(calls);
	json_decref(results);
	strbuf_free(&reasoning);
	return rc;
}

static int convert_system(json_t *msgs, const json_t *sys, char *err, size_t errlen)
{
	struct strbuf b;
	strbuf_init(&b);
	if (json_is_string(sys)) {
		if (strbuf_append(&b, json_string_value(sys), json_string_length(sys)))
			goto oom;
		if (b.len)
			normalize_billing_header(b.p, b.len);
	} else if (json_is_array(sys)) {
		size_t i;
		json_t *block;
		json_array_foreach(sys, i, block)
		{
			char w[32];
			snprintf(w, sizeof w, "system[%zu]", i);
			if (!json_is_object(block)) {
				err_set(err, errlen, "%s: must be an object", w);
				goto fail;
			}
			const char *type = opt_string(block, "type", "", NULL, w, err, errlen);
			if (!type)
				goto fail;
			if (strcmp(type, "text"))
				continue;
			size_t tl;
			const char *t = opt_string(block, "text", "", &tl, w, err, errlen);
			if (!t)
				goto fail;
			/* Each block is normalised on its own, then joined with
			 * no separator at all. */
			size_t at = b.len;
			if (strbuf_append(&b, t, tl))
				goto oom;
			normalize_billing_header(b.p + at, tl);
		}
	} else {
		err_set(err, errlen, "system: must be a string or an array of text blocks");
		goto fail;
	}
	json_t *m = json_pack("{s:s, s:s%}", "role", "system", "content", b.p ? b.p : "", b.len);
	strbuf_free(&b);
	if (!m || json_array_append_new(msgs, m))
		goto oom;
	return 0;
oom:
	err_set(err, errlen, "out of memory");
fail:
	strbuf_free(&b);
	return -1;
}

static int convert_tools(json_t *chat, const json_t *tools, char *err, size_t errlen)
{
	if (!json_is_array(tools)) {
		err_set(err, errlen, "tools: must be an array");
		return -1;
	}
	json_t *out = json_array();
	if (!out || put(chat, "tools", out))
		goto oom;
	size_t i;
	json_t *tool;
	json_array_foreach(tools, i, tool)
	{
		char w[32];
		snprintf(w, sizeof w, "tools[%zu]", i);
		if (!json_is_object(tool)) {
			err_set(err, errlen, "%s: must be an object", w);
			return -1;
		}
		size_t nl, dl;
		const char *name = opt_string(tool, "name", "", &nl, w, err, errlen);
		if (!name)
			return -1;
		const char *desc = opt_string(tool, "description", "", &dl, w, err, errlen);
		if (!desc)
			return -1;
		const json_t *schema = json_object_get(tool, "input_schema");
		json_t *params;
		if (!schema) {
			params = json_object();
		} else if (json_is_object(schema)) {
			params = json_deep_copy(schema);
		} else {
			err_set(err, errlen, "%s.input_schema: must be an object", w);
			return -1;
		}
		/* Server tools (web_search_..., bash_...) become plain functions
		 * with their name and no parameters, as llama-server makes them. */
		if (!params || json_array_append_new(
		                   out, json_pack("{s:s, s:{s:s%, s:s%, s:o}}", "type", "function",
		                                  "function", "name", name, nl, "description", desc,
		                                  dl, "parameters", params)))
			goto oom;
	}
	return 0;
oom:
	err_set(err, errlen, "out of memory");
	return -1;
}

static int convert_tool_choice(json_t *chat, const json_t *tc, char *err, size_t errlen)
{
	if (!json_is_object(tc)) {
		err_set(err, errlen, "tool_choice: must be an object");
		return -1;
	}
	const char *type = opt_string(tc, "type", "", NULL, "tool_choice", err, errlen);
	if (!type)
		return -1;
	const char *oai;
	/* llama-server's chat endpoint takes tool_choice only as a string, so a
	 * forced tool ({"type":"tool","name":...}) can only become "required":
	 * the name is lost, exactly as on llama-server's own /v1/messages. */
	if (!strcmp(type, "auto"))
		oai = "auto";
	else if (!strcmp(type, "any") || !strcmp(type, "tool"))
		oai = "required";
	else if (!strcmp(type, "none"))
		oai = "none";
	else {
		err_set(err, errlen, "tool_choice.type: must be one of auto, any, tool, none");
		return -1;
	}
	if (put(chat, "tool_choice", json_string(oai))) {
		err_set(err, errlen, "out of memory");
		return -1;
	}
	return 0;
}

/* A scalar sampling parameter: copied when present and not null, rejected
 * when of the wrong kind. */
static int copy_param(json_t *chat, const json_t *req, const char *key, int want_int, int want_bool,
                      char *err, size_t errlen)
{
	const json_t *v = json_object_get(req, key);
	if (!v || json_is_null(v))
		return 0;
	int ok = want_bool ? json_is_boolean(v) : want_int ? json_is_integer(v) : json_is_number(v);
	if (!ok) {
		err_set(err, errlen, "%s: must be %s", key,
		        want_bool  ? "a boolean"
		        : want_int ? "an integer"
		                   : "a number");
		return -1;
	}
	if (put_copy(chat, key, v)) {
		err_set(err, errlen, "out of memory");
		return -1;
	}
	return 0;
}

static json_t *convert_request(const json_t *req, int count_tokens, char *err, size_t errlen)
{
	if (!json_is_object(req)) {
		err_set(err, errlen, "request body must be a JSON object");
		return NULL;
	}
	json_t *chat = json_object(), *msgs = json_array();
	if (!chat || !msgs) {
		json_decref(chat);
		json_decref(msgs);
		err_set(err, errlen, "out of memory");
		return NULL;
	}

	const json_t *model = json_object_get(req, "model");
	if (model && !json_is_null(model)) {
		if (!json_is_string(model)) {
			err_set(err, errlen, "model: must be a string");
			goto fail;
		}
		/* Not in llama-server's conversion (which answers with its own
		 * model name) but harmless, and a router-mode server needs it. */
		if (put_copy(chat, "model", model))
			goto oom;
	}
	if (put(chat, "messages", json_incref(msgs)))
		goto oom;

	const json_t *sys = json_object_get(req, "system");
	if (sys && !json_is_null(sys) && convert_system(msgs, sys, err, errlen))
		goto fail;

	const json_t *messages = json_object_get(req, "messages");
	if (!messages) {
		err_set(err, errlen, "'messages' is required");
		goto fail;
	}
	if (!json_is_array(messages)) {
		err_set(err, errlen, "messages: must be an array");
		goto fail;
	}
	size_t i;
	json_t *msg;
	json_array_foreach(messages, i, msg)
	{
		if (!json_is_object(msg)) {
			err_set(err, errlen, "messages[%zu]: must be an object", i);
			goto fail;
		}
		const json_t *rv = json_object_get(msg, "role");
		const char *role = json_is_string(rv) ? json_string_value(rv) : NULL;
		/* Claude Code also sends "system" messages inside messages (its
		 * environment block); they pass as chat system messages, as
		 * llama-server's own conversion passes roles through. */
		if (!role || (strcmp(role, "user") && strcmp(role, "assistant") &&
			      strcmp(role, "system"))) {
			err_set(err, errlen,
			        "messages[%zu].role: must be \"user\", \"assistant\" or \"system\"",
			        i);
			goto fail;
		}
		const json_t *content = json_object_get(msg, "content");
		if (!content) {
			/* llama-server skips an assistant message without
			 * content (a prefill placeholder). */
			if (!strcmp(role, "assistant"))
				continue;
			err_set(err, errlen, "messages[%zu]: 'content' is required", i);
			goto fail;
		}
		if (json_is_string(content)) {
			if (json_array_append_new(
			        msgs, json_pack("{s:s, s:O}", "role", role, "content", content)))
				goto oom;
		} else if (json_is_array(content)) {
			if (convert_blocks(msgs, role, content, i, err, errlen))
				goto fail;
		} else {
			err_set(err, errlen, "messages[%zu].content: must be a string or an array",
			        i);
			goto fail;
		}
	}

	const json_t *tools = json_object_get(req, "tools");
	if (tools && !json_is_null(tools) && convert_tools(chat, tools, err, errlen))
		goto fail;
	const json_t *tc = json_object_get(req, "tool_choice");
	if (tc && !json_is_null(tc) && convert_tool_choice(chat, tc, err, errlen))
		goto fail;

	const json_t *stop = json_object_get(req, "stop_sequences");
	if (stop && !json_is_null(stop)) {
		size_t k;
		json_t *s;
		if (!json_is_array(stop)) {
			err_set(err, errlen, "stop_sequences: must be an array of strings");
			goto fail;
		}
		json_array_foreach(stop, k, s)
		{
			if (!json_is_string(s)) {
				err_set(err, errlen, "stop_sequences[%zu]: must be a string", k);
				goto fail;
			}
		}
		if (put_copy(chat, "stop", stop))
			goto oom;
	}

	if (!count_tokens) {
		/* Anthropic requires max_tokens; llama-server does not and
		 * fills in 4096, so a request that works natively works here. */
		const json_t *mt = json_object_get(req, "max_tokens");
		if (mt && !json_is_null(mt)) {
			if (!json_is_integer(mt) || json_integer_value(mt) < 0) {
				err_set(err, errlen, "max_tokens: must be a non-negative integer");
				goto fail;
			}
			if (put_copy(chat, "max_tokens", mt))
				goto oom;
		} else if (put(chat, "max_tokens", json_integer(4096))) {
			goto oom;
		}
	}
	if (copy_param(chat, req, "temperature", 0, 0, err, errlen) ||
	    copy_param(chat, req, "top_p", 0, 0, err, errlen) ||
	    copy_param(chat, req, "top_k", 1, 0, err, errlen))
		goto fail;
	if (!count_tokens && copy_param(chat, req, "stream", 0, 1, err, errlen))
		goto fail;

	const json_t *kw = json_object_get(req, "chat_template_kwargs");
	if (kw && !json_is_null(kw)) {
		/* Not Anthropic, but llama-server passes it on, and it changes
		 * the rendered prompt (enable_thinking and the like). */
		if (!json_is_object(kw)) {
			err_set(err, errlen, "chat_template_kwargs: must be an object");
			goto fail;
		}
		if (put_copy(chat, "chat_template_kwargs", kw))
			goto oom;
	}

	const json_t *th = json_object_get(req, "thinking");
	if (th && !json_is_null(th)) {
		if (!json_is_object(th)) {
			err_set(err, errlen, "thinking: must be an object");
			goto fail;
		}
		const char *tt = opt_string(th, "type", "", NULL, "thinking", err, errlen);
		if (!tt)
			goto fail;
		if (!strcmp(tt, "enabled")) {
			const json_t *bt = json_object_get(th, "budget_tokens");
			json_int_t budget = 10000;
			if (bt && !json_is_null(bt)) {
				if (!json_is_integer(bt)) {
					err_set(err, errlen,
					        "thinking.budget_tokens: must be an integer");
					goto fail;
				}
				budget = json_integer_value(bt);
			}
			if (put(chat, "thinking_budget_tokens", json_integer(budget)))
				goto oom;
		}
	}

	const json_t *md = json_object_get(req, "metadata");
	if (md && !json_is_null(md)) {
		if (!json_is_object(md)) {
			err_set(err, errlen, "metadata: must be an object");
			goto fail;
		}
		size_t ul;
		const char *uid = opt_string(md, "user_id", "", &ul, "metadata", err, errlen);
		if (!uid)
			goto fail;
		if (ul && put(chat, "__metadata_user_id", json_stringn(uid, ul)))
			goto oom;
	}

	json_decref(msgs);
	return chat;
oom:
	err_set(err, errlen, "out of memory");
fail:
	json_decref(msgs);
	json_decref(chat);
	return NULL;
}

json_t *anthropic_to_chat(const json_t *req, char *err, size_t errlen)
{
	return convert_request(req, 0, err, errlen);
}

json_t *anthropic_count_tokens_request_to_chat(const json_t *req, char *err, size_t errlen)
{
	return convert_request(req, 1, err, errlen);
}

/* ------------------------------------------------ response conversion */

/* "chatcmpl-XYZ" -> "msg_XYZ"; anything else gets "msg_" in front; no id at
 * all gets a random one. */
static json_t *message_id(const json_t *chat_id)
{
	char buf[256];
	if (json_is_string(chat_id) && json_string_length(chat_id)) {
		const char *id = json_string_value(chat_id);
		if (!strncmp(id, "chatcmpl-", 9) && id[9])
			id += 9;
		snprintf(buf, sizeof buf, "msg_%s", id);
	} else {
		char hex[25];
		random_hex(hex, 24);
		snprintf(buf, sizeof buf, "msg_%s", hex);
	}
	return json_string(buf);
}

static long long int_or(const json_t *obj, const char *key, long long def)
{
	const json_t *v = json_object_get(obj, key);
	if (json_is_integer(v))
		return json_integer_value(v);
	if (json_is_real(v))
		return (long long)json_real_value(v);
	return def;
}

/* The prompt numbers of a response or chunk: timings first (llama-server's
 * own), then OpenAI usage. -1 where unknown. */
static void prompt_numbers(const json_t *o, long long *cache_n, long long *prompt_n,
                           long long *out_n)
{
	const json_t *t = json_object_get(o, "timings");
	const json_t *u = json_object_get(o, "usage");
	*cache_n = int_or(t, "cache_n", -1);
	*prompt_n = int_or(t, "prompt_n", -1);
	*out_n = int_or(t, "predicted_n", -1);
	long long pt = int_or(u, "prompt_tokens", -1);
	long long ct = int_or(json_object_get(u, "prompt_tokens_details"), "cached_tokens", -1);
	if (*cache_n < 0 && pt >= 0)
		*cache_n = ct >= 0 ? ct : 0;
	if (*prompt_n < 0 && pt >= 0)
		*prompt_n = pt - (ct > 0 ? ct : 0);
	long long cmp = int_or(u, "completion_tokens", -1);
	if (cmp >= 0)
		*out_n = cmp;
}

static const char *stopping_word(const json_t *resp)
{
	const json_t *w = json_object_get(resp, "stopping_word");
	if (!json_is_string(w))
		w = json_object_get(json_object_get(resp, "__verbose"), "stopping_word");
	return json_is_string(w) && json_string_length(w) ? json_string_value(w) : NULL;
}

/* Tool arguments (a JSON text) -> the input object; what does not parse to an
 * object becomes {}, as llama-server does for text that does not parse. */
static json_t *tool_input(const json_t *args)
{
	if (json_is_object(args))
		return json_deep_copy(args);
	if (json_is_string(args)) {
		json_t *v = json_loadb(json_string_value(args), json_string_length(args),
		                       JSON_DECODE_ANY, NULL);
		if (json_is_object(v))
			return v;
		json_decref(v);
	}
	return json_object();
}

/* Text of a chat message content: a string, or text parts joined. */
static int content_text(const json_t *c, struct strbuf *b)
{
	if (json_is_string(c))
		return strbuf_append(b, json_string_value(c), json_string_length(c));
	if (json_is_array(c)) {
		size_t i;
		json_t *p;
		json_array_foreach(c, i, p)
		{
			const json_t *t = json_object_get(p, "text");
			if (json_is_string(t) &&
			    strbuf_append(b, json_string_value(t), json_string_length(t)))
				return -1;
		}
	}
	return 0;
}

json_t *anthropic_from_chat(const json_t *chat_resp, const char *model, long long cache_n,
                            long long prompt_n)
{
	const json_t *c0 = json_array_get(json_object_get(chat_resp, "choices"), 0);
	const json_t *msg = json_object_get(c0, "message");
	if (!json_is_object(msg))
		return NULL;

	json_t *blocks = json_array();
	json_t *res = NULL;
	struct strbuf text;
	strbuf_init(&text);
	if (!blocks)
		return NULL;

	const json_t *rc = json_object_get(msg, "reasoning_content");
	if (json_is_string(rc) && json_string_length(rc) &&
	    json_array_append_new(blocks, json_pack("{s:s, s:O, s:s}", "type", "thinking",
	                                            "thinking", rc, "signature", "")))
		goto out;
	if (content_text(json_object_get(msg, "content"), &text))
		goto out;
	if (text.len && json_array_append_new(blocks, json_pack("{s:s, s:s%}", "type", "text",
	                                                        "text", text.p, text.len)))
		goto out;
	const json_t *calls = json_object_get(msg, "tool_calls");
	size_t ncalls = 0, i;
	json_t *call;
	json_array_foreach(calls, i, call)
	{
		const json_t *fn = json_object_get(call, "function");
		const json_t *id = json_object_get(call, "id");
		const json_t *name = json_object_get(fn, "name");
		if (!json_is_object(fn))
			continue;
		json_t *b = json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id",
		                      json_is_string(id) ? json_string_value(id) : "", "name",
		                      json_is_string(name) ? json_string_value(name) : "", "input",
		                      tool_input(json_object_get(fn, "arguments")));
		if (json_array_append_new(blocks, b))
			goto out;
		ncalls++;
	}

	const json_t *fr = json_object_get(c0, "finish_reason");
	const char *finish = json_is_string(fr) ? json_string_value(fr) : "stop";
	const char *word = stopping_word(chat_resp);
	const char *stop_reason;
	if (!strcmp(finish, "length"))
		stop_reason = "max_tokens";
	else if (ncalls || !strcmp(finish, "tool_calls"))
		stop_reason = "tool_use";
	else if (word)
		stop_reason = "stop_sequence";
	else
		stop_reason = "end_turn";

	long long t_cache, t_prompt, t_out;
	prompt_numbers(chat_resp, &t_cache, &t_prompt, &t_out);
	if (cache_n < 0)
		cache_n = t_cache > 0 ? t_cache : 0;
	if (prompt_n < 0)
		prompt_n = t_prompt > 0 ? t_prompt : 0;
	if (t_out < 0)
		t_out = 0;

	const json_t *rmodel = json_object_get(chat_resp, "model");
	if (!model)
		model = json_is_string(rmodel) ? json_string_value(rmodel) : "";
	res = json_pack("{s:o, s:s, s:s, s:O, s:s, s:s, s:o, s:{s:I, s:I, s:I}}", "id",
	                message_id(json_object_get(chat_resp, "id")), "type", "message", "role",
	                "assistant", "content", blocks, "model", model, "stop_reason", stop_reason,
	                "stop_sequence", word ? json_string(word) : json_null(), "usage",
	                "input_tokens", (json_int_t)prompt_n, "cache_read_input_tokens",
	                (json_int_t)cache_n, "output_tokens", (json_int_t)t_out);
out:
	json_decref(blocks);
	strbuf_free(&text);
	return res;
}

/* ---------------------------------------------------------- streaming */

enum block_kind { BLOCK_NONE, BLOCK_THINKING, BLOCK_TEXT, BLOCK_TOOL };

struct tool_block {
	long long tool_index; /* the chat chunk's tool_calls[].index */
	long long block_index;
};

struct anthropic_stream {
	char *model;
	long long exp_input, exp_cached;
	int started, delta_sent, done;
	/* Set by the finish chunk; message_delta waits for usage numbers. */
	const char *stop_reason;
	long long cache_n, prompt_n, out_n; /* -1: unknown */
	long long deltas;                   /* content deltas seen: output estimate */
	enum block_kind open;
	long long open_index, open_tool;
	long long next_index;
	struct tool_block *tools;
	size_t ntools, captools;
};

const char *anthropic_ping_event(void)
{
	return "event: ping\ndata: {\"type\": \"ping\"}\n\n";
}

struct anthropic_stream *anthropic_stream_new(const char *model, long long expected_input_tokens,
                                              long long expected_cached)
{
	struct anthropic_stream *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	s->model = strdup(model ? model : "");
	if (!s->model) {
		free(s);
		return NULL;
	}
	s->exp_input = expected_input_tokens > 0 ? expected_input_tokens : 0;
	s->exp_cached = expected_cached > 0 ? expected_cached : 0;
	s->cache_n = s->prompt_n = s->out_n = -1;
	s->open = BLOCK_NONE;
	return s;
}

void anthropic_stream_free(struct anthropic_stream *s)
{
	if (!s)
		return;
	free(s->model);
	free(s->tools);
	free(s);
}

int anthropic_stream_done(const struct anthropic_stream *s)
{
	return s->done;
}

/* Appends "event: <type>\ndata: <compact json>\n\n"; takes data's reference. */
static int emit(struct strbuf *out, const char *type, json_t *data)
{
	if (!data)
		return -1;
	char *js = json_dumps(data, JSON_COMPACT);
	json_decref(data);
	if (!js)
		return -1;
	int rc = strbuf_appends(out, "event: ") || strbuf_appends(out, type) ||
	         strbuf_appends(out, "\ndata: ") || strbuf_appends(out, js) ||
	         strbuf_appends(out, "\n\n");
	free(js);
	return rc ? -1 : 0;
}

static int start_with_id(struct anthropic_stream *s, const json_t *chat_id, struct strbuf *out)
{
	if (s->started)
		return 0;
	json_t *data =
	    json_pack("{s:s, s:{s:o, s:s, s:s, s:[], s:s, s:n, s:n, s:{s:I, s:I, s:i}}}", "type",
	              "message_start", "message", "id", message_id(chat_id), "type", "message",
	              "role", "assistant", "content", "model", s->model, "stop_reason",
	              "stop_sequence", "usage", "input_tokens", (json_int_t)s->exp_input,
	              "cache_read_input_tokens", (json_int_t)s->exp_cached, "output_tokens", 0);
	if (emit(out, "message_start", data))
		return -1;
	s->started = 1;
	return 0;
}

int anthropic_stream_start(struct anthropic_stream *s, struct strbuf *out)
{
	return start_with_id(s, NULL, out);
}

static int close_block(struct anthropic_stream *s, struct strbuf *out)
{
	if (s->open == BLOCK_NONE)
		return 0;
	/* Anthropic clients expect a signature before a thinking block ends;
	 * a local model has none, so it is empty (llama-server does the same). */
	if (s->open == BLOCK_THINKING &&
	    emit(out, "content_block_delta",
	         json_pack("{s:s, s:I, s:{s:s, s:s}}", "type", "content_block_delta", "index",
	                   (json_int_t)s->open_index, "delta", "type", "signature_delta",
	                   "signature", "")))
		return -1;
	if (emit(out, "content_block_stop",
	         json_pack("{s:s, s:I}", "type", "content_block_stop", "index",
	                   (json_int_t)s->open_index)))
		return -1;
	s->open = BLOCK_NONE;
	return 0;
}

/* Makes a thinking or text block the open one, starting it if needed. */
static int open_simple(struct anthropic_stream *s, enum block_kind kind, struct strbuf *out)
{
	if (s->open == kind)
		return 0;
	if (close_block(s, out))
		return -1;
	json_t *cb = kind == BLOCK_THINKING
	                 ? json_pack("{s:s, s:s}", "type", "thinking", "thinking", "")
	                 : json_pack("{s:s, s:s}", "type", "text", "text", "");
	if (emit(out, "content_block_start",
	         json_pack("{s:s, s:I, s:o}", "type", "content_block_start", "index",
	                   (json_int_t)s->next_index, "content_block", cb)))
		return -1;
	s->open = kind;
	s->open_index = s->next_index++;
	return 0;
}

static struct tool_block *find_tool(struct anthropic_stream *s, long long tool_index)
{
	for (size_t i = 0; i < s->ntools; i++)
		if (s->tools[i].tool_index == tool_index)
			return &s->tools[i];
	return NULL;
}

/* The block index that carries tool call tool_index's deltas, starting its
 * tool_use block on first sight. A call whose block was already closed (the
 * backend went back to an earlier call) keeps its old index: Anthropic has no
 * way to reopen a block, and clients assemble input by index. */
static int tool_block_index(struct anthropic_stream *s, long long tool_index, const json_t *tc,
                            long long *index, struct strbuf *out)
{
	struct tool_block *t = find_tool(s, tool_index);
	if (t) {
		*index = t->block_index;
		return 0;
	}
	if (close_block(s, out))
		return -1;
	if (s->ntools == s->captools) {
		size_t cap = s->captools ? s->captools * 2 : 4;
		struct tool_block *nt = realloc(s->tools, cap * sizeof *nt);
		if (!nt)
			return -1;
		s->tools = nt;
		s->captools = cap;
	}
	const json_t *id = json_object_get(tc, "id");
	const json_t *name = json_object_get(json_object_get(tc, "function"), "name");
	char gen[32] = "";
	if (!json_is_string(id) || !json_string_length(id)) {
		char hex[25];
		random_hex(hex, 24);
		snprintf(gen, sizeof gen, "toolu_%s", hex);
	}
	json_t *cb =
	    json_pack("{s:s, s:s, s:s, s:{}}", "type", "tool_use", "id",
	              json_is_string(id) && json_string_length(id) ? json_string_value(id) : gen,
	              "name", json_is_string(name) ? json_string_value(name) : "", "input");
	if (emit(out, "content_block_start",
	         json_pack("{s:s, s:I, s:o}", "type", "content_block_start", "index",
	                   (json_int_t)s->next_index, "content_block", cb)))
		return -1;
	s->tools[s->ntools].tool_index = tool_index;
	s->tools[s->ntools].block_index = s->next_index;
	s->ntools++;
	s->open = BLOCK_TOOL;
	s->open_tool = tool_index;
	s->open_index = s->next_index++;
	*index = s->open_index;
	return 0;
}

static int emit_message_delta(struct anthropic_stream *s, struct strbuf *out)
{
	json_t *usage = json_object();
	if (!usage)
		return -1;
	if (s->prompt_n >= 0 && put(usage, "input_tokens", json_integer(s->prompt_n)))
		goto fail;
	if (s->cache_n >= 0 && put(usage, "cache_read_input_tokens", json_integer(s->cache_n)))
		goto fail;
	if (put(usage, "output_tokens", json_integer(s->out_n >= 0 ? s->out_n : s->deltas)))
		goto fail;
	json_t *data = json_pack("{s:s, s:{s:s, s:n}, s:o}", "type", "message_delta", "delta",
	                         "stop_reason", s->stop_reason ? s->stop_reason : "end_turn",
	                         "stop_sequence", "usage", usage);
	if (emit(out, "message_delta", data))
		return -1;
	s->delta_sent = 1;
	return 0;
fail:
	json_decref(usage);
	return -1;
}

/* Keeps the latest numbers a chunk carries; reports whether it had any. */
static int take_numbers(struct anthropic_stream *s, const json_t *chunk)
{
	long long c, p, o;
	prompt_numbers(chunk, &c, &p, &o);
	if (c >= 0)
		s->cache_n = c;
	if (p >= 0)
		s->prompt_n = p;
	if (o >= 0)
		s->out_n = o;
	return c >= 0 || p >= 0 || o >= 0;
}

/* llama-server's error types -> Anthropic's. */
static const char *anthropic_error_type_of(const char *t)
{
	if (!t)
		return "api_error";
	if (!strcmp(t, "invalid_request_error") || !strcmp(t, "exceed_context_size_error"))
		return "invalid_request_error";
	if (!strcmp(t, "authentication_error") || !strcmp(t, "permission_error") ||
	    !strcmp(t, "not_found_error") || !strcmp(t, "rate_limit_error") ||
	    !strcmp(t, "overloaded_error"))
		return t;
	if (!strcmp(t, "unavailable_error"))
		return "overloaded_error";
	return "api_error";
}

int anthropic_stream_error(struct anthropic_stream *s, const char *type, const char *message,
                           struct strbuf *out)
{
	if (s->done)
		return 0;
	s->done = 1;
	return emit(out, "error",
	            json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type",
	                      type ? type : "api_error", "message", message ? message : ""));
}

int anthropic_stream_feed(struct anthropic_stream *s, const json_t *chunk, struct strbuf *out)
{
	if (s->done || !json_is_object(chunk))
		return 0;
	const json_t *error = json_object_get(chunk, "error");
	if (error) {
		const json_t *t = json_object_get(error, "type");
		const json_t *m = json_object_get(error, "message");
		return anthropic_stream_error(
		    s, anthropic_error_type_of(json_is_string(t) ? json_string_value(t) : NULL),
		    json_is_string(m)       ? json_string_value(m)
		    : json_is_string(error) ? json_string_value(error)
		                            : "backend error",
		    out);
	}
	if (start_with_id(s, json_object_get(chunk, "id"), out))
		return -1;
	int has_numbers = take_numbers(s, chunk);

	const json_t *c0 = json_array_get(json_object_get(chunk, "choices"), 0);
	const json_t *delta = json_object_get(c0, "delta");
	if (s->stop_reason) {
		/* After the finish chunk only usage can come (include_usage puts
		 * llama-server's timings on a last, choice-less chunk). */
		if (has_numbers && !s->delta_sent)
			return emit_message_delta(s, out);
		return 0;
	}

	const json_t *rc = json_object_get(delta, "reasoning_content");
	if (json_is_string(rc) && json_string_length(rc)) {
		if (open_simple(s, BLOCK_THINKING, out) ||
		    emit(out, "content_block_delta",
		         json_pack("{s:s, s:I, s:{s:s, s:O}}", "type", "content_block_delta",
		                   "index", (json_int_t)s->open_index, "delta", "type",
		                   "thinking_delta", "thinking", rc)))
			return -1;
		s->deltas++;
	}
	const json_t *ct = json_object_get(delta, "content");
	if (json_is_string(ct) && json_string_length(ct)) {
		if (open_simple(s, BLOCK_TEXT, out) ||
		    emit(out, "content_block_delta",
		         json_pack("{s:s, s:I, s:{s:s, s:O}}", "type", "content_block_delta",
		                   "index", (json_int_t)s->open_index, "delta", "type",
		                   "text_delta", "text", ct)))
			return -1;
		s->deltas++;
	}
	const json_t *tcs = json_object_get(delta, "tool_calls");
	size_t i;
	json_t *tc;
	json_array_foreach(tcs, i, tc)
	{
		if (!json_is_object(tc))
			continue;
		const json_t *ti = json_object_get(tc, "index");
		long long tool_index = json_is_integer(ti) ? json_integer_value(ti) : (long long)i;
		long long index;
		if (tool_block_index(s, tool_index, tc, &index, out))
			return -1;
		const json_t *args = json_object_get(json_object_get(tc, "function"), "arguments");
		if (json_is_string(args) && json_string_length(args)) {
			if (emit(out, "content_block_delta",
			         json_pack("{s:s, s:I, s:{s:s, s:O}}", "type",
			                   "content_block_delta", "index", (json_int_t)index,
			                   "delta", "type", "input_json_delta", "partial_json",
			                   args)))
				return -1;
			s->deltas++;
		}
	}

	const json_t *fr = json_object_get(c0, "finish_reason");
	if (json_is_string(fr)) {
		const char *f = json_string_value(fr);
		if (!strcmp(f, "length"))
			s->stop_reason = "max_tokens";
		else if (!strcmp(f, "tool_calls") || s->ntools)
			s->stop_reason = "tool_use";
		else
			s->stop_reason = "end_turn";
		if (close_block(s, out))
			return -1;
		if (has_numbers)
			return emit_message_delta(s, out);
	}
	return 0;
}

int anthropic_stream_finish(struct anthropic_stream *s, const json_t *cache_block,
                            struct strbuf *out)
{
	if (s->done)
		return 0;
	if (start_with_id(s, NULL, out) || close_block(s, out))
		return -1;
	if (!s->delta_sent && emit_message_delta(s, out))
		return -1;
	json_t *data = json_pack("{s:s}", "type", "message_stop");
	if (data && cache_block && put_copy(data, "cache", cache_block)) {
		json_decref(data);
		return -1;
	}
	if (emit(out, "message_stop", data))
		return -1;
	s->done = 1;
	return 0;
}
