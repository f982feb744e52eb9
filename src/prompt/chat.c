#include "prompt/chat.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "router/sched.h"
#include "template/jinja.h"
#include "util/bytes.h"
#include "util/dtoa.h"
#include "util/grow.h"
#include "util/json_body.h"
#include "util/strbuf.h"

void chat_caps_from_json(json_t *caps, struct chat_caps *out)
{
	out->supports_string_content = 1;
	out->supports_typed_content = 0;
	out->supports_system_role = 1;
	out->supports_tool_calls = 0;
	out->supports_object_arguments = 0;
	json_t *v;
#define CAP(name)                                                                                  \
	if ((v = json_object_get(caps, #name)) && json_is_boolean(v))                              \
		out->name = json_is_true(v);
	CAP(supports_string_content)
	CAP(supports_typed_content)
	CAP(supports_system_role)
	CAP(supports_tool_calls)
	CAP(supports_object_arguments)
#undef CAP
}

int chat_template_needs_server(const char *src)
{
#define HAS(s) (strstr(src, s) != NULL)
	return (HAS("[SYSTEM_PROMPT]") && HAS("[TOOL_CALLS]") && HAS("[ARGS]") &&
	        !HAS("[CALL_ID]")) ||
	       HAS("<|channel|>") || (HAS(">>>all") && HAS(">>>${recipient}")) ||
	       (HAS("<|tool_calls_section_begin|>") && HAS("<|tool_call_begin|>")) ||
	       (HAS("<|tool_list_start|>") && HAS("<|tool_list_end|>")) ||
	       (HAS("<|role_sep|>") && HAS("<|message_sep|>") && !HAS("<|function_call|>"));
#undef HAS
}

/* ---- nlohmann-compatible dump ---- */

static void put(struct strbuf *o, const char *s, size_t n)
{
	strbuf_append(o, s, n);
}

static void puts_(struct strbuf *o, const char *s)
{
	put(o, s, strlen(s));
}

static void dump_string(struct strbuf *o, const char *s, size_t n)
{
	put(o, "\"", 1);
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		switch (c) {
		case '"':
			puts_(o, "\\\"");
			break;
		case '\\':
			puts_(o, "\\\\");
			break;
		case '\b':
			puts_(o, "\\b");
			break;
		case '\f':
			puts_(o, "\\f");
			break;
		case '\n':
			puts_(o, "\\n");
			break;
		case '\r':
			puts_(o, "\\r");
			break;
		case '\t':
			puts_(o, "\\t");
			break;
		default:
			if (c < 0x20) {
				char esc[8];
				snprintf(esc, sizeof esc, "\\u%04x", c);
				puts_(o, esc);
			} else {
				put(o, (const char *)&s[i], 1);
			}
		}
	}
	put(o, "\"", 1);
}

static void dump(struct strbuf *o, json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_NULL:
		puts_(o, "null");
		return;
	case JSON_TRUE:
		puts_(o, "true");
		return;
	case JSON_FALSE:
		puts_(o, "false");
		return;
	case JSON_INTEGER: {
		char num[32];
		snprintf(num, sizeof num, "%lld", (long long)json_integer_value(v));
		puts_(o, num);
		return;
	}
	case JSON_REAL: {
		char num[40];
		if (isnan(json_real_value(v)) || isinf(json_real_value(v))) {
			o->failed = 1;
			return;
		}
		put(o, num, dtoa_nlohmann(json_real_value(v), num));
		return;
	}
	case JSON_STRING:
		dump_string(o, json_string_value(v), json_string_length(v));
		return;
	case JSON_ARRAY: {
		put(o, "[", 1);
		size_t i;
		json_t *e;
		json_array_foreach(v, i, e)
		{
			if (i)
				put(o, ",", 1);
			dump(o, e);
		}
		put(o, "]", 1);
		return;
	}
	case JSON_OBJECT: {
		put(o, "{", 1);
		const char *k;
		json_t *e;
		int first = 1;
		json_object_foreach(v, k, e)
		{
			if (!first)
				put(o, ",", 1);
			first = 0;
			dump_string(o, k, strlen(k));
			put(o, ":", 1);
			dump(o, e);
		}
		put(o, "}", 1);
		return;
	}
	}
}

char *chat_dump_like_nlohmann(json_t *v)
{
	struct strbuf o = {0};
	dump(&o, v);
	if (o.failed) {
		free(o.p);
		return NULL;
	}
	return o.p ? o.p : strdup("");
}

/* ---- messages ---- */

#define DECLINE(...)                                                                               \
	do {                                                                                       \
		snprintf(why, whylen, __VA_ARGS__);                                                \
		*res = CHAT_DECLINED;                                                              \
		goto fail;                                                                         \
	} while (0)

/* A string field, NULL when absent or empty; *bad when not a string. The
 * value itself, not its C string: the text may hold a NUL. */
static json_t *str_or_null(json_t *o, const char *key, int *bad)
{
	json_t *v = json_object_get(o, key);
	if (!v)
		return NULL;
	if (!json_is_string(v)) {
		*bad = 1;
		return NULL;
	}
	return json_string_length(v) ? v : NULL;
}

/* One message as common_chat_msg::to_json_oaicompat writes it back. */
static json_t *normalize_message(const struct chat_env *env, json_t *m, enum chat_result *res,
                                 char *why, size_t whylen)
{
	json_t *out = json_object();
	json_t *calls_out = NULL;
	if (!out)
		goto oom;
	if (!json_is_object(m))
		DECLINE("a message that is not an object");
	json_t *role = json_object_get(m, "role");
	if (!json_is_string(role))
		DECLINE("a message without a role");
	json_object_set(out, "role", role);
	json_t *content = json_object_get(m, "content");
	json_t *calls = json_object_get(m, "tool_calls");
	if (!content && !calls)
		DECLINE("a message without content or tool_calls");
	int only_string = env->caps.supports_string_content && !env->caps.supports_typed_content;
	int only_typed = !env->caps.supports_string_content && env->caps.supports_typed_content;
	if (json_is_string(content) && json_string_length(content)) {
		if (only_typed)
			json_object_set_new(
			    out, "content",
			    json_pack("[{s:s, s:O}]", "type", "text", "text", content));
		else
			json_object_set(out, "content", content);
	} else if (json_is_array(content) && json_array_size(content)) {
		size_t i;
		json_t *p;
		json_t *parts = json_array();
		char *joined = NULL;
		size_t jl = 0;
		json_array_foreach(content, i, p)
		{
			json_t *type = json_object_get(p, "type");
			json_t *text = json_object_get(p, "text");
			if (!json_is_string(type) || strcmp(json_string_value(type), "text") ||
			    !json_is_string(text)) {
				json_decref(parts);
				free(joined);
				DECLINE("a content part other than text");
			}
			json_array_append_new(
			    parts, json_pack("{s:s, s:O}", "type", "text", "text", text));
			/* Parts joined by newlines, none before the first text. */
			size_t tl = json_string_length(text);
			char *nj = realloc(joined, jl + tl + 2);
			if (!nj) {
				json_decref(parts);
				free(joined);
				goto oom;
			}
			joined = nj;
			if (jl)
				joined[jl++] = '\n';
			memcpy(joined + jl, json_string_value(text), tl);
			jl += tl;
			joined[jl] = 0;
		}
		if (only_string) {
			json_object_set_new(out, "content", json_stringn(joined ? joined : "", jl));
			json_decref(parts);
		} else {
			json_object_set_new(out, "content", parts);
		}
		free(joined);
	} else if (content && !json_is_null(content) && !json_is_string(content) &&
	           !json_is_array(content)) {
		DECLINE("content that is neither a string nor an array");
	} else {
		if (only_typed)
			json_object_set_new(out, "content",
			                    json_pack("[{s:s, s:s}]", "type", "text", "text", ""));
		else
			json_object_set_new(out, "content", json_string(""));
	}
	int bad = 0;
	json_t *reasoning = str_or_null(m, "reasoning_content", &bad);
	json_t *name = str_or_null(m, "name", &bad);
	json_t *call_id = str_or_null(m, "tool_call_id", &bad);
	if (bad)
		DECLINE("reasoning_content, name or tool_call_id that is not a string");
	if (reasoning)
		json_object_set(out, "reasoning_content", reasoning);
	if (name)
		json_object_set(out, "name", name);
	if (call_id)
		json_object_set(out, "tool_call_id", call_id);
	if (calls && json_array_size(calls)) {
		calls_out = json_array();
		size_t i;
		json_t *c;
		json_array_foreach(calls, i, c)
		{
			json_t *type = json_object_get(c, "type");
			json_t *fn = json_object_get(c, "function");
			json_t *fname = json_object_get(fn, "name");
			json_t *args = json_object_get(fn, "arguments");
			json_t *id = json_object_get(c, "id");
			if (!json_is_string(type) || strcmp(json_string_value(type), "function") ||
			    !json_is_object(fn) || !json_is_string(fname) || !args ||
			    (id && !json_is_string(id)))
				DECLINE("a tool call llama-server would not accept");
			json_t *a;
			if (json_is_string(args)) {
				a = json_incref(args);
			} else {
				char *d = chat_dump_like_nlohmann(args);
				if (!d)
					DECLINE("tool-call arguments that are not finite");
				a = json_string(d);
				free(d);
			}
			if (env->caps.supports_object_arguments) {
				json_error_t jerr;
				json_t *parsed =
				    json_loadb(json_string_value(a), json_string_length(a),
				               JSON_DECODE_ANY | JSON_BODY_FLAGS, &jerr);
				json_decref(a);
				if (!parsed)
					DECLINE("tool-call arguments that are not JSON");
				a = parsed;
			}
			json_t *tc = json_pack("{s:s, s:{s:O, s:o}}", "type", "function",
			                       "function", "name", fname, "arguments", a);
			if (!tc)
				goto oom;
			if (id && json_string_length(id))
				json_object_set(tc, "id", id);
			json_array_append_new(calls_out, tc);
		}
		json_object_set_new(out, "tool_calls", calls_out);
		calls_out = NULL;
	} else if (calls && !json_is_array(calls)) {
		DECLINE("tool_calls that is not an array");
	}
	return out;
oom:
	snprintf(why, whylen, "out of memory");
	*res = CHAT_ERROR;
fail:
	json_decref(calls_out);
	json_decref(out);
	return NULL;
}

static json_t *normalize_tools(json_t *tools, enum chat_result *res, char *why, size_t whylen)
{
	json_t *out = json_array();
	size_t i;
	json_t *t;
	json_array_foreach(tools, i, t)
	{
		json_t *type = json_object_get(t, "type");
		json_t *fn = json_object_get(t, "function");
		json_t *name = json_object_get(fn, "name");
		json_t *desc = json_object_get(fn, "description");
		json_t *params = json_object_get(fn, "parameters");
		if (!json_is_string(type) || strcmp(json_string_value(type), "function") ||
		    !json_is_object(fn) || !json_is_string(name) || (desc && !json_is_string(desc)))
			DECLINE("a tool llama-server would not accept");
		json_t *f = json_object();
		json_object_set(f, "name", name);
		json_object_set_new(f, "description", desc ? json_incref(desc) : json_string(""));
		json_object_set_new(f, "parameters", params ? json_incref(params) : json_object());
		json_t *nt = json_object();
		json_object_set_new(nt, "type", json_string("function"));
		json_object_set_new(nt, "function", f);
		json_array_append_new(out, nt);
	}
	return out;
fail:
	json_decref(out);
	return NULL;
}

static void format_time(time_t now, const char *fmt, char *out, size_t n)
{
	struct tm tm;
	localtime_r(&now, &tm);
	if (!strftime(out, n, fmt, &tm))
		out[0] = 0;
}

/* OpenAI's reasoning_effort as llama-server reads it before templating
 * (oaicompat_chat_params_parse; measured on 11669's /apply-template): "none"
 * turns thinking off where chat_template_kwargs does not set enable_thinking
 * (Qwen 3's template then writes an empty think block), and takes away a
 * reasoning_effort kwarg; any other non-empty string reaches the template
 * as reasoning_effort, over the kwarg (gpt-oss's template reads it). A value
 * that is not a string is ignored, as the server's json_value ignores it.
 * OpenAI SDK agents send it, and the Responses API's reasoning.effort
 * becomes it. */
static void reasoning_effort(json_t *g, const json_t *request, const json_t *kwargs)
{
	const json_t *e = json_object_get(request, "reasoning_effort");
	if (!json_is_string(e) || !json_string_length(e))
		return;
	if (json_string_length(e) == 4 && !memcmp(json_string_value(e), "none", 4)) {
		if (!json_is_object(kwargs) || !json_object_get(kwargs, "enable_thinking"))
			json_object_set_new(g, "enable_thinking", json_false());
		json_object_del(g, "reasoning_effort");
	} else {
		json_object_set_new(g, "reasoning_effort", json_deep_copy(e));
	}
}

json_t *chat_template_globals(const struct chat_env *env, json_t *request, enum chat_result *res,
                              char *why, size_t whylen)
{
	*res = CHAT_OK;
	json_t *g = NULL, *msgs = NULL, *tools = NULL;
	json_t *messages = json_object_get(request, "messages");
	if (!json_is_array(messages) || !json_array_size(messages))
		DECLINE("no messages");
	if (json_object_get(request, "continue_final_message"))
		DECLINE("continue_final_message");
	json_t *agp = json_object_get(request, "add_generation_prompt");
	if (agp && !json_is_boolean(agp))
		DECLINE("add_generation_prompt that is not a boolean");
	int add_gen = !agp || json_is_true(agp);
	json_t *last = json_array_get(messages, json_array_size(messages) - 1);
	const char *last_role = json_string_value(json_object_get(last, "role"));
	if (last_role && !strcmp(last_role, "assistant"))
		DECLINE("a final assistant message (prefill)");
	msgs = json_array();
	size_t i;
	json_t *m;
	json_array_foreach(messages, i, m)
	{
		json_t *nm = normalize_message(env, m, res, why, whylen);
		if (!nm)
			goto fail;
		if (!env->template_is_gpt_oss &&
		    !strcmp(json_string_value(json_object_get(nm, "role")), "developer"))
			json_object_set_new(nm, "role", json_string("system"));
		json_array_append_new(msgs, nm);
	}
	if (!env->caps.supports_system_role) {
		json_t *first = json_array_get(msgs, 0);
		if (!strcmp(json_string_value(json_object_get(first, "role")), "system")) {
			if (json_array_size(msgs) > 1) {
				json_t *second = json_array_get(msgs, 1);
				json_t *c1 = json_object_get(first, "content");
				json_t *c2 = json_object_get(second, "content");
				if (!json_is_string(c1) || !json_is_string(c2))
					DECLINE("a system prompt to merge into content parts");
				size_t l1 = json_string_length(c1), l2 = json_string_length(c2);
				char *joined = malloc(l1 + l2 + 2);
				if (!joined)
					goto fail;
				memcpy(joined, json_string_value(c1), l1);
				joined[l1] = '\n';
				memcpy(joined + l1 + 1, json_string_value(c2), l2);
				json_object_set_new(second, "content",
				                    json_stringn(joined, l1 + l2 + 1));
				free(joined);
			}
			json_array_remove(msgs, 0);
		}
	}
	json_t *req_tools = json_object_get(request, "tools");
	if (req_tools && !json_is_null(req_tools)) {
		if (!json_is_array(req_tools))
			DECLINE("tools that is not an array");
		if (json_array_size(req_tools)) {
			tools = normalize_tools(req_tools, res, why, whylen);
			if (!tools)
				goto fail;
		}
	}
	g = json_object();
	json_object_set_new(g, "messages", msgs);
	msgs = NULL;
	json_object_set_new(g, "bos_token", json_string(env->bos_token ? env->bos_token : ""));
	json_object_set_new(g, "eos_token", json_string(env->eos_token ? env->eos_token : ""));
	json_object_set_new(g, "enable_thinking", json_boolean(env->enable_thinking));
	if (tools) {
		json_object_set_new(g, "tools", tools);
		tools = NULL;
	}
	struct chat_dates own, *dates = env->dates ? env->dates : &own;
	if (dates == &own || !dates->datetime[0] || env->now / 60 != dates->at / 60) {
		format_time(env->now, "%b %d %Y", dates->datetime, sizeof dates->datetime);
		format_time(env->now, "%d %b %Y", dates->date_string, sizeof dates->date_string);
		dates->at = env->now;
	}
	json_object_set_new(g, "datetime", json_string(dates->datetime));
	json_object_set_new(g, "date_string", json_string(dates->date_string));
	json_t *kwargs = json_object_get(request, "chat_template_kwargs");
	if (kwargs && json_is_object(kwargs)) {
		const char *k;
		json_t *v;
		json_object_foreach(kwargs, k, v)
		{
			json_object_set(g, k, v);
		}
	}
	reasoning_effort(g, request, kwargs);
	if (add_gen)
		json_object_set_new(g, "add_generation_prompt", json_true());
	return g;
fail:
	if (*res == CHAT_OK)
		*res = CHAT_ERROR;
	json_decref(g);
	json_decref(msgs);
	json_decref(tools);
	return NULL;
}

/* Renders g (the template globals; taken) as a whole prompt. */
static enum chat_result render_globals(const struct chat_env *env, json_t *g, char **prompt,
                                       size_t *len, char *why, size_t whylen)
{
	const struct jinja_template *t =
	    json_object_get(g, "tools") && env->tmpl_tool_use ? env->tmpl_tool_use : env->tmpl;
	char err[512];
	char *text = jinja_render(t, g, env->now, len, err, sizeof err);
	json_decref(g);
	if (!text) {
		snprintf(why, whylen, "template: %s", err);
		return CHAT_ERROR;
	}
	size_t bl = env->bos_token ? strlen(env->bos_token) : 0;
	size_t el = env->eos_token ? strlen(env->eos_token) : 0;
	if (env->add_bos && bl && *len >= bl && !memcmp(text, env->bos_token, bl)) {
		memmove(text, text + bl, *len - bl + 1);
		*len -= bl;
	}
	if (env->add_eos && el && *len >= el && !memcmp(text + *len - el, env->eos_token, el)) {
		*len -= el;
		text[*len] = 0;
	}
	*prompt = text;
	return CHAT_OK;
}

enum chat_result chat_render(const struct chat_env *env, json_t *request, char **prompt,
                             size_t *len, char *why, size_t whylen)
{
	enum chat_result res;
	json_t *g = chat_template_globals(env, request, &res, why, whylen);
	if (!g)
		return res;
	return render_globals(env, g, prompt, len, why, whylen);
}

enum chat_result chat_render_answer(const struct chat_env *env, json_t *request, json_t *answer,
                                    char **prompt, size_t *len, char *why, size_t whylen)
{
	enum chat_result res;
	json_t *g = chat_template_globals(env, request, &res, why, whylen);
	if (!g)
		return res;
	json_t *nm = normalize_message(env, answer, &res, why, whylen);
	if (!nm || json_array_append_new(json_object_get(g, "messages"), nm) != 0 ||
	    json_object_set_new(g, "add_generation_prompt", json_false()) != 0) {
		json_decref(g);
		return res == CHAT_OK ? CHAT_ERROR : res;
	}
	return render_globals(env, g, prompt, len, why, whylen);
}

/* Renders g (the template globals) with only its first k messages and no
 * generation prompt; NULL when the template fails on that prefix. */
static char *render_prefix(const struct chat_env *env, const struct jinja_template *t, json_t *g,
                           json_t *msgs, size_t k, size_t *len)
{
	json_t *sub = json_array();
	for (size_t i = 0; sub && i < k; i++)
		json_array_append(sub, json_array_get(msgs, i));
	if (!sub || json_object_set_new(g, "messages", sub) != 0)
		return NULL;
	char err[256];
	char *text = jinja_render(t, g, env->now, len, err, sizeof err);
	size_t bl = env->bos_token ? strlen(env->bos_token) : 0;
	if (text && env->add_bos && bl && *len >= bl && !memcmp(text, env->bos_token, bl)) {
		memmove(text, text + bl, *len - bl + 1);
		*len -= bl;
	}
	return text;
}

/* Where paragraphs break in prompt[0, end): for each run of line ends that
 * holds an empty line ("\n\n", "\r\n\r\n"), the offset where the run begins
 * (the end of the paragraph before) and the offset after it (the start of
 * the next). Both are candidates because tokenizers split there
 * differently: Qwen's merges "\n\n" into one token only at the end of a
 * text, so the start of the next paragraph is no token boundary of the text
 * before it; Llama 3's ties the punctuation before a line end to it, so the
 * end of the paragraph is none. The schedule keeps whichever maps to a
 * token position (and only one of them: they are too close to both be
 * chunk starts). Writes them to out (when not NULL); returns how many. */
static size_t paragraph_starts(const char *prompt, size_t end, size_t *out)
{
	size_t n = 0, newlines = 0, run = 0;
	int in_run = 0;
	for (size_t i = 0; i < end; i++) {
		char c = prompt[i];
		if (c == '\n' || c == '\r') {
			if (!in_run)
				run = i;
			in_run = 1;
			newlines += c == '\n';
		} else {
			if (newlines >= 2) {
				if (out) {
					if (run > 0)
						out[n] = run;
					out[n + (run > 0)] = i;
				}
				n += 1 + (run > 0);
			}
			newlines = 0;
			in_run = 0;
		}
	}
	return n;
}

unsigned char chat_start_kind(json_t *msgs, size_t k)
{
	if (k >= json_array_size(msgs))
		return SCHED_START_ANSWER; /* the generation prompt */
	const char *role = json_string_value(json_object_get(json_array_get(msgs, k), "role"));
	return role && !strcmp(role, "assistant") ? SCHED_START_ANSWER : SCHED_START_MESSAGE;
}

/* Appends off (of kind) to s; -1 (s->failed set) when out of memory. */
static int starts_push(struct chat_starts *s, size_t off, unsigned char kind)
{
	size_t cap = s->cap;
	if (GROW(s->off, s->cap, s->n + 1, 8) != 0) {
		s->failed = 1;
		return -1;
	}
	if (s->cap != cap) { /* kind[] has off[]'s capacity */
		unsigned char *k = realloc(s->kind, s->cap);
		if (!k) {
			s->failed = 1;
			return -1;
		}
		s->kind = k;
	}
	s->kind[s->n] = kind;
	s->off[s->n++] = off;
	return 0;
}

void chat_starts_add(struct chat_starts *s, const char *prompt, size_t len, const char *text,
                     size_t tl, unsigned char kind, int header)
{
	if (s->failed || !text || tl <= s->last || tl > len || memcmp(text, prompt, tl))
		return;
	if (tl == len) {
		/* The messages without a generation prompt are the whole
		 * prompt: the template's is empty, and generation begins at the
		 * prompt's end. */
		if (header)
			s->header = CHAT_HEADER_EMPTY;
		return;
	}
	if (starts_push(s, tl, kind) != 0)
		return;
	s->last = tl;
	s->header = header ? CHAT_HEADER_LAST : CHAT_HEADER_NONE;
}

void chat_starts_apart(struct chat_starts *s, const char *prompt, size_t len, const char *text,
                       size_t tl)
{
	if (s->failed || !text || !s->n || s->kind[s->n - 1] != SCHED_START_ANSWER)
		return;
	size_t a = 0, most = tl < len ? tl : len;
	while (a < most && text[a] == prompt[a])
		a++;
	/* Agreeing as far as the prompt goes, or the whole rendering: the
	 * message is as the latest turn writes it. Before its start: a
	 * template that renders the messages before it otherwise too (no
	 * start was found there then, so nothing to bound). */
	if (a == most || a < s->last)
		return;
	if (starts_push(s, a, CHAT_CUT_APART) != 0)
		return;
	/* A start at a is still one (the next message's, where the part is
	 * the header a template appends after every message). */
	s->last = a ? a - 1 : 0;
}

int chat_starts_finish(struct chat_starts *s, const char *prompt, size_t **offsets,
                       unsigned char **kind, size_t *n, int *last_is_header)
{
	*offsets = NULL;
	*kind = NULL;
	*n = 0;
	*last_is_header = 0;
	/* The paragraphs of the first message (as far as the first start):
	 * agents build a system prompt from sections, and sessions that share
	 * one differ from a section on. */
	size_t np = !s->failed && s->n ? paragraph_starts(prompt, s->off[0], NULL) : 0;
	if (np) {
		size_t *o = realloc(s->off, (s->n + np) * sizeof *o);
		if (o)
			s->off = o;
		unsigned char *k = o ? realloc(s->kind, s->n + np) : NULL;
		if (k)
			s->kind = k;
		if (!o || !k) {
			s->failed = 1;
		} else {
			memmove(s->off + np, s->off, s->n * sizeof *s->off);
			memmove(s->kind + np, s->kind, s->n);
			paragraph_starts(prompt, s->off[np], s->off);
			memset(s->kind, SCHED_START_SECTION, np);
			s->n += np;
		}
	}
	int rc = s->failed ? -1 : 0;
	if (rc || !s->n) {
		free(s->off);
		free(s->kind);
	} else {
		*offsets = s->off;
		*kind = s->kind;
		*n = s->n;
		*last_is_header = s->header;
	}
	*s = (struct chat_starts){0};
	return rc;
}

/* Whether the template writes an earlier answer right after this
 * request's generation prompt (gen, gl bytes; empty where generation
 * begins at the prompt's end): in the rendering of the messages, an answer
 * and a user's next message, the answer's text follows that header. It
 * decides the joined header (prompt/prompt.h), and it is read off the
 * request alone, as the schedule must be. A template that writes an
 * earlier answer's header otherwise than generation began it (Qwen 3's
 * empty think block in non-thinking mode, dropped from history) says no:
 * its answers get no step region, and their start is where the next
 * turn's chunk ends. Only the header is looked at: what the template does
 * to the messages before (Qwen 3 drops their reasoning once a user
 * speaks) is the message starts' business. */
static int answer_follows(const struct chat_env *env, const struct jinja_template *t, json_t *g,
                          json_t *msgs, const char *gen, size_t gl)
{
	static const char mark[] = "toki-probe-answer";
	enum chat_result res;
	char why[256];
	json_t *more = json_copy(msgs);
	json_t *answer = json_pack("{s:s, s:s}", "role", "assistant", "content", mark);
	json_t *next = json_pack("{s:s, s:s}", "role", "user", "content", "Go on.");
	json_t *na = answer ? normalize_message(env, answer, &res, why, sizeof why) : NULL;
	json_t *nn = next ? normalize_message(env, next, &res, why, sizeof why) : NULL;
	json_decref(answer);
	json_decref(next);
	int follows = 0;
	if (more && na && nn && json_array_append(more, na) == 0 &&
	    json_array_append(more, nn) == 0) {
		size_t tl = 0, ml = sizeof mark - 1;
		char *text = render_prefix(env, t, g, more, json_array_size(more), &tl);
		/* The answer's text: its last occurrence. */
		const char *at = text ? bytes_rfind(text, tl, mark, ml) : NULL;
		follows = at && (size_t)(at - text) >= gl && !memcmp(at - gl, gen, gl);
		free(text);
	}
	json_decref(na);
	json_decref(nn);
	json_decref(more);
	return follows;
}

int chat_message_starts(const struct chat_env *env, json_t *request, const char *prompt, size_t len,
                        size_t **offsets, unsigned char **kind, size_t *n, int *last_is_header,
                        int *joins)
{
	*offsets = NULL;
	*kind = NULL;
	*n = 0;
	*last_is_header = 0;
	*joins = 0;
	if (env->add_eos)
		return 0; /* a prefix would end in the EOS the full prompt has not */
	enum chat_result res;
	char why[256];
	json_t *g = chat_template_globals(env, request, &res, why, sizeof why);
	if (!g)
		return res == CHAT_ERROR ? -1 : 0;
	json_t *msgs = json_incref(json_object_get(g, "messages"));
	const struct jinja_template *t =
	    json_object_get(g, "tools") && env->tmpl_tool_use ? env->tmpl_tool_use : env->tmpl;
	int add_gen = json_is_true(json_object_get(g, "add_generation_prompt"));
	json_object_set_new(g, "add_generation_prompt", json_false());
	size_t m = json_array_size(msgs);
	struct chat_starts s = {0};
	/* Message k starts where the rendering of the first k ends, if that
	 * rendering is a prefix of the whole: a template that renders earlier
	 * messages differently once more follow (one that drops reasoning
	 * before the last user turn, say) gives no start there. k = m is where
	 * the generation prompt starts. The rendering of the first k messages
	 * is also message k - 1's as the latest turn: where an assistant
	 * message's start was found, it says how far the message is as
	 * generation wrote it. */
	int after_answer = 0;
	size_t gen_at = len;
	for (size_t k = 1; !s.failed && k <= m; k++) {
		if (k == m && !add_gen)
			break;
		size_t tl = 0;
		char *text = render_prefix(env, t, g, msgs, k, &tl);
		if (after_answer)
			chat_starts_apart(&s, prompt, len, text, tl);
		unsigned char what = chat_start_kind(msgs, k);
		size_t found = s.n;
		chat_starts_add(&s, prompt, len, text, tl, what, k == m);
		if (k == m && s.header == CHAT_HEADER_LAST)
			gen_at = tl;
		after_answer = what == SCHED_START_ANSWER && s.n > found;
		free(text);
	}
	if (!s.failed && s.header)
		*joins = answer_follows(env, t, g, msgs, prompt + gen_at, len - gen_at);
	json_decref(msgs);
	json_decref(g);
	return chat_starts_finish(&s, prompt, offsets, kind, n, last_is_header);
}

size_t chat_server_prefixes(json_t *request, size_t *ks)
{
	json_t *msgs = json_object_get(request, "messages");
	size_t m = json_array_size(msgs), n = 0;
	if (!m)
		return 0;
	/* llama-server continues a final assistant message (prefill): no
	 * generation prompt of its own then. */
	int add_gen = !json_is_false(json_object_get(request, "add_generation_prompt")) &&
	              chat_start_kind(msgs, m - 1) != SCHED_START_ANSWER;
	for (size_t k = 1; k <= m; k++) {
		if (k == m ? add_gen : k == 1 || chat_start_kind(msgs, k) == SCHED_START_ANSWER) {
			if (ks)
				ks[n] = k;
			n++;
		}
	}
	return n;
}
