#include "backend/prefix_render.h"

#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>

#include <openssl/sha.h>

#include "backend/backend.h"
#include "prompt/chat.h"
#include "util/json_body.h"
#include "util/strbuf.h"

#define CACHE_MAX_ENTRIES 1024
#define CACHE_MAX_BYTES (64u << 20)

struct entry {
	unsigned char key[SHA256_DIGEST_LENGTH];
	char *text;
	size_t len;
	TAILQ_ENTRY(entry) lru; /* most recently used first */
};

TAILQ_HEAD(entry_list, entry);

struct prefix_render_cache {
	struct entry_list lru;
	size_t entries, bytes;
	unsigned long long hits, misses, stale;
};

/* One prefix a request wants: its key, and its rendering once known. */
struct want {
	size_t k;
	unsigned char key[SHA256_DIGEST_LENGTH];
	char *text; /* NULL: none (yet) */
	size_t len;
	int from_cache; /* text came from the cache: checked against the prompt */
	struct backend_call *call;
	struct prefix_render *pr;
};

struct prefix_render {
	struct backend *b;
	unsigned
	    gen; /* b's renders_gen at the start: its renderings are kept only while it holds */
	json_t *request;
	const struct prefix_render_handlers *h;
	void *arg;
	struct want *w;
	size_t n_w;
	size_t pending; /* prefix calls out */
	struct backend_call *full;
	int full_status;
	json_t *answer; /* the whole prompt's answer, once it came */
	size_t kept, rendered;
};

/* ---- the cache ---- */

static void entry_free(struct prefix_render_cache *c, struct entry *e)
{
	TAILQ_REMOVE(&c->lru, e, lru);
	c->entries--;
	c->bytes -= e->len;
	free(e->text);
	free(e);
}

void prefix_render_cache_free(struct backend *b)
{
	struct prefix_render_cache *c = b->renders;
	if (!c)
		return;
	while (!TAILQ_EMPTY(&c->lru))
		entry_free(c, TAILQ_FIRST(&c->lru));
	free(c);
	b->renders = NULL;
	b->renders_gen++;
}

static struct prefix_render_cache *cache_of(struct backend *b)
{
	if (!b->renders && (b->renders = calloc(1, sizeof *b->renders)))
		TAILQ_INIT(&b->renders->lru);
	return b->renders;
}

static struct entry *cache_find(struct prefix_render_cache *c, const unsigned char *key)
{
	struct entry *e;
	TAILQ_FOREACH(e, &c->lru, lru)
	{
		if (!memcmp(e->key, key, sizeof e->key)) {
			TAILQ_REMOVE(&c->lru, e, lru);
			TAILQ_INSERT_HEAD(&c->lru, e, lru);
			return e;
		}
	}
	return NULL;
}

static void cache_put(struct prefix_render_cache *c, const unsigned char *key, const char *text,
                      size_t len)
{
	struct entry *e = cache_find(c, key);
	if (e)
		entry_free(c, e);
	if (len > CACHE_MAX_BYTES / 4)
		return;
	e = calloc(1, sizeof *e);
	if (!e || !(e->text = malloc(len + 1))) {
		free(e);
		return; /* a rendering not kept is asked again next time */
	}
	memcpy(e->key, key, sizeof e->key);
	memcpy(e->text, text, len);
	e->text[len] = 0;
	e->len = len;
	TAILQ_INSERT_HEAD(&c->lru, e, lru);
	c->entries++;
	c->bytes += len;
	while (c->entries > CACHE_MAX_ENTRIES || c->bytes > CACHE_MAX_BYTES)
		entry_free(c, TAILQ_LAST(&c->lru, entry_list));
}

void prefix_render_cache_stats(const struct backend *b, struct prefix_render_stats *st)
{
	const struct prefix_render_cache *c = b->renders;
	*st = (struct prefix_render_stats){0};
	if (c)
		*st = (struct prefix_render_stats){c->entries, c->bytes, c->hits, c->misses,
		                                   c->stale};
}

/* ---- keys ---- */

/* Fields of a request that llama-server's templating never reads: left out
 * of the key, so that a client that varies them (a resend without the
 * cache, another output cap, streamed or not) finds the renderings kept.
 * Any other field is in the key: one that changes nothing costs a render. */
static const char *const not_templated[] = {
    "cache_prompt",
    "frequency_penalty",
    "id_slot",
    "logprobs",
    "max_completion_tokens",
    "max_tokens",
    "metadata",
    "min_p",
    "n_predict",
    "n_probs",
    "presence_penalty",
    "repeat_penalty",
    "return_progress",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "temperature",
    "timings_per_token",
    "top_k",
    "top_logprobs",
    "top_p",
    "user",
};

/* SHA-256 of prev (when not NULL) and v as compact JSON with sorted keys:
 * a chain over the messages, so that the key of k messages costs one
 * message's hash more than the key of k - 1. */
static int chain(const unsigned char *prev, json_t *v, unsigned char *out)
{
	char *dump = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
	if (!dump)
		return -1;
	struct strbuf sb = {0};
	if (prev)
		strbuf_append(&sb, (const char *)prev, SHA256_DIGEST_LENGTH);
	strbuf_appends(&sb, dump);
	free(dump);
	if (sb.failed) {
		strbuf_free(&sb);
		return -1;
	}
	SHA256((const unsigned char *)sb.p, sb.len, out);
	strbuf_free(&sb);
	return 0;
}

/* The /apply-template body for the first k messages, without a generation
 * prompt (malloc'd). */
static char *prefix_body(json_t *request, size_t k)
{
	json_t *msgs = json_object_get(request, "messages");
	json_t *body = json_copy(request);
	json_t *sub = json_array();
	for (size_t i = 0; sub && i < k; i++)
		json_array_append(sub, json_array_get(msgs, i));
	char *raw = NULL;
	if (body && sub && json_object_set(body, "messages", sub) == 0 &&
	    json_object_set_new(body, "add_generation_prompt", json_false()) == 0)
		raw = json_dumps(body, JSON_COMPACT);
	json_decref(sub);
	json_decref(body);
	return raw;
}

/* ---- one request's renders ---- */

/* The backend's cache, unless it was dropped since the request began: a
 * rendering of the server before a restart is not kept for the one after. */
static struct prefix_render_cache *cache_now(struct prefix_render *pr)
{
	return pr->b->renders_gen == pr->gen ? cache_of(pr->b) : NULL;
}

static void pr_free(struct prefix_render *pr)
{
	if (pr->full)
		backend_call_cancel(pr->full);
	for (size_t i = 0; i < pr->n_w; i++) {
		if (pr->w[i].call)
			backend_call_cancel(pr->w[i].call);
		free(pr->w[i].text);
	}
	free(pr->w);
	json_decref(pr->request);
	json_decref(pr->answer);
	free(pr);
}

void prefix_render_cancel(struct prefix_render *pr)
{
	if (pr)
		pr_free(pr);
}

/* Every call is back: the starts, then the handler. */
static void pr_finish(struct prefix_render *pr)
{
	struct prefix_render_result res = {
	    .status = pr->full_status,
	    .answer = pr->answer,
	    .prefixes = pr->n_w,
	    .kept = pr->kept,
	    .rendered = pr->rendered,
	};
	json_t *p = json_object_get(pr->answer, "prompt");
	if (pr->full_status == 200 && json_is_string(p)) {
		const char *prompt = json_string_value(p);
		size_t len = json_string_length(p);
		json_t *msgs = json_object_get(pr->request, "messages");
		size_t m = json_array_size(msgs);
		struct chat_starts s = {0};
		for (size_t i = 0; i < pr->n_w; i++)
			chat_starts_add(&s, prompt, len, pr->w[i].text, pr->w[i].len,
			                chat_start_kind(msgs, pr->w[i].k), pr->w[i].k == m);
		/* Out of memory: no starts (the grid), never wrong ones. */
		chat_starts_finish(&s, prompt, &res.offsets, &res.kind, &res.n, &res.header);
	}
	const struct prefix_render_handlers *h = pr->h;
	void *arg = pr->arg;
	pr->answer = NULL;
	pr_free(pr);
	h->on_done(&res, arg);
	json_decref(res.answer);
}

static void on_prefix_done(struct backend_call *call, int status, const char *body, size_t len,
                           void *arg)
{
	(void)call;
	struct want *w = arg;
	struct prefix_render *pr = w->pr;
	w->call = NULL;
	pr->pending--;
	json_t *o = json_body(status, body, len, -1);
	json_t *p = json_object_get(o, "prompt");
	if (status == 200 && json_is_string(p)) {
		w->len = json_string_length(p);
		w->text = malloc(w->len + 1);
		if (w->text) {
			memcpy(w->text, json_string_value(p), w->len + 1);
			struct prefix_render_cache *c = cache_now(pr);
			if (c)
				cache_put(c, w->key, w->text, w->len);
		}
	}
	/* A prefix the server refuses (a template that fails on it) gives no
	 * start there. */
	json_decref(o);
	if (pr->answer && !pr->pending)
		pr_finish(pr);
}

static void on_prefix_error(struct backend_call *call, enum backend_error err, void *arg)
{
	(void)err;
	on_prefix_done(call, 0, NULL, 0, arg);
}

static const struct backend_call_handlers prefix_handlers = {.on_done = on_prefix_done,
                                                             .on_error = on_prefix_error};

static int ask_prefix(struct prefix_render *pr, struct want *w)
{
	char *raw = prefix_body(pr->request, w->k);
	w->call = raw ? backend_call_start(pr->b->http, "POST", "/apply-template", raw, strlen(raw),
	                                   &prefix_handlers, w)
	              : NULL;
	free(raw);
	if (!w->call)
		return -1;
	pr->pending++;
	pr->rendered++;
	return 0;
}

static void on_full_done(struct backend_call *call, int status, const char *body, size_t len,
                         void *arg)
{
	(void)call;
	struct prefix_render *pr = arg;
	pr->full = NULL;
	pr->full_status = status;
	json_error_t jerr;
	pr->answer = body ? json_loadb(body, len, JSON_BODY_FLAGS, &jerr) : NULL;
	json_t *p = json_object_get(pr->answer, "prompt");
	if (status != 200 || !json_is_string(p)) {
		pr_finish(pr); /* the error goes to the client; the prefixes are moot */
		return;
	}
	/* A kept rendering that is no prefix of this prompt is asked again:
	 * only the server's own rendering may say there is no start. */
	const char *prompt = json_string_value(p);
	size_t plen = json_string_length(p);
	for (size_t i = 0; i < pr->n_w; i++) {
		struct want *w = &pr->w[i];
		if (!w->from_cache || (w->len < plen && !memcmp(w->text, prompt, w->len)))
			continue;
		free(w->text);
		w->text = NULL;
		w->from_cache = 0;
		pr->kept--;
		struct prefix_render_cache *c = cache_now(pr);
		if (c)
			c->stale++;
		if (ask_prefix(pr, w) != 0)
			break; /* out of memory: no start there */
	}
	if (!pr->pending)
		pr_finish(pr);
}

static void on_full_error(struct backend_call *call, enum backend_error err, void *arg)
{
	(void)call;
	struct prefix_render *pr = arg;
	pr->full = NULL;
	const struct prefix_render_handlers *h = pr->h;
	void *harg = pr->arg;
	pr_free(pr);
	h->on_error(err, harg);
}

static const struct backend_call_handlers full_handlers = {.on_done = on_full_done,
                                                           .on_error = on_full_error};

struct prefix_render *prefix_render_start(struct backend *b, json_t *request,
                                          const struct prefix_render_handlers *h, void *arg)
{
	struct prefix_render *pr = calloc(1, sizeof *pr);
	if (!pr)
		return NULL;
	pr->b = b;
	pr->gen = b->renders_gen;
	pr->request = json_incref(request);
	pr->h = h;
	pr->arg = arg;
	json_t *msgs = json_object_get(request, "messages");
	size_t n = chat_server_prefixes(request, NULL);
	pr->w = calloc(n ? n : 1, sizeof *pr->w);
	size_t *ks = calloc(n ? n : 1, sizeof *ks);
	json_t *rest = json_copy(request);
	unsigned char key[SHA256_DIGEST_LENGTH];
	int ok = pr->w && ks && rest && json_object_del(rest, "messages") == 0;
	for (size_t i = 0; ok && i < sizeof not_templated / sizeof *not_templated; i++)
		json_object_del(rest, not_templated[i]);
	ok = ok && chain(NULL, rest, key) == 0;
	json_decref(rest);
	if (ok) {
		chat_server_prefixes(request, ks);
		pr->n_w = n;
	}
	/* The key of the first k messages, for each k wanted. */
	for (size_t k = 1, i = 0; ok && i < pr->n_w; k++) {
		ok = chain(key, json_array_get(msgs, k - 1), key) == 0;
		if (ok && k == ks[i]) {
			struct want *w = &pr->w[i++];
			w->k = k;
			w->pr = pr;
			memcpy(w->key, key, sizeof key);
		}
	}
	free(ks);
	char *raw = ok ? json_dumps(request, JSON_COMPACT) : NULL;
	pr->full = raw ? backend_call_start(b->http, "POST", "/apply-template", raw, strlen(raw),
	                                    &full_handlers, pr)
	               : NULL;
	free(raw);
	struct prefix_render_cache *c = cache_now(pr);
	for (size_t i = 0; pr->full && i < pr->n_w; i++) {
		struct want *w = &pr->w[i];
		struct entry *e = c ? cache_find(c, w->key) : NULL;
		if (e && (w->text = malloc(e->len + 1))) {
			memcpy(w->text, e->text, e->len + 1);
			w->len = e->len;
			w->from_cache = 1;
			pr->kept++;
			c->hits++;
			continue;
		}
		if (c)
			c->misses++;
		if (ask_prefix(pr, w) != 0)
			break;
	}
	if (!pr->full) {
		pr_free(pr);
		return NULL;
	}
	return pr;
}
