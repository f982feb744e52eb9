/* Anthropic answers from chat completions answers: the non-streamed message
 * (anthropic_from_chat) and the streamed events (anthropic_stream_*).
 *
 * Why a file of its own: this half reads what the backend sends back and
 * shares nothing with the request translation in anthropic.c but two jansson
 * helpers (anthropic_put.h); the two change for different reasons (a request
 * field vs. an event shape). */
#include "api/anthropic.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/anthropic_put.h"
#include "platform/platform.h"
#include "util/grow.h"
#include "util/json_body.h"

/* Random ids for messages or tool calls the backend did not name: not secret,
 * only unique, so a weak fallback is fine when no random bytes come. */
static void random_hex(char *out, size_t nhex)
{
	unsigned char raw[32];
	size_t nraw = (nhex + 1) / 2;
	if (nraw > sizeof raw)
		nraw = sizeof raw;
	if (plat_random(raw, nraw) != 0) {
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
		                       JSON_DECODE_ANY | JSON_BODY_FLAGS, NULL);
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
	if (GROW(s->tools, s->captools, s->ntools + 1, 4) != 0)
		return -1;
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
