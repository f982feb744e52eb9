#include "tokenizer/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 32
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/unicode.h"
#include "util/grow.h"

/* ---- the expressions of each type (llama.cpp's llm_tokenizer_bpe) ---- */

#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3                                                                                  \
	RE_CONTRACTIONS                                                                            \
	"|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"               \
	"\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2                                                                                   \
	RE_CONTRACTIONS                                                                            \
	"|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"      \
	"\\s+(?!\\S)|\\s+"

static const char *const re_default[] = {"[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+",
                                         "[0-9][0-9][0-9]", NULL};
static const char *const re_llama3[] = {RE_LLAMA3, NULL};
static const char *const re_gpt2[] = {RE_GPT2, NULL};
static const char *const re_starcoder[] = {"\\p{N}", RE_GPT2, NULL};
/* The backtick and the ~ in \p{S} below are what build 11669 does, seen
 * against the server (the sources this was ported from have neither). */
static const char *const re_falcon[] = {"[\\p{P}\\$\\+<=>\\^~\\|`]+", RE_GPT2, "[0-9][0-9][0-9]",
                                        NULL};
static const char *const re_qwen2[] = {RE_QWEN2, NULL};
static const char *const re_qwen35[] = {
    RE_CONTRACTIONS
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|"
    "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const re_deepseek_coder[] = {
    "[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
    "\\p{N}", NULL};
static const char *const re_deepseek3[] = {
    "\\p{N}{1,3}", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    "[!\"#$%&'()*+,\\-./"
    ":;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
    "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const re_tekken[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?"
    "=[\\p{L}])"
    "([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const re_gpt4o[] = {
    "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" RE_CONTRACTIONS
    "?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" RE_CONTRACTIONS
    "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const re_seed_coder[] = {
    RE_CONTRACTIONS
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+",
    NULL};
static const char *const re_bailingmoe[] = {
    "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+"
    "[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+",
    NULL};
static const char *const re_minicpm5[] = {
    "\\p{N}{1,3}",
    RE_CONTRACTIONS
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|"
    "\\s+(?!\\S)|\\s+",
    NULL};
static const char *const re_gemma4[] = {"[^\\n]+|[\\n]+", NULL};

/* The names each llama.cpp type answers to, and its flags. The order of the
 * flags: ignore_merges, add_bos, no_bos, escape_whitespace, raw_utf8,
 * newline_words. */
static const struct pretokenizer_type types[] = {
    {"default", re_default, 0, 0, 0, 0, 0, 0},
    {"llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|jina-v5-nano", re_llama3, 1,
     1, 0, 0, 0, 0},
    {"dbrx|smaug-bpe", re_llama3, 0, 0, 0, 0, 0, 0},
    {"glm4|chatglm-bpe", re_llama3, 0, 0, 1, 0, 0, 0},
    {"deepseek-coder", re_deepseek_coder, 0, 0, 0, 0, 0, 0},
    {"deepseek-v3|hunyuan-dense|joyai-llm|hy_v4", re_deepseek3, 0, 0, 0, 0, 0, 0},
    {"falcon", re_falcon, 0, 0, 0, 0, 0, 0},
    {"starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b|mellum2", re_starcoder, 0, 0, 0,
     0, 0, 0},
    {"gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|a.x-4.0|mellum|modern-bert|mpt|"
     "olmo|jais|trillion|granite-docling|exaone4",
     re_gpt2, 0, 0, 0, 0, 0, 0},
    {"qwen2|deepseek-r1-qwen|kormo|f2llmv2|megrez|stablelm2|hunyuan|solar-open|grok-2", re_qwen2, 0,
     0, 0, 0, 0, 0},
    {"qwen35", re_qwen35, 0, 0, 0, 0, 0, 0},
    {"tekken", re_tekken, 1, 1, 0, 0, 0, 0},
    {"gpt-4o|llama4|kanana2|talkie|minimax-m2", re_gpt4o, 0, 0, 0, 0, 0, 0},
    {"seed-coder", re_seed_coder, 0, 0, 0, 0, 0, 0},
    {"bailingmoe|bailingmoe2|llada-moe", re_bailingmoe, 0, 0, 0, 0, 0, 0},
    {"minicpm5", re_minicpm5, 1, 0, 0, 0, 0, 0},
    {"gemma4|granite-embed-multi-311m", re_gemma4, 0, 1, 0, 1, 1, 1},
};

static int name_in(const char *names, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = names; *p;) {
		const char *bar = strchr(p, '|');
		size_t len = bar ? (size_t)(bar - p) : strlen(p);
		if (len == n && !memcmp(p, name, n))
			return 1;
		if (!bar)
			break;
		p = bar + 1;
	}
	return 0;
}

const struct pretokenizer_type *pretokenizer_type_find(const char *pre)
{
	if (!pre || !*pre)
		pre = "default";
	for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
		if (name_in(types[i].names, pre))
			return &types[i];
	return NULL;
}

/* ---- growable arrays of piece lengths ---- */

struct lengths {
	size_t *v;
	size_t n, cap;
};

static int lengths_push(struct lengths *l, size_t x)
{
	if (GROW(l->v, l->cap, l->n + 1, 64) != 0)
		return -1;
	l->v[l->n++] = x;
	return 0;
}

/* ---- the compiled pre-tokenizer ---- */

enum split_kind { SPLIT_GPT2, SPLIT_LLAMA3, SPLIT_REGEX_COLLAPSED, SPLIT_REGEX_WIDE };

struct split {
	enum split_kind kind;
	pcre2_code *code;
};

struct pretokenizer {
	const struct pretokenizer_type *type;
	struct split *splits;
	size_t n_splits;
	int need_collapsed, need_wide;
	char byte_sym[256][4];
	unsigned char byte_sym_len[256];
};

static void build_byte_symbols(struct pretokenizer *p);

/* The category placeholders of the collapsed text, and what \p{..} becomes
 * in an expression (the placeholder plus the ASCII members of the class). */
enum {
	COLLAPSED_OTHER = 0xD0,
	COLLAPSED_NUMBER = 0xD1,
	COLLAPSED_LETTER = 0xD2,
	COLLAPSED_PUNCT = 0xD3,
	COLLAPSED_MARK = 0xD4,
	COLLAPSED_SYMBOL = 0xD5,
};

struct category_class {
	const char *name; /* as written in the expression */
	uint32_t placeholder;
	const char *ascii; /* the class's ASCII members, as class syntax */
};

static const struct category_class category_classes[] = {
    {"\\p{N}", COLLAPSED_NUMBER, "\x30-\x39"},
    {"\\p{L}", COLLAPSED_LETTER, "\x41-\x5A\x61-\x7A"},
    {"\\p{P}", COLLAPSED_PUNCT,
     "\x21-\x23\x25-\x2A\x2C-\x2F\x3A-\x3B\x3F-\x40\\\x5B-\\\x5D\x5F\\\x7B\\\x7D"},
    {"\\p{M}", COLLAPSED_MARK, ""},
    {"\\p{S}", COLLAPSED_SYMBOL, "\\\x24\\\x2B\x3C-\x3E\x5E\x60\\\x7C\\\x7E"},
    {"\\p{Lu}", COLLAPSED_LETTER, "\x41-\x5A\x61-\x7A"},
    {"\\p{Ll}", COLLAPSED_LETTER, "\x41-\x5A\x61-\x7A"},
    {"\\p{Lt}", COLLAPSED_LETTER, "\x41-\x5A\x61-\x7A"},
    {"\\p{Lm}", COLLAPSED_LETTER, "\x41-\x5A\x61-\x7A"},
    {"\\p{Lo}", COLLAPSED_LETTER, "\x41-\x5A\x61-\x7A"},
};
#define N_CATEGORY_CLASSES (sizeof category_classes / sizeof category_classes[0])

static int uses_categories(const char *expr)
{
	for (size_t i = 0; i < N_CATEGORY_CLASSES; i++)
		if (strstr(expr, category_classes[i].name))
			return 1;
	return 0;
}

static uint32_t collapse(uint32_t cpt)
{
	if (cpt < 128)
		return cpt;
	uint16_t f = unicode_flags(cpt);
	if (f & UNICODE_WHITESPACE)
		return 0x0B; /* std::regex's \s matches only ASCII: a vertical tab stands in */
	switch (f & UNICODE_CATEGORIES) {
	case UNICODE_NUMBER:
		return COLLAPSED_NUMBER;
	case UNICODE_LETTER:
		return COLLAPSED_LETTER;
	case UNICODE_PUNCT:
		return COLLAPSED_PUNCT;
	case UNICODE_MARK:
		return COLLAPSED_MARK;
	case UNICODE_SYMBOL:
		return COLLAPSED_SYMBOL;
	default:
		return COLLAPSED_OTHER;
	}
}

struct units {
	PCRE2_UCHAR *v;
	size_t n, cap;
};

static int units_push(struct units *u, uint32_t c)
{
	if (GROW(u->v, u->cap, u->n + 1, 256) != 0)
		return -1;
	u->v[u->n++] = c;
	return 0;
}

/* The expression rewritten for the collapsed text, as llama.cpp rewrites it:
 * \p{X} becomes [placeholder + ASCII members], or just those members inside
 * a class already open. */
static int collapse_expression(const char *expr, struct units *out)
{
	int inside = 0;
	size_t len = strlen(expr);
	for (size_t i = 0; i < len; i++) {
		char c = expr[i];
		if (c == '[' && (i == 0 || expr[i - 1] != '\\')) {
			inside = 1;
			if (units_push(out, '['))
				return -1;
			continue;
		}
		if (inside && c == ']' && expr[i - 1] != '\\') {
			inside = 0;
			if (units_push(out, ']'))
				return -1;
			continue;
		}
		if (c == '\\' && i + 3 < len && expr[i + 1] == 'p' && expr[i + 2] == '{') {
			const char *close = strchr(expr + i + 3, '}');
			if (close && (size_t)(close - expr) <= i + 10) {
				size_t n = (size_t)(close - (expr + i)) + 1;
				const struct category_class *cc = NULL;
				for (size_t k = 0; k < N_CATEGORY_CLASSES; k++)
					if (strlen(category_classes[k].name) == n &&
					    !memcmp(category_classes[k].name, expr + i, n))
						cc = &category_classes[k];
				if (cc) {
					if (!inside && units_push(out, '['))
						return -1;
					if (units_push(out, cc->placeholder))
						return -1;
					for (const char *a = cc->ascii; *a; a++)
						if (units_push(out, (unsigned char)*a))
							return -1;
					if (!inside && units_push(out, ']'))
						return -1;
					i += n - 1;
					continue;
				}
			}
		}
		if (units_push(out, (unsigned char)c))
			return -1;
	}
	return 0;
}

static pcre2_code *compile_units(const struct units *pattern, char *err, size_t errlen)
{
	int code;
	PCRE2_SIZE at;
	/* ECMAScript's $ is the end of the input only. */
	pcre2_code *re =
	    pcre2_compile(pattern->v, pattern->n, PCRE2_DOLLAR_ENDONLY, &code, &at, NULL);
	if (!re) {
		PCRE2_UCHAR msg[256];
		pcre2_get_error_message(code, msg, 256);
		char m[256];
		size_t k = 0;
		for (; k < 255 && msg[k]; k++)
			m[k] = msg[k] < 128 ? (char)msg[k] : '?';
		m[k] = 0;
		snprintf(err, errlen, "pre-tokenizer expression: %s at %zu", m, (size_t)at);
		return NULL;
	}
	pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT it still works, slower */
	return re;
}

struct pretokenizer *pretokenizer_new(const struct pretokenizer_type *t, char *err, size_t errlen)
{
	struct pretokenizer *p = calloc(1, sizeof *p);
	size_t n = 0;
	while (t->exprs[n])
		n++;
	if (!p || !(p->splits = calloc(n ? n : 1, sizeof *p->splits))) {
		free(p);
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	p->type = t;
	build_byte_symbols(p);
	for (size_t i = 0; i < n; i++) {
		const char *e = t->exprs[i];
		struct split *s = &p->splits[p->n_splits];
		if (!strcmp(e, RE_GPT2)) {
			s->kind = SPLIT_GPT2;
		} else if (!strcmp(e, RE_LLAMA3)) {
			s->kind = SPLIT_LLAMA3;
		} else {
			struct units pat = {0};
			int collapsed = uses_categories(e);
			int rc = 0;
			if (collapsed) {
				rc = collapse_expression(e, &pat);
			} else {
				size_t len = strlen(e);
				for (size_t pos = 0; pos < len && !rc;)
					rc = units_push(&pat, unicode_decode(e, len, &pos));
			}
			s->kind = collapsed ? SPLIT_REGEX_COLLAPSED : SPLIT_REGEX_WIDE;
			s->code = rc ? NULL : compile_units(&pat, err, errlen);
			if (rc)
				snprintf(err, errlen, "out of memory");
			free(pat.v);
			if (!s->code) {
				pretokenizer_free(p);
				return NULL;
			}
			if (collapsed)
				p->need_collapsed = 1;
			else
				p->need_wide = 1;
		}
		p->n_splits++;
	}
	return p;
}

void pretokenizer_free(struct pretokenizer *p)
{
	if (!p)
		return;
	for (size_t i = 0; i < p->n_splits; i++)
		pcre2_code_free(p->splits[i].code);
	free(p->splits);
	free(p);
}

/* ---- the hand-written splitters (llama.cpp's unicode_regex_split_custom_*) ---- */

#define OUT_OF_RANGE 0xFFFFFFFFu

struct range {
	const uint32_t *cpts;
	size_t ini, end;
	size_t prev_end;
	struct lengths *out;
	int oom;
};

static uint32_t cpt_at(const struct range *r, size_t pos)
{
	return pos >= r->ini && pos < r->end ? r->cpts[pos] : OUT_OF_RANGE;
}

/* Flags of the code point at pos; 0 outside the range (unlike any code
 * point, which has at least its category). */
static uint16_t flags_at(const struct range *r, size_t pos)
{
	return pos >= r->ini && pos < r->end ? unicode_flags(r->cpts[pos]) : 0;
}

static size_t add_piece(struct range *r, size_t end)
{
	size_t len = end - r->prev_end;
	if (len > 0 && lengths_push(r->out, len))
		r->oom = 1;
	r->prev_end = end;
	return len;
}

static uint32_t ascii_lower(uint32_t c)
{
	return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

/* 's|'t|'re|'ve|'m|'ll|'d at pos (case-folded or not): the piece's end, or 0. */
static size_t contraction_end(const struct range *r, size_t pos, int fold)
{
	if (cpt_at(r, pos) != '\'' || pos + 1 >= r->end)
		return 0;
	uint32_t a = cpt_at(r, pos + 1);
	if (fold)
		a = ascii_lower(a);
	if (a == 's' || a == 't' || a == 'm' || a == 'd')
		return pos + 2;
	if (pos + 2 < r->end) {
		uint32_t b = cpt_at(r, pos + 2);
		if (fold)
			b = ascii_lower(b);
		if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
			return pos + 3;
	}
	return 0;
}

#define IS_L(f) ((f)&UNICODE_LETTER)
#define IS_N(f) ((f)&UNICODE_NUMBER)
#define IS_WS(f) ((f)&UNICODE_WHITESPACE)

static void split_gpt2_range(struct range *r)
{
	for (size_t pos = r->ini; pos < r->end && !r->oom;) {
		uint32_t cpt = cpt_at(r, pos);
		uint16_t flags = flags_at(r, pos);
		size_t ce = contraction_end(r, pos, 0);
		if (ce) {
			pos += add_piece(r, ce);
			continue;
		}
		uint16_t f2 = cpt == ' ' ? flags_at(r, pos + 1) : flags;
		if (IS_L(f2)) { /* <space>?\p{L}+ */
			pos += cpt == ' ';
			while (IS_L(f2))
				f2 = flags_at(r, ++pos);
			add_piece(r, pos);
			continue;
		}
		if (IS_N(f2)) { /* <space>?\p{N}+ */
			pos += cpt == ' ';
			while (IS_N(f2))
				f2 = flags_at(r, ++pos);
			add_piece(r, pos);
			continue;
		}
		if (!(IS_WS(f2) || IS_L(f2) || IS_N(f2)) && f2) { /* <space>?[^\s\p{L}\p{N}]+ */
			pos += cpt == ' ';
			while (!(IS_WS(f2) || IS_L(f2) || IS_N(f2)) && f2)
				f2 = flags_at(r, ++pos);
			add_piece(r, pos);
			continue;
		}
		size_t ws = 0;
		while (IS_WS(flags_at(r, pos + ws)))
			ws++;
		if (ws > 1 && cpt_at(r, pos + ws) != OUT_OF_RANGE) { /* \s+(?!\S) */
			pos += ws - 1;
			add_piece(r, pos);
			continue;
		}
		if (ws > 0) { /* \s+ */
			pos += ws;
			add_piece(r, pos);
			continue;
		}
		add_piece(r, ++pos); /* no match */
	}
}

static void split_llama3_range(struct range *r)
{
	for (size_t pos = r->ini; pos < r->end && !r->oom;) {
		uint32_t cpt = cpt_at(r, pos);
		uint16_t flags = flags_at(r, pos);
		size_t ce = contraction_end(r, pos, 1);
		if (ce) {
			pos += add_piece(r, ce);
			continue;
		}
		/* [^\r\n\p{L}\p{N}]?\p{L}+ */
		if (!(cpt == '\r' || cpt == '\n' || IS_N(flags))) {
			if (IS_L(flags) || IS_L(flags_at(r, pos + 1))) {
				pos++;
				while (IS_L(flags_at(r, pos)))
					pos++;
				add_piece(r, pos);
				continue;
			}
		}
		if (IS_N(flags)) { /* \p{N}{1,3} */
			size_t ini = pos;
			while (IS_N(flags_at(r, pos))) {
				if (++pos - ini >= 3) {
					add_piece(r, pos);
					ini = pos;
				}
			}
			add_piece(r, pos);
			continue;
		}
		/* <space>?[^\s\p{L}\p{N}]+[\r\n]* (the first test is on the code
		 * point itself, as in llama.cpp) */
		uint16_t f2 = cpt == ' ' ? flags_at(r, pos + 1) : flags;
		if (!(IS_WS(f2) || IS_L(f2) || IS_N(f2)) && flags) {
			pos += cpt == ' ';
			while (!(IS_WS(f2) || IS_L(f2) || IS_N(f2)) && f2)
				f2 = flags_at(r, ++pos);
			uint32_t c2 = cpt_at(r, pos);
			while (c2 == '\r' || c2 == '\n')
				c2 = cpt_at(r, ++pos);
			add_piece(r, pos);
			continue;
		}
		size_t ws = 0, last_rn = 0;
		while (IS_WS(flags_at(r, pos + ws))) {
			uint32_t c2 = cpt_at(r, pos + ws);
			if (c2 == '\r' || c2 == '\n')
				last_rn = pos + ws + 1;
			ws++;
		}
		if (last_rn > 0) { /* \s*[\r\n]+ */
			pos = last_rn;
			add_piece(r, pos);
			continue;
		}
		if (ws > 1 && cpt_at(r, pos + ws) != OUT_OF_RANGE) { /* \s+(?!\S) */
			pos += ws - 1;
			add_piece(r, pos);
			continue;
		}
		if (ws > 0) { /* \s+ */
			pos += ws;
			add_piece(r, pos);
			continue;
		}
		add_piece(r, ++pos);
	}
}

/* ---- splitting ---- */

/* One expression over every current piece: matches become pieces, and so
 * does the text between them (std::regex_iterator over each piece alone, so
 * that lookahead stops at the piece's end). */
static int split_regex(pcre2_code *code, const PCRE2_UCHAR *subject, const struct lengths *in,
                       struct lengths *out)
{
	pcre2_match_data *md = pcre2_match_data_create_from_pattern(code, NULL);
	if (!md)
		return -1;
	size_t start = 0;
	int rc = 0;
	for (size_t k = 0; k < in->n && !rc; k++) {
		size_t len = in->v[k];
		const PCRE2_UCHAR *s = subject + start;
		size_t at = 0, last = 0;
		while (at <= len) {
			int m = pcre2_match(code, s, len, at, 0, md, NULL);
			if (m < 0)
				break;
			PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
			size_t ms = ov[0], me = ov[1];
			if (me == ms) { /* an empty match: no piece; move on by one */
				at = ms + 1;
				continue;
			}
			if (ms > last && lengths_push(out, ms - last))
				rc = -1;
			if (lengths_push(out, me - ms))
				rc = -1;
			last = at = me;
		}
		if (last < len && lengths_push(out, len - last))
			rc = -1;
		start += len;
	}
	pcre2_match_data_free(md);
	return rc;
}

/* GPT-2's bytes_to_unicode: printable bytes stand for themselves, the
 * others take U+0100, U+0101, ... in byte order. */
static void build_byte_symbols(struct pretokenizer *p)
{
	int n = 0;
	for (int b = 0; b < 256; b++) {
		int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
		uint32_t cpt = printable ? (uint32_t)b : (uint32_t)(256 + n++);
		p->byte_sym_len[b] = (unsigned char)unicode_encode(cpt, p->byte_sym[b]);
	}
}

int pretokenizer_split(const struct pretokenizer *p, const char *text, size_t len,
                       pretokenizer_word_fn fn, void *arg)
{
	size_t n;
	uint32_t *cpts = unicode_decode_all(text, len, &n);
	if (!cpts)
		return -1;
	for (size_t i = 0; i < n; i++)
		if (cpts[i] >= 0x110000) {
			free(cpts);
			return -2;
		}
	struct units collapsed = {0}, wide = {0};
	struct lengths cur = {0}, next = {0};
	char *word = NULL;
	int rc = 0;
	if (p->need_collapsed)
		for (size_t i = 0; i < n && !rc; i++)
			rc = units_push(&collapsed, collapse(cpts[i]));
	if (p->need_wide)
		for (size_t i = 0; i < n && !rc; i++) {
			uint32_t c = cpts[i];
			if (c > 0x7F && (unicode_flags(c) & UNICODE_WHITESPACE))
				c = 0x0B;
			rc = units_push(&wide, c);
		}
	if (!rc && n)
		rc = lengths_push(&cur, n);
	for (size_t k = 0; k < p->n_splits && !rc; k++) {
		const struct split *s = &p->splits[k];
		next.n = 0;
		if (s->kind == SPLIT_GPT2 || s->kind == SPLIT_LLAMA3) {
			size_t start = 0;
			for (size_t i = 0; i < cur.n && !rc; i++) {
				struct range r = {cpts, start, start + cur.v[i], start, &next, 0};
				if (s->kind == SPLIT_GPT2)
					split_gpt2_range(&r);
				else
					split_llama3_range(&r);
				rc = r.oom ? -1 : 0;
				start += cur.v[i];
			}
		} else {
			rc = split_regex(s->code,
			                 s->kind == SPLIT_REGEX_COLLAPSED ? collapsed.v : wide.v,
			                 &cur, &next);
		}
		struct lengths t = cur;
		cur = next;
		next = t;
	}
	/* Each piece back to UTF-8, then (byte-level BPE) each byte to its symbol. */
	size_t start = 0;
	size_t cap = 0;
	for (size_t i = 0; i < cur.n && !rc; i++) {
		size_t need = cur.v[i] * 8;
		if (need > cap) {
			char *w = realloc(word, need);
			if (!w) {
				rc = -1;
				break;
			}
			word = w;
			cap = need;
		}
		size_t wl = 0;
		for (size_t j = start; j < start + cur.v[i]; j++) {
			char u[4];
			size_t ul = unicode_encode(cpts[j], u);
			if (p->type->raw_utf8) {
				memcpy(word + wl, u, ul);
				wl += ul;
			} else {
				for (size_t b = 0; b < ul; b++) {
					unsigned char c = (unsigned char)u[b];
					memcpy(word + wl, p->byte_sym[c], p->byte_sym_len[c]);
					wl += p->byte_sym_len[c];
				}
			}
		}
		start += cur.v[i];
		if (fn(word, wl, arg))
			rc = -1;
	}
	free(word);
	free(cur.v);
	free(next.v);
	free(collapsed.v);
	free(wide.v);
	free(cpts);
	return rc;
}
