/* The template parser: llama.cpp's common/jinja/parser.cpp, production for
 * production (so that precedence and the odd corners, such as optional
 * commas in argument lists, agree). Node fields by kind:
 *   N_IF       a = test, list = body, list2 = else body
 *   N_FOR      a = loop variable(s), b = iterable, list = body, list2 = else
 *   N_SET      a = target, b = value (or NULL: list = body)
 *   N_MACRO    a = name, list = parameters, list2 = body
 *   N_FILTER_BLOCK a = filter, list = body;  N_CALL_BLOCK a = call, list = body
 *   N_MEMBER   a = object, b = property (computed: obj[b])
 *   N_CALL     a = callee, list = arguments
 *   N_BINARY   s = operator, a, b;  N_UNARY s = operator, a
 *   N_FILTER   a = operand, b = filter (identifier or call)
 *   N_TEST     a = operand, b = test (identifier or call), negate
 *   N_SELECT   a = value, b = condition;  N_TERNARY a = cond, b = then, c = else
 *   N_SLICE    a, b, c = start, stop, step (each may be NULL)
 *   N_KWARG    a = key (identifier), b = value;  N_SPREAD a
 *   N_ARRAY, N_TUPLE list = items;  N_OBJECT list = keys, list2 = values */
#include <stdlib.h>
#include <string.h>

#include "template/jinja_impl.h"

struct parser {
	struct arena *a;
	struct jerr *e;
	const struct token *toks;
	size_t n, cur;
	int depth; /* recursion guard: a template is text from a model file */
};

#define ENTER(p)                                                                         \
	do {                                                                             \
		if (++(p)->depth > JINJA_MAX_PARSE_DEPTH)                                \
			jinja_fail((p)->e, "parser: template nested too deep at token %zu", \
				   (p)->cur);                                            \
	} while (0)

static const struct token eof_token = {T_EOF, "", 0, 0};

static const struct token *peek(const struct parser *p, size_t off)
{
	return p->cur + off < p->n ? &p->toks[p->cur + off] : &eof_token;
}

static const struct token *next(struct parser *p)
{
	if (p->cur >= p->n)
		jinja_fail(p->e, "parser: unexpected end of template");
	return &p->toks[p->cur++];
}

static int is(const struct parser *p, enum tok t)
{
	return peek(p, 0)->t == t;
}

static int is_ident(const struct parser *p, const char *name)
{
	return peek(p, 0)->t == T_IDENT && !strcmp(peek(p, 0)->v, name);
}

static void expect(struct parser *p, enum tok t, const char *what)
{
	const struct token *k = peek(p, 0);
	if (k->t != t)
		jinja_fail(p->e, "parser: expected %s at %zu (got '%s')", what, k->pos, k->v);
	p->cur++;
}

static void expect_ident(struct parser *p, const char *name)
{
	if (!is_ident(p, name))
		jinja_fail(p->e, "parser: expected %s at %zu", name, peek(p, 0)->pos);
	p->cur++;
}

/* {% name %} with name among the '|'-separated names. */
static int is_statement(const struct parser *p, const char *names)
{
	if (peek(p, 0)->t != T_OPEN_STMT || peek(p, 1)->t != T_IDENT)
		return 0;
	const char *v = peek(p, 1)->v;
	size_t vl = strlen(v);
	for (const char *s = names; *s;) {
		const char *bar = strchr(s, '|');
		size_t l = bar ? (size_t)(bar - s) : strlen(s);
		if (l == vl && !memcmp(s, v, l))
			return 1;
		if (!bar)
			break;
		s = bar + 1;
	}
	return 0;
}

static struct node *mk(struct parser *p, enum node_kind k, size_t tok_index)
{
	struct node *nd = arena_alloc(p->a, sizeof *nd);
	if (!nd)
		jinja_fail(p->e, "out of memory");
	nd->kind = k;
	nd->pos = tok_index < p->n ? p->toks[tok_index].pos : 0;
	return nd;
}

static void add(struct parser *p, struct nodes *l, struct node *nd)
{
	if (l->n == l->cap) {
		size_t cap = l->cap ? l->cap * 2 : 8;
		struct node **v = arena_alloc(p->a, cap * sizeof *v);
		if (!v)
			jinja_fail(p->e, "out of memory");
		if (l->n)
			memcpy(v, l->v, l->n * sizeof *v);
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = nd;
}

static struct node *parse_any(struct parser *p);
static struct node *parse_expression(struct parser *p);
static struct node *parse_primary(struct parser *p);
static struct node *parse_call(struct parser *p, struct node *callee);
static struct node *parse_if_expression(struct parser *p);

static void parse_args(struct parser *p, struct nodes *args)
{
	expect(p, T_LPAREN, "(");
	while (!is(p, T_RPAREN)) {
		struct node *arg;
		if (peek(p, 0)->t == T_MUL && !strcmp(peek(p, 0)->v, "*")) {
			size_t at = p->cur++;
			arg = mk(p, N_SPREAD, at);
			arg->a = parse_expression(p);
		} else {
			arg = parse_expression(p);
			if (is(p, T_EQUALS)) {
				size_t at = p->cur++;
				struct node *kw = mk(p, N_KWARG, at);
				kw->a = arg;
				kw->b = parse_expression(p);
				arg = kw;
			}
		}
		add(p, args, arg);
		if (is(p, T_COMMA))
			p->cur++;
		if (is(p, T_EOF))
			jinja_fail(p->e, "parser: unterminated argument list");
	}
	expect(p, T_RPAREN, ")");
}

static struct node *parse_member_arguments(struct parser *p)
{
	struct node *parts[3] = {NULL, NULL, NULL};
	size_t count = 0;
	int slice = 0;
	size_t at = p->cur;
	while (!is(p, T_RBRACKET)) {
		if (is(p, T_EOF))
			jinja_fail(p->e, "parser: unterminated [");
		if (is(p, T_COLON)) {
			if (count < 3)
				parts[count] = NULL;
			count++;
			p->cur++;
			slice = 1;
		} else {
			struct node *x = parse_expression(p);
			if (count < 3)
				parts[count] = x;
			count++;
			if (is(p, T_COLON)) {
				p->cur++;
				slice = 1;
			}
		}
	}
	if (slice) {
		struct node *s = mk(p, N_SLICE, at);
		s->a = parts[0];
		s->b = count > 1 ? parts[1] : NULL;
		s->c = count > 2 ? parts[2] : NULL;
		return s;
	}
	if (!count)
		return mk(p, N_BLANK, at);
	return parts[0];
}

static struct node *parse_member(struct parser *p, struct node *object)
{
	size_t at = p->cur;
	while (is(p, T_DOT) || is(p, T_LBRACKET)) {
		int computed = next(p)->t == T_LBRACKET;
		struct node *prop;
		if (computed) {
			prop = parse_member_arguments(p);
			expect(p, T_RBRACKET, "]");
		} else {
			prop = parse_primary(p);
		}
		struct node *m = mk(p, N_MEMBER, at);
		m->a = object;
		m->b = prop;
		m->computed = computed;
		object = m;
	}
	return object;
}

static struct node *parse_call(struct parser *p, struct node *callee)
{
	size_t at = p->cur;
	struct node *c = mk(p, N_CALL, at);
	c->a = callee;
	parse_args(p, &c->list);
	struct node *m = parse_member(p, c);
	return is(p, T_LPAREN) ? parse_call(p, m) : m;
}

static struct node *parse_call_member(struct parser *p)
{
	struct node *m = parse_member(p, parse_primary(p));
	return is(p, T_LPAREN) ? parse_call(p, m) : m;
}

static struct node *parse_filter(struct parser *p)
{
	struct node *operand = parse_call_member(p);
	while (is(p, T_PIPE)) {
		size_t at = p->cur++;
		struct node *f = parse_primary(p);
		if (is(p, T_LPAREN))
			f = parse_call(p, f);
		struct node *fe = mk(p, N_FILTER, at);
		fe->a = operand;
		fe->b = f;
		operand = fe;
	}
	return operand;
}

static struct node *parse_test(struct parser *p)
{
	struct node *operand = parse_filter(p);
	while (is_ident(p, "is")) {
		size_t at = p->cur++;
		int negate = 0;
		if (is_ident(p, "not")) {
			p->cur++;
			negate = 1;
		}
		struct node *t = parse_primary(p);
		if (is(p, T_LPAREN))
			t = parse_call(p, t);
		struct node *te = mk(p, N_TEST, at);
		te->a = operand;
		te->b = t;
		te->negate = negate;
		operand = te;
	}
	return operand;
}

static struct node *binary(struct parser *p, size_t at, const struct token *op, struct node *l,
			   struct node *r)
{
	struct node *b = mk(p, N_BINARY, at);
	b->s = op->v;
	b->a = l;
	b->b = r;
	return b;
}

static struct node *parse_multiplicative(struct parser *p)
{
	struct node *left = parse_test(p);
	while (is(p, T_MUL)) {
		size_t at = p->cur;
		const struct token *op = next(p);
		left = binary(p, at, op, left, parse_test(p));
	}
	return left;
}

static struct node *parse_additive(struct parser *p)
{
	struct node *left = parse_multiplicative(p);
	while (is(p, T_ADD)) {
		size_t at = p->cur;
		const struct token *op = next(p);
		left = binary(p, at, op, left, parse_multiplicative(p));
	}
	return left;
}

static const struct token not_in_token = {T_IDENT, "not in", 6, 0};

static struct node *parse_comparison(struct parser *p)
{
	struct node *left = parse_additive(p);
	for (;;) {
		size_t at = p->cur;
		const struct token *op;
		if (is_ident(p, "not") && peek(p, 1)->t == T_IDENT && !strcmp(peek(p, 1)->v, "in")) {
			op = &not_in_token;
			p->cur += 2;
		} else if (is_ident(p, "in") || is(p, T_CMP)) {
			op = next(p);
		} else {
			break;
		}
		left = binary(p, at, op, left, parse_additive(p));
	}
	return left;
}

static struct node *parse_not(struct parser *p)
{
	if (is_ident(p, "not")) {
		size_t at = p->cur;
		const struct token *op = next(p);
		struct node *u = mk(p, N_UNARY, at);
		u->s = op->v;
		ENTER(p);
		u->a = parse_not(p);
		p->depth--;
		return u;
	}
	return parse_comparison(p);
}

static struct node *parse_and(struct parser *p)
{
	struct node *left = parse_not(p);
	while (is_ident(p, "and")) {
		size_t at = p->cur;
		const struct token *op = next(p);
		left = binary(p, at, op, left, parse_not(p));
	}
	return left;
}

static struct node *parse_or(struct parser *p)
{
	struct node *left = parse_and(p);
	while (is_ident(p, "or")) {
		size_t at = p->cur;
		const struct token *op = next(p);
		left = binary(p, at, op, left, parse_and(p));
	}
	return left;
}

static struct node *parse_if_expression(struct parser *p)
{
	struct node *a = parse_or(p);
	if (is_ident(p, "if")) {
		size_t at = p->cur++;
		struct node *test = parse_or(p);
		if (is_ident(p, "else")) {
			size_t at2 = p->cur++;
			struct node *t = mk(p, N_TERNARY, at2);
			t->a = test;
			t->b = a;
			t->c = parse_if_expression(p);
			return t;
		}
		struct node *s = mk(p, N_SELECT, at);
		s->a = a;
		s->b = test;
		return s;
	}
	return a;
}

static struct node *parse_expression(struct parser *p)
{
	ENTER(p);
	struct node *nd = parse_if_expression(p);
	p->depth--;
	return nd;
}

static struct node *parse_sequence(struct parser *p, int primary)
{
	size_t at = p->cur;
	struct node *first = primary ? parse_primary(p) : parse_expression(p);
	if (!is(p, T_COMMA))
		return first;
	struct node *t = mk(p, N_TUPLE, at);
	add(p, &t->list, first);
	while (is(p, T_COMMA)) {
		p->cur++;
		add(p, &t->list, primary ? parse_primary(p) : parse_expression(p));
	}
	return t;
}

static struct node *parse_primary(struct parser *p)
{
	size_t at = p->cur;
	const struct token *t = next(p);
	switch (t->t) {
	case T_NUM: {
		if (strchr(t->v, '.')) {
			struct node *nd = mk(p, N_FLOAT, at);
			nd->f = strtod(t->v, NULL);
			return nd;
		}
		struct node *nd = mk(p, N_INT, at);
		nd->i = strtoll(t->v, NULL, 10);
		return nd;
	}
	case T_STR: {
		/* Adjacent string literals join. */
		size_t len = t->len, extra = 0;
		for (size_t k = p->cur; k < p->n && p->toks[k].t == T_STR; k++)
			extra += p->toks[k].len;
		char *s = arena_alloc(p->a, len + extra + 1);
		if (!s)
			jinja_fail(p->e, "out of memory");
		memcpy(s, t->v, len);
		while (is(p, T_STR)) {
			const struct token *u = next(p);
			memcpy(s + len, u->v, u->len);
			len += u->len;
		}
		struct node *nd = mk(p, N_TEXT, at);
		nd->s = s;
		nd->len = len;
		return nd;
	}
	case T_IDENT: {
		struct node *nd = mk(p, N_IDENT, at);
		nd->s = t->v;
		nd->len = t->len;
		return nd;
	}
	case T_LPAREN: {
		struct node *e = parse_sequence(p, 0);
		expect(p, T_RPAREN, ")");
		return e;
	}
	case T_LBRACKET: {
		struct node *arr = mk(p, N_ARRAY, at);
		while (!is(p, T_RBRACKET)) {
			if (is(p, T_EOF))
				jinja_fail(p->e, "parser: unterminated [");
			add(p, &arr->list, parse_expression(p));
			if (is(p, T_COMMA))
				p->cur++;
		}
		p->cur++;
		return arr;
	}
	case T_LBRACE: {
		struct node *obj = mk(p, N_OBJECT, at);
		while (!is(p, T_RBRACE)) {
			if (is(p, T_EOF))
				jinja_fail(p->e, "parser: unterminated {");
			add(p, &obj->list, parse_expression(p));
			expect(p, T_COLON, ":");
			add(p, &obj->list2, parse_expression(p));
			if (is(p, T_COMMA))
				p->cur++;
		}
		p->cur++;
		return obj;
	}
	default:
		jinja_fail(p->e, "parser: unexpected token '%s' at %zu", t->v, t->pos);
	}
}

static void parse_until(struct parser *p, const char *names, struct nodes *body)
{
	while (!is_statement(p, names)) {
		if (is(p, T_EOF))
			jinja_fail(p->e, "parser: missing {%% %s %%}", names);
		add(p, body, parse_any(p));
	}
}

static struct node *parse_if(struct parser *p, size_t at)
{
	struct node *nd = mk(p, N_IF, at);
	nd->a = parse_expression(p);
	expect(p, T_CLOSE_STMT, "%}");
	parse_until(p, "elif|else|endif", &nd->list);
	if (is_statement(p, "elif")) {
		size_t at2 = p->cur;
		p->cur += 2;
		add(p, &nd->list2, parse_if(p, at2));
	} else if (is_statement(p, "else")) {
		p->cur += 2;
		expect(p, T_CLOSE_STMT, "%}");
		parse_until(p, "endif", &nd->list2);
	}
	return nd;
}

static void expect_end(struct parser *p, const char *name)
{
	expect(p, T_OPEN_STMT, "{%");
	expect_ident(p, name);
	expect(p, T_CLOSE_STMT, "%}");
}

static struct node *parse_statement(struct parser *p)
{
	expect(p, T_OPEN_STMT, "{%");
	if (peek(p, 0)->t != T_IDENT)
		jinja_fail(p->e, "parser: unknown statement at %zu", peek(p, 0)->pos);
	size_t at = p->cur;
	const char *name = next(p)->v;
	struct node *nd;
	if (!strcmp(name, "set")) {
		nd = mk(p, N_SET, at);
		nd->a = parse_sequence(p, 0);
		if (is(p, T_EQUALS)) {
			p->cur++;
			nd->b = parse_sequence(p, 0);
		} else {
			expect(p, T_CLOSE_STMT, "%}");
			parse_until(p, "endset", &nd->list);
			expect(p, T_OPEN_STMT, "{%");
			expect_ident(p, "endset");
		}
		expect(p, T_CLOSE_STMT, "%}");
	} else if (!strcmp(name, "if")) {
		nd = parse_if(p, at);
		expect_end(p, "endif");
	} else if (!strcmp(name, "macro")) {
		nd = mk(p, N_MACRO, at);
		nd->a = parse_primary(p);
		parse_args(p, &nd->list);
		expect(p, T_CLOSE_STMT, "%}");
		parse_until(p, "endmacro", &nd->list2);
		expect_end(p, "endmacro");
	} else if (!strcmp(name, "for")) {
		nd = mk(p, N_FOR, at);
		nd->a = parse_sequence(p, 1);
		if (!is_ident(p, "in"))
			jinja_fail(p->e, "parser: expected 'in' at %zu", peek(p, 0)->pos);
		p->cur++;
		nd->b = parse_expression(p);
		expect(p, T_CLOSE_STMT, "%}");
		parse_until(p, "endfor|else", &nd->list);
		if (is_statement(p, "else")) {
			p->cur += 2;
			expect(p, T_CLOSE_STMT, "%}");
			parse_until(p, "endfor", &nd->list2);
		}
		expect_end(p, "endfor");
	} else if (!strcmp(name, "break")) {
		expect(p, T_CLOSE_STMT, "%}");
		nd = mk(p, N_BREAK, at);
	} else if (!strcmp(name, "continue")) {
		expect(p, T_CLOSE_STMT, "%}");
		nd = mk(p, N_CONTINUE, at);
	} else if (!strcmp(name, "call")) {
		nd = mk(p, N_CALL_BLOCK, at);
		struct nodes caller_args = {0};
		if (is(p, T_LPAREN))
			parse_args(p, &caller_args);
		struct node *callee = parse_primary(p);
		if (callee->kind != N_IDENT)
			jinja_fail(p->e, "parser: expected identifier after call");
		struct node *call = mk(p, N_CALL, at);
		call->a = callee;
		parse_args(p, &call->list);
		expect(p, T_CLOSE_STMT, "%}");
		parse_until(p, "endcall", &nd->list);
		expect_end(p, "endcall");
		nd->a = call;
	} else if (!strcmp(name, "filter")) {
		nd = mk(p, N_FILTER_BLOCK, at);
		struct node *f = parse_primary(p);
		if (f->kind == N_IDENT && is(p, T_LPAREN))
			f = parse_call(p, f);
		nd->a = f;
		expect(p, T_CLOSE_STMT, "%}");
		parse_until(p, "endfilter", &nd->list);
		expect_end(p, "endfilter");
	} else if (!strcmp(name, "generation") || !strcmp(name, "endgeneration")) {
		nd = mk(p, N_NOOP, at);
		p->cur++;
	} else {
		jinja_fail(p->e, "parser: unknown statement '%s'", name);
	}
	return nd;
}

static struct node *parse_any_inner(struct parser *p);

static struct node *parse_any(struct parser *p)
{
	ENTER(p);
	struct node *nd = parse_any_inner(p);
	p->depth--;
	return nd;
}

static struct node *parse_any_inner(struct parser *p)
{
	size_t at = p->cur;
	const struct token *t = peek(p, 0);
	switch (t->t) {
	case T_COMMENT:
		p->cur++;
		return mk(p, N_COMMENT, at);
	case T_TEXT: {
		p->cur++;
		struct node *nd = mk(p, N_TEXT, at);
		nd->s = t->v;
		nd->len = t->len;
		return nd;
	}
	case T_OPEN_STMT:
		return parse_statement(p);
	case T_OPEN_EXPR: {
		p->cur++;
		struct node *e = parse_expression(p);
		expect(p, T_CLOSE_EXPR, "}}");
		return e;
	}
	default:
		jinja_fail(p->e, "parser: unexpected token '%s' at %zu", t->v, t->pos);
	}
}

void jinja_parse_tokens(struct arena *a, struct jerr *e, const struct token *toks, size_t n,
			struct nodes *body)
{
	struct parser p = {a, e, toks, n, 0, 0};
	while (p.cur < p.n)
		add(&p, body, parse_any(&p));
}
