/* Writer of random-weight llama GGUF models for tests and benchmarks.
 *
 * The file is self-contained: a SentencePiece-style ("llama") vocabulary with
 * byte fallback and a ChatML template are generated here, so llama-server
 * loads it with no tokenizer file. Weights come from a seeded splitmix64
 * stream and are exact multiples of 2^-28 (no float rounding anywhere before
 * the integer f16 conversion), so the same seed gives the same bytes on every
 * machine. Tensor data is streamed in chunks; memory does not grow with the
 * model.
 */
#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "platform/platform.h"
#include "util/err.h"
#include "util/grow.h"

/* --- Vocabulary ---------------------------------------------------------- */

/* SentencePiece marks a word boundary (a space) with U+2581. */
#define SPM_SPACE "\xe2\x96\x81"

/* Token types, as llama.cpp numbers them (llama_token_type). */
enum {
	TOK_NORMAL = 1,
	TOK_UNKNOWN = 2,
	TOK_CONTROL = 3,
	TOK_BYTE = 6,
};

/* Common English words, most frequent first; each becomes "▁word". Lower-case
 * and a few capitalised forms that start sentences. */
static const char *const words[] = {
    "the",       "of",       "and",      "to",       "a",       "in",       "is",        "it",
    "you",       "that",     "he",       "was",      "for",     "on",       "are",       "with",
    "as",        "I",        "his",      "they",     "be",      "at",       "one",       "have",
    "this",      "from",     "or",       "had",      "by",      "not",      "word",      "but",
    "what",      "some",     "we",       "can",      "out",     "other",    "were",      "all",
    "there",     "when",     "up",       "use",      "your",    "how",      "said",      "an",
    "each",      "she",      "which",    "do",       "their",   "time",     "if",        "will",
    "way",       "about",    "many",     "then",     "them",    "write",    "would",     "like",
    "so",        "these",    "her",      "long",     "make",    "thing",    "see",       "him",
    "two",       "has",      "look",     "more",     "day",     "could",    "go",        "come",
    "did",       "number",   "sound",    "no",       "most",    "people",   "my",        "over",
    "know",      "water",    "than",     "call",     "first",   "who",      "may",       "down",
    "side",      "been",     "now",      "find",     "any",     "new",      "work",      "part",
    "take",      "get",      "place",    "made",     "live",    "where",    "after",     "back",
    "little",    "only",     "round",    "man",      "year",    "came",     "show",      "every",
    "good",      "me",       "give",     "our",      "under",   "name",     "very",      "through",
    "just",      "form",     "sentence", "great",    "think",   "say",      "help",      "low",
    "line",      "differ",   "turn",     "cause",    "much",    "mean",     "before",    "move",
    "right",     "boy",      "old",      "too",      "same",    "tell",     "does",      "set",
    "three",     "want",     "air",      "well",     "also",    "play",     "small",     "end",
    "put",       "home",     "read",     "hand",     "port",    "large",    "spell",     "add",
    "even",      "land",     "here",     "must",     "big",     "high",     "such",      "follow",
    "act",       "why",      "ask",      "men",      "change",  "went",     "light",     "kind",
    "off",       "need",     "house",    "picture",  "try",     "us",       "again",     "animal",
    "point",     "mother",   "world",    "near",     "build",   "self",     "earth",     "father",
    "head",      "stand",    "own",      "page",     "should",  "country",  "found",     "answer",
    "school",    "grow",     "study",    "still",    "learn",   "plant",    "cover",     "food",
    "sun",       "four",     "between",  "state",    "keep",    "eye",      "never",     "last",
    "let",       "thought",  "city",     "tree",     "cross",   "farm",     "hard",      "start",
    "might",     "story",    "saw",      "far",      "sea",     "draw",     "left",      "late",
    "run",       "while",    "press",    "close",    "night",   "real",     "life",      "few",
    "north",     "open",     "seem",     "together", "next",    "white",    "children",  "begin",
    "got",       "walk",     "example",  "ease",     "paper",   "group",    "always",    "music",
    "those",     "both",     "mark",     "often",    "letter",  "until",    "mile",      "river",
    "car",       "feet",     "care",     "second",   "book",    "carry",    "took",      "science",
    "eat",       "room",     "friend",   "began",    "idea",    "fish",     "mountain",  "stop",
    "once",      "base",     "hear",     "horse",    "cut",     "sure",     "watch",     "color",
    "face",      "wood",     "main",     "enough",   "plain",   "girl",     "usual",     "young",
    "ready",     "above",    "ever",     "red",      "list",    "though",   "feel",      "talk",
    "bird",      "soon",     "body",     "dog",      "family",  "direct",   "pose",      "leave",
    "song",      "measure",  "door",     "product",  "black",   "short",    "numeral",   "class",
    "wind",      "question", "happen",   "complete", "ship",    "area",     "half",      "rock",
    "order",     "fire",     "south",    "problem",  "piece",   "told",     "knew",      "pass",
    "since",     "top",      "whole",    "king",     "space",   "heard",    "best",      "hour",
    "better",    "true",     "during",   "hundred",  "five",    "remember", "step",      "early",
    "hold",      "west",     "ground",   "interest", "reach",   "fast",     "verb",      "sing",
    "listen",    "six",      "table",    "travel",   "less",    "morning",  "ten",       "simple",
    "several",   "toward",   "war",      "lay",      "against", "pattern",  "slow",      "center",
    "love",      "person",   "money",    "serve",    "appear",  "road",     "map",       "rain",
    "rule",      "govern",   "pull",     "cold",     "notice",  "voice",    "energy",    "hunt",
    "probable",  "bed",      "brother",  "egg",      "ride",    "cell",     "believe",   "perhaps",
    "pick",      "sudden",   "count",    "square",   "reason",  "length",   "represent", "art",
    "subject",   "region",   "size",     "vary",     "settle",  "speak",    "weight",    "general",
    "ice",       "matter",   "circle",   "pair",     "include", "divide",   "feel",      "cat",
    "hello",     "yes",      "code",     "file",     "model",   "data",     "system",    "user",
    "assistant", "tool",     "function", "value",    "return",  "test",     "error",     "The",
    "A",         "In",       "It",       "He",       "She",     "They",     "We",        "You",
    "This",      "That",     "What",     "How",      "Hello",   "If",       "And",       "But",
    "There",     "When",     "My",       "Once",     "One",
};

/* Word endings and pieces that appear inside words (no "▁"). */
static const char *const subwords[] = {
    "ing",  "ed",   "er",
    "ly",   "tion", "es",
    "est",  "ment", "ness",
    "able", "ful",  "less",
    "ous",  "ive",  "al",
    "ity",  "ion",  "ers",
    "ings", "ies",  "ied",
    "'s",   "'t",   "'re",
    "'ll",  "'ve",  "n't",
    "th",   "he",   "in",
    "an",   "re",   "on",
    "at",   "en",   "nd",
    "ti",   "te",   "or",
    "ar",   "st",   "nt",
    "to",   "it",   "is",
    "ou",   "ea",   "hi",
    "se",   "ng",   "ve",
    "le",   "co",   "me",
    "de",   "ri",   "ro",
    "ic",   "ne",   "ra",
    "ce",   "li",   "ch",
    "ll",   "be",   "ma",
    "si",   "om",   "ur",
    "ca",   "el",   "ta",
    "la",   "ns",   "di",
    "fo",   "ho",   "pe",
    "ec",   "pr",   "no",
    "ct",   "us",   "ac",
    "ot",   "il",   "tr",
    "ly",   "nc",   "et",
    "ut",   "ss",   "so",
    "rs",   "un",   "lo",
    "wa",   "ge",   "ie",
    "wh",   "ee",   "wi",
    "em",   "ad",   "ol",
    "rt",   "po",   "we",
    "na",   "ul",   "ni",
    "ts",   "mo",   "ow",
    "pa",   "im",   "mi",
    "ai",   "sh",   "ir",
    "su",   "id",   "os",
    "iv",   "ia",   "am",
    "fi",   "ci",   "vi",
    "pl",   "ig",   "tu",
    "ev",   "ld",   "ry",
    "mp",   "fe",   "bl",
    "ab",   "gh",   "ty",
    "op",   "wo",   "sa",
    "ay",   "ex",   "ke",
    "fr",   "oo",   "av",
    "ag",   "if",   "ap",
    "gr",   "od",   "bo",
    "sp",   "rd",   "do",
    "uc",   "bu",   "ei",
    "ov",   "by",   "rm",
    "ep",   "tt",   "oc",
    "fa",   "ef",   "cu",
    "rn",   "sc",   "gi",
    "da",   "yo",   "cr",
    "cl",   "du",   "ga",
    "qu",   "ue",   "ff",
    "ba",   "ey",   "ls",
    "va",   "um",   "pp",
    "ua",   "up",   "lu",
    "go",   "ht",   "ru",
    "ug",   "ds",   "lt",
    "pi",   "rc",   "rr",
    "eg",   "au",   "ck",
    "ew",   "mu",   "br",
    "bi",   "pt",   "ak",
    "pu",   "ui",   "rg",
    "ib",   "tl",   "ny",
    "ki",   "rk",   "ys",
    "ob",   "mm",   "fu",
    "ph",   "og",   "ms",
    "ye",   "ud",   "mb",
    "ip",   "ub",   "oi",
    "rl",   "gu",   "dr",
    "hr",   "cc",   "tw",
    "ft",   "wn",   "nu",
    "af",   "hu",   "nn",
    "eo",   "vo",   "rv",
    "nf",   "xp",   "gn",
    "sm",   "fl",   "iz",
    "ok",   "nl",   "my",
    "gl",   "aw",   "ju",
    "oa",   "eq",   "sy",
    "sl",   "ps",   "jo",
    "ff",   "ey",   "\xe2\x80\x99s", /* "’s" */
    "...",  "--",   "\".",
    ".\"",  "),",   "();",
    "{}",   "[]",   "==",
    "->",   "//",   "/*",
    "*/",   "\\n",
};

/* How many of the most frequent words also get a form without "▁". */
#define BARE_WORDS 120

struct vocab {
	char **text; /* owned: each a malloc'd NUL-terminated string */
	float *score;
	int32_t *type;
	uint32_t n;
	uint32_t cap;
};

static void vocab_free(struct vocab *v)
{
	for (uint32_t i = 0; i < v->n; i++)
		free(v->text[i]);
	free(v->text);
	free(v->score);
	free(v->type);
	memset(v, 0, sizeof(*v));
}

static bool vocab_has(const struct vocab *v, const char *s, size_t len)
{
	/* Linear: the vocabulary is about a thousand short pieces and built once. */
	for (uint32_t i = 0; i < v->n; i++)
		if (strlen(v->text[i]) == len && !memcmp(v->text[i], s, len))
			return true;
	return false;
}

/* Number of UTF-8 code points; SPM scores are per piece, and "▁" counts as
 * one character like any letter. */
static size_t utf8_len(const char *s, size_t n)
{
	size_t c = 0;
	for (size_t i = 0; i < n; i++)
		if (((unsigned char)s[i] & 0xc0) != 0x80)
			c++;
	return c;
}

static bool vocab_add(struct vocab *v, const char *s, size_t len, float score, int32_t type)
{
	if (vocab_has(v, s, len))
		return true;
	if (v->n == v->cap) {
		uint32_t ncap = v->cap ? v->cap * 2 : 1024;
		char **t = realloc(v->text, ncap * sizeof(*t));
		if (!t)
			return false;
		v->text = t;
		float *sc = realloc(v->score, ncap * sizeof(*sc));
		if (!sc)
			return false;
		v->score = sc;
		int32_t *ty = realloc(v->type, ncap * sizeof(*ty));
		if (!ty)
			return false;
		v->type = ty;
		v->cap = ncap;
	}
	char *copy = malloc(len + 1);
	if (!copy)
		return false;
	memcpy(copy, s, len);
	copy[len] = '\0';
	v->text[v->n] = copy;
	v->score[v->n] = score;
	v->type[v->n] = type;
	v->n++;
	return true;
}

/* Adds a piece and every prefix of it of at least min_chars characters.
 * llama.cpp's SPM tokenizer only merges two adjacent pieces whose
 * concatenation is itself in the vocabulary, so a word is reachable only if
 * a chain of its prefixes is. Scores grow with length (the highest-scoring
 * merge goes first), so the chain from a word's start wins over short pieces
 * inside it. */
static bool vocab_add_with_prefixes(struct vocab *v, const char *piece, size_t min_chars)
{
	size_t n = strlen(piece);
	for (size_t end = 1; end <= n; end++) {
		/* Only cut at code point boundaries. */
		if (end < n && ((unsigned char)piece[end] & 0xc0) == 0x80)
			continue;
		size_t chars = utf8_len(piece, end);
		if (chars < min_chars)
			continue;
		if (!vocab_add(v, piece, end, (float)chars, TOK_NORMAL))
			return false;
	}
	return true;
}

static bool vocab_build(struct vocab *v)
{
	static const char *const specials[] = {"<unk>", "<s>", "</s>", "<|im_start|>",
	                                       "<|im_end|>"};
	static const int32_t special_types[] = {TOK_UNKNOWN, TOK_CONTROL, TOK_CONTROL, TOK_CONTROL,
	                                        TOK_CONTROL};
	memset(v, 0, sizeof(*v));
	for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++)
		if (!vocab_add(v, specials[i], strlen(specials[i]), 0.0f, special_types[i]))
			goto oom;
	/* Byte fallback: llama.cpp looks these up as "<0x%02X>". */
	for (unsigned b = 0; b < 256; b++) {
		char s[8];
		snprintf(s, sizeof s, "<0x%02X>", b);
		if (!vocab_add(v, s, strlen(s), 0.0f, TOK_BYTE))
			goto oom;
	}
	if (!vocab_add(v, SPM_SPACE, strlen(SPM_SPACE), 1.0f, TOK_NORMAL))
		goto oom;
	for (char c = '!'; c <= '~'; c++)
		if (!vocab_add(v, &c, 1, 1.0f, TOK_NORMAL))
			goto oom;
	for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
		char piece[64];
		snprintf(piece, sizeof piece, SPM_SPACE "%s", words[i]);
		if (!vocab_add_with_prefixes(v, piece, 2))
			goto oom;
	}
	/* Without the space prefix (see add_space_prefix below) a word at the
	 * start of a text or after a newline or special token has no "▁": give
	 * the most frequent words, every capitalised one and the ChatML roles a
	 * bare form too. */
	for (size_t i = 0; i < sizeof words / sizeof words[0]; i++) {
		const char *w = words[i];
		bool role = !strcmp(w, "system") || !strcmp(w, "user") || !strcmp(w, "assistant") ||
		            !strcmp(w, "tool");
		if (i < BARE_WORDS || (w[0] >= 'A' && w[0] <= 'Z') || role)
			if (!vocab_add_with_prefixes(v, w, 2))
				goto oom;
	}
	for (size_t i = 0; i < sizeof subwords / sizeof subwords[0]; i++)
		if (!vocab_add_with_prefixes(v, subwords[i], 2))
			goto oom;
	return true;
oom:
	vocab_free(v);
	return false;
}

uint32_t gguf_gen_vocab_size(void)
{
	/* Built once; atomic because any thread may ask first. */
	static _Atomic uint32_t cached;
	if (!cached) {
		struct vocab v;
		if (!vocab_build(&v))
			return 0;
		cached = v.n;
		vocab_free(&v);
	}
	return cached;
}

static const char chatml_template[] =
    "{% for message in messages %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/* --- Parameters ---------------------------------------------------------- */

#define HEAD_DIM 64u
#define MAX_EMBD 65536u
#define MAX_LAYERS 1024u
#define MAX_FF (1u << 20)
#define MAX_HEADS 1024u
#define MAX_CTX (1u << 24)

void gguf_gen_params_default(struct gguf_gen_params *p)
{
	memset(p, 0, sizeof(*p));
	p->context_length = 32768;
	p->seed = 1;
	p->weight_type = GGML_TYPE_F16;
	p->sliding_window = 128;
	gguf_gen_params_for_size(p, 24000000, NULL, 0);
}

bool gguf_parse_param_count(const char *s, uint64_t *out)
{
	if (!s || !*s)
		return false;
	errno = 0;
	char *end;
	double v = strtod(s, &end);
	if (end == s || errno != 0 || !(v > 0))
		return false;
	double mult = 1;
	if (*end) {
		switch (*end) {
		case 'k':
		case 'K':
			mult = 1e3;
			break;
		case 'm':
		case 'M':
			mult = 1e6;
			break;
		case 'b':
		case 'B':
		case 'g':
		case 'G':
			mult = 1e9;
			break;
		case 't':
		case 'T':
			mult = 1e12;
			break;
		default:
			return false;
		}
		end++;
	}
	if (*end)
		return false;
	v *= mult;
	if (!(v >= 1) || v > 1e15)
		return false;
	*out = (uint64_t)llround(v);
	return true;
}

static uint64_t plan_param_count(const struct gguf_gen_params *p, uint32_t n_vocab);

uint64_t gguf_gen_param_count(const struct gguf_gen_params *p)
{
	uint64_t v = p->vocab ? p->vocab->n : gguf_gen_vocab_size();
	if (!p->n_head || !p->n_head_kv)
		return 0;
	/* What the writer writes: every tensor's elements. */
	return plan_param_count(p, (uint32_t)v);
}

static const char *const arch_names[] = {
    [GGUF_GEN_ARCH_LLAMA] = "llama",         [GGUF_GEN_ARCH_QWEN35] = "qwen35",
    [GGUF_GEN_ARCH_GEMMA3] = "gemma3",       [GGUF_GEN_ARCH_GPT_OSS] = "gpt-oss",
    [GGUF_GEN_ARCH_QWEN35MOE] = "qwen35moe",
};

const char *gguf_gen_arch_name(enum gguf_gen_arch a)
{
	return (unsigned)a < sizeof arch_names / sizeof arch_names[0] ? arch_names[a] : "llama";
}

bool gguf_gen_arch_parse(const char *s, enum gguf_gen_arch *out)
{
	for (size_t i = 0; s && i < sizeof arch_names / sizeof arch_names[0]; i++)
		if (!strcmp(s, arch_names[i])) {
			*out = (enum gguf_gen_arch)i;
			return true;
		}
	return false;
}

/* Layers a well-proportioned model of width n_embd has: about n_embd / 64 up
 * to 16 layers at 1024, then slower (llama 7B: 4096 wide, 32 layers). */
static double ideal_layers(uint32_t n_embd)
{
	double w = n_embd;
	return w <= 1024 ? (w / 64 < 2 ? 2 : w / 64) : 16 * sqrt(w / 1024);
}

static void shape_for_width(struct gguf_gen_params *p, uint32_t e)
{
	p->n_embd = e;
	p->n_head = e / HEAD_DIM;
	/* Grouped-query attention 4:1 where the heads divide, as in recent
	 * llama models; it makes the KV cache per token realistic too. */
	p->n_head_kv = p->n_head % 4 == 0 ? p->n_head / 4 : p->n_head;
	uint32_t ff = (uint32_t)((8ull * e / 3 + 63) / 64 * 64);
	p->n_ff = ff;
}

/* Widths tried: multiples of 64 up to 192, then of 256, so that from 256 up
 * the head count is a multiple of 4 and grouped-query attention applies. */
static uint32_t next_width(uint32_t e)
{
	return e < 256 ? e + 64 : e + 256;
}

bool gguf_gen_params_for_size(struct gguf_gen_params *p, uint64_t n_params, char *err,
                              size_t errlen)
{
	double best_cost = INFINITY;
	struct gguf_gen_params best = *p;
	for (uint32_t e = 64; e <= 16384; e = next_width(e)) {
		struct gguf_gen_params c = *p;
		shape_for_width(&c, e);
		c.n_layers = 0;
		uint64_t base = gguf_gen_param_count(&c);
		c.n_layers = 1;
		uint64_t per_layer = gguf_gen_param_count(&c) - base;
		if (base >= n_params)
			break; /* wider only gets bigger */
		uint64_t l = (n_params - base + per_layer / 2) / per_layer;
		if (l < 1)
			l = 1;
		if (l > MAX_LAYERS)
			continue;
		c.n_layers = (uint32_t)l;
		double total = (double)gguf_gen_param_count(&c);
		/* Close to the target count first, then a sensible depth/width. */
		double cost = 4 * fabs(log(total / (double)n_params)) +
		              fabs(log((double)l / ideal_layers(e)));
		if (cost < best_cost) {
			best_cost = cost;
			best = c;
		}
	}
	if (!isfinite(best_cost)) {
		struct gguf_gen_params smallest = *p;
		shape_for_width(&smallest, 64);
		smallest.n_layers = 1;
		uint64_t min = gguf_gen_param_count(&smallest);
		/* The embedding and output matrices dominate a small model, so
		 * the floor is the vocabulary's: name the one that set it. */
		char vocab_name[64];
		if (p->vocab)
			snprintf(vocab_name, sizeof vocab_name,
			         "this vocabulary (%" PRIu32 " tokens)", p->vocab->n);
		else
			snprintf(vocab_name, sizeof vocab_name, "the built-in vocabulary");
		if (n_params < min)
			err_set(err, errlen,
			        "%" PRIu64
			        " parameters is too small: the smallest model with %s has "
			        "%" PRIu64,
			        n_params, vocab_name, min);
		else
			err_set(err, errlen,
			        "%" PRIu64 " parameters is more than this generator supports",
			        n_params);
		return false;
	}
	*p = best;
	return true;
}

bool gguf_gen_params_check(const struct gguf_gen_params *p, char *err, size_t errlen)
{
	if (p->n_embd == 0 || p->n_embd > MAX_EMBD || p->n_layers == 0 ||
	    p->n_layers > MAX_LAYERS || p->n_ff == 0 || p->n_ff > MAX_FF || p->n_head == 0 ||
	    p->n_head > MAX_HEADS || p->n_head_kv == 0 || p->context_length == 0 ||
	    p->context_length > MAX_CTX) {
		err_set(err, errlen,
		        "parameters out of range (embd 1..%u, layers 1..%u, ff 1..%u, heads 1..%u, "
		        "ctx 1..%u)",
		        MAX_EMBD, MAX_LAYERS, MAX_FF, MAX_HEADS, MAX_CTX);
		return false;
	}
	if (p->n_embd % p->n_head != 0) {
		err_set(err, errlen, "n_embd %u is not a multiple of the head count %u", p->n_embd,
		        p->n_head);
		return false;
	}
	if ((p->n_embd / p->n_head) % 2 != 0) {
		err_set(err, errlen, "head size %u must be even (rotary embeddings)",
		        p->n_embd / p->n_head);
		return false;
	}
	if (p->n_head_kv > p->n_head || p->n_head % p->n_head_kv != 0) {
		err_set(err, errlen, "the head count %u is not a multiple of the KV head count %u",
		        p->n_head, p->n_head_kv);
		return false;
	}
	if (p->weight_type != GGML_TYPE_F16 && p->weight_type != GGML_TYPE_F32) {
		err_set(err, errlen, "weight type must be f16 or f32");
		return false;
	}
	if ((p->arch == GGUF_GEN_ARCH_GEMMA3 || p->arch == GGUF_GEN_ARCH_GPT_OSS) &&
	    (p->sliding_window == 0 || p->sliding_window > MAX_CTX)) {
		err_set(err, errlen, "the sliding window must be 1..%u tokens", MAX_CTX);
		return false;
	}
	if ((unsigned)p->arch > GGUF_GEN_ARCH_QWEN35MOE) {
		err_set(err, errlen, "unknown architecture");
		return false;
	}
	return true;
}

/* --- Metadata serialisation into memory ---------------------------------- */

struct wbuf {
	uint8_t *p; /* owned */
	size_t len;
	size_t cap;
	bool oom;
	uint64_t n_kv; /* key/value pairs written, patched into the header */
};

static void wb_put(struct wbuf *b, const void *data, size_t n)
{
	if (b->oom)
		return;
	if (GROW(b->p, b->cap, b->len + n, 4096) != 0) {
		b->oom = true;
		return;
	}
	memcpy(b->p + b->len, data, n);
	b->len += n;
}

/* Little-endian encoding regardless of the host. */
static void wb_u32(struct wbuf *b, uint32_t v)
{
	uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
	wb_put(b, x, 4);
}

static void wb_u64(struct wbuf *b, uint64_t v)
{
	wb_u32(b, (uint32_t)v);
	wb_u32(b, (uint32_t)(v >> 32));
}

static void wb_f32(struct wbuf *b, float f)
{
	uint32_t v;
	memcpy(&v, &f, 4);
	wb_u32(b, v);
}

static void wb_str(struct wbuf *b, const char *s)
{
	size_t n = strlen(s);
	wb_u64(b, n);
	wb_put(b, s, n);
}

static void kv_key(struct wbuf *b, const char *key, enum gguf_type t)
{
	b->n_kv++;
	wb_str(b, key);
	wb_u32(b, t);
}

static void kv_u32(struct wbuf *b, const char *key, uint32_t v)
{
	kv_key(b, key, GGUF_TYPE_UINT32);
	wb_u32(b, v);
}

static void kv_f32(struct wbuf *b, const char *key, float v)
{
	kv_key(b, key, GGUF_TYPE_FLOAT32);
	wb_f32(b, v);
}

static void kv_bool(struct wbuf *b, const char *key, bool v)
{
	uint8_t x = v;
	kv_key(b, key, GGUF_TYPE_BOOL);
	wb_put(b, &x, 1);
}

static void kv_str(struct wbuf *b, const char *key, const char *v)
{
	kv_key(b, key, GGUF_TYPE_STRING);
	wb_str(b, v);
}

/* --- Tensors ------------------------------------------------------------- */

/* How a tensor's values are made. */
enum fill {
	FILL_RANDOM, /* the seeded uniform stream */
	FILL_ONES,   /* a norm's weights: all 1.0 */
	FILL_DECAY,  /* a Gated DeltaNet's A (-exp(A_log)): all -1.0, so the state decays */
};

struct tensor_plan {
	char name[48];
	uint32_t n_dims;
	uint64_t ne[3];
	uint32_t type;
	enum fill fill;
	uint64_t offset;
	uint64_t nbytes;
};

static uint64_t align_up(uint64_t x, uint64_t a)
{
	return (x + a - 1) / a * a;
}

static void plan_tensor3(struct tensor_plan *t, const char *name, uint64_t ne0, uint64_t ne1,
                         uint64_t ne2, uint32_t type, enum fill fill)
{
	snprintf(t->name, sizeof t->name, "%s", name);
	t->ne[0] = ne0;
	t->ne[1] = ne1 ? ne1 : 1;
	t->ne[2] = ne2 ? ne2 : 1;
	t->n_dims = ne2 ? 3 : ne1 ? 2 : 1;
	t->type = type;
	t->fill = fill;
	t->nbytes = ne0 * t->ne[1] * t->ne[2] * (type == GGML_TYPE_F16 ? 2 : 4);
}

/* A matrix in the weight type, or a 1-D norm (f32, all ones, as llama.cpp's
 * converter writes norms). */
static void plan_tensor(struct tensor_plan *t, const char *name, uint64_t ne0, uint64_t ne1,
                        uint32_t wtype)
{
	plan_tensor3(t, name, ne0, ne1, 0, ne1 ? wtype : GGML_TYPE_F32,
	             ne1 ? FILL_RANDOM : FILL_ONES);
}

/* splitmix64: tiny, fast, and fully specified, so streams agree everywhere. */
static uint64_t splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* A uniform value in [-2^-5, 2^-5) (std ~0.018, the usual 0.02 init scale)
 * as f32 bits: k * 2^-28 with |k| < 2^23 is exact in a float, so no
 * rounding mode or FMA contraction can change it. */
static uint32_t random_f32_bits(uint64_t *s)
{
	int32_t k = (int32_t)(splitmix64(s) >> 40) - (1 << 23);
	float f = (float)k * 0x1p-28f;
	uint32_t bits;
	memcpy(&bits, &f, 4);
	return bits;
}

/* IEEE f32 -> f16 bits, round to nearest even, all in integers. */
static uint16_t f32_to_f16(uint32_t x)
{
	uint32_t sign = (x >> 16) & 0x8000u;
	uint32_t e8 = (x >> 23) & 0xffu;
	uint32_t mant = x & 0x7fffffu;
	if (e8 == 0xff)
		return (uint16_t)(sign | 0x7c00u | (mant ? 0x200u : 0));
	int32_t e = (int32_t)e8 - 127 + 15;
	if (e >= 31)
		return (uint16_t)(sign | 0x7c00u);
	if (e <= 0) {
		if (e < -10)
			return (uint16_t)sign;
		mant |= 0x800000u;
		uint32_t shift = (uint32_t)(14 - e);
		uint32_t h = mant >> shift;
		uint32_t rem = mant & ((1u << shift) - 1);
		uint32_t half = 1u << (shift - 1);
		if (rem > half || (rem == half && (h & 1)))
			h++;
		return (uint16_t)(sign | h);
	}
	uint32_t h = ((uint32_t)e << 10) | (mant >> 13);
	uint32_t rem = mant & 0x1fffu;
	/* A carry out of the mantissa correctly bumps the exponent. */
	if (rem > 0x1000u || (rem == 0x1000u && (h & 1)))
		h++;
	return (uint16_t)(sign | h);
}

/* Buffered output to a file descriptor. */
struct out {
	int fd;
	uint8_t *buf; /* owned */
	size_t len;
	size_t cap;
	uint64_t written;
	int err; /* errno of the first failure */
};

static bool out_flush(struct out *o)
{
	size_t off = 0;
	while (!o->err && off < o->len) {
		ssize_t n = write(o->fd, o->buf + off, o->len - off);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			o->err = errno;
		} else {
			off += (size_t)n;
		}
	}
	o->written += off;
	o->len = 0;
	return !o->err;
}

static bool out_put(struct out *o, const void *data, size_t n)
{
	const uint8_t *p = data;
	while (n > 0 && !o->err) {
		if (o->len == o->cap && !out_flush(o))
			break;
		size_t k = o->cap - o->len < n ? o->cap - o->len : n;
		memcpy(o->buf + o->len, p, k);
		o->len += k;
		p += k;
		n -= k;
	}
	return !o->err;
}

static bool out_zeros(struct out *o, uint64_t n)
{
	static const uint8_t zero[64];
	while (n > 0) {
		size_t k = n < sizeof zero ? (size_t)n : sizeof zero;
		if (!out_put(o, zero, k))
			return false;
		n -= k;
	}
	return true;
}

/* Streams one tensor's values in fixed-size chunks. Each tensor has its own
 * stream, seeded from the model seed and the tensor's index, so a tensor's
 * values do not depend on how others were written. */
static bool write_tensor(struct out *o, const struct tensor_plan *t, uint64_t seed, size_t index)
{
	uint8_t chunk[16384];
	uint64_t s = seed ^ (0x632be59bd9b4e019ull * (index + 1));
	uint64_t n = t->ne[0] * t->ne[1] * t->ne[2];
	size_t esize = t->type == GGML_TYPE_F16 ? 2 : 4;
	size_t per = sizeof chunk / esize;
	for (uint64_t i = 0; i < n;) {
		size_t k = n - i < per ? (size_t)(n - i) : per;
		for (size_t j = 0; j < k; j++) {
			uint32_t bits = t->fill == FILL_ONES    ? 0x3f800000u
			                : t->fill == FILL_DECAY ? 0xbf800000u
			                                        : random_f32_bits(&s);
			uint8_t *d = chunk + j * esize;
			if (esize == 2) {
				uint16_t h = f32_to_f16(bits);
				d[0] = (uint8_t)h;
				d[1] = (uint8_t)(h >> 8);
			} else {
				d[0] = (uint8_t)bits;
				d[1] = (uint8_t)(bits >> 8);
				d[2] = (uint8_t)(bits >> 16);
				d[3] = (uint8_t)(bits >> 24);
			}
		}
		if (!out_put(o, chunk, k * esize))
			return false;
		i += k;
	}
	return true;
}

/* The derived shapes of the other architectures, from the llama-style
 * params: head size hd = n_embd / n_head everywhere. */
#define QWEN35_FULL_ATTN_INTERVAL 4u /* every 4th layer attention, the rest Gated DeltaNet */
#define QWEN35_CONV_KERNEL 4u
#define GPT_OSS_EXPERTS 4u
#define GPT_OSS_EXPERTS_USED 2u

/* The tokenizer keys for a vocabulary taken from another model: byte-level
 * BPE ("gpt2": pre-tokenizer and merges) or SentencePiece-style ("llama":
 * scores, and whether a space goes before the text). */
static void write_external_vocab(struct wbuf *b, const struct gguf_gen_vocab *v,
                                 const char *chat_template, const char *vocab_size_key)
{
	bool spm = !strcmp(v->model, "llama");
	kv_u32(b, vocab_size_key, v->n);
	kv_str(b, "tokenizer.ggml.model", spm ? "llama" : "gpt2");
	if (!spm)
		kv_str(b, "tokenizer.ggml.pre", v->pre);
	kv_key(b, "tokenizer.ggml.tokens", GGUF_TYPE_ARRAY);
	wb_u32(b, GGUF_TYPE_STRING);
	wb_u64(b, v->n);
	for (uint32_t i = 0; i < v->n; i++)
		wb_str(b, v->tokens[i]);
	if (v->scores) {
		kv_key(b, "tokenizer.ggml.scores", GGUF_TYPE_ARRAY);
		wb_u32(b, GGUF_TYPE_FLOAT32);
		wb_u64(b, v->n);
		for (uint32_t i = 0; i < v->n; i++)
			wb_f32(b, v->scores[i]);
	}
	kv_key(b, "tokenizer.ggml.token_type", GGUF_TYPE_ARRAY);
	wb_u32(b, GGUF_TYPE_INT32);
	wb_u64(b, v->n);
	for (uint32_t i = 0; i < v->n; i++)
		wb_u32(b, (uint32_t)v->types[i]);
	if (!spm) { /* llama.cpp refuses a "gpt2" vocabulary without merges */
		kv_key(b, "tokenizer.ggml.merges", GGUF_TYPE_ARRAY);
		wb_u32(b, GGUF_TYPE_STRING);
		wb_u64(b, v->n_merges);
		for (uint32_t i = 0; i < v->n_merges; i++)
			wb_str(b, v->merges[i]);
	}
	if (v->bos >= 0)
		kv_u32(b, "tokenizer.ggml.bos_token_id", (uint32_t)v->bos);
	if (v->eos >= 0)
		kv_u32(b, "tokenizer.ggml.eos_token_id", (uint32_t)v->eos);
	if (v->unk >= 0)
		kv_u32(b, "tokenizer.ggml.unknown_token_id", (uint32_t)v->unk);
	if (v->pad >= 0)
		kv_u32(b, "tokenizer.ggml.padding_token_id", (uint32_t)v->pad);
	if (v->add_bos >= 0)
		kv_bool(b, "tokenizer.ggml.add_bos_token", v->add_bos);
	if (v->add_eos >= 0)
		kv_bool(b, "tokenizer.ggml.add_eos_token", v->add_eos);
	if (v->add_space_prefix >= 0)
		kv_bool(b, "tokenizer.ggml.add_space_prefix", v->add_space_prefix);
	const char *tmpl = chat_template ? chat_template : v->chat_template;
	if (tmpl)
		kv_str(b, "tokenizer.chat_template", tmpl);
}

/* Builds header, metadata and tensor infos; fills plan offsets. */
static bool build_metadata(const struct gguf_gen_params *p, const struct vocab *v,
                           struct tensor_plan *plan, size_t n_tensors, struct wbuf *b)
{
	char name[128];
	if (p->name)
		snprintf(name, sizeof name, "%s", p->name);
	else
		snprintf(name, sizeof name, "toki-random-llama-%uL-%uE-seed%" PRIu64, p->n_layers,
		         p->n_embd, p->seed);

	wb_put(b, GGUF_MAGIC, 4);
	wb_u32(b, 3);
	wb_u64(b, n_tensors);
	const size_t n_kv_at = b->len;
	wb_u64(b, 0); /* n_kv, patched below once the pairs are counted */

	const char *an = gguf_gen_arch_name(p->arch);
	char key[96];
#define AKEY(suffix) (snprintf(key, sizeof key, "%s." suffix, an), key)
	kv_str(b, "general.architecture", an);
	kv_str(b, "general.name", name);
	kv_u32(b, "general.alignment", GGUF_DEFAULT_ALIGNMENT);
	/* llama_ftype: 0 all f32, 1 mostly f16. */
	kv_u32(b, "general.file_type", p->weight_type == GGML_TYPE_F16 ? 1 : 0);
	uint32_t head_dim = p->n_embd / p->n_head;
	kv_u32(b, AKEY("context_length"), p->context_length);
	kv_u32(b, AKEY("embedding_length"), p->n_embd);
	kv_u32(b, AKEY("block_count"), p->n_layers);
	kv_u32(b, AKEY("feed_forward_length"), p->n_ff);
	kv_u32(b, AKEY("attention.head_count"), p->n_head);
	kv_u32(b, AKEY("attention.head_count_kv"), p->n_head_kv);
	kv_u32(b, AKEY("rope.dimension_count"), head_dim);
	kv_f32(b, AKEY("attention.layer_norm_rms_epsilon"), 1e-5f);
	kv_f32(b, AKEY("rope.freq_base"), 10000.0f);
	if (p->arch != GGUF_GEN_ARCH_LLAMA) {
		kv_u32(b, AKEY("attention.key_length"), head_dim);
		kv_u32(b, AKEY("attention.value_length"), head_dim);
	}
	switch (p->arch) {
	case GGUF_GEN_ARCH_LLAMA:
		break;
	case GGUF_GEN_ARCH_QWEN35:
	case GGUF_GEN_ARCH_QWEN35MOE: {
		/* Interleaved multi-axis rotary sections over head_dim / 2
		 * frequencies, in Qwen 3.5's proportions (11, 11, 10 of 32); text
		 * positions are the same on every axis. */
		uint32_t half = head_dim / 2, s0 = (half + 2) / 3;
		kv_key(b, AKEY("rope.dimension_sections"), GGUF_TYPE_ARRAY);
		wb_u32(b, GGUF_TYPE_INT32);
		wb_u64(b, 4);
		wb_u32(b, s0);
		wb_u32(b, s0);
		wb_u32(b, half - 2 * s0);
		wb_u32(b, 0);
		kv_u32(b, AKEY("full_attention_interval"), QWEN35_FULL_ATTN_INTERVAL);
		kv_u32(b, AKEY("ssm.conv_kernel"), QWEN35_CONV_KERNEL);
		kv_u32(b, AKEY("ssm.state_size"), head_dim);
		kv_u32(b, AKEY("ssm.group_count"), p->n_head_kv);
		kv_u32(b, AKEY("ssm.time_step_rank"), p->n_head);
		kv_u32(b, AKEY("ssm.inner_size"), head_dim * p->n_head);
		if (p->arch == GGUF_GEN_ARCH_QWEN35MOE) {
			kv_u32(b, AKEY("expert_count"), GPT_OSS_EXPERTS);
			kv_u32(b, AKEY("expert_used_count"), GPT_OSS_EXPERTS_USED);
			kv_u32(b, AKEY("expert_feed_forward_length"), p->n_ff);
			kv_u32(b, AKEY("expert_shared_feed_forward_length"), p->n_ff);
		}
		break;
	}
	case GGUF_GEN_ARCH_GEMMA3:
		kv_u32(b, AKEY("attention.sliding_window"), p->sliding_window);
		break;
	case GGUF_GEN_ARCH_GPT_OSS:
		kv_u32(b, AKEY("attention.sliding_window"), p->sliding_window);
		kv_u32(b, AKEY("expert_count"), GPT_OSS_EXPERTS);
		kv_u32(b, AKEY("expert_used_count"), GPT_OSS_EXPERTS_USED);
		kv_u32(b, AKEY("expert_feed_forward_length"), p->n_ff);
		break;
	}
	if (p->vocab) {
		write_external_vocab(b, p->vocab, p->chat_template, AKEY("vocab_size"));
		goto tokenizer_done;
	}
	kv_u32(b, AKEY("vocab_size"), v->n);
#undef AKEY

	kv_str(b, "tokenizer.ggml.model", "llama");
	kv_key(b, "tokenizer.ggml.tokens", GGUF_TYPE_ARRAY);
	wb_u32(b, GGUF_TYPE_STRING);
	wb_u64(b, v->n);
	for (uint32_t i = 0; i < v->n; i++)
		wb_str(b, v->text[i]);
	kv_key(b, "tokenizer.ggml.scores", GGUF_TYPE_ARRAY);
	wb_u32(b, GGUF_TYPE_FLOAT32);
	wb_u64(b, v->n);
	for (uint32_t i = 0; i < v->n; i++)
		wb_f32(b, v->score[i]);
	kv_key(b, "tokenizer.ggml.token_type", GGUF_TYPE_ARRAY);
	wb_u32(b, GGUF_TYPE_INT32);
	wb_u64(b, v->n);
	for (uint32_t i = 0; i < v->n; i++)
		wb_u32(b, (uint32_t)v->type[i]);
	kv_u32(b, "tokenizer.ggml.bos_token_id", GGUF_GEN_TOKEN_BOS);
	/* </s> stays EOS; <|im_end|>, which ends every ChatML turn, is EOT.
	 * llama.cpp stops generation on both (its end-of-generation set holds
	 * EOS, EOT and any token spelled <|im_end|>). */
	kv_u32(b, "tokenizer.ggml.eos_token_id", GGUF_GEN_TOKEN_EOS);
	kv_u32(b, "tokenizer.ggml.eot_token_id", GGUF_GEN_TOKEN_IM_END);
	kv_u32(b, "tokenizer.ggml.unknown_token_id", GGUF_GEN_TOKEN_UNK);
	kv_u32(b, "tokenizer.ggml.padding_token_id", GGUF_GEN_TOKEN_UNK);
	kv_bool(b, "tokenizer.ggml.add_bos_token", true);
	kv_bool(b, "tokenizer.ggml.add_eos_token", false);
	/* SentencePiece models usually prefix the text with a space, and
	 * llama.cpp then also inserts one after every special token, so
	 * "<|im_end|>\n<|im_start|>user" would become "<|im_end|> ▁ \n
	 * <|im_start|> ▁user". ChatML prompts tokenize cleanly without it. */
	kv_bool(b, "tokenizer.ggml.add_space_prefix", false);
	kv_str(b, "tokenizer.chat_template", p->chat_template ? p->chat_template : chatml_template);
tokenizer_done:
	if (!b->oom)
		for (int i = 0; i < 8; i++)
			b->p[n_kv_at + i] = (uint8_t)(b->n_kv >> (8 * i));

	uint64_t off = 0;
	for (size_t i = 0; i < n_tensors; i++) {
		struct tensor_plan *t = &plan[i];
		t->offset = off;
		off = align_up(off + t->nbytes, GGUF_DEFAULT_ALIGNMENT);
		wb_str(b, t->name);
		wb_u32(b, t->n_dims);
		for (uint32_t d = 0; d < t->n_dims; d++)
			wb_u64(b, t->ne[d]);
		wb_u32(b, t->type);
		wb_u64(b, t->offset);
	}
	return !b->oom;
}

static bool qwen35_is_recurrent(uint32_t layer)
{
	return (layer + 1) % QWEN35_FULL_ATTN_INTERVAL != 0;
}

static struct tensor_plan *make_plan(const struct gguf_gen_params *p, uint32_t n_vocab,
                                     size_t *n_out)
{
	size_t n = 3 + 24 * (size_t)p->n_layers;
	struct tensor_plan *plan = calloc(n, sizeof(*plan));
	if (!plan)
		return NULL;
	enum gguf_gen_arch arch = p->arch;
	uint64_t e = p->n_embd, head_dim = e / p->n_head;
	uint64_t q_dim = head_dim * p->n_head, kv_dim = head_dim * p->n_head_kv;
	uint64_t ff = p->n_ff;
	uint32_t wt = p->weight_type;
	size_t k = 0;
	/* GGUF dims are ne0 first: a matrix mapping x (ne0 = input) to y
	 * (ne1 = output), as llama.cpp's loader expects. */
	plan_tensor(&plan[k++], "token_embd.weight", e, n_vocab, wt);
	plan_tensor(&plan[k++], "output_norm.weight", e, 0, wt);
	/* Gemma ties the output to the embedding. */
	if (arch != GGUF_GEN_ARCH_GEMMA3)
		plan_tensor(&plan[k++], "output.weight", e, n_vocab, wt);
	for (uint32_t l = 0; l < p->n_layers; l++) {
		char nm[48];
#define BLK(suffix, ne0, ne1)                                                                      \
	do {                                                                                       \
		snprintf(nm, sizeof nm, "blk.%u." suffix ".weight", l);                            \
		plan_tensor(&plan[k++], nm, (ne0), (ne1), wt);                                     \
	} while (0)
/* f32 tensors of up to 3 dims: biases, sinks, SSM parameters, experts' biases. */
#define BLK32(name, ne0, ne1, fill)                                                                \
	do {                                                                                       \
		snprintf(nm, sizeof nm, "blk.%u." name, l);                                        \
		plan_tensor3(&plan[k++], nm, (ne0), (ne1), 0, GGML_TYPE_F32, (fill));              \
	} while (0)
#define BLK3(suffix, ne0, ne1, ne2)                                                                \
	do {                                                                                       \
		snprintf(nm, sizeof nm, "blk.%u." suffix ".weight", l);                            \
		plan_tensor3(&plan[k++], nm, (ne0), (ne1), (ne2), wt, FILL_RANDOM);                \
	} while (0)
		switch (arch) {
		case GGUF_GEN_ARCH_LLAMA:
			BLK("attn_norm", e, 0);
			BLK("attn_q", e, q_dim);
			BLK("attn_k", e, kv_dim);
			BLK("attn_v", e, kv_dim);
			BLK("attn_output", q_dim, e);
			BLK("ffn_norm", e, 0);
			BLK("ffn_gate", e, ff);
			BLK("ffn_up", e, ff);
			BLK("ffn_down", ff, e);
			break;
		case GGUF_GEN_ARCH_QWEN35:
		case GGUF_GEN_ARCH_QWEN35MOE: {
			/* Gated DeltaNet: K heads = KV heads, V heads = heads, both
			 * of the head size. */
			uint64_t key_dim = kv_dim, value_dim = q_dim;
			BLK("attn_norm", e, 0);
			BLK("post_attention_norm", e, 0);
			if (!qwen35_is_recurrent(l)) {
				BLK("attn_q", e, 2 * q_dim); /* queries and their output gate */
				BLK("attn_k", e, kv_dim);
				BLK("attn_v", e, kv_dim);
				BLK("attn_output", q_dim, e);
				BLK("attn_q_norm", head_dim, 0);
				BLK("attn_k_norm", head_dim, 0);
			} else {
				BLK("attn_qkv", e, 2 * key_dim + value_dim);
				BLK("attn_gate", e, value_dim);
				BLK32("ssm_conv1d.weight", QWEN35_CONV_KERNEL,
				      2 * key_dim + value_dim, FILL_RANDOM);
				BLK32("ssm_dt.bias", p->n_head, 0, FILL_RANDOM);
				BLK32("ssm_a", p->n_head, 0, FILL_DECAY);
				BLK("ssm_beta", e, p->n_head);
				BLK("ssm_alpha", e, p->n_head);
				BLK("ssm_norm", head_dim, 0);
				BLK("ssm_out", value_dim, e);
			}
			if (arch == GGUF_GEN_ARCH_QWEN35) {
				BLK("ffn_gate", e, ff);
				BLK("ffn_up", e, ff);
				BLK("ffn_down", ff, e);
				break;
			}
			/* Routed experts (softmax gating, no biases) and one shared
			 * expert behind a sigmoid gate. */
			BLK("ffn_gate_inp", e, GPT_OSS_EXPERTS);
			BLK3("ffn_gate_exps", e, ff, GPT_OSS_EXPERTS);
			BLK3("ffn_up_exps", e, ff, GPT_OSS_EXPERTS);
			BLK3("ffn_down_exps", ff, e, GPT_OSS_EXPERTS);
			BLK("ffn_gate_inp_shexp", e, 0);
			BLK("ffn_gate_shexp", e, ff);
			BLK("ffn_up_shexp", e, ff);
			BLK("ffn_down_shexp", ff, e);
			break;
		}
		case GGUF_GEN_ARCH_GEMMA3:
			BLK("attn_norm", e, 0);
			BLK("attn_q", e, q_dim);
			BLK("attn_k", e, kv_dim);
			BLK("attn_v", e, kv_dim);
			BLK("attn_output", q_dim, e);
			BLK("attn_q_norm", head_dim, 0);
			BLK("attn_k_norm", head_dim, 0);
			BLK("post_attention_norm", e, 0);
			BLK("ffn_norm", e, 0);
			BLK("ffn_gate", e, ff);
			BLK("ffn_up", e, ff);
			BLK("ffn_down", ff, e);
			BLK("post_ffw_norm", e, 0);
			break;
		case GGUF_GEN_ARCH_GPT_OSS:
			BLK("attn_norm", e, 0);
			BLK("post_attention_norm", e, 0);
			BLK("attn_q", e, q_dim);
			BLK32("attn_q.bias", q_dim, 0, FILL_RANDOM);
			BLK("attn_k", e, kv_dim);
			BLK32("attn_k.bias", kv_dim, 0, FILL_RANDOM);
			BLK("attn_v", e, kv_dim);
			BLK32("attn_v.bias", kv_dim, 0, FILL_RANDOM);
			BLK("attn_output", q_dim, e);
			BLK32("attn_output.bias", e, 0, FILL_RANDOM);
			BLK32("attn_sinks.weight", p->n_head, 0, FILL_RANDOM);
			BLK("ffn_gate_inp", e, GPT_OSS_EXPERTS);
			BLK32("ffn_gate_inp.bias", GPT_OSS_EXPERTS, 0, FILL_RANDOM);
			BLK3("ffn_gate_exps", e, ff, GPT_OSS_EXPERTS);
			BLK32("ffn_gate_exps.bias", ff, GPT_OSS_EXPERTS, FILL_RANDOM);
			BLK3("ffn_up_exps", e, ff, GPT_OSS_EXPERTS);
			BLK32("ffn_up_exps.bias", ff, GPT_OSS_EXPERTS, FILL_RANDOM);
			BLK3("ffn_down_exps", ff, e, GPT_OSS_EXPERTS);
			BLK32("ffn_down_exps.bias", e, GPT_OSS_EXPERTS, FILL_RANDOM);
			break;
		}
#undef BLK
#undef BLK32
#undef BLK3
	}
	*n_out = k;
	return plan;
}

static uint64_t plan_param_count(const struct gguf_gen_params *p, uint32_t n_vocab)
{
	size_t n = 0;
	struct tensor_plan *plan = make_plan(p, n_vocab, &n);
	if (!plan)
		return 0;
	uint64_t total = 0;
	for (size_t i = 0; i < n; i++)
		total += plan[i].ne[0] * plan[i].ne[1] * plan[i].ne[2];
	free(plan);
	return total;
}

/* Makes the rename durable: the directory entry must reach the disk too. */
int gguf_write_random_llama(const struct gguf_gen_params *p, const char *path, char *err,
                            size_t errlen)
{
	if (!p || !path || !*path) {
		err_set(err, errlen, "no output path");
		return -1;
	}
	if (!gguf_gen_params_check(p, err, errlen))
		return -1;

	int rc = -1;
	struct vocab v;
	struct wbuf meta = {0};
	struct tensor_plan *plan = NULL;
	struct out o = {.fd = -1};
	char *tmp = NULL;
	size_t n_tensors = 0;

	if (!vocab_build(&v)) {
		err_set(err, errlen, "out of memory");
		return -1;
	}
	plan = make_plan(p, p->vocab ? p->vocab->n : v.n, &n_tensors);
	if (!plan || !build_metadata(p, &v, plan, n_tensors, &meta)) {
		err_set(err, errlen, "out of memory");
		goto done;
	}

	size_t plen = strlen(path);
	tmp = malloc(plen + 5);
	o.cap = 1u << 20;
	o.buf = malloc(o.cap);
	if (!tmp || !o.buf) {
		err_set(err, errlen, "out of memory");
		goto done;
	}
	memcpy(tmp, path, plen);
	memcpy(tmp + plen, ".tmp", 5);
	o.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (o.fd < 0) {
		err_set(err, errlen, "cannot create %s: %s", tmp, strerror(errno));
		goto done;
	}

	out_put(&o, meta.p, meta.len);
	out_zeros(&o, align_up(meta.len, GGUF_DEFAULT_ALIGNMENT) - meta.len);
	for (size_t i = 0; i < n_tensors && !o.err; i++) {
		if (!write_tensor(&o, &plan[i], p->seed, i))
			break;
		/* Every tensor, the last included, is padded to the alignment,
		 * as llama.cpp's own writer does. */
		uint64_t end = plan[i].offset + plan[i].nbytes;
		out_zeros(&o, align_up(end, GGUF_DEFAULT_ALIGNMENT) - end);
	}
	out_flush(&o);
	if (!o.err && fsync(o.fd) != 0)
		o.err = errno;
	if (o.err) {
		err_set(err, errlen, "writing %s: %s", tmp, strerror(o.err));
		goto done;
	}
	int fd = o.fd;
	o.fd = -1;
	if (close(fd) != 0) {
		err_set(err, errlen, "closing %s: %s", tmp, strerror(errno));
		goto done;
	}
	if (rename(tmp, path) != 0) {
		err_set(err, errlen, "renaming %s to %s: %s", tmp, path, strerror(errno));
		goto done;
	}
	plat_fsync_dir_of(path);
	rc = 0;

done:
	if (o.fd >= 0)
		close(o.fd);
	if (rc != 0 && tmp)
		unlink(tmp);
	free(tmp);
	free(o.buf);
	free(meta.p);
	free(plan);
	vocab_free(&v);
	return rc;
}
