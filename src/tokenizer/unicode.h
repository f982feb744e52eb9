/* Unicode as llama.cpp's tokenizers see it: a code point's category flags
 * (\p{L}, \p{N}, ... and llama.cpp's White_Space list), and UTF-8 decoding
 * with llama.cpp's rules for broken input (each byte that does not start a
 * valid sequence becomes U+FFFD). The pre-tokenizers must classify exactly
 * as the server does, or a word splits differently and the tokens differ. */
#ifndef TOKI_TOKENIZER_UNICODE_H
#define TOKI_TOKENIZER_UNICODE_H

#include <stddef.h>
#include <stdint.h>

enum {
	UNICODE_UNDEFINED = 0x001,
	UNICODE_NUMBER = 0x002, /* \p{N} */
	UNICODE_LETTER = 0x004, /* \p{L} */
	UNICODE_SEPARATOR = 0x008,
	UNICODE_MARK = 0x010,	 /* \p{M} */
	UNICODE_PUNCT = 0x020,	 /* \p{P} */
	UNICODE_SYMBOL = 0x040, /* \p{S} */
	UNICODE_CONTROL = 0x080,
	UNICODE_CATEGORIES = 0x0FF,
	UNICODE_WHITESPACE = 0x100, /* \s */
};

struct unicode_run {
	uint32_t start;
	uint16_t flags;
};

/* Generated tables (unicode_data.c). */
extern const struct unicode_run unicode_runs[];
extern const size_t unicode_n_runs;
extern const uint16_t unicode_latin1[256];
extern const char unicode_data_version[];

/* The flags of a code point; past U+10FFFF, UNICODE_UNDEFINED. */
uint16_t unicode_flags(uint32_t cpt);

/* Decodes one code point at s[*pos] (len bytes in all) the way llama.cpp
 * does: an invalid or truncated sequence yields U+FFFD and consumes one
 * byte. Overlong forms and values past U+10FFFF are not rejected (llama.cpp
 * does not reject them either). */
uint32_t unicode_decode(const char *s, size_t len, size_t *pos);
/* Decodes a whole string into a new array (*n code points); NULL when out
 * of memory. */
uint32_t *unicode_decode_all(const char *s, size_t len, size_t *n);
/* Writes the UTF-8 form of cpt (at most 4 bytes) and returns its length;
 * 0 for values past U+10FFFF. */
size_t unicode_encode(uint32_t cpt, char out[4]);
/* Bytes in the sequence that the byte c starts, by its high bits (1 for
 * continuation bytes), as llama.cpp's unicode_len_utf8. */
size_t unicode_sequence_length(unsigned char c);

#endif
