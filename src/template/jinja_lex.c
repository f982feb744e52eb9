/* The template lexer: llama.cpp's common/jinja/lexer.cpp, rule for rule.
 * Its whitespace handling is the part a prompt's bytes depend on most:
 * lstrip_blocks and trim_blocks on, {%- / -%} stripping, one trailing newline
 * of the whole template dropped, \r\n and \r read as \n. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/jinja_impl.h"

struct lexer {
	struct arena *a;
	struct jerr *e;
	char *src; /* normalized, NUL-terminated */
	size_t size, pos;
	struct token *toks;
	size_t n, cap;
};

static void push(struct lexer *l, enum tok t, const char *v, size_t len, size_t pos)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 256;
		struct token *nt = arena_alloc(l->a, cap * sizeof *nt);
		if (!nt)
			jinja_fail(l->e, "out of memory");
		if (l->n)
			memcpy(nt, l->toks, l->n * sizeof *nt);
		l->toks = nt;
		l->cap = cap;
	}
	char *copy = arena_alloc(l->a, len + 1);
	if (!copy)
		jinja_fail(l->e, "out of memory");
	memcpy(copy, v, len);
	l->toks[l->n++] = (struct token){t, copy, len, pos};
}

static enum tok last_type(const struct lexer *l, enum tok if_none)
{
	return l->n ? l->toks[l->n - 1].t : if_none;
}

/* src[pos + n] is one of chars (false past the end, as in llama.cpp). */
static int next_is(const struct lexer *l, const char *chars, size_t n)
{
	if (l->pos + n >= l->size)
		return 0;
	return strchr(chars, l->src[l->pos + n]) != NULL && l->src[l->pos + n] != 0;
}

static int is_word(char c)
{
	return isalnum((unsigned char)c) || c == '_';
}

static int is_digit(char c)
{
	return isdigit((unsigned char)c);
}

struct sbuf {
	char *p;
	size_t len, cap;
};

static void sb_put(struct lexer *l, struct sbuf *b, char c)
{
	if (b->len + 1 >= b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 64;
		char *p = arena_alloc(l->a, cap);
		if (!p)
			jinja_fail(l->e, "out of memory");
		if (b->len)
			memcpy(p, b->p, b->len);
		b->p = p;
		b->cap = cap;
	}
	b->p[b->len++] = c;
	b->p[b->len] = 0;
}

/* consume_while: with backslash escapes, as llama.cpp's. */
static void consume_while(struct lexer *l, int (*pred)(int, int), int arg, struct sbuf *out)
{
	while (pred(l->src[l->pos], arg)) {
		if (l->src[l->pos] == '\\') {
			l->pos++;
			if (l->pos >= l->size)
				jinja_fail(l->e, "lexer: unexpected end of input after escape at %zu", l->pos);
			char c = l->src[l->pos++];
			char u;
			switch (c) {
			case 'n': u = '\n'; break;
			case 't': u = '\t'; break;
			case 'r': u = '\r'; break;
			case 'b': u = '\b'; break;
			case 'f': u = '\f'; break;
			case 'v': u = '\v'; break;
			case '\\': u = '\\'; break;
			case '\'': u = '\''; break;
			case '"': u = '"'; break;
			default: jinja_fail(l->e, "lexer: unknown escape character \\%c at %zu", c, l->pos);
			}
			sb_put(l, out, u);
			continue;
		}
		sb_put(l, out, l->src[l->pos++]);
		if (l->pos > l->size)
			jinja_fail(l->e, "lexer: unexpected end of input at %zu", l->pos);
	}
}

static int pred_space(int c, int arg)
{
	(void)arg;
	return isspace((unsigned char)c);
}

static int pred_digit(int c, int arg)
{
	(void)arg;
	return isdigit((unsigned char)c);
}

static int pred_word(int c, int arg)
{
	(void)arg;
	return is_word((char)c);
}

static int pred_not(int c, int quote)
{
	return c != quote;
}

static void strip_left(char **s, size_t *len)
{
	while (*len && strchr(" \t\r\n", **s)) {
		(*s)++;
		(*len)--;
	}
}

static void strip_right(const char *s, size_t *len)
{
	while (*len && strchr(" \t\r\n", s[*len - 1]))
		(*len)--;
}

static const struct {
	const char *seq;
	enum tok t;
} mapping[] = {
	{"{%-", T_OPEN_STMT}, {"-%}", T_CLOSE_STMT}, {"{{-", T_OPEN_EXPR}, {"-}}", T_CLOSE_EXPR},
	{"{%", T_OPEN_STMT},  {"%}", T_CLOSE_STMT},  {"{{", T_OPEN_EXPR},  {"}}", T_CLOSE_EXPR},
	{"(", T_LPAREN},      {")", T_RPAREN},	     {"{", T_LBRACE},	   {"}", T_RBRACE},
	{"[", T_LBRACKET},    {"]", T_RBRACKET},     {",", T_COMMA},	   {".", T_DOT},
	{":", T_COLON},	      {"|", T_PIPE},	     {"<=", T_CMP},	   {">=", T_CMP},
	{"==", T_CMP},	      {"!=", T_CMP},	     {"<", T_CMP},	   {">", T_CMP},
	{"+", T_ADD},	      {"-", T_ADD},	     {"~", T_ADD},	   {"*", T_MUL},
	{"/", T_MUL},	      {"%", T_MUL},	     {"=", T_EQUALS},
};

struct token *jinja_lex(struct arena *a, struct jerr *e, const char *source, size_t len,
			size_t *n_tokens)
{
	struct lexer lx = {a, e, NULL, 0, 0, NULL, 0, 0};
	struct lexer *l = &lx;
	*n_tokens = 0;
	if (!len)
		return NULL;
	/* \r\n and then \r become \n; then one trailing newline goes (judged on
	 * the source as given, as llama.cpp does). */
	l->src = arena_alloc(a, len + 1);
	if (!l->src)
		jinja_fail(e, "out of memory");
	size_t k = 0;
	for (size_t i = 0; i < len; i++) {
		if (source[i] == '\r' && i + 1 < len && source[i + 1] == '\n')
			continue;
		l->src[k++] = source[i] == '\r' ? '\n' : source[i];
	}
	if (source[len - 1] == '\n' && k)
		k--;
	l->src[k] = 0;
	l->size = k;
	size_t curly_depth = 0;

	while (l->pos < l->size) {
		size_t start_pos = l->pos;
		enum tok last = last_type(l, T_CLOSE_STMT);
		if (last == T_CLOSE_STMT || last == T_CLOSE_EXPR || last == T_COMMENT) {
			int can_rm_newline = 0, rstrip_block = 0;
			if (l->pos > 3) {
				char c0 = l->src[l->pos - 3], c1 = l->src[l->pos - 2],
				     c2 = l->src[l->pos - 1];
				rstrip_block = c0 == '-' && (c1 == '%' || c1 == '}' || c1 == '#') && c2 == '}';
				can_rm_newline = (c1 == '#' || c1 == '%' || c1 == '-') && c2 == '}';
			}
			size_t start = l->pos, end = start;
			while (l->pos < l->size && !(l->src[l->pos] == '{' && next_is(l, "%{#", 1)))
				end = ++l->pos;
			/* lstrip_blocks: spaces between a line start and {% or {# go. */
			if (l->src[l->pos] == '{' && next_is(l, "%#-", 1)) {
				size_t cur = end;
				while (cur > start) {
					char c = l->src[cur - 1];
					if (cur == 1) {
						end = 0;
						break;
					}
					if (c == '\n') {
						end = cur;
						break;
					}
					if (!isspace((unsigned char)c))
						break;
					cur--;
				}
			}
			char *text = l->src + start;
			size_t tlen = end > start ? end - start : 0;
			/* trim_blocks: the newline after %} or #} goes. */
			if (can_rm_newline && tlen && text[0] == '\n') {
				text++;
				tlen--;
			}
			if (rstrip_block)
				strip_left(&text, &tlen);
			if (l->src[l->pos] == '{' && next_is(l, "{%#", 1) && next_is(l, "-", 2))
				strip_right(text, &tlen);
			if (tlen) {
				push(l, T_TEXT, text, tlen, start_pos);
				continue;
			}
		}
		if (l->src[l->pos] == '{' && next_is(l, "#", 1)) {
			start_pos = l->pos;
			l->pos += 2;
			size_t cstart = l->pos;
			while (!(l->src[l->pos] == '#' && next_is(l, "}", 1))) {
				if (l->pos + 2 >= l->size)
					jinja_fail(e, "lexer: missing end of comment tag at %zu", l->pos);
				l->pos++;
			}
			push(l, T_COMMENT, l->src + cstart, l->pos - cstart, start_pos);
			l->pos += 2;
			continue;
		}
		last = last_type(l, T_EOF);
		if (l->src[l->pos] == '-' && (last == T_OPEN_EXPR || last == T_OPEN_STMT)) {
			l->pos++;
			if (l->pos >= l->size)
				break;
		}
		struct sbuf ws = {0};
		consume_while(l, pred_space, 0, &ws);
		if (l->pos >= l->size)
			break;
		char ch = l->src[l->pos];
		int closing = ch == '-' && next_is(l, "%}", 1);
		if (!closing && (ch == '-' || ch == '+')) {
			start_pos = l->pos;
			enum tok lt = last_type(l, T_EOF);
			if (lt == T_TEXT || lt == T_EOF)
				jinja_fail(e, "lexer: unexpected character %c at %zu", ch, l->pos);
			if (lt != T_IDENT && lt != T_NUM && lt != T_STR && lt != T_RPAREN &&
			    lt != T_RBRACKET) {
				/* A unary operator, or a signed number. */
				l->pos++;
				struct sbuf num = {0};
				sb_put(l, &num, ch);
				consume_while(l, pred_digit, 0, &num);
				if (l->pos < l->size && l->src[l->pos] == '.' && l->pos + 1 < l->size &&
				    is_digit(l->src[l->pos + 1])) {
					l->pos++;
					sb_put(l, &num, '.');
					consume_while(l, pred_digit, 0, &num);
				}
				push(l, num.len > 1 ? T_NUM : T_UNARY, num.p, num.len, start_pos);
				continue;
			}
		}
		int matched = 0;
		for (size_t m = 0; m < sizeof mapping / sizeof mapping[0]; m++) {
			size_t sl = strlen(mapping[m].seq);
			if (!strcmp(mapping[m].seq, "}}") && curly_depth > 0)
				continue;
			if (l->pos + sl <= l->size && !memcmp(l->src + l->pos, mapping[m].seq, sl)) {
				push(l, mapping[m].t, mapping[m].seq, sl, l->pos);
				if (mapping[m].t == T_OPEN_EXPR)
					curly_depth = 0;
				else if (mapping[m].t == T_LBRACE)
					curly_depth++;
				else if (mapping[m].t == T_RBRACE)
					curly_depth--;
				l->pos += sl;
				matched = 1;
				break;
			}
		}
		if (matched)
			continue;
		if (ch == '\'' || ch == '"') {
			start_pos = l->pos;
			l->pos++;
			struct sbuf s = {0};
			consume_while(l, pred_not, ch, &s);
			push(l, T_STR, s.p ? s.p : "", s.len, start_pos);
			l->pos++;
			continue;
		}
		if (is_digit(ch)) {
			start_pos = l->pos;
			struct sbuf num = {0};
			consume_while(l, pred_digit, 0, &num);
			if (l->pos < l->size && l->src[l->pos] == '.' && l->pos + 1 < l->size &&
			    is_digit(l->src[l->pos + 1])) {
				l->pos++;
				sb_put(l, &num, '.');
				consume_while(l, pred_digit, 0, &num);
			}
			push(l, T_NUM, num.p, num.len, start_pos);
			continue;
		}
		if (is_word(ch)) {
			start_pos = l->pos;
			struct sbuf w = {0};
			consume_while(l, pred_word, 0, &w);
			push(l, T_IDENT, w.p, w.len, start_pos);
			continue;
		}
		jinja_fail(e, "lexer: unexpected character %c at %zu", ch, l->pos);
	}
	*n_tokens = l->n;
	return l->toks;
}
