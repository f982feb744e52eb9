#include "prompt/prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/queue.h>
#include <xxhash.h>

#include "model/gguf.h"
#include "router/sched.h"
#include "template/jinja.h"

/* Fragments shorter than this are tokenized every time: a lookup would cost
 * about as much. */
#define CACHE_MIN_BYTES 48
#define DEFAULT_CACHE_TOKENS (1u << 20)

struct cache_entry {
	XXH128_hash_t key;
	token_t *tokens;
	size_t n;
	TAILQ_ENTRY(cache_entry) lru; /* most recent first */
	int used;
};

struct frag_cache {
	struct cache_entry *slots;
	size_t mask, count;
	TAILQ_HEAD(lru_list, cache_entry) lru;
	size_t tokens, budget;
};

struct prompt_engine {
	struct vocab *vocab;
	struct jinja_template *tmpl, *tmpl_tool_use;
	int has_chat;
	char *bos, *eos;
	struct chat_env env;
	struct chat_dates dates;
	struct frag_cache cache;
	struct prompt_engine_stats stats;
};

/* ---- the fragment cache ---- */

static int cache_init(struct frag_cache *c, size_t budget)
{
	size_t cap = 4096;
	c->slots = calloc(cap, sizeof *c->slots);
	if (!c->slots)
		return -1;
	c->mask = cap - 1;
	c->budget = budget;
	TAILQ_INIT(&c->lru);
	return 0;
}

static size_t slot_of(const struct frag_cache *c, XXH128_hash_t k)
{
	return (size_t)k.low64 & c->mask;
}

static struct cache_entry *cache_find(struct frag_cache *c, XXH128_hash_t k)
{
	for (size_t i = slot_of(c, k), probes = 0; probes <= c->mask;
	     i = (i + 1) & c->mask, probes++) {
		struct cache_entry *e = &c->slots[i];
		if (!e->used)
			return NULL;
		if (XXH128_isEqual(e->key, k))
			return e;
	}
	return NULL;
}

/* Removes an entry and re-seats the probe run after it (linear probing). */
static void cache_remove(struct frag_cache *c, struct cache_entry *e)
{
	TAILQ_REMOVE(&c->lru, e, lru);
	free(e->tokens);
	c->tokens -= e->n;
	c->count--;
	size_t i = (size_t)(e - c->slots);
	e->used = 0;
	for (size_t j = (i + 1) & c->mask; c->slots[j].used; j = (j + 1) & c->mask) {
		struct cache_entry moved = c->slots[j];
		TAILQ_REMOVE(&c->lru, &c->slots[j], lru);
		c->slots[j].used = 0;
		size_t k = slot_of(c, moved.key);
		while (c->slots[k].used)
			k = (k + 1) & c->mask;
		/* The copy's links are stale; inserting rewrites both. */
		c->slots[k] = moved;
		TAILQ_INSERT_HEAD(&c->lru, &c->slots[k], lru);
	}
}

static void cache_put(struct frag_cache *c, XXH128_hash_t k, const token_t *t, size_t n)
{
	if (n > c->budget / 4)
		return; /* one fragment must not flush the cache */
	while (!TAILQ_EMPTY(&c->lru) &&
	       (c->tokens + n > c->budget || (c->count + 1) * 2 > c->mask + 1))
		cache_remove(c, TAILQ_LAST(&c->lru, lru_list));
	if ((c->count + 1) * 2 > c->mask + 1)
		return;
	token_t *copy = malloc((n ? n : 1) * sizeof *copy);
	if (!copy)
		return;
	memcpy(copy, t, n * sizeof *t);
	size_t i = slot_of(c, k);
	while (c->slots[i].used)
		i = (i + 1) & c->mask;
	struct cache_entry *e = &c->slots[i];
	e->key = k;
	e->tokens = copy;
	e->n = n;
	e->used = 1;
	TAILQ_INSERT_HEAD(&c->lru, e, lru);
	c->count++;
	c->tokens += n;
}

static void cache_free(struct frag_cache *c)
{
	for (size_t i = 0; c->slots && i <= c->mask; i++)
		if (c->slots[i].used)
			free(c->slots[i].tokens);
	free(c->slots);
}

/* ---- the engine ---- */

static struct jinja_template *parse_template(const char *src, char *err, size_t errlen)
{
	char e[384];
	struct jinja_template *t = jinja_parse(src, strlen(src), e, sizeof e);
	if (!t)
		snprintf(err, errlen, "chat template: %s", e);
	return t;
}

/* The piece llama.cpp's token_to_piece(special=true) gives a special
 * token: its text. */
static char *token_piece(const struct vocab *v, token_t id)
{
	size_t len;
	const char *t = vocab_token_text(v, id, &len);
	return t ? strndup(t, len) : strdup("");
}

struct prompt_engine *prompt_engine_new(const struct prompt_engine_config *cfg, char *err,
                                        size_t errlen)
{
	struct gguf_error gerr;
	struct gguf *g = gguf_open(cfg->model_path, &gerr);
	if (!g) {
		snprintf(err, errlen, "%s: %s", cfg->model_path, gerr.text);
		return NULL;
	}
	struct prompt_engine *pe = calloc(1, sizeof *pe);
	if (!pe) {
		gguf_close(g);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	pe->vocab = vocab_from_gguf(g, err, errlen);
	const char *own_template = gguf_get_string(g, "tokenizer.chat_template");
	const char *src = cfg->chat_template ? cfg->chat_template : own_template;
	char *src_copy = src ? strdup(src) : NULL;
	gguf_close(g);
	if (!pe->vocab || cache_init(&pe->cache, cfg->cache_tokens ? cfg->cache_tokens
	                                                           : DEFAULT_CACHE_TOKENS) != 0) {
		if (pe->vocab)
			snprintf(err, errlen, "out of memory");
		free(src_copy);
		prompt_engine_free(pe);
		return NULL;
	}
	/* Without a template the engine still tokenizes (completions). */
	if (src_copy && !chat_template_needs_server(src_copy)) {
		pe->tmpl = parse_template(src_copy, err, errlen);
		if (pe->tmpl && cfg->tool_use_template)
			pe->tmpl_tool_use = parse_template(cfg->tool_use_template, err, errlen);
		pe->has_chat = pe->tmpl && (!cfg->tool_use_template || pe->tmpl_tool_use);
	}
	token_t bos = vocab_bos(pe->vocab);
	pe->bos = cfg->bos_token ? strdup(cfg->bos_token)
	          : bos >= 0     ? token_piece(pe->vocab, bos)
	                         : strdup("");
	pe->eos = cfg->eos_token ? strdup(cfg->eos_token) : strdup("");
	pe->env.tmpl = pe->tmpl;
	pe->env.tmpl_tool_use = pe->tmpl_tool_use;
	pe->env.template_is_gpt_oss = src_copy && strstr(src_copy, "<|channel|>") != NULL;
	chat_caps_from_json(cfg->caps, &pe->env.caps);
	pe->env.bos_token = pe->bos;
	pe->env.dates = &pe->dates;
	pe->env.eos_token = pe->eos;
	pe->env.add_bos = vocab_adds_bos(pe->vocab);
	pe->env.add_eos = vocab_adds_eos(pe->vocab);
	pe->env.enable_thinking = cfg->enable_thinking;
	free(src_copy);
	if (!pe->bos || !pe->eos) {
		snprintf(err, errlen, "out of memory");
		prompt_engine_free(pe);
		return NULL;
	}
	return pe;
}

void prompt_engine_free(struct prompt_engine *pe)
{
	if (!pe)
		return;
	vocab_free(pe->vocab);
	jinja_free(pe->tmpl);
	jinja_free(pe->tmpl_tool_use);
	cache_free(&pe->cache);
	free(pe->bos);
	free(pe->eos);
	free(pe);
}

const struct vocab *prompt_engine_vocab(const struct prompt_engine *pe)
{
	return pe->vocab;
}

int prompt_engine_has_chat(const struct prompt_engine *pe)
{
	return pe->has_chat;
}

void prompt_engine_set_thinking(struct prompt_engine *pe, int on)
{
	pe->env.enable_thinking = on;
}

int prompt_engine_thinking(const struct prompt_engine *pe)
{
	return pe->env.enable_thinking;
}

void prompt_engine_get_stats(const struct prompt_engine *pe, struct prompt_engine_stats *st)
{
	*st = pe->stats;
	st->cached_tokens = pe->cache.tokens;
}

static int tokenize_fragment(struct prompt_engine *pe, const char *text, size_t len,
                             int after_special, struct token_list *out)
{
	pe->stats.fragments++;
	if (len < CACHE_MIN_BYTES)
		return vocab_tokenize_fragment(pe->vocab, text, len, after_special, out);
	/* The key covers the text and whether a special token came before
	 * (SentencePiece adds a space then). */
	XXH128_hash_t k = XXH3_128bits_withSeed(text, len, after_special ? 1 : 0);
	struct cache_entry *e = cache_find(&pe->cache, k);
	if (e) {
		pe->stats.fragment_hits++;
		TAILQ_REMOVE(&pe->cache.lru, e, lru);
		TAILQ_INSERT_HEAD(&pe->cache.lru, e, lru);
		return token_list_append(out, e->tokens, e->n);
	}
	size_t before = out->n;
	int rc = vocab_tokenize_fragment(pe->vocab, text, len, after_special, out);
	if (rc == 0)
		cache_put(&pe->cache, k, out->v + before, out->n - before);
	return rc;
}

/* Tokenizes as prompt_engine_tokenize; with cuts (byte offsets, increasing),
 * also finds the token position where each cut falls: pos[i] is the number
 * of tokens before cuts[i] when the tokens of the text before it are exactly
 * the prompt's first pos[i] tokens, else (size_t)-1. A cut at a special
 * token is that; one inside text is checked by tokenizing the text before it
 * (llama.cpp's tokenizers may merge across it), from the last cut found. A
 * cut of kind CHAT_CUT_APART (kind may be NULL: none) rounds down instead:
 * pos[i] counts the prompt's tokens that lie wholly before it. */
static int tokenize_cuts(struct prompt_engine *pe, const char *text, size_t len,
                         struct token_list *out, const size_t *cuts, const unsigned char *kind,
                         size_t n_cuts, size_t *pos)
{
	const struct vocab *v = pe->vocab;
	struct fragment_list f = {0};
	if (vocab_partition(v, text, len, 1, &f))
		return -1;
	int rc = 0;
	if (vocab_adds_bos(v))
		rc = token_list_push(out, vocab_bos(v));
	int after_special = 1;
	size_t ci = 0;
	for (size_t i = 0; i < n_cuts; i++)
		pos[i] = (size_t)-1;
	for (size_t i = 0; i < f.n && !rc; i++) {
		size_t off = f.v[i].off, end = off + f.v[i].len, before = out->n;
		size_t vb = off, vt = before;
		if (f.v[i].token >= 0) {
			rc = token_list_push(out, f.v[i].token);
		} else {
			rc = tokenize_fragment(pe, text + off, f.v[i].len, after_special, out);
		}
		for (; !rc && ci < n_cuts && cuts[ci] < end; ci++) {
			if (cuts[ci] < off)
				continue;
			int down = kind && kind[ci] == CHAT_CUT_APART;
			if (cuts[ci] == off || (down && f.v[i].token >= 0)) {
				pos[ci] = before;
				continue;
			}
			if (f.v[i].token >= 0)
				continue; /* inside a special token's text */
			/* The text from the last cut found in this fragment (vb, at
			 * token vt) to this one, tokenized alone, must be the prompt's
			 * next tokens. A found cut is a token boundary, so no merge
			 * crossed it, and the text after it tokenizes as it would
			 * from the fragment's start: checking from there costs the
			 * fragment's length once, not once per cut. Through the
			 * fragment cache: the next turn has the same system prompt. */
			struct token_list head = {0};
			int hr = tokenize_fragment(pe, text + vb, cuts[ci] - vb,
			                           vb == off && after_special, &head);
			if (hr == -1) {
				rc = -1;
			} else if (hr == 0 && vt + head.n < out->n &&
			           !memcmp(head.v, out->v + vt, head.n * sizeof *head.v)) {
				pos[ci] = vt += head.n;
				vb = cuts[ci];
			} else if (hr == 0 && down) {
				/* The tokens both tokenizations share are the same
				 * bytes, all before the cut. */
				size_t j = 0;
				while (j < head.n && vt + j < out->n && head.v[j] == out->v[vt + j])
					j++;
				pos[ci] = vt + j;
			}
			token_list_free(&head);
		}
		after_special = f.v[i].token >= 0;
	}
	if (!rc && vocab_adds_eos(v))
		rc = token_list_push(out, vocab_eos(v));
	fragment_list_free(&f);
	return rc;
}

int prompt_engine_tokenize(struct prompt_engine *pe, const char *text, size_t len,
                           struct token_list *out)
{
	return tokenize_cuts(pe, text, len, out, NULL, NULL, 0, NULL);
}

/* Step regions: the tokens of an earlier answer, each its own chunk.
 * llama-server computes an answer's rows one token at a time as it
 * generates them; a schedule that evaluates them one at a time too gives
 * the same bits (../shared/proto/decode_steps.py: on CPU and Vulkan, dense,
 * hybrid and sliding-window models), so the slot that generated the answer
 * already holds the next turn's rows and nothing is recomputed. An
 * assistant message gets a region when its tokens begin with this
 * request's own generation prompt (tokens [g, n)): what follows is where
 * generation began. The region ends at the first control token (the end
 * of the turn, which generation samples but never evaluates) or at the next
 * start; a start at its end begins the rest of the message. User-defined
 * tokens (Qwen's <think> and <tool_call>) are words the model wrote: an
 * answer's reasoning and tool calls are in its region (bench_families.py:
 * every family that writes tool calls gets them back as generated). A
 * region also ends, its last step starting the rest of the message, where
 * the prompt parts from the template's rendering of the message as the
 * latest turn (apart[0..n_apart), increasing token positions,
 * CHAT_CUT_APART): generation wrote that format, so the rows from there on
 * are in no cache, and evaluating them one at a time would cost decode
 * speed for nothing (Qwen 3 drops an answer's reasoning once a user
 * speaks: its text follows the header where <think> was). All of it
 * is read off the request, so the schedule is still a function of the
 * request alone. With the joined header (st->joins, prompt.h) a region
 * begins one token earlier, at the header's last token (the token before
 * the message, where the header is empty), and that step stands for the
 * message's start, which becomes SCHED_START_PLAIN; the generation
 * prompt's last token, the prompt's, is a step too: the rows the
 * generating request left are the next turn's. Where a region runs to an
 * assistant message's start, that start stays one, not joined. Returns 0
 * or -1 (out of memory; the starts are unchanged). */
/* Writes a start (pos, kind non-NULL: the second pass) or counts one more
 * than the starts had (the first). */
static void emit(size_t *pos, unsigned char *kind, size_t *k, size_t *extra, size_t p,
                 unsigned char what)
{
	if (pos) {
		pos[*k] = p;
		kind[(*k)++] = what;
	} else {
		(*extra)++;
	}
}

static int add_step_regions(const struct vocab *v, const token_t *tok, size_t n,
                            struct prompt_starts *st, const size_t *apart, size_t n_apart)
{
	int last = st->header == CHAT_HEADER_LAST, joins = st->joins;
	if (!st->header || (!joins && st->n < (size_t)1 + last))
		return 0;
	/* An empty generation prompt (Mistral's) is at the prompt's end: every
	 * assistant message is where a generation began. */
	size_t g = last ? st->pos[st->n - 1] : n, h = n - g, extra = 0;
	for (int pass = 0; pass < 2; pass++) {
		size_t *pos = NULL, k = 0;
		unsigned char *kind = NULL;
		if (pass) {
			if (!extra)
				return 0;
			pos = malloc((st->n + extra) * sizeof *pos);
			kind = malloc(st->n + extra);
			if (!pos || !kind) {
				free(pos);
				free(kind);
				return -1;
			}
		}
		/* The region before ran to this start: it stays a start, not
		 * joined, or the last step's chunk would run on past it. */
		int ran_to = 0;
		for (size_t i = 0; i < st->n; i++) {
			size_t a = st->pos[i], next = i + 1 < st->n ? st->pos[i + 1] : n;
			int gen = last && i + 1 == st->n;
			int region = !gen && st->kind[i] == SCHED_START_ANSWER && next - a > h &&
			             !memcmp(tok + a, tok + g, h * sizeof *tok);
			/* The joined header: the step at the header's last token
			 * (before the message, where the header is empty) stands
			 * for the message's start. */
			int join = joins && !ran_to && (gen || region);
			ran_to = 0;
			if (join && !h)
				emit(pos, kind, &k, &extra, a - 1, SCHED_START_STEP);
			if (pass)
				emit(pos, kind, &k, &extra, a,
				     join ? SCHED_START_PLAIN : st->kind[i]);
			if (join && h)
				emit(pos, kind, &k, &extra, a + h - 1, SCHED_START_STEP);
			if (!region)
				continue;
			size_t e = vocab_find_control(v, tok, a + h, next), j = 0;
			while (j < n_apart && apart[j] < a)
				j++;
			/* Where the prompt parts from the answer as generation
			 * wrote it, the region ends. Parted right where generation
			 * began, its one step starts the rest as one chunk, and
			 * the header's rows, which the slot holds, are kept. */
			if (j < n_apart && apart[j] < e)
				e = apart[j] > a + h ? apart[j] : a + h;
			/* The next start ends the last step's chunk: kept, whatever
			 * it starts. */
			if (e == next && i + 1 < st->n) {
				if (st->kind[i + 1] != SCHED_START_ANSWER)
					st->kind[i + 1] = SCHED_START_STEP;
				else
					ran_to = 1;
			}
			for (size_t p = a + h; p <= e && p < next; p++)
				emit(pos, kind, &k, &extra, p, SCHED_START_STEP);
		}
		/* An empty generation prompt: the prompt's last token is the
		 * step that begins the answer's region. */
		if (joins && !last && !ran_to)
			emit(pos, kind, &k, &extra, n - 1, SCHED_START_STEP);
		if (pass) {
			free(st->pos);
			free(st->kind);
			st->pos = pos;
			st->kind = kind;
			st->n = k;
		}
	}
	return 0;
}

int prompt_engine_tokenize_starts(struct prompt_engine *pe, const char *text, size_t len,
                                  size_t *cuts, unsigned char *kind, size_t n_cuts, int header,
                                  int joins, struct token_list *out, struct prompt_starts *starts)
{
	size_t *pos = n_cuts ? malloc(n_cuts * sizeof *pos) : NULL;
	if (n_cuts && !pos) {
		free(cuts);
		free(kind);
		return -1;
	}
	int rc = tokenize_cuts(pe, text, len, out, cuts, kind, n_cuts, pos);
	size_t *apart = starts && !rc ? malloc(n_cuts * sizeof *apart) : NULL, n_apart = 0;
	if (starts && !rc && n_cuts && !apart)
		rc = -1;
	if (starts && !rc) {
		/* Token positions of the starts that map to one, in order; those
		 * of the CHAT_CUT_APART cuts apart (pos[] is read ahead of where
		 * it is written: k <= i). */
		size_t k = 0, prev = 0, msgs = 0;
		for (size_t i = 0; i < n_cuts; i++) {
			if (kind[i] == CHAT_CUT_APART) {
				if (pos[i] != (size_t)-1)
					apart[n_apart++] = pos[i];
				continue;
			}
			msgs++;
			int last = i + 1 == n_cuts;
			if (pos[i] != (size_t)-1 && pos[i] > prev && pos[i] < out->n) {
				kind[k] = kind[i];
				pos[k++] = pos[i];
				prev = pos[i];
				if (last && header == CHAT_HEADER_LAST)
					starts->header = CHAT_HEADER_LAST;
			}
		}
		starts->pos = pos;
		starts->kind = kind;
		kind = NULL;
		starts->n = k;
		if (header == CHAT_HEADER_EMPTY && k)
			starts->header = CHAT_HEADER_EMPTY;
		starts->messages = msgs;
		starts->joins = joins && starts->header;
		pos = NULL;
		if (add_step_regions(pe->vocab, out->v, out->n, starts, apart, n_apart) != 0)
			rc = -1;
	}
	free(apart);
	free(pos);
	free(cuts);
	free(kind);
	return rc;
}

/* A chat prompt's result from its tokenization's (tokenize_cuts). */
static enum chat_result tokenized(int rc, char *why, size_t whylen)
{
	if (rc == -2) {
		snprintf(why, whylen, "text the server's tokenizer rejects");
		return CHAT_DECLINED;
	}
	if (rc) {
		snprintf(why, whylen, "out of memory");
		return CHAT_ERROR;
	}
	return CHAT_OK;
}

enum chat_result prompt_engine_chat_answer(struct prompt_engine *pe, json_t *request,
                                           json_t *answer, time_t now, struct token_list *out,
                                           char *why, size_t whylen)
{
	if (!pe->has_chat) {
		snprintf(why, whylen, "the chat template is one llama-server renders its own way");
		return CHAT_DECLINED;
	}
	pe->env.now = now;
	char *text = NULL;
	size_t len = 0;
	enum chat_result r =
	    chat_render_answer(&pe->env, request, answer, &text, &len, why, whylen);
	if (r != CHAT_OK)
		return r;
	int rc = tokenize_cuts(pe, text, len, out, NULL, NULL, 0, NULL);
	free(text);
	return tokenized(rc, why, whylen);
}

enum chat_result prompt_engine_chat(struct prompt_engine *pe, json_t *request, time_t now,
                                    char **prompt, size_t *prompt_len, struct token_list *out,
                                    char *why, size_t whylen)
{
	return prompt_engine_chat_starts(pe, request, now, prompt, prompt_len, out, NULL, why,
	                                 whylen);
}

enum chat_result prompt_engine_chat_starts(struct prompt_engine *pe, json_t *request, time_t now,
                                           char **prompt, size_t *prompt_len,
                                           struct token_list *out, struct prompt_starts *starts,
                                           char *why, size_t whylen)
{
	if (starts)
		*starts = (struct prompt_starts){0};
	*prompt = NULL;
	if (!pe->has_chat) {
		snprintf(why, whylen, "the chat template is one llama-server renders its own way");
		return CHAT_DECLINED;
	}
	pe->env.now = now;
	enum chat_result r = chat_render(&pe->env, request, prompt, prompt_len, why, whylen);
	if (r != CHAT_OK)
		return r;
	size_t *cuts = NULL, n_cuts = 0;
	unsigned char *kind = NULL;
	int header = 0, joins = 0;
	if (starts && chat_message_starts(&pe->env, request, *prompt, *prompt_len, &cuts, &kind,
	                                  &n_cuts, &header, &joins) != 0) {
		snprintf(why, whylen, "out of memory");
		return CHAT_ERROR;
	}
	int rc = prompt_engine_tokenize_starts(pe, *prompt, *prompt_len, cuts, kind, n_cuts, header,
	                                       joins, out, starts);
	return tokenized(rc, why, whylen);
}
