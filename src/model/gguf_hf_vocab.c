/* gguf_gen_vocab_from_hf: a Hugging Face tokenizer for the GGUF writer. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "model/gguf.h"
#include "util/err.h"
#include "util/strmap.h"

/* tokenizer.ggml.token_type values (llama.cpp's llama_token_type). */
enum {
	TYPE_NORMAL = 1,
	TYPE_UNKNOWN = 2,
	TYPE_CONTROL = 3,
	TYPE_USER_DEFINED = 4,
	TYPE_UNUSED = 5,
	TYPE_BYTE = 6,
};

/* SentencePiece writes a space as U+2581. */
#define SPM_SPACE "\xe2\x96\x81"

void gguf_gen_vocab_free(struct gguf_gen_vocab *v)
{
	if (!v)
		return;
	for (uint32_t i = 0; i < v->n; i++)
		free(v->tokens[i]);
	for (uint32_t i = 0; i < v->n_merges; i++)
		free(v->merges[i]);
	free(v->tokens);
	free(v->types);
	free(v->scores);
	free(v->merges);
	free(v->chat_template);
	memset(v, 0, sizeof *v);
}

/* A token named in tokenizer_config.json: a string or {"content": ...}. */
static const char *config_token(json_t *config, const char *key)
{
	json_t *t = json_object_get(config, key);
	if (json_is_object(t))
		t = json_object_get(t, "content");
	return json_string_value(t);
}

static const char *or_empty(const char *s)
{
	return s ? s : "";
}

static int32_t id_of(const struct gguf_gen_vocab *v, const char *text)
{
	if (!text)
		return -1;
	for (uint32_t i = 0; i < v->n; i++)
		if (v->tokens[i] && !strcmp(v->tokens[i], text))
			return (int32_t)i;
	return -1;
}

static bool str_is(json_t *j, const char *s)
{
	const char *t = json_string_value(j);
	return t && !strcmp(t, s);
}

static const char *type_of(json_t *j)
{
	const char *t = json_string_value(json_object_get(j, "type"));
	return t ? t : "?";
}

/* A Replace of " " by "▁" (normalizer or pre-tokenizer Split pattern). */
static bool replaces_space(json_t *n)
{
	return str_is(json_object_get(n, "type"), "Replace") &&
	       str_is(json_object_get(json_object_get(n, "pattern"), "String"), " ") &&
	       str_is(json_object_get(n, "content"), SPM_SPACE);
}

/* A json array of the steps of a Sequence ("normalizers" or
 * "pretokenizers"), or a one-element array of a single step (new
 * reference); NULL for null. */
static json_t *steps_of(json_t *j, const char *list_key)
{
	if (!j || json_is_null(j))
		return NULL;
	if (str_is(json_object_get(j, "type"), "Sequence"))
		return json_incref(json_object_get(j, list_key));
	json_t *a = json_array();
	if (a)
		json_array_append(a, j);
	return a;
}

/* What a byte-fallback BPE tokenizer does to text before its merges, as
 * far as llama.cpp's SentencePiece tokenizer does the same: it writes every
 * ' ' as '▁' and, with add_space_prefix, puts a '▁' before the text and
 * after every special token; it splits nothing. Sets *prefix; -1 with the
 * reason when the tokenizer does something else. */
static int spm_text_steps(json_t *tok, const char *file, int *prefix, char *err, size_t errlen)
{
	bool escaped = false, prepends = false;
	json_t *norm = json_object_get(tok, "normalizer");
	json_t *list = steps_of(norm, "normalizers");
	if (norm && !json_is_null(norm) && !json_is_array(list)) {
		json_decref(list);
		err_set(err, errlen, "%s: unreadable normalizer", file);
		return -1;
	}
	size_t i;
	json_t *n;
	json_array_foreach(list, i, n)
	{
		if (replaces_space(n) && !escaped) {
			escaped = true;
		} else if (str_is(json_object_get(n, "type"), "Prepend") &&
		           str_is(json_object_get(n, "prepend"), SPM_SPACE) && !prepends) {
			prepends = true;
		} else {
			err_set(err, errlen,
			        "%s: its normalizer '%s' is not one llama.cpp's SentencePiece "
			        "tokenizer applies (only ' ' to '\u2581' and a leading '\u2581')",
			        file, type_of(n));
			json_decref(list);
			return -1;
		}
	}
	json_decref(list);
	json_t *pt = json_object_get(tok, "pre_tokenizer");
	list = steps_of(pt, "pretokenizers");
	if (pt && !json_is_null(pt) && !json_is_array(list)) {
		json_decref(list);
		err_set(err, errlen, "%s: unreadable pre_tokenizer", file);
		return -1;
	}
	int rc = 0;
	json_array_foreach(list, i, n)
	{
		const char *type = type_of(n);
		if (!strcmp(type, "Split") && escaped &&
		    str_is(json_object_get(json_object_get(n, "pattern"), "String"), " ")) {
			/* Gemma's: splits at spaces the normalizer has already
			 * replaced, so it never splits. */
			continue;
		}
		if (strcmp(type, "Metaspace") || escaped ||
		    !str_is(json_object_get(n, "replacement"), SPM_SPACE)) {
			err_set(err, errlen,
			        "%s: its pre-tokenizer '%s' splits the text, which llama.cpp's "
			        "SentencePiece tokenizer does not",
			        file, type);
			rc = -1;
			break;
		}
		/* Older files have add_prefix_space and always split. */
		const char *sc = json_string_value(json_object_get(n, "prepend_scheme"));
		if (!sc)
			sc = json_is_false(json_object_get(n, "add_prefix_space")) ? "never"
			                                                           : "always";
		if (!json_is_false(json_object_get(n, "split"))) {
			err_set(err, errlen,
			        "%s: its Metaspace pre-tokenizer splits the text at each '\u2581', "
			        "which llama.cpp's SentencePiece tokenizer does not",
			        file);
			rc = -1;
		} else if (!strcmp(sc, "first")) {
			err_set(
			    err, errlen,
			    "%s: its Metaspace pre-tokenizer puts a '\u2581' before the text only "
			    "(prepend_scheme \"first\"); llama.cpp's SentencePiece tokenizer puts "
			    "one after every special token too",
			    file);
			rc = -1;
		} else if (strcmp(sc, "always") && strcmp(sc, "never")) {
			err_set(err, errlen, "%s: unknown Metaspace prepend_scheme '%s'", file, sc);
			rc = -1;
		}
		if (rc)
			break;
		escaped = true;
		prepends = prepends || !strcmp(sc, "always");
	}
	if (rc) {
		json_decref(list);
		return -1;
	}
	json_decref(list);
	if (!escaped) {
		err_set(err, errlen,
		        "%s: it keeps spaces as they are; llama.cpp's SentencePiece tokenizer "
		        "writes them as '\u2581' (a Replace normalizer or Metaspace pre-tokenizer)",
		        file);
		return -1;
	}
	*prefix = prepends;
	return 0;
}

static bool is_byte_token(const char *s)
{
	static const char hex[] = "0123456789ABCDEFabcdef";
	return strlen(s) == 6 && !strncmp(s, "<0x", 3) && s[5] == '>' && s[3] &&
	       strchr(hex, s[3]) && s[4] && strchr(hex, s[4]);
}

/* The merge rank of each pair, and the SentencePiece scores and token types
 * of a byte-fallback BPE vocabulary: llama.cpp merges the adjacent pair
 * whose concatenation is a token with the highest score, where the
 * tokenizer merges the pair listed first. With each token's score minus the
 * rank of the first merge that makes it, the two agree as long as every
 * two tokens that make a third are one of its merges (else llama.cpp would
 * make a token the tokenizer never does), which is checked: -1 with the
 * reason when not. */
static int spm_scores(const char *file, struct gguf_gen_vocab *v, char *err, size_t errlen)
{
	int rc = -1;
	struct strmap *ids = strmap_new(v->n), *pairs = NULL;
	char *key = NULL;
	size_t key_cap = 0;
	if (!ids)
		goto oom;
	for (uint32_t k = 0; k < v->n; k++) {
		if (v->types[k] == TYPE_UNUSED)
			continue;
		int32_t other;
		int r = strmap_add(ids, v->tokens[k], strlen(v->tokens[k]), (int32_t)k, &other);
		if (r < 0)
			goto oom;
		if (r == 0) { /* llama.cpp refuses such a file */
			err_set(err, errlen, "%s: token '%s' twice (ids %d and %u)", file,
			        v->tokens[k], other, k);
			goto done;
		}
	}
	if (!(v->scores = calloc(v->n ? v->n : 1, sizeof *v->scores)) ||
	    !(pairs = strmap_new(v->n_merges)))
		goto oom;
	if (v->n_merges > (1u << 24)) { /* a float holds ranks exactly up to 2^24 */
		err_set(err, errlen, "%s: more merges than scores can order (%u)", file,
		        v->n_merges);
		goto done;
	}
	for (uint32_t r = 0; r < v->n_merges; r++) {
		const char *m = v->merges[r];
		/* "left right": SentencePiece pieces hold no ' ' (it is '▁'). */
		const char *sp = m[0] ? strchr(m + 1, ' ') : NULL;
		if (!sp || strchr(sp + 1, ' ')) {
			err_set(err, errlen, "%s: merge %u ('%s') is not two pieces", file, r, m);
			goto done;
		}
		size_t la = (size_t)(sp - m), lb = strlen(sp + 1);
		if (la + lb + 1 > key_cap) {
			key_cap = (la + lb + 1) * 2;
			char *k = realloc(key, key_cap);
			if (!k)
				goto oom;
			key = k;
		}
		memcpy(key, m, la);
		memcpy(key + la, sp + 1, lb);
		int32_t id = strmap_get(ids, key, la + lb);
		if (id < 0) {
			err_set(err, errlen, "%s: merge '%s' makes a piece that is not a token",
			        file, m);
			goto done;
		}
		if (v->scores[id] == 0)
			v->scores[id] = -(float)(r + 1);
		key[la] = (char)0xff; /* no UTF-8 text holds it */
		memcpy(key + la + 1, sp + 1, lb);
		if (strmap_add(pairs, key, la + lb + 1, (int32_t)r, NULL) < 0)
			goto oom;
	}
	for (uint32_t k = 0; k < v->n; k++) {
		if (v->types[k] != TYPE_NORMAL)
			continue;
		const char *t = v->tokens[k];
		size_t len = strlen(t);
		if (len + 2 > key_cap) {
			key_cap = (len + 2) * 2;
			char *nk = realloc(key, key_cap);
			if (!nk)
				goto oom;
			key = nk;
		}
		for (size_t cut = 1; cut < len; cut++) {
			if (((unsigned char)t[cut] & 0xc0) == 0x80)
				continue; /* inside a code point */
			if (strmap_get(ids, t, cut) < 0 || strmap_get(ids, t + cut, len - cut) < 0)
				continue;
			memcpy(key, t, cut);
			key[cut] = (char)0xff;
			memcpy(key + cut + 1, t + cut, len - cut);
			if (strmap_get(pairs, key, len + 1) < 0) {
				err_set(
				    err, errlen,
				    "%s: tokens '%.*s' and '%s' make token '%s' but are not one "
				    "of its merges: llama.cpp's SentencePiece tokenizer would "
				    "merge them where this tokenizer does not",
				    file, (int)cut, t, t + cut, t);
				goto done;
			}
		}
	}
	rc = 0;
	goto done;
oom:
	err_set(err, errlen, "out of memory");
done:
	free(key);
	strmap_free(ids);
	strmap_free(pairs);
	return rc;
}

/* The SentencePiece-style parts of a byte-fallback BPE tokenizer: what
 * llama.cpp needs beyond the byte-level conversion, or -1 with the reason
 * it cannot tokenize as this tokenizer does. */
static int spm_vocab(json_t *tok, json_t *model, json_t *config, const char *file,
                     struct gguf_gen_vocab *v, char *err, size_t errlen)
{
	json_t *dropout = json_object_get(model, "dropout");
	if (json_is_number(dropout) && json_number_value(dropout) > 0) {
		err_set(err, errlen, "%s: BPE dropout samples its merges; llama.cpp's do not",
		        file);
		return -1;
	}
	if (json_is_true(json_object_get(model, "ignore_merges"))) {
		err_set(err, errlen,
		        "%s: ignore_merges takes whole words from the vocabulary first, which "
		        "llama.cpp's SentencePiece tokenizer does not",
		        file);
		return -1;
	}
	const char *cont = json_string_value(json_object_get(model, "continuing_subword_prefix"));
	const char *suffix = json_string_value(json_object_get(model, "end_of_word_suffix"));
	if ((cont && *cont) || (suffix && *suffix)) {
		err_set(err, errlen,
		        "%s: word prefixes or suffixes in its merges are not SentencePiece's",
		        file);
		return -1;
	}
	if (spm_text_steps(tok, file, &v->add_space_prefix, err, errlen) != 0)
		return -1;
	/* An added token the normalizer would change is matched on the
	 * normalized text by the tokenizer, on the raw text by llama.cpp. */
	size_t i;
	json_t *a;
	json_array_foreach(json_object_get(tok, "added_tokens"), i, a)
	{
		const char *c = json_string_value(json_object_get(a, "content"));
		if (json_is_true(json_object_get(a, "normalized")) &&
		    (strchr(c, ' ') || strstr(c, SPM_SPACE))) {
			err_set(err, errlen,
			        "%s: added token '%s' is matched after spaces become '\u2581', "
			        "llama.cpp matches it before",
			        file, c);
			return -1;
		}
		if (json_is_true(json_object_get(a, "lstrip")) ||
		    json_is_true(json_object_get(a, "rstrip")) ||
		    json_is_true(json_object_get(a, "single_word"))) {
			err_set(err, errlen,
			        "%s: added token '%s' strips spaces or matches whole words only, "
			        "which llama.cpp does not do for it",
			        file, c);
			return -1;
		}
	}
	const char *key;
	json_t *val;
	json_object_foreach(json_object_get(model, "vocab"), key, val)
	{
		uint32_t id = (uint32_t)json_integer_value(val);
		if (v->types[id] == TYPE_NORMAL && is_byte_token(key))
			v->types[id] = TYPE_BYTE;
	}
	v->unk = id_of(v, json_string_value(json_object_get(model, "unk_token")));
	if (v->unk >= 0)
		v->types[v->unk] = TYPE_UNKNOWN;
	if (spm_scores(file, v, err, errlen) != 0)
		return -1;
	/* The merges are in the scores now; llama.cpp reads none for "llama". */
	for (uint32_t k = 0; k < v->n_merges; k++)
		free(v->merges[k]);
	v->n_merges = 0;
	snprintf(v->model, sizeof v->model, "llama");
	v->pre[0] = 0;

	/* BOS/EOS added as the tokenizer's post-processor adds them, where the
	 * config does not say (convert_hf_to_gguf.py reads the same). */
	json_t *pp = json_object_get(tok, "post_processor");
	json_t *single = json_object_get(pp, "single");
	if (str_is(json_object_get(pp, "type"), "TemplateProcessing") && json_is_array(single) &&
	    json_array_size(single) > 0) {
		json_t *first = json_object_get(json_array_get(single, 0), "SpecialToken");
		json_t *last = json_object_get(json_array_get(single, json_array_size(single) - 1),
		                               "SpecialToken");
		int32_t fid = id_of(v, json_string_value(json_object_get(first, "id")));
		int32_t lid = id_of(v, json_string_value(json_object_get(last, "id")));
		if (v->bos < 0 && !json_is_null(json_object_get(config, "bos_token")))
			v->bos = fid;
		if (v->add_bos < 0)
			v->add_bos = fid >= 0 && fid == v->bos;
		if (v->add_eos < 0)
			v->add_eos = lid >= 0 && lid == v->eos && json_array_size(single) > 1;
	}
	return 0;
}

int gguf_gen_vocab_from_hf(const char *tokenizer_json, const char *config_json, const char *pre,
                           struct gguf_gen_vocab *v, char *err, size_t errlen)
{
	memset(v, 0, sizeof *v);
	v->bos = v->eos = v->eot = v->pad = v->unk = -1;
	v->add_bos = v->add_eos = v->add_space_prefix = -1;
	json_error_t jerr;
	json_t *tok = json_load_file(tokenizer_json, 0, &jerr);
	if (!tok) {
		err_set(err, errlen, "%s: %s (line %d)", tokenizer_json, jerr.text, jerr.line);
		return -1;
	}
	json_t *config = NULL;
	if (config_json &&
	    !(config = json_load_file(config_json, JSON_DECODE_INT_AS_REAL, &jerr))) {
		err_set(err, errlen, "%s: %s (line %d)", config_json, jerr.text, jerr.line);
		json_decref(tok);
		return -1;
	}
	int rc = -1;
	json_t *model = json_object_get(tok, "model");
	json_t *vocab = json_object_get(model, "vocab");
	json_t *merges = json_object_get(model, "merges");
	json_t *added = json_object_get(tok, "added_tokens");
	if (!json_is_object(vocab) || !json_is_array(merges) ||
	    strcmp(or_empty(json_string_value(json_object_get(model, "type"))), "BPE") != 0) {
		err_set(err, errlen, "%s: not a BPE tokenizer (model.type, vocab, merges)",
		        tokenizer_json);
		goto done;
	}
	/* Ids may leave gaps: the vocabulary is as large as the highest id. */
	uint64_t n = 0;
	const char *key;
	json_t *val;
	json_object_foreach(vocab, key, val)
	{
		if (!json_is_integer(val) || json_integer_value(val) < 0 ||
		    json_integer_value(val) > 10000000) {
			err_set(err, errlen, "%s: bad id for '%s'", tokenizer_json, key);
			goto done;
		}
		if ((uint64_t)json_integer_value(val) + 1 > n)
			n = (uint64_t)json_integer_value(val) + 1;
	}
	size_t i;
	json_array_foreach(added, i, val)
	{
		json_int_t id = json_integer_value(json_object_get(val, "id"));
		if (id < 0 || id > 10000000 || !json_is_string(json_object_get(val, "content"))) {
			err_set(err, errlen, "%s: bad added token %zu", tokenizer_json, i);
			goto done;
		}
		if ((uint64_t)id + 1 > n)
			n = (uint64_t)id + 1;
	}
	v->n = (uint32_t)n;
	v->tokens = calloc(n ? n : 1, sizeof *v->tokens);
	v->types = calloc(n ? n : 1, sizeof *v->types);
	v->merges = calloc(json_array_size(merges) + 1, sizeof *v->merges);
	if (!v->tokens || !v->types || !v->merges)
		goto oom;
	json_object_foreach(vocab, key, val)
	{
		uint32_t id = (uint32_t)json_integer_value(val);
		free(v->tokens[id]);
		if (!(v->tokens[id] = strdup(key)))
			goto oom;
		v->types[id] = TYPE_NORMAL;
	}
	json_array_foreach(added, i, val)
	{
		uint32_t id = (uint32_t)json_integer_value(json_object_get(val, "id"));
		free(v->tokens[id]);
		if (!(v->tokens[id] = strdup(json_string_value(json_object_get(val, "content")))))
			goto oom;
		v->types[id] = json_is_true(json_object_get(val, "special")) ? TYPE_CONTROL
		                                                             : TYPE_USER_DEFINED;
	}
	for (uint32_t k = 0; k < v->n; k++)
		if (!v->tokens[k]) { /* as convert_hf_to_gguf.py fills gaps */
			char pad[32];
			snprintf(pad, sizeof pad, "[PAD%u]", k);
			if (!(v->tokens[k] = strdup(pad)))
				goto oom;
			v->types[k] = TYPE_UNUSED;
		}
	json_array_foreach(merges, i, val)
	{
		char *m = NULL;
		if (json_is_string(val)) {
			m = strdup(json_string_value(val));
		} else if (json_is_array(val) && json_array_size(val) == 2) {
			const char *a = json_string_value(json_array_get(val, 0));
			const char *b = json_string_value(json_array_get(val, 1));
			if (a && b && asprintf(&m, "%s %s", a, b) < 0)
				m = NULL;
		}
		if (!m)
			goto oom;
		v->merges[v->n_merges++] = m;
	}
	/* Byte fallback (<0xXX> tokens for bytes no piece has) is what
	 * SentencePiece vocabularies have and byte-level ones never need. */
	bool spm = json_is_true(json_object_get(model, "byte_fallback"));
	if (spm && pre) {
		err_set(err, errlen,
		        "%s: --pre is for byte-level BPE tokenizers; this one is "
		        "SentencePiece-style (byte fallback), which llama.cpp tokenizes without "
		        "a pre-tokenizer",
		        tokenizer_json);
		goto done;
	}
	if (!spm && !pre) {
		err_set(err, errlen,
		        "%s: a byte-level BPE tokenizer needs --pre (llama.cpp's pre-tokenizer "
		        "type: llama-bpe, qwen2, gpt-2, ...)",
		        tokenizer_json);
		goto done;
	}
	snprintf(v->model, sizeof v->model, "gpt2");
	snprintf(v->pre, sizeof v->pre, "%s", spm ? "" : pre);
	v->bos = id_of(v, config_token(config, "bos_token"));
	v->eos = id_of(v, config_token(config, "eos_token"));
	v->pad = id_of(v, config_token(config, "pad_token"));
	json_t *ab = json_object_get(config, "add_bos_token");
	if (json_is_boolean(ab))
		v->add_bos = json_is_true(ab);
	json_t *ae = json_object_get(config, "add_eos_token");
	if (spm && json_is_boolean(ae))
		v->add_eos = json_is_true(ae);
	if (json_is_null(json_object_get(config, "bos_token"))) {
		/* The model has no BOS (Qwen's configs say so). llama.cpp cannot
		 * be told "none": without an id it takes 11 for a BPE vocabulary
		 * and 1 for a SentencePiece one, an ordinary piece ("," in
		 * Qwen's) that /props and every template's bos_token would then
		 * show. Name a control token instead, which no text produces:
		 * the pad token, which is what llama.cpp's converter writes for
		 * these models from their config.json's bos_token_id, else the
		 * EOS. Nothing adds it: the tokenizer it comes from cannot. */
		if (v->pad >= 0 && v->types[v->pad] == TYPE_CONTROL)
			v->bos = v->pad;
		else if (v->eos >= 0 && v->types[v->eos] == TYPE_CONTROL)
			v->bos = v->eos;
		v->add_bos = 0;
	}
	if (spm && spm_vocab(tok, model, config, tokenizer_json, v, err, errlen) != 0)
		goto done;
	json_t *tmpl = json_object_get(config, "chat_template");
	if (json_is_array(tmpl)) { /* named templates: the default one */
		json_t *e, *pick = NULL;
		json_array_foreach(tmpl, i, e)
		{
			const char *name = json_string_value(json_object_get(e, "name"));
			if (!pick || !strcmp(or_empty(name), "default"))
				pick = e;
		}
		tmpl = json_object_get(pick, "template");
	}
	if (json_is_string(tmpl) && !(v->chat_template = strdup(json_string_value(tmpl))))
		goto oom;
	rc = 0;
	goto done;
oom:
	err_set(err, errlen, "out of memory");
done:
	if (rc)
		gguf_gen_vocab_free(v);
	json_decref(tok);
	json_decref(config);
	return rc;
}
