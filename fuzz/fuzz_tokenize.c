/* The tokenizers (src/tokenizer/): the text of every request toki routes
 * goes through them. Two vocabularies built in memory: a byte-level BPE one
 * (every byte a token, a few merges, control and user-defined tokens),
 * run under the pre-tokenizer type the first input byte picks, and a
 * SentencePiece one with byte fallback. The rest of the input is the text.
 *
 * Checked: the call returns 0 (or -2 where llama-server would throw), ids
 * are in range, and for valid UTF-8 the tokens spell the text exactly
 * (BPE: each token's byte-level text mapped back to bytes; SentencePiece:
 * U+2581 back to spaces, <0xXX> back to bytes, the leading space it adds
 * taken off). */
#include <stdint.h>
#include <string.h>

#include "fuzz_common.h"
#include "model/gguf.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab.h"

static const char *const pre_names[] = {
    "default", "llama3",     "dbrx",       "chatglm-bpe", "deepseek-coder", "deepseek-v3",
    "falcon",  "starcoder",  "gpt-2",      "qwen2",       "qwen35",         "tekken",
    "gpt-4o",  "seed-coder", "bailingmoe", "minicpm5",
};
#define N_PRE (sizeof pre_names / sizeof pre_names[0])

static const char *const specials[] = {"<s>", "</s>", "<|im_start|>", "<|im_end|>", "<tool>"};
static const char *const merges[] = {"\xc4\xa0 t", "h e", "t h", "\xc4\xa0t h",      "i n", "e r",
                                     "\xc4\xa0 a", "o n", "r e", "\xc4\xa0 \xc4\xa0"};

struct buf {
	uint8_t *p;
	size_t len, cap;
};

static void put(struct buf *b, const void *d, size_t n)
{
	if (b->len + n > b->cap) {
		b->cap = (b->len + n) * 2;
		b->p = realloc(b->p, b->cap);
		FUZZ_CHECK(b->p);
	}
	memcpy(b->p + b->len, d, n);
	b->len += n;
}
static void put_u32(struct buf *b, uint32_t v)
{
	put(b, &v, 4);
}
static void put_u64(struct buf *b, uint64_t v)
{
	put(b, &v, 8);
}
static void put_str(struct buf *b, const char *s, size_t n)
{
	put_u64(b, n);
	put(b, s, n);
}
static void put_key(struct buf *b, const char *k, uint32_t type)
{
	put_str(b, k, strlen(k));
	put_u32(b, type);
}

/* GPT-2's bytes_to_unicode: byte -> code point. */
static uint32_t byte_cpt[256];
static int cpt_byte(uint32_t c)
{
	for (int i = 0; i < 256; i++)
		if (byte_cpt[i] == c)
			return i;
	return -1;
}

static void init_byte_map(void)
{
	int n = 0;
	for (int b = 0; b < 256; b++) {
		if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE))
			byte_cpt[b] = (uint32_t)b;
		else
			byte_cpt[b] = 256 + (uint32_t)n++;
	}
}

/* tokens: specials, the 256 byte symbols, the merge results. */
static struct vocab *bpe_vocab(const char *pre)
{
	const char *toks[5 + 256 + 16];
	char bytes[256][5];
	char merged[16][16];
	int32_t types[5 + 256 + 16];
	size_t n = 0;
	for (size_t i = 0; i < 5; i++) {
		types[n] = i == 4 ? 4 : 3; /* user-defined, control */
		toks[n++] = specials[i];
	}
	for (int b = 0; b < 256; b++) {
		size_t l = unicode_encode(byte_cpt[b], bytes[b]);
		bytes[b][l] = 0;
		types[n] = 1;
		toks[n++] = bytes[b];
	}
	size_t n_merges = sizeof merges / sizeof merges[0];
	for (size_t i = 0; i < n_merges; i++) {
		const char *sp = strchr(merges[i], ' ');
		snprintf(merged[i], sizeof merged[i], "%.*s%s", (int)(sp - merges[i]), merges[i],
		         sp + 1);
		types[n] = 1;
		toks[n++] = merged[i];
	}
	struct buf b = {0};
	put(&b, "GGUF", 4);
	put_u32(&b, 3);
	put_u64(&b, 0);
	put_u64(&b, 7);
	put_key(&b, "general.architecture", GGUF_TYPE_STRING);
	put_str(&b, "llama", 5);
	put_key(&b, "tokenizer.ggml.model", GGUF_TYPE_STRING);
	put_str(&b, "gpt2", 4);
	put_key(&b, "tokenizer.ggml.pre", GGUF_TYPE_STRING);
	put_str(&b, pre, strlen(pre));
	put_key(&b, "tokenizer.ggml.tokens", GGUF_TYPE_ARRAY);
	put_u32(&b, GGUF_TYPE_STRING);
	put_u64(&b, n);
	for (size_t i = 0; i < n; i++)
		put_str(&b, toks[i], strlen(toks[i]));
	put_key(&b, "tokenizer.ggml.token_type", GGUF_TYPE_ARRAY);
	put_u32(&b, GGUF_TYPE_INT32);
	put_u64(&b, n);
	for (size_t i = 0; i < n; i++)
		put_u32(&b, (uint32_t)types[i]);
	put_key(&b, "tokenizer.ggml.merges", GGUF_TYPE_ARRAY);
	put_u32(&b, GGUF_TYPE_STRING);
	put_u64(&b, n_merges);
	for (size_t i = 0; i < n_merges; i++)
		put_str(&b, merges[i], strlen(merges[i]));
	put_key(&b, "tokenizer.ggml.bos_token_id", GGUF_TYPE_UINT32);
	put_u32(&b, 0);
	struct gguf_error gerr;
	struct gguf *g = gguf_open_memory(b.p, b.len, &gerr);
	FUZZ_CHECK(g);
	char err[256];
	struct vocab *v = vocab_from_gguf(g, err, sizeof err);
	if (!v)
		fprintf(stderr, "fuzz_tokenize: %s: %s\n", pre, err);
	FUZZ_CHECK(v);
	gguf_close(g);
	free(b.p);
	return v;
}

/* <unk>, <s>, </s>, <0x00>..<0xFF>, then pieces with scores. */
static struct vocab *spm_vocab(void)
{
	static const char *const pieces[] = {"\xe2\x96\x81",
	                                     "\xe2\x96\x81"
	                                     "t",
	                                     "he",
	                                     "\xe2\x96\x81"
	                                     "the",
	                                     "in",
	                                     "er",
	                                     "\xe2\x96\x81"
	                                     "a",
	                                     "on",
	                                     "e",
	                                     "t",
	                                     "h",
	                                     "a"};
	size_t n_pieces = sizeof pieces / sizeof pieces[0];
	size_t n = 3 + 256 + n_pieces;
	struct buf b = {0};
	put(&b, "GGUF", 4);
	put_u32(&b, 3);
	put_u64(&b, 0);
	put_u64(&b, 5);
	put_key(&b, "general.architecture", GGUF_TYPE_STRING);
	put_str(&b, "llama", 5);
	put_key(&b, "tokenizer.ggml.model", GGUF_TYPE_STRING);
	put_str(&b, "llama", 5);
	put_key(&b, "tokenizer.ggml.tokens", GGUF_TYPE_ARRAY);
	put_u32(&b, GGUF_TYPE_STRING);
	put_u64(&b, n);
	put_str(&b, "<unk>", 5);
	put_str(&b, "<s>", 3);
	put_str(&b, "</s>", 4);
	for (int i = 0; i < 256; i++) {
		char t[8];
		snprintf(t, sizeof t, "<0x%02X>", i);
		put_str(&b, t, 6);
	}
	for (size_t i = 0; i < n_pieces; i++)
		put_str(&b, pieces[i], strlen(pieces[i]));
	put_key(&b, "tokenizer.ggml.scores", GGUF_TYPE_ARRAY);
	put_u32(&b, GGUF_TYPE_FLOAT32);
	put_u64(&b, n);
	for (size_t i = 0; i < n; i++) {
		float s = i < 259 ? 0.0f : -(float)(i - 259);
		uint32_t u;
		memcpy(&u, &s, 4);
		put_u32(&b, u);
	}
	put_key(&b, "tokenizer.ggml.token_type", GGUF_TYPE_ARRAY);
	put_u32(&b, GGUF_TYPE_INT32);
	put_u64(&b, n);
	for (size_t i = 0; i < n; i++)
		put_u32(&b, i == 0 ? 2 : i < 3 ? 3 : i < 259 ? 6 : 1);
	struct gguf_error gerr;
	struct gguf *g = gguf_open_memory(b.p, b.len, &gerr);
	FUZZ_CHECK(g);
	char err[256];
	struct vocab *v = vocab_from_gguf(g, err, sizeof err);
	if (!v)
		fprintf(stderr, "fuzz_tokenize: spm: %s\n", err);
	FUZZ_CHECK(v);
	gguf_close(g);
	free(b.p);
	return v;
}

static struct vocab *bpe[N_PRE], *spm;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	init_byte_map();
	for (size_t i = 0; i < N_PRE; i++)
		bpe[i] = bpe_vocab(pre_names[i]);
	spm = spm_vocab();
	return 0;
}

static int valid_utf8(const char *s, size_t n)
{
	for (size_t pos = 0; pos < n;) {
		size_t at = pos;
		uint32_t c = unicode_decode(s, n, &pos);
		if (c == 0xFFFD && !(pos - at == 3 && !memcmp(s + at, "\xef\xbf\xbd", 3)))
			return 0;
		if ((c >= 0xD800 && c <= 0xDFFF) || c > 0x10FFFF)
			return 0;
		/* Overlong forms decode too; llama.cpp keeps their value. */
		char back[4];
		if (unicode_encode(c, back) != pos - at)
			return 0;
	}
	return 1;
}

/* The bytes BPE tokens spell (specials as their text). */
static size_t spell_bpe(const struct vocab *v, const struct token_list *t, char *out, size_t cap)
{
	size_t k = 0;
	for (size_t i = 0; i < t->n; i++) {
		size_t len;
		const char *s = vocab_token_text(v, t->v[i], &len);
		FUZZ_CHECK(s);
		if (vocab_token_is_special(v, t->v[i])) {
			FUZZ_CHECK(k + len <= cap);
			memcpy(out + k, s, len);
			k += len;
			continue;
		}
		for (size_t pos = 0; pos < len;) {
			int b = cpt_byte(unicode_decode(s, len, &pos));
			FUZZ_CHECK(b >= 0 && k < cap);
			out[k++] = (char)b;
		}
	}
	return k;
}

static size_t spell_spm(const struct vocab *v, const struct token_list *t, char *out, size_t cap)
{
	size_t k = 0;
	for (size_t i = 0; i < t->n; i++) {
		size_t len;
		const char *s = vocab_token_text(v, t->v[i], &len);
		FUZZ_CHECK(s);
		unsigned x;
		if (len == 6 && sscanf(s, "<0x%2X>", &x) == 1 &&
		    !vocab_token_is_special(v, t->v[i])) {
			FUZZ_CHECK(k < cap);
			out[k++] = (char)x;
			continue;
		}
		for (size_t j = 0; j < len; j++) {
			FUZZ_CHECK(k < cap);
			if (j + 3 <= len && !memcmp(s + j, "\xe2\x96\x81", 3)) {
				out[k++] = ' ';
				j += 2;
			} else {
				out[k++] = s[j];
			}
		}
	}
	return k;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	const char *text = (const char *)data + 1;
	size_t n = size - 1;
	int parse_special = data[0] & 0x80;
	size_t cap = 4 * n + 64;
	char *spelled = malloc(cap);
	FUZZ_CHECK(spelled);
	int valid = valid_utf8(text, n);

	const struct vocab *v = bpe[(data[0] & 0x7F) % N_PRE];
	struct token_list t = {0};
	int rc = vocab_tokenize(v, text, n, 0, parse_special, &t);
	FUZZ_CHECK(rc == 0 || rc == -2);
	for (size_t i = 0; i < t.n; i++)
		FUZZ_CHECK(t.v[i] >= 0 && (size_t)t.v[i] < vocab_size(v));
	if (rc == 0 && valid) {
		size_t k = spell_bpe(v, &t, spelled, cap);
		FUZZ_CHECK(k == n && !memcmp(spelled, text, n));
	}
	token_list_free(&t);

	struct token_list s = {0};
	rc = vocab_tokenize(spm, text, n, 0, parse_special, &s);
	FUZZ_CHECK(rc == 0 || rc == -2);
	for (size_t i = 0; i < s.n; i++)
		FUZZ_CHECK(s.v[i] >= 0 && (size_t)s.v[i] < vocab_size(spm));
	/* A U+2581 in the text spells as a space: SentencePiece cannot tell. */
	if (rc == 0 && valid && !parse_special && n && !memmem(text, n, "\xe2\x96\x81", 3)) {
		size_t k = spell_spm(spm, &s, spelled, cap);
		/* add_space_prefix: one space in front. */
		FUZZ_CHECK(k == n + 1 && spelled[0] == ' ' && !memcmp(spelled + 1, text, n));
	}
	token_list_free(&s);
	free(spelled);
	return 0;
}
