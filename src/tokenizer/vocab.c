#include "tokenizer/vocab.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "platform/platform.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"
#include "util/grow.h"
#include "util/strmap.h"

/* llama.cpp's token attributes (llama_token_attr). */
enum {
	ATTR_UNKNOWN = 1 << 0,
	ATTR_UNUSED = 1 << 1,
	ATTR_NORMAL = 1 << 2,
	ATTR_CONTROL = 1 << 3,
	ATTR_USER_DEFINED = 1 << 4,
	ATTR_BYTE = 1 << 5,
	ATTR_LSTRIP = 1 << 7,
	ATTR_RSTRIP = 1 << 8,
};

/* tokenizer.ggml.token_type values (llama_token_type). */
enum {
	TYPE_UNDEFINED,
	TYPE_NORMAL,
	TYPE_UNKNOWN,
	TYPE_CONTROL,
	TYPE_USER_DEFINED,
	TYPE_UNUSED,
	TYPE_BYTE
};

struct token_data {
	char *text;
	size_t len;
	float score;
	unsigned attr;
};

struct vocab {
	enum vocab_kind kind;
	char pre[64];
	struct token_data *tokens;
	size_t n_tokens;
	struct strmap *text_to_id;
	struct strmap *merges; /* "left\xFFright" -> rank (BPE) */
	const struct pretokenizer_type *pre_type;
	struct pretokenizer *pretok;
	token_t bos, eos;
	int add_bos, add_eos, add_space_prefix;
	/* The tokens split out of text (control, user-defined, unknown),
	 * longest first, as llama.cpp's cache_special_tokens. */
	token_t *specials;
	size_t n_specials;
};

#define SPM_SPACE "\xe2\x96\x81" /* U+2581, SentencePiece's space */

/* ---- lists ---- */

int token_list_push(struct token_list *l, token_t t)
{
	return token_list_append(l, &t, 1);
}

int token_list_append(struct token_list *l, const token_t *t, size_t n)
{
	if (GROW(l->v, l->cap, l->n + n, 64) != 0)
		return -1;
	if (n)
		memcpy(l->v + l->n, t, n * sizeof *t);
	l->n += n;
	return 0;
}

void token_list_free(struct token_list *l)
{
	free(l->v);
	l->v = NULL;
	l->n = l->cap = 0;
}

static int fragment_push(struct fragment_list *l, size_t off, size_t len, token_t token)
{
	if (GROW(l->v, l->cap, l->n + 1, 16) != 0)
		return -1;
	l->v[l->n++] = (struct fragment){off, len, token};
	return 0;
}

void fragment_list_free(struct fragment_list *l)
{
	free(l->v);
	l->v = NULL;
	l->n = l->cap = 0;
}

/* ---- accessors ---- */

enum vocab_kind vocab_kind(const struct vocab *v)
{
	return v->kind;
}

size_t vocab_size(const struct vocab *v)
{
	return v->n_tokens;
}

const char *vocab_pre(const struct vocab *v)
{
	return v->pre;
}

const char *vocab_token_text(const struct vocab *v, token_t id, size_t *len)
{
	if (id < 0 || (size_t)id >= v->n_tokens)
		return NULL;
	if (len)
		*len = v->tokens[id].len;
	return v->tokens[id].text;
}

int vocab_token_is_special(const struct vocab *v, token_t id)
{
	return id >= 0 && (size_t)id < v->n_tokens &&
	       (v->tokens[id].attr & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN));
}

static int token_is_control(const struct vocab *v, token_t id)
{
	return id >= 0 && (size_t)id < v->n_tokens &&
	       (v->tokens[id].attr & (ATTR_CONTROL | ATTR_UNKNOWN));
}

size_t vocab_find_control(const struct vocab *v, const token_t *tok, size_t from, size_t to)
{
	while (from < to && !token_is_control(v, tok[from]))
		from++;
	return from;
}

token_t vocab_bos(const struct vocab *v)
{
	return v->bos;
}

token_t vocab_eos(const struct vocab *v)
{
	return v->eos;
}

int vocab_adds_bos(const struct vocab *v)
{
	return v->add_bos;
}

int vocab_adds_eos(const struct vocab *v)
{
	return v->add_eos;
}

static token_t text_to_token(const struct vocab *v, const char *s, size_t len)
{
	return strmap_get(v->text_to_id, s, len);
}

static token_t find_text(const struct vocab *v, const char *s)
{
	return text_to_token(v, s, strlen(s));
}

/* ---- loading ---- */

void vocab_free(struct vocab *v)
{
	if (!v)
		return;
	/* n_tokens is known before the array exists: a load that fails between
	 * the two frees no texts. */
	for (size_t i = 0; v->tokens && i < v->n_tokens; i++)
		free(v->tokens[i].text);
	free(v->tokens);
	strmap_free(v->text_to_id);
	strmap_free(v->merges);
	pretokenizer_free(v->pretok);
	free(v->specials);
	free(v);
}

static int id_key(const struct gguf *g, const char *key, size_t n_tokens, token_t *id)
{
	uint32_t x;
	if (!gguf_get_u32(g, key, &x))
		return 0;
	if (x < n_tokens)
		*id = (token_t)x;
	return 1;
}

/* A token llama.cpp recognises by its text and makes a control token. For
 * the single-id kinds (EOT, FIM ...), only when the file did not name one;
 * the first match found then wins. */
static void detect_by_text(struct vocab *v, const char *const *list, token_t *id)
{
	if (*id >= 0)
		return;
	for (size_t i = 0; list[i]; i++) {
		token_t t = find_text(v, list[i]);
		if (t >= 0) {
			*id = t;
			v->tokens[t].attr |= ATTR_CONTROL;
			return;
		}
	}
}

static const char *const eot_texts[] = {"<|eot_id|>",
                                        "<|im_end|>",
                                        "<|end|>",
                                        "<end_of_turn>",
                                        "<|endoftext|>",
                                        "<|end_of_text|>",
                                        "<EOT>",
                                        "_<EOT>",
                                        "[EOT]",
                                        "<\xef\xbd\x9c"
                                        "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                                        "<end_of_utterance>",
                                        NULL};
static const char *const eom_texts[] = {"<|eom_id|>", NULL};
static const char *const fim_pre_texts[] = {"<|fim_prefix|>",
                                            "<fim-prefix>",
                                            "<fim_prefix>",
                                            "<\xef\xbd\x9c"
                                            "fim\xe2\x96\x81"
                                            "begin\xef\xbd\x9c>",
                                            "<PRE>",
                                            SPM_SPACE "<PRE>",
                                            "<|code_prefix|>",
                                            "<|prefix|>",
                                            NULL};
static const char *const fim_suf_texts[] = {"<|fim_suffix|>",
                                            "<fim-suffix>",
                                            "<fim_suffix>",
                                            "<\xef\xbd\x9c"
                                            "fim\xe2\x96\x81hole\xef\xbd\x9c>",
                                            "<SUF>",
                                            SPM_SPACE "<SUF>",
                                            "<|code_suffix|>",
                                            "<|suffix|>",
                                            NULL};
static const char *const fim_mid_texts[] = {"<|fim_middle|>",
                                            "<fim-middle>",
                                            "<fim_middle>",
                                            "<\xef\xbd\x9c"
                                            "fim\xe2\x96\x81"
                                            "end\xef\xbd\x9c>",
                                            "<MID>",
                                            SPM_SPACE "<MID>",
                                            "<|code_middle|>",
                                            "<|middle|>",
                                            NULL};
static const char *const fim_pad_texts[] = {"<|fim_pad|>", "<fim-pad>", "<fim_pad>",
                                            "<PAD>",       "[PAD]",     NULL};
static const char *const fim_rep_texts[] = {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>",
                                            "<REPO>",       "<reponame>",    NULL};
static const char *const fim_sep_texts[] = {"<|file_sep|>", NULL};
/* Tokens that end a generation, which llama.cpp makes control tokens. */
static const char *const eog_texts[] = {"<|eot_id|>",
                                        "<|im_end|>",
                                        "<|end|>",
                                        "<|return|>",
                                        "<|call|>",
                                        "<|flush|>",
                                        "<|calls|>",
                                        "<end_of_turn>",
                                        "<|endoftext|>",
                                        "</s>",
                                        "<|eom_id|>",
                                        "<EOT>",
                                        "_<EOT>",
                                        "[EOT]",
                                        "[EOS]",
                                        "<|end_of_text|>",
                                        "<end_of_utterance>",
                                        "<eos>",
                                        "<turn|>",
                                        "<|tool_response>",
                                        "<\xef\xbd\x9c"
                                        "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",
                                        "[e~[",
                                        NULL};

struct eog_set {
	token_t ids[64];
	size_t n;
};

static void eog_add(struct eog_set *s, token_t id)
{
	if (id < 0)
		return;
	for (size_t i = 0; i < s->n; i++)
		if (s->ids[i] == id)
			return;
	if (s->n < sizeof s->ids / sizeof s->ids[0])
		s->ids[s->n++] = id;
}

static int eog_has_text(const struct vocab *v, const struct eog_set *s, const char *text,
                        token_t *id)
{
	for (size_t i = 0; i < s->n; i++) {
		const struct token_data *t = &v->tokens[s->ids[i]];
		if (t->len == strlen(text) && !memcmp(t->text, text, t->len)) {
			if (id)
				*id = s->ids[i];
			return 1;
		}
	}
	return 0;
}

/* The attribute fix-ups llama.cpp makes by token text after loading
 * (llama_vocab::impl::load): which tokens are control tokens decides what
 * the special-token split takes out of a prompt. */
static void fix_attributes(struct vocab *v, const struct gguf *g)
{
	token_t eot = -1, eom = -1, fim_pre = -1, fim_suf = -1, fim_mid = -1, fim_pad = -1,
	        fim_rep = -1, fim_sep = -1;
	id_key(g, "tokenizer.ggml.eot_token_id", v->n_tokens, &eot);
	id_key(g, "tokenizer.ggml.eom_token_id", v->n_tokens, &eom);
	id_key(g, "tokenizer.ggml.fim_pre_token_id", v->n_tokens, &fim_pre);
	id_key(g, "tokenizer.ggml.fim_suf_token_id", v->n_tokens, &fim_suf);
	id_key(g, "tokenizer.ggml.fim_mid_token_id", v->n_tokens, &fim_mid);
	id_key(g, "tokenizer.ggml.fim_pad_token_id", v->n_tokens, &fim_pad);
	id_key(g, "tokenizer.ggml.fim_rep_token_id", v->n_tokens, &fim_rep);
	id_key(g, "tokenizer.ggml.fim_sep_token_id", v->n_tokens, &fim_sep);
	id_key(g, "tokenizer.ggml.prefix_token_id", v->n_tokens, &fim_pre);
	id_key(g, "tokenizer.ggml.suffix_token_id", v->n_tokens, &fim_suf);
	id_key(g, "tokenizer.ggml.middle_token_id", v->n_tokens, &fim_mid);
	detect_by_text(v, eot_texts, &eot);
	detect_by_text(v, eom_texts, &eom);
	detect_by_text(v, fim_pre_texts, &fim_pre);
	detect_by_text(v, fim_suf_texts, &fim_suf);
	detect_by_text(v, fim_mid_texts, &fim_mid);
	detect_by_text(v, fim_pad_texts, &fim_pad);
	detect_by_text(v, fim_rep_texts, &fim_rep);
	detect_by_text(v, fim_sep_texts, &fim_sep);

	/* Control tokens named "unused" are unused; that changes nothing here. */
	struct eog_set eog = {{0}, 0};
	eog_add(&eog, fim_pad);
	eog_add(&eog, fim_rep);
	eog_add(&eog, fim_sep);
	for (size_t i = 0; eog_texts[i]; i++) {
		token_t t = find_text(v, eog_texts[i]);
		if (t >= 0) {
			eog_add(&eog, t);
			v->tokens[t].attr |= ATTR_CONTROL;
		}
	}
	/* gpt-oss: always rendered. */
	static const char *const harmony[] = {"<|channel|>", "<|message|>", "<|start|>",
	                                      "<|constrain|>", NULL};
	for (size_t i = 0; harmony[i]; i++) {
		token_t t = find_text(v, harmony[i]);
		if (t >= 0)
			v->tokens[t].attr = ATTR_USER_DEFINED;
	}
	eog_add(&eog, v->eos);
	eog_add(&eog, eot);
	eog_add(&eog, eom);
	token_t end_id;
	int call =
	    eog_has_text(v, &eog, "<|call|>", NULL) || eog_has_text(v, &eog, "<|calls|>", NULL);
	if (eog_has_text(v, &eog, "<|end|>", &end_id) && call &&
	    (eog_has_text(v, &eog, "<|return|>", NULL) || eog_has_text(v, &eog, "<|flush|>", NULL)))
		v->tokens[end_id].attr = ATTR_USER_DEFINED;
	token_t s_id;
	if (eog_has_text(v, &eog, "<|tool_response>", NULL) && eog_has_text(v, &eog, "</s>", &s_id))
		v->tokens[s_id].attr = ATTR_NORMAL;
}

static int by_length_desc(const void *a, const void *b, void *arg)
{
	const struct vocab *v = arg;
	token_t x = *(const token_t *)a, y = *(const token_t *)b;
	size_t lx = v->tokens[x].len, ly = v->tokens[y].len;
	if (lx != ly)
		return lx > ly ? -1 : 1;
	return x < y ? -1 : x > y;
}

static int contains_any(const char *s, const char *const *subs)
{
	for (size_t i = 0; subs[i]; i++)
		if (strstr(s, subs[i]))
			return 1;
	return 0;
}

static void set_attr(struct vocab *v, const char *text, unsigned attr, int on)
{
	token_t t = find_text(v, text);
	if (t < 0)
		return;
	if (on)
		v->tokens[t].attr |= attr;
	else
		v->tokens[t].attr &= ~attr;
}

/* lstrip/rstrip, which llama.cpp sets by model name (they are not in GGUF). */
static void strip_attributes(struct vocab *v, const struct gguf *g)
{
	char name[256] = "";
	const char *n = gguf_get_string(g, "general.name");
	if (n)
		snprintf(name, sizeof name, "%s", n);
	for (char *c = name; *c; c++)
		if (*c >= 'A' && *c <= 'Z')
			*c = (char)(*c + 32);
	const char *arch = gguf_get_string(g, "general.architecture");
	static const char *const jina[] = {"jina-v2-de", "jina-v2-es", "jina-v2-code", NULL};
	static const char *const bert[] = {"nomic-bert-moe", "jina-bert-v3", NULL};
	static const char *const phi3[] = {"phi-3", "phi3", NULL};
	static const char *const modern[] = {"modern-bert", NULL};
	if (contains_any(v->pre, jina) || (arch && contains_any(arch, bert))) {
		set_attr(v, "<mask>", ATTR_LSTRIP, 1);
	} else if (contains_any(name, phi3)) {
		for (size_t i = 0; i < v->n_specials; i++)
			v->tokens[v->specials[i]].attr |= ATTR_RSTRIP;
		set_attr(v, "</s>", ATTR_RSTRIP, 1);
		set_attr(v, "<unk>", ATTR_RSTRIP, 0);
		set_attr(v, "<s>", ATTR_RSTRIP, 0);
		set_attr(v, "<|endoftext|>", ATTR_RSTRIP, 0);
	} else if (contains_any(name, modern)) {
		set_attr(v, "[MASK]", ATTR_LSTRIP, 1);
	}
}

static int load_merges(struct vocab *v, const struct gguf *g, char *err, size_t errlen)
{
	const struct gguf_kv *kv = gguf_find_key(g, "tokenizer.ggml.merges");
	if (!kv || kv->type != GGUF_TYPE_ARRAY || kv->arr_type != GGUF_TYPE_STRING) {
		snprintf(err, errlen, "BPE vocabulary without tokenizer.ggml.merges");
		return -1;
	}
	uint64_t n = gguf_kv_arr_n(kv);
	v->merges = strmap_new((size_t)n);
	if (!v->merges) {
		snprintf(err, errlen, "out of memory");
		return -1;
	}
	char *key = NULL;
	size_t cap = 0;
	for (uint64_t i = 0; i < n; i++) {
		const struct gguf_str *s = gguf_kv_arr_str(kv, i);
		/* llama.cpp splits at the first space after the first byte; a
		 * line without one is the pair ("", ""). */
		const char *sp = s->len > 1 ? memchr(s->data + 1, ' ', s->len - 1) : NULL;
		size_t l1 = sp ? (size_t)(sp - s->data) : 0;
		size_t l2 = sp ? s->len - l1 - 1 : 0;
		if (l1 + l2 + 1 > cap) {
			cap = (l1 + l2 + 1) * 2;
			char *k = realloc(key, cap);
			if (!k) {
				free(key);
				snprintf(err, errlen, "out of memory");
				return -1;
			}
			key = k;
		}
		memcpy(key, s->data, l1);
		key[l1] = (char)0xFF;
		memcpy(key + l1 + 1, sp ? sp + 1 : "", l2);
		/* The first rank of a repeated pair stays (std::map emplace). */
		if (strmap_add(v->merges, key, l1 + l2 + 1, (int32_t)i, NULL) < 0) {
			free(key);
			snprintf(err, errlen, "out of memory");
			return -1;
		}
	}
	free(key);
	return 0;
}

struct vocab *vocab_from_gguf(const struct gguf *g, char *err, size_t errlen)
{
	const char *model = gguf_get_string(g, "tokenizer.ggml.model");
	if (!model) {
		snprintf(err, errlen, "no tokenizer.ggml.model in the file");
		return NULL;
	}
	struct vocab *v = calloc(1, sizeof *v);
	if (!v) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	const char *pre = gguf_get_string(g, "tokenizer.ggml.pre");
	if (!strcmp(model, "llama")) {
		v->kind = VOCAB_SPM;
		v->bos = 1;
		v->eos = 2;
		v->add_bos = 1;
		v->add_space_prefix = 1;
	} else if (!strcmp(model, "gpt2")) {
		v->kind = VOCAB_BPE;
		v->bos = 11;
		v->eos = 11;
		v->pre_type = pretokenizer_type_find(pre);
		if (!v->pre_type) {
			snprintf(err, errlen, "pre-tokenizer '%s' is not one toki implements", pre);
			goto fail;
		}
		snprintf(v->pre, sizeof v->pre, "%s", pre ? pre : "");
		v->add_bos = v->pre_type->add_bos;
	} else {
		snprintf(err, errlen, "tokenizer '%s' is not one toki implements", model);
		goto fail;
	}
	bool b;
	if (gguf_get_bool(g, "tokenizer.ggml.add_space_prefix", &b))
		v->add_space_prefix = b;

	const struct gguf_kv *tk = gguf_find_key(g, "tokenizer.ggml.tokens");
	if (!tk || tk->type != GGUF_TYPE_ARRAY || tk->arr_type != GGUF_TYPE_STRING) {
		snprintf(err, errlen, "no tokenizer.ggml.tokens in the file");
		goto fail;
	}
	v->n_tokens = (size_t)gguf_kv_arr_n(tk);
	const struct gguf_kv *sk = gguf_find_key(g, "tokenizer.ggml.scores");
	const struct gguf_kv *yk = gguf_find_key(g, "tokenizer.ggml.token_type");
	if ((sk && gguf_kv_arr_n(sk) < v->n_tokens) || (yk && gguf_kv_arr_n(yk) < v->n_tokens)) {
		snprintf(err, errlen, "fewer scores or token types than tokens");
		goto fail;
	}
	v->tokens = calloc(v->n_tokens ? v->n_tokens : 1, sizeof *v->tokens);
	v->text_to_id = strmap_new(v->n_tokens);
	if (!v->tokens || !v->text_to_id) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	for (size_t i = 0; i < v->n_tokens; i++) {
		const struct gguf_str *s = gguf_kv_arr_str(tk, i);
		struct token_data *t = &v->tokens[i];
		char empty[32];
		const char *text = s->data;
		size_t len = (size_t)s->len;
		if (!len) { /* llama.cpp names empty tokens [EMPTY_<id>] */
			len = (size_t)snprintf(empty, sizeof empty, "[EMPTY_%zu]", i);
			text = empty;
		}
		t->text = malloc(len + 1);
		if (!t->text) {
			snprintf(err, errlen, "out of memory");
			goto fail;
		}
		memcpy(t->text, text, len);
		t->text[len] = 0;
		t->len = len;
		double score = 0;
		if (sk)
			gguf_kv_arr_f64(sk, i, &score);
		t->score = (float)score;
		int64_t type = TYPE_NORMAL;
		if (yk)
			gguf_kv_arr_i64(yk, i, &type);
		switch (type) {
		case TYPE_UNKNOWN:
			t->attr = ATTR_UNKNOWN;
			break;
		case TYPE_UNUSED:
			t->attr = ATTR_UNUSED;
			break;
		case TYPE_NORMAL:
			t->attr = ATTR_NORMAL;
			break;
		case TYPE_CONTROL:
			t->attr = ATTR_CONTROL;
			break;
		case TYPE_USER_DEFINED:
			t->attr = ATTR_USER_DEFINED;
			break;
		case TYPE_BYTE:
			t->attr = ATTR_BYTE;
			break;
		default:
			t->attr = 0;
			break;
		}
		if (!yk)
			t->attr = ATTR_NORMAL;
		int32_t other;
		int rc = strmap_add(v->text_to_id, t->text, len, (int32_t)i, &other);
		if (rc < 0) {
			snprintf(err, errlen, "out of memory");
			goto fail;
		}
		if (rc == 0) { /* llama.cpp refuses to load such a file */
			snprintf(err, errlen, "duplicate token in vocabulary (ids %d and %zu)",
			         other, i);
			goto fail;
		}
	}
	if (v->kind == VOCAB_BPE && load_merges(v, g, err, errlen) != 0)
		goto fail;

	id_key(g, "tokenizer.ggml.bos_token_id", v->n_tokens, &v->bos);
	id_key(g, "tokenizer.ggml.eos_token_id", v->n_tokens, &v->eos);
	if ((size_t)v->bos >= v->n_tokens)
		v->bos = -1;
	if ((size_t)v->eos >= v->n_tokens)
		v->eos = -1;
	if (v->pre_type && v->pre_type->no_bos)
		v->bos = -1;
	if (gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &b))
		v->add_bos = b;
	if (gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &b))
		v->add_eos = b;
	if (v->pre_type && v->pre_type->escape_whitespace) /* gemma4: always a BOS */
		v->add_bos = 1;
	if ((v->add_bos && v->bos < 0) || (v->add_eos && v->eos < 0)) {
		snprintf(err, errlen, "the vocabulary adds a BOS/EOS token it does not have");
		goto fail;
	}
	fix_attributes(v, g);

	for (size_t i = 0; i < v->n_tokens; i++)
		if (v->tokens[i].attr & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN))
			v->n_specials++;
	v->specials = malloc((v->n_specials ? v->n_specials : 1) * sizeof *v->specials);
	if (!v->specials) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	for (size_t i = 0, k = 0; i < v->n_tokens; i++)
		if (v->tokens[i].attr & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN))
			v->specials[k++] = (token_t)i;
	if (plat_qsort_r(v->specials, v->n_specials, sizeof *v->specials, by_length_desc, v) != 0) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	strip_attributes(v, g);

	if (v->kind == VOCAB_BPE) {
		v->pretok = pretokenizer_new(v->pre_type, err, errlen);
		if (!v->pretok)
			goto fail;
	}
	return v;
fail:
	vocab_free(v);
	return NULL;
}

/* ---- special tokens ---- */

static int is_c_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

/* Splits raw fragments at every occurrence of special token t, leftmost
 * first and without overlaps, as llama.cpp does for each special token in
 * turn. */
static int split_at_token(const struct vocab *v, token_t t, const char *text,
                          struct fragment_list *in, struct fragment_list *out)
{
	const struct token_data *td = &v->tokens[t];
	out->n = 0;
	for (size_t i = 0; i < in->n; i++) {
		struct fragment f = in->v[i];
		if (f.token >= 0) {
			if (fragment_push(out, f.off, f.len, f.token))
				return -1;
			continue;
		}
		size_t base = f.off, blen = f.len;
		for (;;) {
			const char *m =
			    blen >= td->len ? memmem(text + base, blen, td->text, td->len) : NULL;
			if (!m) {
				if (blen && fragment_push(out, base, blen, -1))
					return -1;
				break;
			}
			size_t at = (size_t)(m - text);
			size_t left = at - base;
			if (td->attr & ATTR_LSTRIP)
				while (left > 0 && is_c_space(text[base + left - 1]))
					left--;
			if (left && fragment_push(out, base, left, -1))
				return -1;
			if (fragment_push(out, at, td->len, t))
				return -1;
			size_t roff = at + td->len;
			size_t rlen = base + blen - roff;
			if (td->attr & ATTR_RSTRIP)
				while (rlen > 0 && is_c_space(text[roff])) {
					roff++;
					rlen--;
				}
			base = roff;
			blen = rlen;
		}
	}
	return 0;
}

int vocab_partition(const struct vocab *v, const char *text, size_t len, int parse_special,
                    struct fragment_list *out)
{
	out->n = 0;
	if (!len)
		return 0;
	/* Which byte pairs occur: a special token whose first two bytes do not
	 * is skipped without a search (a prompt of 100 KB against hundreds of
	 * special tokens). */
	uint64_t *pairs = calloc(65536 / 64, sizeof *pairs);
	uint64_t bytes[4] = {0};
	if (!pairs)
		return -1;
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)text[i];
		bytes[c >> 6] |= (uint64_t)1 << (c & 63);
		if (i + 1 < len) {
			unsigned p = (unsigned)c << 8 | (unsigned char)text[i + 1];
			pairs[p >> 6] |= (uint64_t)1 << (p & 63);
		}
	}
	struct fragment_list a = {0}, b = {0};
	int rc = fragment_push(&a, 0, len, -1);
	for (size_t k = 0; k < v->n_specials && !rc; k++) {
		token_t t = v->specials[k];
		const struct token_data *td = &v->tokens[t];
		if (!parse_special && (td->attr & (ATTR_CONTROL | ATTR_UNKNOWN)))
			continue;
		if (td->len > len || !td->len)
			continue;
		unsigned char c0 = (unsigned char)td->text[0];
		if (!(bytes[c0 >> 6] >> (c0 & 63) & 1))
			continue;
		if (td->len >= 2) {
			unsigned p = (unsigned)c0 << 8 | (unsigned char)td->text[1];
			if (!(pairs[p >> 6] >> (p & 63) & 1))
				continue;
		}
		rc = split_at_token(v, t, text, &a, &b);
		struct fragment_list tmp = a;
		a = b;
		b = tmp;
	}
	free(pairs);
	free(b.v);
	if (rc) {
		free(a.v);
		return -1;
	}
	free(out->v);
	*out = a;
	return 0;
}

/* ---- SentencePiece ---- */

struct symbol {
	int prev, next;
	size_t off, n; /* into the text being tokenized */
};

struct symbols {
	struct symbol *v;
	size_t n, cap;
};

static int symbols_push(struct symbols *s, struct symbol sym)
{
	if (GROW(s->v, s->cap, s->n + 1, 64) != 0)
		return -1;
	s->v[s->n++] = sym;
	return 0;
}

/* A binary heap of candidate merges. SentencePiece pops the highest score
 * first, BPE the lowest rank; ties go to the leftmost pair. */
struct bigram {
	int left, right;
	float key; /* score (SPM) or -rank (BPE): higher pops first */
	size_t size;
};

struct heap {
	struct bigram *v;
	size_t n, cap;
};

static int bigram_before(const struct bigram *a, const struct bigram *b)
{
	return a->key > b->key || (a->key == b->key && a->left < b->left);
}

static int heap_push(struct heap *h, struct bigram x)
{
	if (GROW(h->v, h->cap, h->n + 1, 64) != 0)
		return -1;
	size_t i = h->n++;
	while (i > 0) {
		size_t parent = (i - 1) / 2;
		if (!bigram_before(&x, &h->v[parent]))
			break;
		h->v[i] = h->v[parent];
		i = parent;
	}
	h->v[i] = x;
	return 0;
}

static struct bigram heap_pop(struct heap *h)
{
	struct bigram top = h->v[0];
	struct bigram last = h->v[--h->n];
	size_t i = 0;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= h->n)
			break;
		if (c + 1 < h->n && bigram_before(&h->v[c + 1], &h->v[c]))
			c++;
		if (!bigram_before(&h->v[c], &last))
			break;
		h->v[i] = h->v[c];
		i = c;
	}
	if (h->n)
		h->v[i] = last;
	return top;
}

struct session {
	const struct vocab *v;
	const char *text;
	struct symbols sym;
	struct heap heap;
	int oom;
};

static void spm_try_bigram(struct session *s, int left, int right)
{
	if (left < 0 || right < 0)
		return;
	const struct symbol *l = &s->sym.v[left], *r = &s->sym.v[right];
	token_t t = text_to_token(s->v, s->text + l->off, l->n + r->n);
	if (t < 0)
		return;
	struct bigram b = {left, right, s->v->tokens[t].score, l->n + r->n};
	if (heap_push(&s->heap, b))
		s->oom = 1;
}

static int spm_byte_token(const struct vocab *v, unsigned char c, struct token_list *out)
{
	char hex[8];
	snprintf(hex, sizeof hex, "<0x%02X>", c);
	token_t t = find_text(v, hex);
	if (t < 0) {
		char raw = (char)c;
		t = text_to_token(v, &raw, 1);
	}
	if (t < 0)
		return -2; /* llama.cpp throws here */
	return token_list_push(out, t);
}

static int spm_tokenize(const struct vocab *v, const char *text, size_t len, struct token_list *out)
{
	struct session s = {v, text, {0}, {0}, 0};
	int rc = 0;
	for (size_t off = 0; off < len && !rc;) {
		size_t n = unicode_sequence_length((unsigned char)text[off]);
		if (n > len - off)
			n = len - off;
		int idx = (int)s.sym.n;
		struct symbol sym = {idx - 1, off + n == len ? -1 : idx + 1, off, n};
		rc = symbols_push(&s.sym, sym);
		off += n;
	}
	for (size_t i = 1; i < s.sym.n && !rc && !s.oom; i++)
		spm_try_bigram(&s, (int)i - 1, (int)i);
	while (s.heap.n && !rc && !s.oom) {
		struct bigram b = heap_pop(&s.heap);
		struct symbol *l = &s.sym.v[b.left], *r = &s.sym.v[b.right];
		if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
			continue;
		l->n += r->n;
		r->n = 0;
		l->next = r->next;
		if (r->next >= 0)
			s.sym.v[r->next].prev = b.left;
		spm_try_bigram(&s, l->prev, b.left);
		spm_try_bigram(&s, b.left, l->next);
	}
	if (s.oom)
		rc = -1;
	/* A symbol that is not a token can only be one character (merges make
	 * tokens): it goes out as byte tokens. */
	for (int i = s.sym.n ? 0 : -1; i != -1 && !rc; i = s.sym.v[i].next) {
		const struct symbol *sym = &s.sym.v[i];
		token_t t = text_to_token(v, text + sym->off, sym->n);
		if (t >= 0) {
			rc = token_list_push(out, t);
			continue;
		}
		for (size_t j = 0; j < sym->n && !rc; j++)
			rc = spm_byte_token(v, (unsigned char)text[sym->off + j], out);
	}
	free(s.sym.v);
	free(s.heap.v);
	return rc;
}

/* ---- BPE ---- */

static int32_t merge_rank(const struct vocab *v, const char *l, size_t ll, const char *r, size_t rl,
                          char *key)
{
	memcpy(key, l, ll);
	key[ll] = (char)0xFF;
	memcpy(key + ll + 1, r, rl);
	return strmap_get(v->merges, key, ll + rl + 1);
}

struct bpe_word_ctx {
	const struct vocab *v;
	struct symbols sym; /* reused for every word */
	struct heap heap;
	char *key;
	size_t key_cap;
	struct token_list *out;
	int rc;
};

static void bpe_try_bigram(struct bpe_word_ctx *c, const char *word, int left, int right)
{
	if (left < 0 || right < 0)
		return;
	const struct symbol *l = &c->sym.v[left], *r = &c->sym.v[right];
	int32_t rank = merge_rank(c->v, word + l->off, l->n, word + r->off, r->n, c->key);
	if (rank < 0)
		return;
	struct bigram b = {left, right, -(float)rank, l->n + r->n};
	/* Ranks beyond 2^24 would lose precision in a float: compare exactly. */
	if (rank > (1 << 24)) {
		c->rc = -2;
		return;
	}
	if (heap_push(&c->heap, b))
		c->rc = -1;
}

static int bpe_emit(struct bpe_word_ctx *c, const char *text, size_t len)
{
	const struct vocab *v = c->v;
	token_t t = text_to_token(v, text, len);
	if (t >= 0)
		return token_list_push(c->out, t);
	for (size_t j = 0; j < len; j++) {
		token_t b;
		if (!v->pre_type->raw_utf8) {
			b = text_to_token(v, text + j, 1);
		} else {
			char hex[8];
			snprintf(hex, sizeof hex, "<0x%02X>", (unsigned char)text[j]);
			b = find_text(v, hex);
		}
		if (b >= 0 && token_list_push(c->out, b))
			return -1;
	}
	return 0;
}

static int is_newlines(const char *w, size_t len)
{
	for (size_t i = 0; i < len; i++)
		if (w[i] != '\n')
			return 0;
	return 1;
}

static int bpe_word(const char *word, size_t len, void *arg)
{
	struct bpe_word_ctx *c = arg;
	const struct vocab *v = c->v;
	if ((v->pre_type->ignore_merges ||
	     (v->pre_type->newline_words && is_newlines(word, len))) &&
	    text_to_token(v, word, len) >= 0) {
		c->rc = bpe_emit(c, word, len);
		return c->rc;
	}
	if (len * 2 + 2 > c->key_cap) {
		size_t cap = len * 2 + 64;
		char *k = realloc(c->key, cap);
		if (!k) {
			c->rc = -1;
			return -1;
		}
		c->key = k;
		c->key_cap = cap;
	}
	c->sym.n = 0;
	c->heap.n = 0;
	for (size_t off = 0; off < len;) {
		size_t n = unicode_sequence_length((unsigned char)word[off]);
		if (n > len - off)
			n = len - off;
		int idx = (int)c->sym.n;
		struct symbol sym = {idx - 1, off + n == len ? -1 : idx + 1, off, n};
		if (symbols_push(&c->sym, sym)) {
			c->rc = -1;
			return -1;
		}
		off += n;
	}
	for (size_t i = 1; i < c->sym.n && !c->rc; i++)
		bpe_try_bigram(c, word, (int)i - 1, (int)i);
	while (c->heap.n && !c->rc) {
		struct bigram b = heap_pop(&c->heap);
		struct symbol *l = &c->sym.v[b.left], *r = &c->sym.v[b.right];
		/* A pair whose text changed since it was queued is outdated: both
		 * start where they did, so the sizes tell. */
		if (l->n == 0 || r->n == 0 || l->n + r->n != b.size)
			continue;
		l->n += r->n;
		r->n = 0;
		l->next = r->next;
		if (r->next >= 0)
			c->sym.v[r->next].prev = b.left;
		bpe_try_bigram(c, word, l->prev, b.left);
		bpe_try_bigram(c, word, b.left, l->next);
	}
	for (size_t i = 0; i < c->sym.n && !c->rc; i++)
		if (c->sym.v[i].n)
			c->rc = bpe_emit(c, word + c->sym.v[i].off, c->sym.v[i].n);
	return c->rc;
}

static int bpe_tokenize(const struct vocab *v, const char *text, size_t len, struct token_list *out)
{
	struct bpe_word_ctx c = {v, {0}, {0}, NULL, 0, out, 0};
	int rc = pretokenizer_split(v->pretok, text, len, bpe_word, &c);
	if (c.rc)
		rc = c.rc;
	free(c.sym.v);
	free(c.heap.v);
	free(c.key);
	return rc;
}

/* ---- tokenizing ---- */

/* Replaces every ' ' with U+2581 in a new buffer, optionally after a leading
 * space. */
static char *escape_spaces(const char *text, size_t len, int lead, size_t *out_len)
{
	size_t spaces = lead;
	for (size_t i = 0; i < len; i++)
		spaces += text[i] == ' ';
	char *e = malloc(len + lead + spaces * 2 + 1);
	if (!e)
		return NULL;
	size_t k = 0;
	if (lead) {
		memcpy(e, SPM_SPACE, 3);
		k = 3;
	}
	for (size_t i = 0; i < len; i++) {
		if (text[i] == ' ') {
			memcpy(e + k, SPM_SPACE, 3);
			k += 3;
		} else {
			e[k++] = text[i];
		}
	}
	e[k] = 0;
	*out_len = k;
	return e;
}

int vocab_tokenize_fragment(const struct vocab *v, const char *text, size_t len, int after_special,
                            struct token_list *out)
{
	if (v->kind == VOCAB_SPM) {
		size_t el;
		char *e = escape_spaces(text, len, v->add_space_prefix && after_special, &el);
		if (!e)
			return -1;
		int rc = spm_tokenize(v, e, el, out);
		free(e);
		return rc;
	}
	if (v->pre_type->escape_whitespace) {
		size_t el;
		char *e = escape_spaces(text, len, 0, &el);
		if (!e)
			return -1;
		int rc = bpe_tokenize(v, e, el, out);
		free(e);
		return rc;
	}
	return bpe_tokenize(v, text, len, out);
}

int vocab_tokenize(const struct vocab *v, const char *text, size_t len, int add_special,
                   int parse_special, struct token_list *out)
{
	struct fragment_list f = {0};
	if (vocab_partition(v, text, len, parse_special, &f))
		return -1;
	int rc = 0;
	if (add_special && v->add_bos)
		rc = token_list_push(out, v->bos);
	int after_special = 1;
	for (size_t i = 0; i < f.n && !rc; i++) {
		if (f.v[i].token >= 0) {
			rc = token_list_push(out, f.v[i].token);
			after_special = 1;
		} else {
			rc = vocab_tokenize_fragment(v, text + f.v[i].off, f.v[i].len,
			                             after_special, out);
			after_special = 0;
		}
	}
	if (!rc && add_special && v->add_eos)
		rc = token_list_push(out, v->eos);
	fragment_list_free(&f);
	return rc;
}
