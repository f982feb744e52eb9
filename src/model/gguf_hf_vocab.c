/* gguf_gen_vocab_from_hf: a Hugging Face tokenizer for the GGUF writer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "model/gguf.h"
#include "util/err.h"

enum { TYPE_NORMAL = 1, TYPE_CONTROL = 3, TYPE_USER_DEFINED = 4, TYPE_UNUSED = 5 };

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

int gguf_gen_vocab_from_hf(const char *tokenizer_json, const char *config_json, const char *pre,
                           struct gguf_gen_vocab *v, char *err, size_t errlen)
{
	memset(v, 0, sizeof *v);
	v->bos = v->eos = v->eot = v->pad = -1;
	v->add_bos = -1;
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
	snprintf(v->pre, sizeof v->pre, "%s", pre);
	v->bos = id_of(v, config_token(config, "bos_token"));
	v->eos = id_of(v, config_token(config, "eos_token"));
	v->pad = id_of(v, config_token(config, "pad_token"));
	json_t *ab = json_object_get(config, "add_bos_token");
	if (json_is_boolean(ab))
		v->add_bos = json_is_true(ab);
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
	json_t *tmpl = json_object_get(config, "chat_template");
	if (json_is_array(tmpl)) { /* named templates: the default one */
		json_t *e, *pick = NULL;
		json_array_foreach(
		    tmpl, i,
		    e) if (!pick || !strcmp(or_empty(json_string_value(json_object_get(e, "name"))),
		                            "default")) pick = e;
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
