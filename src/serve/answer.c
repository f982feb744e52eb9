#include "serve/answer.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/dtoa.h"
#include "util/json_body.h"

/* JSON's blanks between tokens. */
static int json_blank(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* ---- the cache block, as text ---- */

static void text_put(struct strbuf *t, const char *s, size_t n)
{
	strbuf_append(t, s, n);
}

static void text_printf(struct strbuf *t, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void text_printf(struct strbuf *t, const char *fmt, ...)
{
	char buf[256];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof buf)
		t->failed = 1;
	else
		text_put(t, buf, (size_t)n);
}

/* ,"key": (no comma before the first key). */
static void text_key(struct strbuf *t, const char *key)
{
	if (t->len > 1)
		text_put(t, ",", 1);
	text_put(t, "\"", 1);
	text_put(t, key, strlen(key));
	text_put(t, "\":", 2);
}

/* ,"key":"value" with value escaped as JSON requires. */
static void text_key_string(struct strbuf *t, const char *key, const char *v)
{
	text_key(t, key);
	text_put(t, "\"", 1);
	for (const unsigned char *c = (const unsigned char *)(v ? v : ""); *c; c++) {
		if (*c == '"' || *c == '\\') {
			char e[2] = {'\\', (char)*c};
			text_put(t, e, 2);
		} else if (*c < 0x20) {
			text_printf(t, "\\u%04x", *c);
		} else {
			text_put(t, (const char *)c, 1);
		}
	}
	text_put(t, "\"", 1);
}

static void text_key_int(struct strbuf *t, const char *key, long long v)
{
	char num[24], *e = num + sizeof num, *p = e;
	unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
	do
		*--p = (char)('0' + u % 10);
	while (u /= 10);
	if (v < 0)
		*--p = '-';
	text_key(t, key);
	text_put(t, p, (size_t)(e - p));
}

/* Numbers that are estimates or times use the shortest form that reads
 * back exactly (util/dtoa.h). */
static void text_key_real(struct strbuf *t, const char *key, double v)
{
	char num[40];
	size_t n;
	if (v != v || v - v != 0) /* NaN or infinite: JSON has no such number */
		n = (size_t)snprintf(num, sizeof num, "null");
	else
		n = dtoa_nlohmann(v, num);
	text_key(t, key);
	text_put(t, num, n);
}

static void text_key_raw(struct strbuf *t, const char *key, const char *raw)
{
	text_key(t, key);
	text_put(t, raw, strlen(raw));
}

char *answer_cache_text(const struct cache_facts *f)
{
	struct strbuf t = {0};
	text_put(&t, "{", 1);
	text_key_string(&t, "backend", f->backend ? f->backend : "");
	if (f->slot >= 0)
		text_key_int(&t, "slot", f->slot);
	else
		text_key_raw(&t, "slot", "null");
	text_key_string(&t, "route", f->route);
	text_key_string(&t, "mode", f->mode);
	text_key_int(&t, "prompt_tokens", f->prompt_tokens);
	text_key_int(&t, "matched", f->matched);
	text_key_int(&t, "reuse", f->reuse);
	if (f->have_counts) {
		text_key_int(&t, "cached", f->cached);
		text_key_int(&t, "evaluated", f->evaluated);
	}
	if (f->exact) {
		/* "messages": chunks that end where messages start; "grid":
		 * llama-server's own schedule (--reuse grid, or no prompt of
		 * toki's own to find messages in). */
		text_key_string(&t, "schedule", f->schedule);
		if (f->schedule_why)
			text_key_string(&t, "schedule_why", f->schedule_why);
		text_key_int(&t, "chunks", f->chunks);
		text_key_int(&t, "steps", f->steps);
		text_key_int(&t, "replayed", f->replayed);
		if (f->verdict) /* whether the promise holds on this backend */
			text_key_string(&t, "exact", f->verdict);
	}
	text_key_raw(&t, "trimmed", f->trimmed ? "true" : "false");
	text_key_int(&t, "max_tokens", f->max_tokens);
	if (f->max_tokens_clamped)
		text_key_raw(&t, "max_tokens_clamped", "true");
	if (f->restored)
		text_key_string(&t, "restored", f->restored);
	text_key_real(&t, "est_prefill_ms", f->est_prefill_ms);
	text_key_string(&t, "tokenized", f->tokenized);
	if (f->templated)
		text_key_string(&t, "templated", f->templated);
	if (f->tokenize_ms > 0)
		text_key_real(&t, "tokenize_ms", f->tokenize_ms);
	text_put(&t, "}", 1);
	if (t.failed) {
		free(t.p);
		return NULL;
	}
	return t.p;
}

json_t *answer_cache_json(const struct cache_facts *f)
{
	char *text = answer_cache_text(f);
	json_error_t jerr;
	json_t *c = text ? json_loads(text, 0, &jerr) : NULL;
	free(text);
	return c ? c : json_object();
}

int answer_cache_wanted(const json_t *body)
{
	const json_t *f = json_object_get(body, "response_fields");
	if (!json_is_array(f))
		return 1;
	size_t i;
	const json_t *v;
	json_array_foreach(f, i, v)
	{
		const char *name = json_string_value(v);
		if (name && (!strcmp(name, "cache") || !strncmp(name, "cache/", 6)))
			return 1;
	}
	return 0;
}

/* ---- byte surgery on the answer ---- */

/* Where the JSON object in text (an event's "data:" or a whole body)
 * opens and closes; 0 when there is none. */
static int object_span(const char *text, size_t len, size_t *open_at, size_t *close_at)
{
	size_t open = 0;
	const char *data = memmem(text, len, "data:", 5);
	if (data && (data == text || data[-1] == '\n' || data[-1] == '\r'))
		open = (size_t)(data - text) + 5;
	while (open < len && json_blank(text[open]))
		open++;
	size_t close = len;
	while (close > open && text[close - 1] != '}')
		close--;
	if (open >= len || text[open] != '{' || close <= open + 1)
		return 0;
	*open_at = open;
	*close_at = close;
	return 1;
}

/* text with text[at..end) replaced by repl (rl bytes), in a new buffer. */
static char *splice(const char *text, size_t len, size_t at, size_t end, const char *repl,
                    size_t rl, size_t *out_len)
{
	size_t n = len - (end - at) + rl;
	char *out = malloc(n + 1);
	if (!out)
		return NULL;
	memcpy(out, text, at);
	memcpy(out + at, repl, rl);
	memcpy(out + at + rl, text + end, len - end);
	out[n] = 0;
	*out_len = n;
	return out;
}

/* When a request ran in several backend steps, the last step's timings and
 * usage describe only that step: they are rewritten to describe the whole
 * request. Only the counts change: every other byte stays as the server
 * wrote it. A new buffer, or NULL when nothing changes. */
static char *whole_request_counts(const char *text, size_t len, const struct answer_totals *w,
                                  size_t *out_len)
{
	long long cached = w->cached, evaluated = w->evaluated;
	double ms = w->prompt_ms;
	char *cur = NULL;
	size_t cur_len = len;
	const char *src = text;
	/* The last "timings":{...}, a flat object. */
	static const char tk[] = "\"timings\":";
	const char *at = NULL;
	for (const char *q = src; (q = memmem(q, cur_len - (size_t)(q - src), tk, sizeof tk - 1));
	     q++)
		at = q;
	const char *ob = at ? at + sizeof tk - 1 : NULL;
	const char *cb = ob && ob < src + cur_len && *ob == '{'
	                     ? memchr(ob, '}', cur_len - (size_t)(ob - src))
	                     : NULL;
	if (cb) {
		json_error_t jerr;
		json_t *t = json_loadb(ob, (size_t)(cb - ob) + 1, 0, &jerr);
		if (json_is_object(t)) {
			json_object_set_new(t, "cache_n", json_integer(cached));
			json_object_set_new(t, "prompt_n", json_integer(evaluated));
			json_object_set_new(t, "prompt_ms", json_real(ms));
			if (evaluated > 0 && ms > 0) {
				json_object_set_new(t, "prompt_per_token_ms",
				                    json_real(ms / (double)evaluated));
				json_object_set_new(t, "prompt_per_second",
				                    json_real(1000.0 * (double)evaluated / ms));
			}
			char *js = json_dumps(t, JSON_COMPACT);
			if (js) {
				size_t nl = 0;
				char *next = splice(src, cur_len, (size_t)(ob - src),
				                    (size_t)(cb - src) + 1, js, strlen(js), &nl);
				if (next) {
					free(cur);
					cur = next;
					src = cur;
					cur_len = nl;
				}
				free(js);
			}
		}
		json_decref(t);
	}
	/* usage's cached_tokens (prompt_tokens_details, input_tokens_details). */
	static const char ck[] = "\"cached_tokens\":";
	char num[32];
	int nn = snprintf(num, sizeof num, "%lld", cached);
	for (size_t from = 0;;) {
		const char *q = memmem(src + from, cur_len - from, ck, sizeof ck - 1);
		if (!q)
			break;
		size_t v = (size_t)(q - src) + sizeof ck - 1, e = v;
		while (e < cur_len && ((src[e] >= '0' && src[e] <= '9') || src[e] == '-'))
			e++;
		if (e == v) {
			from = v;
			continue;
		}
		size_t nl = 0;
		char *next = splice(src, cur_len, v, e, num, (size_t)nn, &nl);
		if (!next)
			break;
		free(cur);
		cur = next;
		src = cur;
		cur_len = nl;
		from = v + (size_t)nn;
	}
	if (cur)
		*out_len = cur_len;
	return cur;
}

/* Inserts ,"cache":{...} before the final '}' of the JSON object held in
 * text (an event's data, or a whole body), keeping every other byte. A new
 * buffer, or NULL when the text is not an object. */
static char *inject_cache_text(const char *text, size_t len, const char *cs, size_t *out_len)
{
	size_t open, close;
	if (!object_span(text, len, &open, &close))
		return NULL;
	/* An empty object must not get a leading comma. */
	size_t k = close - 1;
	while (k > open + 1 && json_blank(text[k - 1]))
		k--;
	int empty = k == open + 1;
	size_t cl = strlen(cs);
	size_t n = len + cl + 12;
	char *out = malloc(n);
	if (!out)
		return NULL;
	size_t pos = close - 1;
	memcpy(out, text, pos);
	int w = snprintf(out + pos, n - pos, "%s\"cache\":%s", empty ? "" : ",", cs);
	memcpy(out + pos + (size_t)w, text + pos, len - pos);
	*out_len = pos + (size_t)w + (len - pos);
	out[*out_len] = 0; /* n leaves room: w is at most cl + 9 */
	return out;
}

char *answer_rewrite(const char *text, size_t len, const struct answer_totals *totals,
                     const char *cache_text, size_t *out_len)
{
	size_t wl = 0;
	char *whole = totals && totals->steps ? whole_request_counts(text, len, totals, &wl) : NULL;
	if (!cache_text) {
		if (whole)
			*out_len = wl;
		return whole;
	}
	char *out = whole ? inject_cache_text(whole, wl, cache_text, out_len)
	                  : inject_cache_text(text, len, cache_text, out_len);
	if (!out && whole) { /* not an object: the counts alone */
		*out_len = wl;
		return whole;
	}
	free(whole);
	return out;
}

/* ---- timings ---- */

void answer_timings_of(const json_t *obj, struct answer_timings *out)
{
	const json_t *t = json_object_get(obj, "timings");
	if (!json_is_object(t)) {
		/* No timings (the Responses API without streaming): usage has the
		 * same two numbers, as total and cached input tokens. */
		const json_t *u = json_object_get(obj, "usage");
		if (!json_is_object(u) && json_is_object(json_object_get(obj, "response")))
			u = json_object_get(json_object_get(obj, "response"), "usage");
		const json_t *total = json_object_get(u, "input_tokens");
		const json_t *cached =
		    json_object_get(json_object_get(u, "input_tokens_details"), "cached_tokens");
		if (!json_is_integer(total)) {
			total = json_object_get(u, "prompt_tokens");
			cached = json_object_get(json_object_get(u, "prompt_tokens_details"),
			                         "cached_tokens");
		}
		if (!json_is_integer(total))
			return;
		out->seen = 1;
		out->cache_n = json_integer_value(cached);
		out->prompt_n = json_integer_value(total) - out->cache_n;
		out->prompt_ms = 0;
		out->predicted_n = 0;
		out->predicted_ms = 0;
		return;
	}
	out->seen = 1;
	out->cache_n = json_integer_value(json_object_get(t, "cache_n"));
	out->prompt_n = json_integer_value(json_object_get(t, "prompt_n"));
	out->prompt_ms = json_number_value(json_object_get(t, "prompt_ms"));
	out->predicted_n = json_integer_value(json_object_get(t, "predicted_n"));
	out->predicted_ms = json_number_value(json_object_get(t, "predicted_ms"));
}

/* Numbers toki does not use are skipped, not converted. */
int answer_scan_timings(const char *p, const char *end, struct answer_timings *out)
{
	long long cache_n = -1, prompt_n = -1, predicted_n = 0;
	double prompt_ms = 0, predicted_ms = 0;
#define SKIP_WS()                                                                                  \
	while (p < end && json_blank(*p))                                                          \
	p++
	SKIP_WS();
	if (p >= end || *p++ != '{')
		return 0;
	for (;;) {
		SKIP_WS();
		if (p < end && *p == '}')
			break;
		if (p >= end || *p++ != '"')
			return 0;
		const char *key = p;
		while (p < end && *p != '"' && *p != '\\')
			p++;
		if (p >= end || *p != '"')
			return 0;
		size_t klen = (size_t)(p++ - key);
		SKIP_WS();
		if (p >= end || *p++ != ':')
			return 0;
		SKIP_WS();
		char num[48];
		size_t n = 0;
		while (p < end && n < sizeof num - 1 &&
		       ((*p >= '0' && *p <= '9') || *p == '-' || *p == '+' || *p == '.' ||
		        *p == 'e' || *p == 'E'))
			num[n++] = *p++;
		if (!n || n == sizeof num - 1)
			return 0;
		num[n] = 0;
#define IS(k) (klen == sizeof k - 1 && !memcmp(key, k, klen))
		if (IS("cache_n"))
			cache_n = strtoll(num, NULL, 10);
		else if (IS("prompt_n"))
			prompt_n = strtoll(num, NULL, 10);
		else if (IS("predicted_n"))
			predicted_n = strtoll(num, NULL, 10);
		else if (IS("prompt_ms"))
			prompt_ms = strtod(num, NULL);
		else if (IS("predicted_ms"))
			predicted_ms = strtod(num, NULL);
#undef IS
		SKIP_WS();
		if (p < end && *p == ',') {
			p++;
			continue;
		}
		if (p < end && *p == '}')
			break;
		return 0;
	}
#undef SKIP_WS
	if (cache_n < 0 || prompt_n < 0)
		return 0;
	out->seen = 1;
	out->cache_n = cache_n;
	out->prompt_n = prompt_n;
	out->prompt_ms = prompt_ms;
	out->predicted_n = predicted_n;
	out->predicted_ms = predicted_ms;
	return 1;
}

/* The last occurrence of the key is the real one (llama-server writes it
 * after everything generated), and reading only that object spares parsing
 * the whole answer: most of the daemon's work on a short request. */
void answer_timings_in_body(const char *body, size_t len, struct answer_timings *t)
{
	static const char key[] = "\"timings\":";
	const char *at = NULL;
	for (const char *p = body; (p = memmem(p, len - (size_t)(p - body), key, sizeof key - 1));
	     p++)
		at = p;
	if (at && answer_scan_timings(at + sizeof key - 1, body + len, t))
		return;
	json_error_t jerr;
	json_t *obj = json_loadb(body, len, JSON_BODY_FLAGS, &jerr);
	if (obj)
		answer_timings_of(obj, t);
	json_decref(obj);
}

/* ---- events ---- */

char *answer_progress_event(json_t *event, long long cache, long long processed, double time_ms)
{
	json_t *pp = json_object_get(event, "prompt_progress");
	if (json_is_object(pp)) {
		json_object_set_new(pp, "cache", json_integer(cache));
		json_object_set_new(pp, "processed", json_integer(processed));
		json_object_set_new(pp, "time_ms", json_real(time_ms));
	}
	return json_dumps(event, JSON_COMPACT);
}

void answer_end_turn_at_cap(json_t *chat)
{
	size_t i;
	json_t *ch;
	json_array_foreach(json_object_get(chat, "choices"), i, ch)
	{
		const char *fr = json_string_value(json_object_get(ch, "finish_reason"));
		if (fr && !strcmp(fr, "length"))
			json_object_set_new(ch, "finish_reason", json_string("stop"));
	}
}

/* Sets b to s when s is a non-empty string: an id, a type or a name comes
 * whole, in a stream with the first piece of its call. */
static void set_piece(struct strbuf *b, const json_t *s)
{
	if (!json_string_length(s))
		return;
	strbuf_reset(b);
	strbuf_append(b, json_string_value(s), json_string_length(s));
}

static void add_calls(struct answer_msg *m, const json_t *calls)
{
	size_t i;
	const json_t *c;
	json_array_foreach(calls, i, c)
	{
		const json_t *jx = json_object_get(c, "index");
		json_int_t x = json_is_integer(jx) ? json_integer_value(jx) : (json_int_t)i;
		/* A call is added by its first piece, in order. */
		if (x < 0 || (size_t)x > m->n_calls) {
			m->failed = 1;
			return;
		}
		if ((size_t)x == m->n_calls) {
			struct answer_call *nc = realloc(m->calls, (m->n_calls + 1) * sizeof *nc);
			if (!nc) {
				m->failed = 1;
				return;
			}
			m->calls = nc;
			m->calls[m->n_calls++] = (struct answer_call){0};
		}
		struct answer_call *to = &m->calls[x];
		const json_t *fn = json_object_get(c, "function"),
		             *args = json_object_get(fn, "arguments");
		set_piece(&to->id, json_object_get(c, "id"));
		set_piece(&to->type, json_object_get(c, "type"));
		set_piece(&to->name, json_object_get(fn, "name"));
		if (json_is_string(args))
			strbuf_append(&to->arguments, json_string_value(args),
			              json_string_length(args));
		if (to->id.failed || to->type.failed || to->name.failed || to->arguments.failed)
			m->failed = 1;
	}
}

/* The ids of a list of token probabilities (a chat choice's
 * logprobs.content, /completion's completion_probabilities), each entry's
 * own (not its top candidates'). */
static void add_ids(struct answer_msg *m, const json_t *list)
{
	size_t i;
	const json_t *e;
	json_array_foreach(list, i, e)
	{
		const json_t *id = json_object_get(e, "id");
		if (!json_is_integer(id))
			continue;
		if (m->n_ids == m->cap_ids) {
			size_t cap = m->cap_ids ? 2 * m->cap_ids : 64;
			int32_t *v = realloc(m->ids, cap * sizeof *v);
			if (!v) {
				m->failed = 1;
				return;
			}
			m->ids = v;
			m->cap_ids = cap;
		}
		m->ids[m->n_ids++] = (int32_t)json_integer_value(id);
	}
}

void answer_msg_add(struct answer_msg *m, const json_t *obj)
{
	json_t *choice = json_array_get(json_object_get(obj, "choices"), 0);
	const json_t *msg = obj, *text;
	if (choice) {
		msg = json_object_get(choice, "delta");
		if (!msg)
			msg = json_object_get(choice, "message");
		text = msg ? json_object_get(msg, "content") : json_object_get(choice, "text");
	} else {
		text = json_object_get(obj, "content");
	}
	if (json_is_string(text))
		strbuf_append(&m->text, json_string_value(text), json_string_length(text));
	if (msg) {
		json_t *reasoning = json_object_get(msg, "reasoning_content");
		if (json_is_string(reasoning))
			strbuf_append(&m->reasoning, json_string_value(reasoning),
			              json_string_length(reasoning));
		add_calls(m, json_object_get(msg, "tool_calls"));
	}
	add_ids(m, choice ? json_object_get(json_object_get(choice, "logprobs"), "content")
	                  : json_object_get(obj, "completion_probabilities"));
	const char *fr = json_string_value(json_object_get(choice, "finish_reason"));
	if (fr) {
		m->finished = 1;
		m->cut_at_length = !strcmp(fr, "length");
	}
	if (m->text.failed || m->reasoning.failed)
		m->failed = 1;
}

int answer_msg_structured(const struct answer_msg *m)
{
	return m->n_calls || m->reasoning.len;
}

static json_t *piece_json(const struct strbuf *b)
{
	return json_stringn(b->len ? b->p : "", b->len);
}

json_t *answer_msg_json(const struct answer_msg *m)
{
	json_t *o = json_pack("{s:s, s:o}", "role", "assistant", "content", piece_json(&m->text));
	if (o && m->reasoning.len)
		json_object_set_new(o, "reasoning_content", piece_json(&m->reasoning));
	json_t *calls = o && m->n_calls ? json_array() : NULL;
	for (size_t i = 0; calls && i < m->n_calls; i++) {
		const struct answer_call *c = &m->calls[i];
		json_t *jc = json_pack("{s:o, s:{s:o, s:o}}", "type",
		                       c->type.len ? piece_json(&c->type) : json_string("function"),
		                       "function", "name", piece_json(&c->name), "arguments",
		                       piece_json(&c->arguments));
		if (jc && c->id.len)
			json_object_set_new(jc, "id", piece_json(&c->id));
		if (!jc || json_array_append_new(calls, jc) != 0) {
			json_decref(calls);
			json_decref(o);
			return NULL;
		}
	}
	if (calls && json_object_set_new(o, "tool_calls", calls) != 0) {
		json_decref(o);
		return NULL;
	}
	return o;
}

void answer_msg_reset(struct answer_msg *m)
{
	answer_msg_free(m);
	*m = (struct answer_msg){0};
}

void answer_msg_free(struct answer_msg *m)
{
	strbuf_free(&m->text);
	strbuf_free(&m->reasoning);
	for (size_t i = 0; i < m->n_calls; i++) {
		strbuf_free(&m->calls[i].id);
		strbuf_free(&m->calls[i].type);
		strbuf_free(&m->calls[i].name);
		strbuf_free(&m->calls[i].arguments);
	}
	free(m->calls);
	m->calls = NULL;
	m->n_calls = 0;
	free(m->ids);
	m->ids = NULL;
	m->n_ids = m->cap_ids = 0;
}

/* ---- the answer's token ids ---- */

int answer_probs_asked(const json_t *body)
{
	const json_t *n = json_object_get(body, "n_probs");
	return json_is_true(json_object_get(body, "logprobs")) ||
	       (json_is_number(n) && json_number_value(n) > 0);
}

/* A sampling parameter as the server applies it: the request's, else the
 * server's default. */
static const json_t *sampling_param(const json_t *body, const json_t *defaults, const char *key)
{
	const json_t *v = json_object_get(body, key);
	return v && !json_is_null(v) ? v : json_object_get(defaults, key);
}

/* Whether the chain has a top_k sampler: a list of names, or llama-server's
 * string of one letter each ('k'); neither given, its default has one. */
static int chain_has_top_k(const json_t *samplers)
{
	if (json_is_string(samplers))
		return strchr(json_string_value(samplers), 'k') != NULL;
	if (!json_is_array(samplers))
		return 1;
	size_t i;
	const json_t *s;
	json_array_foreach(samplers, i, s)
	{
		const char *name = json_string_value(s);
		if (name && (!strcmp(name, "top_k") || !strcmp(name, "k")))
			return 1;
	}
	return 0;
}

int answer_ids_cheap(const json_t *body, const json_t *defaults)
{
	/* What the answer lists is the client's to say where it says anything
	 * of it. */
	if (json_object_get(body, "logprobs") || json_object_get(body, "top_logprobs") ||
	    json_object_get(body, "n_probs") || json_object_get(body, "post_sampling_probs") ||
	    json_object_get(body, "response_fields"))
		return 0;
	const json_t *mirostat = sampling_param(body, defaults, "mirostat");
	if (json_is_number(mirostat) && json_number_value(mirostat) != 0)
		return 0;
	const json_t *k = sampling_param(body, defaults, "top_k");
	if (!json_is_number(k) || json_number_value(k) < 1 ||
	    json_number_value(k) > ANSWER_IDS_MAX_TOP_K)
		return 0;
	return chain_has_top_k(sampling_param(body, defaults, "samplers"));
}

int answer_ids_ask(json_t *body)
{
	return json_object_set_new(body, "n_probs", json_integer(1)) ||
	       json_object_set_new(body, "post_sampling_probs", json_true());
}

/* Where the JSON value at p (after any blank) ends: a string, an object or
 * array with everything in it, or a bare word (number, true, null). */
static const char *value_end(const char *p, const char *end)
{
	while (p < end && json_blank(*p))
		p++;
	int depth = 0, in_str = 0;
	for (; p < end; p++) {
		char c = *p;
		if (in_str) {
			if (c == '\\')
				p++;
			else if (c == '"') {
				in_str = 0;
				if (!depth)
					return p + 1;
			}
		} else if (c == '"') {
			in_str = 1;
		} else if (c == '{' || c == '[') {
			depth++;
		} else if (c == '}' || c == ']') {
			if (!depth)
				return p; /* a bare word's end */
			if (!--depth)
				return p + 1;
		} else if (!depth && (c == ',' || json_blank(c))) {
			return p;
		}
	}
	return end;
}

char *answer_drop_probs(const char *text, size_t len, size_t *out_len)
{
	static const char key[] = "\"logprobs\"";
	const char *end = text + len, *copied = text;
	struct strbuf b = {0};
	int in_str = 0;
	for (const char *p = text; p < end; p++) {
		if (in_str) {
			if (*p == '\\')
				p++;
			else if (*p == '"')
				in_str = 0;
			continue;
		}
		if (*p != '"')
			continue;
		const char *q = p + sizeof key - 1;
		if ((size_t)(end - p) < sizeof key - 1 || memcmp(p, key, sizeof key - 1) != 0) {
			in_str = 1;
			continue;
		}
		while (q < end && json_blank(*q))
			q++;
		if (q == end || *q != ':') {
			p = q - 1; /* a string "logprobs", not a key */
			continue;
		}
		/* The member, with the comma before it (or, first in its object,
		 * the one after it). */
		const char *from = p, *to = value_end(q + 1, end);
		const char *c = from;
		while (c > copied && json_blank(c[-1]))
			c--;
		if (c > copied && c[-1] == ',') {
			from = c - 1;
		} else {
			const char *n = to;
			while (n < end && json_blank(*n))
				n++;
			if (n < end && *n == ',')
				to = n + 1;
		}
		strbuf_append(&b, copied, (size_t)(from - copied));
		copied = to;
		p = to - 1;
	}
	if (copied == text) {
		strbuf_free(&b);
		return NULL;
	}
	strbuf_append(&b, copied, (size_t)(end - copied));
	if (b.failed) {
		strbuf_free(&b);
		return NULL;
	}
	*out_len = b.len;
	return b.p;
}

/* 1 for a chunk that cannot be an answer's last: a token of /completion
 * ("stop": false), choices that all go on (every finish_reason null), a
 * Responses delta. llama-server puts timings on each of them when the client
 * asks for timings_per_token; anything else with timings may be the last. */
static int goes_on(const char *data)
{
	json_error_t jerr;
	json_t *o = json_loads(data, JSON_BODY_FLAGS, &jerr);
	int on = 0;
	const json_t *choices = json_object_get(o, "choices");
	const char *type = json_string_value(json_object_get(o, "type"));
	if (json_is_false(json_object_get(o, "stop"))) {
		on = 1;
	} else if (json_is_array(choices) && json_array_size(choices)) {
		size_t i;
		const json_t *c;
		on = 1;
		json_array_foreach(choices, i, c)
		{
			if (!json_is_null(json_object_get(c, "finish_reason")))
				on = 0;
		}
	} else if (type) {
		size_t n = strlen(type);
		on = n > 6 && !strcmp(type + n - 6, ".delta");
	}
	json_decref(o);
	return on;
}

enum answer_event answer_event_kind(const char *data)
{
	if (!data)
		return ANSWER_EVENT_OTHER;
	if (!strcmp(data, "[DONE]"))
		return ANSWER_EVENT_DONE;
	if (strstr(data, "\"prompt_progress\""))
		return ANSWER_EVENT_PROGRESS;
	if (strstr(data, "\"timings\"") && !goes_on(data))
		return ANSWER_EVENT_TIMINGS;
	return ANSWER_EVENT_OTHER;
}

int answer_hold_keep(struct answer_hold *h, const char *raw, size_t len, struct strbuf *out)
{
	answer_hold_release(h, NULL, NULL, out);
	h->p = malloc(len ? len : 1);
	if (!h->p) {
		strbuf_append(out, raw, len);
		return -1;
	}
	memcpy(h->p, raw, len);
	h->len = len;
	return 0;
}

void answer_hold_release(struct answer_hold *h, const struct answer_totals *totals,
                         const char *cache_text, struct strbuf *out)
{
	if (!h->p)
		return;
	size_t n = 0;
	char *re =
	    totals || cache_text ? answer_rewrite(h->p, h->len, totals, cache_text, &n) : NULL;
	if (re)
		strbuf_append(out, re, n);
	else
		strbuf_append(out, h->p, h->len);
	free(re);
	answer_hold_free(h);
}

void answer_hold_free(struct answer_hold *h)
{
	free(h->p);
	h->p = NULL;
	h->len = 0;
}
