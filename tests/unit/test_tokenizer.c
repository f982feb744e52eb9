/* Unit tests for the tokenizer's parts (src/tokenizer/, src/util/strmap.c)
 * and the prompt engine's fragment cache (src/prompt/prompt.c).
 * tests/integration/test_tokenizer.py compares whole tokenizations with
 * llama-server over hundreds of texts; these pin the pieces and, above all,
 * the refusals: a vocabulary toki cannot reproduce must not load. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "gguf_craft.h"
#include "model/gguf.h"
#include "prompt/prompt.h"
#include "router/sched.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"
#include "util/strmap.h"

/* The SentencePiece model the tests read: $TOKI_TEST_MODEL, else
 * ../shared/models/stories260K.gguf beside the source tree (as
 * tests/unit/test_gguf.c finds it), else -- a clone without ../shared -- a
 * random-weight model the project's writer makes, as the integration tests
 * do. What differs between the two is in the struct. */
struct spm_model {
	char path[1024];
	size_t vocab_size;
	int space_prefix; /* the first word gets a U+2581 in front */
	int generated;
};
static struct spm_model spm_model;

static int find_spm_model(void **state)
{
	(void)state;
	struct spm_model *m = &spm_model;
	const char *env = getenv("TOKI_TEST_MODEL");
	const char *file = __FILE__;
	const char *tail = strstr(file, "/tests/unit/test_tokenizer.c");
	if (env && *env)
		snprintf(m->path, sizeof m->path, "%s", env);
	else
		snprintf(m->path, sizeof m->path, "%.*s/../shared/models/stories260K.gguf",
		         tail ? (int)(tail - file) : 1, tail ? file : ".");
	if (access(m->path, R_OK) == 0) {
		m->vocab_size = 512;
		m->space_prefix = 1;
		return 0;
	}
	const char *tmp = getenv("TMPDIR");
	snprintf(m->path, sizeof m->path, "%s/toki-test-tokenizer-%d.gguf",
	         tmp && *tmp ? tmp : "/tmp", (int)getpid());
	struct gguf_gen_params p;
	gguf_gen_params_default(&p);
	p.n_embd = 64;
	p.n_layers = 1;
	p.n_head = 1;
	p.n_head_kv = 1;
	p.n_ff = 128;
	p.context_length = 4096;
	char err[256];
	if (gguf_write_random_llama(&p, m->path, err, sizeof err) != 0) {
		fprintf(stderr, "cannot write a test model: %s\n", err);
		return -1;
	}
	m->vocab_size = gguf_gen_vocab_size();
	m->space_prefix = 0;
	m->generated = 1;
	return 0;
}

static int remove_spm_model(void **state)
{
	(void)state;
	if (spm_model.generated)
		unlink(spm_model.path);
	return 0;
}

/* --- strmap -------------------------------------------------------------- */

static void test_strmap(void **state)
{
	(void)state;
	struct strmap *m = strmap_new(4); /* far fewer than it will hold */
	assert_non_null(m);
	char key[32];
	for (int i = 0; i < 100000; i++) {
		int n = snprintf(key, sizeof key, "k%d", i);
		assert_int_equal(strmap_add(m, key, (size_t)n, i, NULL), 1);
	}
	assert_int_equal(strmap_count(m), 100000);
	for (int i = 0; i < 100000; i += 7) {
		int n = snprintf(key, sizeof key, "k%d", i);
		assert_int_equal(strmap_get(m, key, (size_t)n), i);
	}
	/* A key already there keeps its value and reports it. */
	int32_t existing = -1;
	assert_int_equal(strmap_add(m, "k42", 3, 7, &existing), 0);
	assert_int_equal(existing, 42);
	assert_int_equal(strmap_get(m, "k42", 3), 42);
	/* Prefixes, absent keys, the empty key and keys with NUL bytes are keys
	 * like any other. */
	assert_int_equal(strmap_get(m, "k4", 1), -1);
	assert_int_equal(strmap_get(m, "nope", 4), -1);
	assert_int_equal(strmap_get(m, "", 0), -1);
	assert_int_equal(strmap_add(m, "", 0, 5, NULL), 1);
	assert_int_equal(strmap_get(m, "", 0), 5);
	assert_int_equal(strmap_add(m, "a\0b", 3, 6, NULL), 1);
	assert_int_equal(strmap_add(m, "a\0c", 3, 8, NULL), 1);
	assert_int_equal(strmap_get(m, "a\0b", 3), 6);
	assert_int_equal(strmap_get(m, "a\0c", 3), 8);
	assert_int_equal(strmap_get(m, "a", 1), -1);
	strmap_free(m);
	strmap_free(NULL);
}

/* --- unicode ------------------------------------------------------------- */

static void test_unicode_round_trip(void **state)
{
	(void)state;
	char buf[4];
	for (uint32_t c = 0; c <= 0x10FFFF; c++) {
		if (c >= 0xD800 && c <= 0xDFFF)
			continue;
		size_t n = unicode_encode(c, buf);
		assert_int_equal(n, unicode_sequence_length((unsigned char)buf[0]));
		size_t pos = 0;
		uint32_t back = unicode_decode(buf, n, &pos);
		if (back != c || pos != n)
			fail_msg("U+%04X: decoded U+%04X after %zu of %zu bytes", c, back, pos, n);
	}
}

static void test_unicode_invalid(void **state)
{
	(void)state;
	/* Each bad byte is one U+FFFD and one byte consumed, as llama.cpp's
	 * unicode_cpts_from_utf8 does: a lone continuation byte, a truncated
	 * sequence, a lead byte followed by ASCII. */
	const char s[] = "\x80"
	                 "a"
	                 "\xe2\x82"
	                 "\xf0\x9f\x98"
	                 "b";
	size_t n;
	uint32_t *cp = unicode_decode_all(s, sizeof s - 1, &n);
	assert_non_null(cp);
	uint32_t want[] = {0xFFFD, 'a', 0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD, 0xFFFD, 'b'};
	assert_int_equal(n, sizeof want / sizeof want[0]);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(cp[i], want[i]);
	free(cp);
	/* A sequence cut by the end of the buffer is invalid too. */
	size_t pos = 0;
	assert_int_equal(unicode_decode("\xc3\xa9", 1, &pos), 0xFFFD);
	assert_int_equal(pos, 1);
}

static void test_unicode_flags(void **state)
{
	(void)state;
	assert_true(unicode_flags('A') & UNICODE_LETTER);
	assert_true(unicode_flags('7') & UNICODE_NUMBER);
	assert_true(unicode_flags(' ') & UNICODE_WHITESPACE);
	assert_true(unicode_flags('\n') & UNICODE_WHITESPACE);
	assert_true(unicode_flags(0x3000) & UNICODE_WHITESPACE); /* ideographic space */
	assert_true(unicode_flags(0x4E2D) & UNICODE_LETTER);     /* 中 */
	assert_true(unicode_flags(0x0661) & UNICODE_NUMBER);     /* Arabic-Indic one */
	assert_true(unicode_flags(0x0301) & UNICODE_MARK);       /* combining acute */
	assert_true(unicode_flags('!') & UNICODE_PUNCT);
	assert_true(unicode_flags('+') & UNICODE_SYMBOL);
	assert_true(unicode_flags(0x1F600) & UNICODE_SYMBOL); /* 😀 */
	assert_false(unicode_flags('A') & UNICODE_NUMBER);
	assert_int_equal(unicode_flags(0x110000), UNICODE_UNDEFINED);
	assert_true(unicode_flags(0x10FFFF) & UNICODE_UNDEFINED); /* unassigned */
}

/* --- pre-tokenizers ------------------------------------------------------ */

struct words {
	char text[16][32];
	int n;
};

static int collect(const char *word, size_t len, void *arg)
{
	struct words *w = arg;
	if (w->n == 16 || len >= sizeof w->text[0])
		return 1;
	memcpy(w->text[w->n], word, len);
	w->text[w->n][len] = 0;
	w->n++;
	return 0;
}

static void expect_words(const char *pre, const char *text, const char *const *want)
{
	const struct pretokenizer_type *t = pretokenizer_type_find(pre);
	if (!t)
		fail_msg("pre-tokenizer %s not found", pre);
	char err[256];
	struct pretokenizer *p = pretokenizer_new(t, err, sizeof err);
	if (!p)
		fail_msg("%s: %s", pre, err);
	struct words w = {0};
	assert_int_equal(pretokenizer_split(p, text, strlen(text), collect, &w), 0);
	int n = 0;
	while (want[n])
		n++;
	for (int i = 0; i < n && i < w.n; i++)
		if (strcmp(w.text[i], want[i]))
			fail_msg("%s on [%s]: word %d is [%s], want [%s]", pre, text, i, w.text[i],
			         want[i]);
	if (w.n != n)
		fail_msg("%s on [%s]: %d words, want %d", pre, text, w.n, n);
	pretokenizer_free(p);
}

static void test_pretokenizers(void **state)
{
	(void)state;
	/* Words in GPT-2's byte alphabet: a space is U+0120 (Ġ). */
	const char *llama3[] = {"Hello", "\xc4\xa0world", "\xc4\xa0", "123", "4", "!!", NULL};
	expect_words("llama-bpe", "Hello world 1234!!", llama3);
	const char *gpt2[] = {"Hello", "\xc4\xa0world",
	                      "\xc4\xa0"
	                      "1234",
	                      "!!", NULL};
	expect_words("gpt-2", "Hello world 1234!!", gpt2);
	/* Qwen 2 splits digits one by one. */
	const char *qwen2[] = {"ab", "1", "2", NULL};
	expect_words("qwen2", "ab12", qwen2);
	const char *contractions[] = {"It", "'s", NULL};
	expect_words("llama3", "It's", contractions);

	assert_non_null(pretokenizer_type_find(NULL));
	assert_non_null(pretokenizer_type_find(""));
	assert_non_null(pretokenizer_type_find("default"));
	assert_null(pretokenizer_type_find("no-such-tokenizer"));
	assert_null(pretokenizer_type_find("llama")); /* a name must match whole */
}

/* --- vocabularies -------------------------------------------------------- */

/* A vocabulary in a GGUF with no tensors. tokens: NULL-terminated. types:
 * llama.cpp token types, or NULL for none. */
struct vocab_file {
	const char *model, *pre;
	const char *const *tokens;
	const int32_t *types;
	int n_scores; /* -1: one per token */
	const char *const *merges;
	int bos;     /* -1: no key */
	int add_bos; /* -1: no key */
};

static void kv_str(struct buf *b, const char *key, const char *v)
{
	b_str(b, key);
	b_u32(b, GGUF_TYPE_STRING);
	b_str(b, v);
}

static void kv_str_array(struct buf *b, const char *key, const char *const *v)
{
	uint64_t n = 0;
	while (v[n])
		n++;
	b_str(b, key);
	b_u32(b, GGUF_TYPE_ARRAY);
	b_u32(b, GGUF_TYPE_STRING);
	b_u64(b, n);
	for (uint64_t i = 0; i < n; i++)
		b_str(b, v[i]);
}

static struct gguf *open_vocab_file(const struct vocab_file *f, struct buf *b)
{
	size_t n_tokens = 0;
	while (f->tokens && f->tokens[n_tokens])
		n_tokens++;
	uint64_t n_kv = 1 + (f->model ? 1 : 0) + (f->pre ? 1 : 0) + (f->tokens ? 1 : 0) +
	                (f->types ? 1 : 0) + (f->n_scores != 0 ? 1 : 0) + (f->merges ? 1 : 0) +
	                (f->bos >= 0 ? 1 : 0) + (f->add_bos >= 0 ? 1 : 0);
	b_header(b, 0, n_kv);
	kv_str(b, "general.architecture", "llama");
	if (f->model)
		kv_str(b, "tokenizer.ggml.model", f->model);
	if (f->pre)
		kv_str(b, "tokenizer.ggml.pre", f->pre);
	if (f->tokens)
		kv_str_array(b, "tokenizer.ggml.tokens", f->tokens);
	if (f->n_scores != 0) {
		uint64_t n = f->n_scores < 0 ? n_tokens : (uint64_t)f->n_scores;
		b_str(b, "tokenizer.ggml.scores");
		b_u32(b, GGUF_TYPE_ARRAY);
		b_u32(b, GGUF_TYPE_FLOAT32);
		b_u64(b, n);
		for (uint64_t i = 0; i < n; i++) {
			float score = -(float)i;
			uint32_t bits;
			memcpy(&bits, &score, 4);
			b_u32(b, bits);
		}
	}
	if (f->types) {
		b_str(b, "tokenizer.ggml.token_type");
		b_u32(b, GGUF_TYPE_ARRAY);
		b_u32(b, GGUF_TYPE_INT32);
		b_u64(b, n_tokens);
		for (size_t i = 0; i < n_tokens; i++)
			b_u32(b, (uint32_t)f->types[i]);
	}
	if (f->merges)
		kv_str_array(b, "tokenizer.ggml.merges", f->merges);
	if (f->bos >= 0) {
		b_str(b, "tokenizer.ggml.bos_token_id");
		b_u32(b, GGUF_TYPE_UINT32);
		b_u32(b, (uint32_t)f->bos);
	}
	if (f->add_bos >= 0) {
		b_str(b, "tokenizer.ggml.add_bos_token");
		b_u32(b, GGUF_TYPE_BOOL);
		b_u8(b, (uint8_t)f->add_bos);
	}
	struct gguf_error err;
	struct gguf *g = gguf_open_memory(b->p, b->len, &err);
	if (!g)
		fail_msg("crafted GGUF does not parse: %s", err.text);
	return g;
}

static struct vocab *load(const struct vocab_file *f, char *err, size_t errlen)
{
	struct buf b = {0};
	struct gguf *g = open_vocab_file(f, &b);
	struct vocab *v = vocab_from_gguf(g, err, errlen);
	gguf_close(g);
	free(b.p);
	return v;
}

static void expect_refused(const struct vocab_file *f, const char *needle)
{
	char err[256] = "";
	struct vocab *v = load(f, err, sizeof err);
	if (v) {
		vocab_free(v);
		fail_msg("vocabulary loaded; expected a refusal with '%s'", needle);
	}
	if (!strstr(err, needle))
		fail_msg("refusal '%s' lacks '%s'", err, needle);
}

/* A byte-level BPE vocabulary of a few tokens, with merges in rank order. */
static const char *const bpe_tokens[] = {"<s>",
                                         "a",
                                         "b",
                                         "\xc4\xa0",
                                         "ab",
                                         "\xc4\xa0"
                                         "a",
                                         "\xc4\xa0"
                                         "ab",
                                         NULL};
static const int32_t bpe_types[] = {3, 1, 1, 1, 1, 1, 1};

static void test_bpe_merges_by_rank(void **state)
{
	(void)state;
	char err[256];
	/* "a b" outranks "Ġ a": " ab" becomes "Ġ" + "ab", as there is no
	 * "Ġ ab" merge, although "Ġab" is a token. */
	const char *const merges[] = {"a b", "\xc4\xa0 a",
	                              "\xc4\xa0"
	                              "a b",
	                              NULL};
	struct vocab_file f = {"gpt2", "default", bpe_tokens, bpe_types, 0, merges, 0, 0};
	struct vocab *v = load(&f, err, sizeof err);
	if (!v)
		fail_msg("load: %s", err);
	assert_int_equal(vocab_kind(v), VOCAB_BPE);
	assert_int_equal(vocab_size(v), 7);
	assert_string_equal(vocab_pre(v), "default");
	assert_int_equal(vocab_bos(v), 0);
	assert_false(vocab_adds_bos(v));
	assert_true(vocab_token_is_special(v, 0));
	assert_false(vocab_token_is_special(v, 1));
	assert_null(vocab_token_text(v, 7, NULL));
	struct token_list out = {0};
	assert_int_equal(vocab_tokenize(v, "ab ab", 5, 1, 1, &out), 0);
	token_t want[] = {4, 3, 4};
	assert_int_equal(out.n, 3);
	assert_memory_equal(out.v, want, sizeof want);
	/* The control token is split out with parse_special, not without
	 * ("<", "s", ">" have no tokens, so that text is the server's). */
	out.n = 0;
	assert_int_equal(vocab_tokenize(v, "<s>ab", 5, 0, 1, &out), 0);
	assert_int_equal(out.n, 2);
	assert_int_equal(out.v[0], 0);
	assert_int_equal(out.v[1], 4);
	token_list_free(&out);
	vocab_free(v);

	/* With "Ġ a" first the same text merges the other way. */
	const char *const merges2[] = {"\xc4\xa0 a", "a b",
	                               "\xc4\xa0"
	                               "a b",
	                               NULL};
	f.merges = merges2;
	v = load(&f, err, sizeof err);
	assert_non_null(v);
	struct token_list out2 = {0};
	assert_int_equal(vocab_tokenize(v, "ab ab", 5, 0, 0, &out2), 0);
	token_t want2[] = {4, 6};
	assert_int_equal(out2.n, 2);
	assert_memory_equal(out2.v, want2, sizeof want2);
	token_list_free(&out2);
	vocab_free(v);
}

static void test_vocab_refusals(void **state)
{
	(void)state;
	const char *const merges[] = {"a b", NULL};
	struct vocab_file f = {NULL, NULL, bpe_tokens, bpe_types, 0, merges, 0, 0};
	expect_refused(&f, "no tokenizer.ggml.model");
	f.model = "bert";
	expect_refused(&f, "tokenizer 'bert' is not one toki implements");
	f.model = "gpt2";
	f.pre = "no-such-pre";
	expect_refused(&f, "pre-tokenizer 'no-such-pre'");
	f.pre = "default";
	f.tokens = NULL;
	expect_refused(&f, "no tokenizer.ggml.tokens");
	f.tokens = bpe_tokens;
	f.n_scores = 3;
	expect_refused(&f, "fewer scores");
	f.n_scores = 0;
	const char *const dup[] = {"<s>", "a", "a", NULL};
	f.tokens = dup;
	expect_refused(&f, "duplicate token");
	f.tokens = bpe_tokens;
	/* It adds a BOS it does not have. */
	f.bos = 99;
	f.add_bos = 1;
	expect_refused(&f, "BOS/EOS");
	/* SentencePiece adds a BOS by default, id 1 unless the file says. */
	const char *const spm1[] = {"<unk>", NULL};
	struct vocab_file s = {"llama", NULL, spm1, NULL, -1, NULL, -1, -1};
	expect_refused(&s, "BOS/EOS");
}

static void test_sentencepiece(void **state)
{
	(void)state;
	const char *path = spm_model.path;
	struct gguf_error gerr;
	struct gguf *g = gguf_open(path, &gerr);
	if (!g)
		fail_msg("%s: %s", path, gerr.text);
	char err[256];
	struct vocab *v = vocab_from_gguf(g, err, sizeof err);
	gguf_close(g);
	if (!v)
		fail_msg("load: %s", err);
	assert_int_equal(vocab_kind(v), VOCAB_SPM);
	assert_int_equal(vocab_size(v), spm_model.vocab_size);
	assert_true(vocab_adds_bos(v));
	struct token_list out = {0};
	const char *text = "Once upon a time, there was a little girl.";
	assert_int_equal(vocab_tokenize(v, text, strlen(text), 1, 1, &out), 0);
	assert_true(out.n > 5);
	assert_int_equal(out.v[0], vocab_bos(v));
	/* The pieces spell the text, with U+2581 for each space (and one more in
	 * front where the vocabulary adds a space prefix). */
	char spelled[256] = "";
	size_t k = 0;
	for (size_t i = 1; i < out.n; i++) {
		size_t len;
		const char *t = vocab_token_text(v, out.v[i], &len);
		assert_non_null(t);
		for (size_t j = 0; j < len; j++) {
			if (j + 3 <= len && !memcmp(t + j, "\xe2\x96\x81", 3)) {
				spelled[k++] = ' ';
				j += 2;
			} else {
				spelled[k++] = t[j];
			}
		}
	}
	spelled[k] = 0;
	if (spm_model.space_prefix) {
		assert_int_equal(spelled[0], ' ');
		assert_string_equal(spelled + 1, text);
	} else {
		assert_string_equal(spelled, text);
	}
	/* A byte the vocabulary spells only through byte fallback. */
	out.n = 0;
	assert_int_equal(vocab_tokenize(v, "\xe2\x82\xac", 3, 0, 0, &out), 0);
	assert_true(out.n >= 1);
	token_list_free(&out);
	vocab_free(v);
}

/* --- the prompt engine's fragment cache ---------------------------------- */

static void test_fragment_cache(void **state)
{
	(void)state;
	const char *path = spm_model.path;
	struct prompt_engine_config cfg = {.model_path = path};
	char err[256];
	struct prompt_engine *pe = prompt_engine_new(&cfg, err, sizeof err);
	if (!pe)
		fail_msg("engine: %s", err);
	const char *text = "One day, a little cat saw a big red ball in the park.";
	struct token_list first = {0}, again = {0}, direct = {0};
	assert_int_equal(prompt_engine_tokenize(pe, text, strlen(text), &first), 0);
	struct prompt_engine_stats st1, st2;
	prompt_engine_get_stats(pe, &st1);
	assert_int_equal(prompt_engine_tokenize(pe, text, strlen(text), &again), 0);
	prompt_engine_get_stats(pe, &st2);
	/* The second time is a cache hit, with the same tokens as the first and
	 * as the tokenizer itself. */
	assert_true(st2.fragment_hits > st1.fragment_hits);
	assert_int_equal(first.n, again.n);
	assert_memory_equal(first.v, again.v, first.n * sizeof *first.v);
	assert_int_equal(vocab_tokenize(prompt_engine_vocab(pe), text, strlen(text), 1, 1, &direct),
	                 0);
	assert_int_equal(first.n, direct.n);
	assert_memory_equal(first.v, direct.v, first.n * sizeof *first.v);
	size_t direct_n = direct.n;
	token_list_free(&first);
	token_list_free(&again);
	token_list_free(&direct);
	prompt_engine_free(pe);

	/* A model file that is not there is a refusal, not a crash. */
	cfg.model_path = "/nonexistent/model.gguf";
	assert_null(prompt_engine_new(&cfg, err, sizeof err));
	assert_true(err[0] != 0);
	/* A template that does not parse leaves chat requests to the server,
	 * and the engine still tokenizes (completions). So does one that
	 * llama-server renders through a handler of its own. */
	cfg.model_path = path;
	const char *templates[] = {"{% for %}", "{{ '<|channel|>' }}"};
	for (int i = 0; i < 2; i++) {
		cfg.chat_template = templates[i];
		pe = prompt_engine_new(&cfg, err, sizeof err);
		assert_non_null(pe);
		assert_false(prompt_engine_has_chat(pe));
		struct token_list t = {0};
		assert_int_equal(prompt_engine_tokenize(pe, text, strlen(text), &t), 0);
		assert_int_equal(t.n, direct_n);
		token_list_free(&t);
		prompt_engine_free(pe);
	}
	cfg.chat_template = "{{ messages[0].content }}";
	pe = prompt_engine_new(&cfg, err, sizeof err);
	assert_non_null(pe);
	assert_true(prompt_engine_has_chat(pe));
	prompt_engine_free(pe);
}

/* Step regions (prompt.c): an earlier answer that begins with the
 * request's own generation prompt gets a one-token chunk for each token
 * after it, up to its first control token (the end of its turn) or where
 * the prompt parts from the answer as generation wrote it (a
 * CHAT_CUT_APART at byte apart; SIZE_MAX: none); one that does not begin
 * so, none. */
static size_t step_starts_joined(struct prompt_engine *pe, const char *text, const char *answer,
                                 const char *user, const char *gen, size_t apart, int joins,
                                 struct token_list *t, struct prompt_starts *st)
{
	size_t n_cuts = apart == SIZE_MAX ? 3 : 4, i = 0;
	size_t *cuts = malloc(n_cuts * sizeof *cuts);
	unsigned char *kind = malloc(n_cuts);
	assert_non_null(cuts);
	assert_non_null(kind);
	cuts[i] = (size_t)(strstr(text, answer) - text);
	kind[i++] = SCHED_START_ANSWER;
	if (apart != SIZE_MAX) {
		cuts[i] = apart;
		kind[i++] = CHAT_CUT_APART;
	}
	cuts[i] = (size_t)(strstr(text, user) - text);
	kind[i++] = SCHED_START_MESSAGE;
	cuts[i] = strlen(text) - strlen(gen); /* the generation prompt ends the text */
	kind[i++] = SCHED_START_ANSWER;
	assert_int_equal(prompt_engine_tokenize_starts(pe, text, strlen(text), cuts, kind, n_cuts,
	                                               1, joins, t, st),
	                 0);
	size_t steps = 0;
	for (i = 0; i < st->n; i++)
		steps += st->kind[i] == SCHED_START_STEP;
	return steps;
}

static size_t step_starts_apart(struct prompt_engine *pe, const char *text, const char *answer,
                                const char *user, const char *gen, size_t apart,
                                struct token_list *t, struct prompt_starts *st)
{
	return step_starts_joined(pe, text, answer, user, gen, apart, 0, t, st);
}

static size_t step_starts(struct prompt_engine *pe, const char *text, const char *answer,
                          const char *user, const char *gen, struct token_list *t,
                          struct prompt_starts *st)
{
	return step_starts_apart(pe, text, answer, user, gen, SIZE_MAX, t, st);
}

/* The joined header (prompt.h): a chat request's starts say it joins where
 * the template writes an earlier answer right after the generation prompt;
 * not where history writes it otherwise, nor where the template fails on
 * the probe conversation (the request itself is still rendered, with its
 * generation prompt as the last chunk). */
static int joins_with(const char *tmpl, const char *req_json, struct prompt_starts *st)
{
	struct prompt_engine_config cfg = {.model_path = spm_model.path, .chat_template = tmpl};
	char err[256], why[256], *prompt = NULL;
	size_t plen = 0;
	struct prompt_engine *pe = prompt_engine_new(&cfg, err, sizeof err);
	if (!pe)
		fail_msg("engine: %s", err);
	json_t *req = json_loads(req_json, 0, NULL);
	assert_non_null(req);
	struct token_list t = {0};
	*st = (struct prompt_starts){0};
	assert_int_equal(
	    prompt_engine_chat_starts(pe, req, 0, &prompt, &plen, &t, st, why, sizeof why),
	    CHAT_OK);
	int joins = st->joins;
	/* Joined: the prompt's last token is a step; else the generation
	 * prompt's start is the last. */
	assert_true(st->n > 0);
	assert_int_equal(st->pos[st->n - 1] == t.n - 1, joins);
	assert_int_equal(st->kind[st->n - 1], joins ? SCHED_START_STEP : SCHED_START_ANSWER);
	free(prompt);
	token_list_free(&t);
	json_decref(req);
	prompt_engine_free(pe);
	return joins;
}

static void test_joined_header_probe(void **state)
{
	(void)state;
	const char *req = "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"},"
	                  " {\"role\": \"user\", \"content\": \"Hi there\"}]}";
#define CHATML_TURNS                                                                               \
	"{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
	struct prompt_starts st;
	assert_true(joins_with(CHATML_TURNS "{% if add_generation_prompt %}<|im_start|>assistant\n"
	                                    "{% endif %}",
	                       req, &st));
	free(st.pos);
	free(st.kind);
	/* A generation prompt with an empty think block that history drops. */
	assert_false(joins_with(CHATML_TURNS "{% if add_generation_prompt %}<|im_start|>assistant\n"
	                                     "<think>\n\n</think>\n\n{% endif %}",
	                        req, &st));
	free(st.pos);
	free(st.kind);
	/* A template that refuses the probe's longer conversation. */
	assert_false(joins_with("{% if messages|length > 2 %}{{ raise_exception('two at most') }}"
	                        "{% endif %}" CHATML_TURNS
	                        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
	                        req, &st));
	free(st.pos);
	free(st.kind);
#undef CHATML_TURNS
}

static void test_step_regions(void **state)
{
	(void)state;
	struct prompt_engine_config cfg = {.model_path = spm_model.path};
	char err[256];
	struct prompt_engine *pe = prompt_engine_new(&cfg, err, sizeof err);
	if (!pe)
		fail_msg("engine: %s", err);
	token_t eos = vocab_eos(prompt_engine_vocab(pe));
	const char *text = "Hi</s>B:Once upon a time</s>C: more</s>B:";
	struct token_list t = {0};
	struct prompt_starts st = {0};
	size_t steps = step_starts(pe, text, "B:Once", "C: more", "B:", &t, &st);
	assert_true(st.header);
	/* The generation prompt: the last start to the end. */
	size_t g = st.pos[st.n - 1], h = t.n - g, a = st.pos[0];
	assert_memory_equal(t.v + a, t.v + g, h * sizeof *t.v);
	/* Steps from the answer's first token after that prompt to its end of
	 * turn, which starts the rest of the message. */
	size_t e = a + h;
	while (t.v[e] != eos)
		e++;
	assert_int_equal(steps, e - (a + h) + 1);
	assert_int_equal(st.pos[1], a + h);
	assert_int_equal(st.kind[1], SCHED_START_STEP);
	assert_int_equal(st.pos[steps], e);
	/* sched_chunks keeps every step: one-token chunks. */
	size_t n = sched_chunks(st.pos, st.kind, st.n);
	assert_int_equal(n, steps + 2);
	for (size_t i = 1; i < steps; i++)
		assert_int_equal(st.pos[i + 1] - st.pos[i], 1);
	free(st.pos);
	free(st.kind);
	token_list_free(&t);

	/* Where the prompt parts from the answer as generation wrote it: the
	 * steps end at the last token wholly before that byte, which starts
	 * the rest of the message; not a start itself. Inside a word: rounded
	 * down to the word's first token. */
	const char *at = strstr(text, "pon a time");
	st = (struct prompt_starts){0};
	steps =
	    step_starts_apart(pe, text, "B:Once", "C: more", "B:", (size_t)(at - text), &t, &st);
	assert_true(steps > 0);
	assert_true(steps < e - (a + h) + 1);
	assert_int_equal(st.n, steps + 3);
	size_t cut = st.pos[steps]; /* the last step: the rest of the message */
	struct token_list head = {0};
	assert_int_equal(prompt_engine_tokenize(pe, text, (size_t)(at - text), &head), 0);
	assert_true(cut <= head.n);
	assert_memory_equal(t.v, head.v, cut * sizeof *t.v);
	assert_true(cut == head.n || t.v[cut] != head.v[cut]);
	token_list_free(&head);
	free(st.pos);
	free(st.kind);
	token_list_free(&t);
	/* Right where generation began (a template that dropped the
	 * reasoning generation wrote there): one step, there, starting the
	 * whole message's text as one chunk; the header before it is kept. */
	st = (struct prompt_starts){0};
	at = strstr(text, "Once");
	assert_int_equal(
	    step_starts_apart(pe, text, "B:Once", "C: more", "B:", (size_t)(at - text), &t, &st),
	    1);
	assert_int_equal(st.n, 4);
	assert_int_equal(st.pos[1], a + h);
	free(st.pos);
	free(st.kind);
	token_list_free(&t);
	/* Inside the end of turn's text: rounded down to that token, the
	 * region's end anyway. */
	st = (struct prompt_starts){0};
	at = strstr(text, "</s>C:") + 2;
	assert_int_equal(
	    step_starts_apart(pe, text, "B:Once", "C: more", "B:", (size_t)(at - text), &t, &st),
	    e - (a + h) + 1);
	free(st.pos);
	free(st.kind);
	token_list_free(&t);

	/* The joined header: the step at the header's last token stands for
	 * the answer's start, and the prompt's last token is a step of its
	 * own, where the generation prompt's start was. Without steps
	 * (SCHED_START_PLAIN made an answer's start again), the starts are
	 * as without the join. */
	st = (struct prompt_starts){0};
	size_t jsteps =
	    step_starts_joined(pe, text, "B:Once", "C: more", "B:", SIZE_MAX, 1, &t, &st);
	assert_true(st.joins);
	assert_int_equal(jsteps, (e - (a + h) + 1) + 2);
	assert_int_equal(st.pos[0], a);
	assert_int_equal(st.kind[0], SCHED_START_PLAIN);
	assert_int_equal(st.pos[1], a + h - 1);
	assert_int_equal(st.kind[1], SCHED_START_STEP);
	assert_int_equal(st.pos[st.n - 2], g);
	assert_int_equal(st.kind[st.n - 2], SCHED_START_PLAIN);
	assert_int_equal(st.pos[st.n - 1], t.n - 1);
	assert_int_equal(st.kind[st.n - 1], SCHED_START_STEP);
	n = sched_chunks(st.pos, st.kind, st.n);
	assert_int_equal(n, jsteps);
	assert_int_equal(st.pos[0], a + h - 1);
	assert_int_equal(st.pos[n - 1], t.n - 1);
	free(st.pos);
	free(st.kind);
	token_list_free(&t);

	/* An answer that does not begin with this request's generation
	 * prompt: no steps (where its generation began is not known). */
	text = "Hi</s>Z:Once upon a time</s>C: more</s>B:";
	st = (struct prompt_starts){0};
	assert_int_equal(step_starts(pe, text, "Z:Once", "C: more", "B:", &t, &st), 0);
	assert_int_equal(st.n, 3);
	free(st.pos);
	free(st.kind);
	token_list_free(&t);
	prompt_engine_free(pe);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_strmap),
	    cmocka_unit_test(test_unicode_round_trip),
	    cmocka_unit_test(test_unicode_invalid),
	    cmocka_unit_test(test_unicode_flags),
	    cmocka_unit_test(test_pretokenizers),
	    cmocka_unit_test(test_bpe_merges_by_rank),
	    cmocka_unit_test(test_vocab_refusals),
	    cmocka_unit_test(test_sentencepiece),
	    cmocka_unit_test(test_fragment_cache),
	    cmocka_unit_test(test_step_regions),
	    cmocka_unit_test(test_joined_header_probe),
	};
	return cmocka_run_group_tests(tests, find_spm_model, remove_spm_model);
}
