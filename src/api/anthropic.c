/* Anthropic Messages requests to chat completions requests
 * (anthropic_to_chat, anthropic_count_tokens_request_to_chat), and the
 * nlohmann-compatible JSON dump their tool call arguments are written with.
 *
 * Why the answer's translation is elsewhere (anthropic_answer.c): this half
 * follows llama-server's request conversion line by line, the other follows
 * its answer and event shapes; they share no state and change separately. */
#include "api/anthropic.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/anthropic_put.h"
#include "util/dtoa.h"
#include "util/err.h"

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
	char out[32];
	return strbuf_append(b, out, dtoa_shortest(d, 15, out));
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
		if (!role ||
		    (strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "system"))) {
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
