/* BPE pre-tokenization: splitting text into the words that BPE merges never
 * cross, as llama.cpp does for each pre-tokenizer type (tokenizer.ggml.pre).
 *
 * llama.cpp applies a list of regular expressions in turn, each one splitting
 * the pieces the previous one left (text between matches is a piece too).
 * Two of its expressions (GPT-2's and Llama 3's) run as hand-written code;
 * the others run through std::regex, on a "collapsed" copy of the text in
 * which every code point above U+007F stands for its category (one byte per
 * code point), with \p{..} in the expression rewritten to match those bytes.
 * This module does the same: the two hand-written splitters are ported, and
 * the rest runs the same rewritten expressions through PCRE2 (32-bit code
 * units, no UTF mode, so that a unit is a code point or a collapsed byte, as
 * in std::regex). */
#ifndef TOKI_TOKENIZER_PRETOKENIZE_H
#define TOKI_TOKENIZER_PRETOKENIZE_H

#include <stddef.h>
#include <stdint.h>

/* What a pre-tokenizer type implies for the rest of the tokenizer. */
struct pretokenizer_type {
	const char *names;	  /* the tokenizer.ggml.pre values, '|'-separated */
	const char *const *exprs; /* NULL-terminated */
	unsigned ignore_merges : 1; /* a word that is a token is taken whole */
	unsigned add_bos : 1;	    /* the default for add_bos_token */
	unsigned no_bos : 1;	    /* the type clears the BOS id (chatglm) */
	unsigned escape_whitespace : 1; /* ' ' becomes U+2581 before BPE */
	unsigned raw_utf8 : 1;	       /* words are not byte-level encoded */
	unsigned newline_words : 1;    /* a newline-only word that is a token is taken whole */
};

/* The type llama.cpp selects for a tokenizer.ggml.pre value ("" and NULL:
 * "default"), or NULL when toki does not implement it. */
const struct pretokenizer_type *pretokenizer_type_find(const char *pre);

struct pretokenizer;

struct pretokenizer *pretokenizer_new(const struct pretokenizer_type *t, char *err, size_t errlen);
void pretokenizer_free(struct pretokenizer *p);

/* Called for each word, in order; the word is in BPE's alphabet (each byte
 * mapped to a code point, as GPT-2's bytes_to_unicode) unless the type uses
 * raw UTF-8. Return non-zero to stop. */
typedef int (*pretokenizer_word_fn)(const char *word, size_t len, void *arg);

/* Splits text. Returns 0; -1 when out of memory or a callback stopped; -2
 * when the text holds a code point that llama.cpp cannot write back as
 * UTF-8 (past U+10FFFF), where the server throws rather than tokenizes. */
int pretokenizer_split(const struct pretokenizer *p, const char *text, size_t len,
		       pretokenizer_word_fn fn, void *arg);

#endif
