/* Internals of the Jinja engine (jinja.h): tokens, the parse tree, values,
 * the arena every render allocates from, and the error exit. */
#ifndef TOKI_TEMPLATE_JINJA_IMPL_H
#define TOKI_TEMPLATE_JINJA_IMPL_H

#include <setjmp.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <jansson.h>

/* ---- arena: one per parse tree, one per render; freed whole ---- */

struct arena_block;
struct arena {
	struct arena_block *head;
	size_t total, limit; /* bytes taken from malloc; the most it may take (0: no cap) */
};
/* zeroed; NULL when out of memory or past the arena's limit */
void *arena_alloc(struct arena *a, size_t n);
void arena_free(struct arena *a);

/* ---- errors: a failing render or parse longjmps out ---- */

struct jerr {
	jmp_buf jb;
	char msg[512];
};
_Noreturn void jinja_fail(struct jerr *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- tokens (llama.cpp's jinja lexer) ---- */

enum tok {
	T_EOF,
	T_TEXT,
	T_NUM,
	T_STR,
	T_IDENT,
	T_EQUALS,
	T_LPAREN,
	T_RPAREN,
	T_OPEN_STMT,
	T_CLOSE_STMT,
	T_OPEN_EXPR,
	T_CLOSE_EXPR,
	T_LBRACKET,
	T_RBRACKET,
	T_LBRACE,
	T_RBRACE,
	T_COMMA,
	T_DOT,
	T_COLON,
	T_PIPE,
	T_ADD,	 /* + - ~ */
	T_MUL,	 /* * / % */
	T_CMP,	 /* < > <= >= == != */
	T_UNARY, /* a lone - or + before an operand */
	T_COMMENT,
};

struct token {
	enum tok t;
	const char *v; /* NUL-terminated, escapes resolved */
	size_t len;
	size_t pos;
};

/* Splits src into tokens (allocated in a). */
struct token *jinja_lex(struct arena *a, struct jerr *e, const char *src, size_t len,
			size_t *n_tokens);

/* ---- the parse tree ---- */

enum node_kind {
	N_TEXT, /* a string literal, also the text between blocks */
	N_COMMENT,
	N_NOOP,
	N_IF,
	N_FOR,
	N_BREAK,
	N_CONTINUE,
	N_SET,
	N_MACRO,
	N_CALL_BLOCK, /* {% call %}: parsed, fails when run (as in llama.cpp) */
	N_FILTER_BLOCK,
	N_IDENT,
	N_INT,
	N_FLOAT,
	N_ARRAY,
	N_TUPLE,
	N_OBJECT,
	N_MEMBER,
	N_CALL,
	N_BINARY,
	N_UNARY,
	N_FILTER,
	N_TEST,
	N_SELECT,  /* x if cond (no else) */
	N_TERNARY,
	N_SLICE,
	N_KWARG,
	N_SPREAD,
	N_BLANK, /* obj[] */
};

struct node;
struct nodes {
	struct node **v;
	size_t n, cap;
};

struct node {
	enum node_kind kind;
	size_t pos;
	const char *s; /* text, identifier, operator */
	size_t len;
	int64_t i;
	double f;
	int negate;   /* N_TEST */
	int computed; /* N_MEMBER: obj[x] */
	struct node *a, *b, *c; /* operands: see the parser */
	struct nodes list;	/* body, items, arguments */
	struct nodes list2;	/* else body, object values, macro body */
};

struct jinja_template {
	struct arena arena;
	struct nodes body;
};

void jinja_parse_tokens(struct arena *a, struct jerr *e, const struct token *toks, size_t n,
			struct nodes *body);

/* ---- values ---- */

enum jtype {
	JT_UNDEF,
	JT_NONE,
	JT_BOOL,
	JT_INT,
	JT_FLOAT,
	JT_STR,
	JT_ARRAY,
	JT_TUPLE,
	JT_OBJECT,
	JT_FUNC,
	JT_KWARG,
};

struct jval;
struct rt;
struct scope;

/* A built-in: args[0] is the bound value (the filter's input) when bound. */
typedef struct jval *(*jbuiltin)(struct rt *rt, struct jval **args, size_t n);

struct jval {
	enum jtype t;
	int64_t i; /* int, bool; a float's truncation */
	double f;  /* float; an int as a double (±inf when it does not fit) */
	/* strings: bytes and, when concatenated, the lengths of the parts (the
	 * unit capitalize and title work on) */
	const char *s;
	size_t len;
	size_t *parts;
	size_t n_parts; /* 0: one part */
	/* arrays, tuples; objects (keys[i] -> items[i]) */
	struct jval **items, **keys;
	size_t n, cap;
	int no_builtins; /* the loop object and scopes have no methods */
	/* functions: a built-in, bound to arg0, or a macro */
	const char *name;
	jbuiltin fn;
	struct jval *arg0;
	const struct node *macro;
	struct scope *macro_scope;
	/* keyword arguments: key = val */
	const char *kw;
	struct jval *kwval;
	const char *hint; /* undefined: the name that was looked up */
};

struct scope {
	struct scope *parent;
	struct jval *vars; /* an object */
};

/* The state of one render. */
struct rt {
	struct arena arena;
	struct jerr err;
	time_t now;
	int depth;	      /* statement nesting and macro calls */
	int eval_depth;	      /* expression nesting */
};

/* What one render may spend. A chat template runs inside the daemon's event
 * loop on text the model file supplies: a template that loops for ever or
 * builds a string without end must fail (the server then makes that
 * prompt), not stall every other request. Every evaluation allocates from
 * the render's arena and nothing is freed before the render ends, so the
 * arena's cap bounds time as well as memory (reached in about half a
 * second); real templates over long conversations stay far below it. */
#define JINJA_MAX_RENDER_BYTES (256u << 20)
#define JINJA_MAX_EVAL_DEPTH 1000
#define JINJA_MAX_PARSE_DEPTH 500

struct jval *jv_new(struct rt *rt, enum jtype t);
struct jval *jv_undef(struct rt *rt, const char *hint);
struct jval *jv_none(struct rt *rt);
struct jval *jv_bool(struct rt *rt, int b);
struct jval *jv_int(struct rt *rt, int64_t i);
struct jval *jv_float(struct rt *rt, double f);
/* A string value over bytes that live as long as the render (copied when
 * copy is set). */
struct jval *jv_str(struct rt *rt, const char *s, size_t len, int copy);
struct jval *jv_strz(struct rt *rt, const char *s);
struct jval *jv_array(struct rt *rt, enum jtype t);
struct jval *jv_object(struct rt *rt);
struct jval *jv_func(struct rt *rt, const char *name, jbuiltin fn, struct jval *arg0);

void jv_push(struct rt *rt, struct jval *arr, struct jval *v);
/* Object members: insert replaces in place; get returns NULL when absent.
 * Keys compare as llama.cpp's == (1, 1.0 and true are one key). */
void jv_insert(struct rt *rt, struct jval *obj, struct jval *key, struct jval *v);
void jv_insert_str(struct rt *rt, struct jval *obj, const char *key, struct jval *v);
struct jval *jv_get(struct rt *rt, struct jval *obj, struct jval *key);
struct jval *jv_get_str(struct jval *obj, const char *key);

int jv_is_numeric(const struct jval *v); /* int, float, bool */
int jv_is_array(const struct jval *v);	  /* array or tuple */
int jv_is_none(const struct jval *v);	  /* none or undefined */
int jv_truthy(struct rt *rt, const struct jval *v);
int64_t jv_as_int(struct rt *rt, const struct jval *v);
double jv_as_float(struct rt *rt, const struct jval *v);
/* llama.cpp's as_string: what ~ and string() make of a value. */
struct jval *jv_as_string(struct rt *rt, struct jval *v);
/* ==, as llama.cpp defines it. */
int jv_equal(const struct jval *a, const struct jval *b);
/* value_compare(a, b, op) for sort, dictsort and the comparison tests. */
enum jcmp { JCMP_EQ, JCMP_GE, JCMP_GT, JCMP_LT, JCMP_NE };
int jv_compare(struct rt *rt, struct jval *a, struct jval *b, enum jcmp op);
/* tojson with llama.cpp's layout. */
struct jval *jv_to_json(struct rt *rt, struct jval *v, int indent, const char *item_sep,
			const char *key_sep);
struct jval *jv_from_json(struct rt *rt, json_t *j);
const char *jv_type_name(const struct jval *v);

/* Concatenation that keeps both operands' parts. */
struct jval *jv_concat(struct rt *rt, struct jval *a, struct jval *b);

/* A growable output that records its parts. */
struct jbuf {
	char *p;
	size_t len, cap;
	size_t *parts;
	size_t n_parts, cap_parts;
};
void jbuf_append(struct rt *rt, struct jbuf *b, const char *s, size_t len);
/* Appends a string value with its parts. */
void jbuf_append_value_parts(struct rt *rt, struct jbuf *b, const struct jval *s);
struct jval *jbuf_value(struct rt *rt, struct jbuf *b);

/* ---- built-ins (jinja_builtins.c) ---- */

/* The method or filter name of v's type, or NULL. */
jbuiltin jinja_type_builtin(const struct jval *v, const char *name);
/* A global function (range, namespace, ...) or test ("test_is_string"). */
jbuiltin jinja_global_builtin(const char *name);

/* Argument helpers for built-ins. */
struct jval *jinja_kwarg(struct jval **args, size_t n, const char *key);
struct jval *jinja_kwarg_or_pos(struct rt *rt, struct jval **args, size_t n, const char *key,
				size_t pos);
void jinja_need(struct rt *rt, const char *fn, size_t n, size_t min, size_t max);

#endif
