/* A model's vocabulary, read from its GGUF file, and the tokenizers that turn
 * text into the same token ids as the llama-server serving that file.
 *
 * Why toki tokenizes at all: every chat request must be tokenized before it
 * can be routed, and asking llama-server costs two HTTP round trips
 * (/apply-template, /tokenize) on every request. Doing it here, exactly as
 * llama.cpp does, makes routing cost microseconds. "Exactly" is the hard
 * part, so this is a port of llama.cpp's behaviour, quirks included: its
 * special-token splitting (longest token first, with its rules for which
 * tokens count as special), SentencePiece merging by score, BPE merging by
 * rank over pre-tokenized words, byte fallback. Vocabularies it does not
 * implement (WordPiece, Unigram, RWKV, a pre-tokenizer not in the table) are
 * refused at load, and the caller asks the server instead; the prompt engine
 * (src/prompt/) also checks this tokenizer against the server's before and
 * while it uses it. */
#ifndef TOKI_TOKENIZER_VOCAB_H
#define TOKI_TOKENIZER_VOCAB_H

#include <stddef.h>
#include <stdint.h>

#include "router/radix.h" /* token_t */

struct gguf;
struct vocab;

enum vocab_kind { VOCAB_SPM = 1, VOCAB_BPE = 2 };

/* A growable list of tokens. All-zero is empty. */
struct token_list {
	token_t *v;
	size_t n, cap;
};
int token_list_push(struct token_list *l, token_t t);
int token_list_append(struct token_list *l, const token_t *t, size_t n);
void token_list_free(struct token_list *l);

/* A piece of text after special tokens are split out: either raw text
 * (text[off..off+len)) or one special token. */
struct fragment {
	size_t off, len;
	token_t token; /* -1 for raw text */
};
struct fragment_list {
	struct fragment *v;
	size_t n, cap;
};
void fragment_list_free(struct fragment_list *l);

/* Loads the vocabulary of an open GGUF. NULL with the reason in err when
 * the file has none, or one that toki does not tokenize itself. */
struct vocab *vocab_from_gguf(const struct gguf *g, char *err, size_t errlen);
void vocab_free(struct vocab *v);

enum vocab_kind vocab_kind(const struct vocab *v);
size_t vocab_size(const struct vocab *v);
/* The tokenizer.ggml.pre value ("" for SentencePiece). */
const char *vocab_pre(const struct vocab *v);
/* A token's text as stored (NULL for ids out of range). */
const char *vocab_token_text(const struct vocab *v, token_t id, size_t *len);
/* Whether the tokenizer splits it out of text as one token (parse_special). */
int vocab_token_is_special(const struct vocab *v, token_t id);
/* The first control token (or unknown one) of tok[from, to), or to: where
 * an answer's turn ends (exact mode's keep and its step regions agree on
 * it). A control token is what a template writes around messages (the end
 * of a turn, a role's header), never a word a model writes inside an
 * answer, as user-defined tokens (Qwen's <think>, <tool_call>) are. */
size_t vocab_find_control(const struct vocab *v, const token_t *tok, size_t from, size_t to);
token_t vocab_bos(const struct vocab *v); /* -1 when none */
token_t vocab_eos(const struct vocab *v);
int vocab_adds_bos(const struct vocab *v);
int vocab_adds_eos(const struct vocab *v);

/* Splits special tokens out of text, as llama.cpp's tokenizer_st_partition:
 * with parse_special, control, unknown and user-defined tokens; without,
 * user-defined ones only. Returns 0 or -1 (out of memory). */
int vocab_partition(const struct vocab *v, const char *text, size_t len, int parse_special,
                    struct fragment_list *out);
/* Tokenizes one raw-text fragment, appending to out. after_special: the
 * previous fragment was a special token, or this is the first (SentencePiece
 * then adds its leading space). Returns 0; -1 out of memory; -2 when the
 * server would fail on this text (a byte with no byte token, a code point
 * past U+10FFFF), which the caller must leave to the server. */
int vocab_tokenize_fragment(const struct vocab *v, const char *text, size_t len, int after_special,
                            struct token_list *out);
/* The whole of llama_tokenize(text, add_special, parse_special). Same
 * returns. */
int vocab_tokenize(const struct vocab *v, const char *text, size_t len, int add_special,
                   int parse_special, struct token_list *out);

#endif
