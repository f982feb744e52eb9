/* The template runtime: llama.cpp's common/jinja/runtime.cpp. Statements
 * render into a buffer the way llama.cpp gathers their values: strings as
 * they are, numbers and booleans through as_string, arrays as their items,
 * and None, undefined, objects and functions as nothing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "template/jinja.h"
#include "template/jinja_impl.h"

#define FAIL(...) jinja_fail(&rt->err, __VA_ARGS__)

enum flow { FLOW_NEXT, FLOW_BREAK, FLOW_CONTINUE };

static struct jval *eval(struct rt *rt, const struct node *nd, struct scope *sc);
static enum flow exec_list(struct rt *rt, const struct nodes *l, struct scope *sc, struct jbuf *out);

/* ---- scopes ---- */

static struct scope *scope_new(struct rt *rt, struct scope *parent)
{
	struct scope *s = arena_alloc(&rt->arena, sizeof *s);
	if (!s)
		FAIL("out of memory");
	s->parent = parent;
	s->vars = jv_object(rt);
	s->vars->no_builtins = 1;
	return s;
}

/* A child scope sees its parent's variables as they are, as llama.cpp's copy
 * of the parent context does; what it sets stays in it. */
static struct jval *scope_get(struct scope *s, const char *name)
{
	for (; s; s = s->parent) {
		struct jval *v = jv_get_str(s->vars, name);
		if (v)
			return v;
	}
	return NULL;
}

static void scope_set(struct rt *rt, struct scope *s, const char *name, struct jval *v)
{
	jv_insert_str(rt, s->vars, name, v);
}

/* ---- output ---- */

static void emit(struct rt *rt, struct jbuf *out, struct jval *v)
{
	switch (v->t) {
	case JT_STR:
		jbuf_append_value_parts(rt, out, v);
		return;
	case JT_INT:
	case JT_FLOAT:
	case JT_BOOL: {
		struct jval *s = jv_as_string(rt, v);
		jbuf_append(rt, out, s->s, s->len);
		return;
	}
	case JT_ARRAY:
	case JT_TUPLE:
		for (size_t i = 0; i < v->n; i++)
			emit(rt, out, v->items[i]);
		return;
	default:
		return;
	}
}

static struct jval *render_list(struct rt *rt, const struct nodes *l, struct scope *sc)
{
	struct jbuf out = {0};
	jbuf_append(rt, &out, "", 0);
	enum flow f = exec_list(rt, l, sc, &out);
	if (f != FLOW_NEXT)
		FAIL("break or continue outside a loop");
	return jbuf_value(rt, &out);
}

/* ---- calls ---- */

struct args {
	struct jval **v;
	size_t n, cap;
};

static void args_push(struct rt *rt, struct args *a, struct jval *v)
{
	if (a->n == a->cap) {
		size_t cap = a->cap ? a->cap * 2 : 8;
		struct jval **nv = arena_alloc(&rt->arena, cap * sizeof *nv);
		if (!nv)
			FAIL("out of memory");
		if (a->n)
			memcpy(nv, a->v, a->n * sizeof *nv);
		a->v = nv;
		a->cap = cap;
	}
	a->v[a->n++] = v;
}

static struct jval *invoke(struct rt *rt, struct jval *fn, struct args *a);

static const char *param_name(struct rt *rt, const struct node *p)
{
	const struct node *id = p->kind == N_KWARG ? p->a : p;
	if (id->kind != N_IDENT)
		FAIL("Invalid parameter type in macro");
	return id->s;
}

/* Build 11669 binds a macro's keyword arguments by name (seen against the
 * server); positional ones fill the parameters in order, the rest take
 * their defaults, evaluated where the macro was defined. */
static struct jval *call_macro(struct rt *rt, struct jval *fn, struct args *a)
{
	const struct node *m = fn->macro;
	struct scope *mctx = scope_new(rt, fn->macro_scope);
	size_t positional = 0;
	for (size_t i = 0; i < a->n; i++)
		if (a->v[i]->t != JT_KWARG)
			positional++;
	size_t pos = 0;
	for (size_t i = 0; i < m->list.n; i++) {
		const struct node *p = m->list.v[i];
		const char *name = param_name(rt, p);
		struct jval *v = jinja_kwarg(a->v, a->n, name);
		if (!v && pos < positional) {
			size_t seen = 0;
			for (size_t k = 0; k < a->n; k++)
				if (a->v[k]->t != JT_KWARG && seen++ == pos) {
					v = a->v[k];
					break;
				}
			pos++;
		}
		if (!v) {
			if (p->kind != N_KWARG)
				FAIL("Not enough arguments provided to macro '%s'", fn->name);
			v = eval(rt, p->b, fn->macro_scope);
		}
		scope_set(rt, mctx, name, v);
	}
	return render_list(rt, &m->list2, mctx);
}

static struct jval *invoke(struct rt *rt, struct jval *fn, struct args *a)
{
	if (fn->t != JT_FUNC)
		FAIL("Callee is not a function: got %s", jv_type_name(fn));
	if (++rt->depth > 200)
		FAIL("recursion too deep");
	struct jval *r;
	if (fn->macro) {
		r = call_macro(rt, fn, a);
	} else {
		struct args full = {0};
		if (fn->arg0)
			args_push(rt, &full, fn->arg0);
		for (size_t i = 0; i < a->n; i++)
			args_push(rt, &full, a->v[i]);
		r = fn->fn(rt, full.v, full.n);
	}
	rt->depth--;
	return r;
}

/* try_builtin_func: the method of v's type, bound to v. */
static struct jval *bound_builtin(struct rt *rt, struct jval *v, const char *name, int undef_missing)
{
	if (v->t == JT_FUNC || v->t == JT_KWARG)
		FAIL("No builtins available for type %s", jv_type_name(v));
	jbuiltin fn = jinja_type_builtin(v, name);
	if (fn)
		return jv_func(rt, name, fn, v);
	if (undef_missing)
		return jv_undef(rt, name);
	FAIL("Unknown (built-in) filter '%s' for type %s", name, jv_type_name(v));
}

static void eval_args(struct rt *rt, const struct nodes *l, struct scope *sc, struct args *a)
{
	for (size_t i = 0; i < l->n; i++)
		args_push(rt, a, eval(rt, l->v[i], sc));
}

/* ---- expressions ---- */

static int op_is(const struct node *nd, const char *op)
{
	return !strcmp(nd->s, op);
}

static struct jval *concat_nullable(struct rt *rt, struct jval *l, struct jval *r)
{
	int ln = jv_is_none(l), rn = jv_is_none(r);
	if ((ln && r->t == JT_STR) || (rn && l->t == JT_STR)) {
		struct jval *empty = jv_str(rt, "", 0, 0);
		return jv_concat(rt, ln ? empty : l, rn ? empty : r);
	}
	return NULL;
}

static struct jval *eval_binary(struct rt *rt, const struct node *nd, struct scope *sc)
{
	struct jval *l = eval(rt, nd->a, sc);
	if (op_is(nd, "and"))
		return jv_truthy(rt, l) ? eval(rt, nd->b, sc) : l;
	if (op_is(nd, "or"))
		return jv_truthy(rt, l) ? l : eval(rt, nd->b, sc);
	struct jval *r = eval(rt, nd->b, sc);
	if (op_is(nd, "=="))
		return jv_bool(rt, jv_equal(l, r));
	if (op_is(nd, "!="))
		return jv_bool(rt, !jv_equal(l, r));
	int plus = op_is(nd, "+") || op_is(nd, "~");
	if (l->t == JT_UNDEF || r->t == JT_UNDEF) {
		if (r->t == JT_UNDEF && (op_is(nd, "in") || op_is(nd, "not in")))
			return jv_bool(rt, op_is(nd, "not in"));
		struct jval *c = plus ? concat_nullable(rt, l, r) : NULL;
		if (c)
			return c;
		FAIL("Cannot perform operation %s on undefined values", nd->s);
	}
	if (l->t == JT_NONE || r->t == JT_NONE) {
		struct jval *c = plus ? concat_nullable(rt, l, r) : NULL;
		if (c)
			return c;
		FAIL("Cannot perform operation on null values");
	}
	int ln = l->t == JT_INT || l->t == JT_FLOAT, rn = r->t == JT_INT || r->t == JT_FLOAT;
	if (ln && rn) {
		double a = l->f, b = r->f;
		int is_float = l->t == JT_FLOAT || r->t == JT_FLOAT;
		if (op_is(nd, "+") || op_is(nd, "-") || op_is(nd, "*")) {
			double res = op_is(nd, "+") ? a + b : op_is(nd, "-") ? a - b : a * b;
			if (is_float)
				return jv_float(rt, res);
			if (!(res < 9223372036854775808.0 && res >= -9223372036854775808.0))
				FAIL("integer overflow");
			return jv_int(rt, (int64_t)res);
		}
		if (op_is(nd, "/"))
			return jv_float(rt, a / b);
		if (op_is(nd, "%")) {
			double rem = fmod(a, b);
			if (is_float)
				return jv_float(rt, rem);
			if (!(rem < 9223372036854775808.0 && rem >= -9223372036854775808.0))
				FAIL("integer modulo by zero");
			return jv_int(rt, (int64_t)rem);
		}
		if (op_is(nd, "<"))
			return jv_bool(rt, a < b);
		if (op_is(nd, ">"))
			return jv_bool(rt, a > b);
		if (op_is(nd, ">="))
			return jv_bool(rt, a >= b);
		if (op_is(nd, "<="))
			return jv_bool(rt, a <= b);
	}
	if (jv_is_array(l) && jv_is_array(r)) {
		if (op_is(nd, "+")) {
			struct jval *out = jv_array(rt, JT_ARRAY);
			for (size_t i = 0; i < l->n; i++)
				jv_push(rt, out, l->items[i]);
			for (size_t i = 0; i < r->n; i++)
				jv_push(rt, out, r->items[i]);
			return out;
		}
	} else if (jv_is_array(r)) {
		int member = 0;
		for (size_t i = 0; i < r->n && !member; i++)
			member = jv_equal(l, r->items[i]);
		if (op_is(nd, "in"))
			return jv_bool(rt, member);
		if (op_is(nd, "not in"))
			return jv_bool(rt, !member);
	}
	if (op_is(nd, "*") && ((l->t == JT_STR && r->t == JT_INT) ||
				(l->t == JT_INT && r->t == JT_STR))) {
		/* Repetition, as build 11669 does it: a count below one is "". */
		struct jval *str = l->t == JT_STR ? l : r;
		int64_t times = l->t == JT_INT ? l->i : r->i;
		struct jbuf out = {0};
		jbuf_append(rt, &out, "", 0);
		for (int64_t i = 0; str->len && i < times; i++)
			jbuf_append_value_parts(rt, &out, str);
		return jbuf_value(rt, &out);
	}
	if ((l->t == JT_STR || r->t == JT_STR) && plus)
		return jv_concat(rt, jv_as_string(rt, l), jv_as_string(rt, r));
	if (l->t == JT_STR && r->t == JT_STR && (op_is(nd, "in") || op_is(nd, "not in"))) {
		int found = !l->len || memmem(r->s, r->len, l->s, l->len) != NULL;
		return jv_bool(rt, op_is(nd, "in") ? found : !found);
	}
	if (r->t == JT_OBJECT && (op_is(nd, "in") || op_is(nd, "not in"))) {
		int has = jv_get(rt, r, l) != NULL;
		return jv_bool(rt, op_is(nd, "in") ? has : !has);
	}
	FAIL("Unknown operator \"%s\" between %s and %s", nd->s, jv_type_name(l), jv_type_name(r));
}

static struct jval *apply_filter(struct rt *rt, struct jval *input, const struct node *f,
				 struct scope *sc)
{
	const struct node *id = f->kind == N_CALL ? f->a : f;
	if (id->kind != N_IDENT)
		FAIL(f->kind == N_CALL ? "Filter callee must be an identifier" : "Invalid filter expression");
	const char *name = !strcmp(id->s, "trim") ? "strip" : id->s;
	struct args a = {0};
	if (f->kind == N_CALL)
		eval_args(rt, &f->list, sc, &a);
	return invoke(rt, bound_builtin(rt, input, name, 0), &a);
}

static struct jval *eval_test(struct rt *rt, const struct node *nd, struct scope *sc)
{
	struct jval *input = eval(rt, nd->a, sc);
	struct args a = {0};
	args_push(rt, &a, input);
	const struct node *t = nd->b;
	const struct node *id = t->kind == N_CALL ? t->a : t;
	if (id->kind != N_IDENT)
		FAIL("Invalid test expression");
	if (t->kind == N_CALL)
		eval_args(rt, &t->list, sc, &a);
	char name[128];
	snprintf(name, sizeof name, "test_is_%s", id->s);
	jbuiltin fn = jinja_global_builtin(name);
	if (!fn)
		FAIL("Unknown test '%s'", id->s);
	struct jval *r = fn(rt, a.v, a.n);
	return nd->negate ? jv_bool(rt, !jv_truthy(rt, r)) : r;
}

static struct jval *eval_member(struct rt *rt, const struct node *nd, struct scope *sc)
{
	struct jval *obj = eval(rt, nd->a, sc);
	struct jval *prop;
	if (nd->computed) {
		if (nd->b->kind == N_SLICE) {
			const struct node *s = nd->b;
			/* A string's slice ends at its length too (seen against build
			 * 11669; older llama.cpp stopped strings at 0). */
			int64_t size = obj->t == JT_ARRAY || obj->t == JT_TUPLE ? (int64_t)obj->n
				       : obj->t == JT_STR			 ? (int64_t)obj->len
										 : 0;
			struct args a = {0};
			args_push(rt, &a, s->a ? eval(rt, s->a, sc) : jv_int(rt, 0));
			args_push(rt, &a, s->b ? eval(rt, s->b, sc) : jv_int(rt, size));
			args_push(rt, &a, s->c ? eval(rt, s->c, sc) : jv_int(rt, 1));
			return invoke(rt, bound_builtin(rt, obj, "slice", 0), &a);
		}
		prop = eval(rt, nd->b, sc);
	} else {
		if (nd->b->kind != N_IDENT)
			FAIL("Static member property must be an identifier");
		prop = jv_strz(rt, nd->b->s);
		/* A built-in wins over a key of the same name (obj.items is the
		 * method, obj['items'] the value). */
		struct jval *b = bound_builtin(rt, obj, nd->b->s, 1);
		if (b->t != JT_UNDEF)
			return b;
	}
	if (obj->t == JT_UNDEF)
		return jv_undef(rt, "object_property");
	if (obj->t == JT_OBJECT) {
		struct jval *v = jv_get(rt, obj, prop);
		if (v && v->t != JT_UNDEF)
			return v;
		if (prop->t != JT_STR)
			return v ? v : jv_undef(rt, "object_property");
		char *key = arena_alloc(&rt->arena, prop->len + 1);
		if (!key)
			FAIL("out of memory");
		memcpy(key, prop->s, prop->len);
		return bound_builtin(rt, obj, key, 1);
	}
	if (jv_is_array(obj) || obj->t == JT_STR) {
		if (prop->t == JT_INT) {
			int64_t idx = prop->i;
			if (jv_is_array(obj)) {
				if (idx < 0)
					idx += (int64_t)obj->n;
				if (idx >= 0 && idx < (int64_t)obj->n)
					return obj->items[idx];
			} else if (idx >= 0 && idx < (int64_t)obj->len) {
				return jv_str(rt, obj->s + idx, 1, 0);
			}
			return jv_undef(rt, "object_property");
		}
		if (prop->t == JT_STR) {
			char *key = arena_alloc(&rt->arena, prop->len + 1);
			if (!key)
				FAIL("out of memory");
			memcpy(key, prop->s, prop->len);
			return bound_builtin(rt, obj, key, 1);
		}
		FAIL("Cannot access property with non-string/non-number: got %s", jv_type_name(prop));
	}
	if (prop->t != JT_STR)
		FAIL("Cannot access property with non-string: got %s", jv_type_name(prop));
	char *key = arena_alloc(&rt->arena, prop->len + 1);
	if (!key)
		FAIL("out of memory");
	memcpy(key, prop->s, prop->len);
	return bound_builtin(rt, obj, key, 1);
}

static struct jval *eval_node(struct rt *rt, const struct node *nd, struct scope *sc);

static struct jval *eval(struct rt *rt, const struct node *nd, struct scope *sc)
{
	if (++rt->eval_depth > JINJA_MAX_EVAL_DEPTH)
		FAIL("template expression nested too deep");
	struct jval *v = eval_node(rt, nd, sc);
	rt->eval_depth--;
	return v;
}

static struct jval *eval_node(struct rt *rt, const struct node *nd, struct scope *sc)
{
	switch (nd->kind) {
	case N_TEXT:
		return jv_str(rt, nd->s, nd->len, 0);
	case N_INT:
		return jv_int(rt, nd->i);
	case N_FLOAT:
		return jv_float(rt, nd->f);
	case N_IDENT: {
		struct jval *v = scope_get(sc, nd->s);
		if (v && v->t != JT_UNDEF)
			return v;
		jbuiltin fn = jinja_global_builtin(nd->s);
		if (fn)
			return jv_func(rt, nd->s, fn, NULL);
		return jv_undef(rt, nd->s);
	}
	case N_ARRAY:
	case N_TUPLE: {
		struct jval *a = jv_array(rt, nd->kind == N_TUPLE ? JT_TUPLE : JT_ARRAY);
		for (size_t i = 0; i < nd->list.n; i++)
			jv_push(rt, a, eval(rt, nd->list.v[i], sc));
		return a;
	}
	case N_OBJECT: {
		struct jval *o = jv_object(rt);
		for (size_t i = 0; i < nd->list.n; i++) {
			struct jval *k = eval(rt, nd->list.v[i], sc);
			jv_insert(rt, o, k, eval(rt, nd->list2.v[i], sc));
		}
		return o;
	}
	case N_BINARY:
		return eval_binary(rt, nd, sc);
	case N_UNARY: {
		struct jval *v = eval(rt, nd->a, sc);
		if (!strcmp(nd->s, "not"))
			return jv_bool(rt, !jv_truthy(rt, v));
		if (!strcmp(nd->s, "-")) {
			if (v->t == JT_INT)
				return jv_int(rt, -v->i);
			if (v->t == JT_FLOAT)
				return jv_float(rt, -v->f);
			FAIL("Unary - operator requires numeric operand");
		}
		FAIL("Unknown unary operator '%s'", nd->s);
	}
	case N_FILTER:
		return apply_filter(rt, eval(rt, nd->a, sc), nd->b, sc);
	case N_TEST:
		return eval_test(rt, nd, sc);
	case N_SELECT:
		if (!jv_truthy(rt, eval(rt, nd->b, sc)))
			return jv_undef(rt, NULL);
		return eval(rt, nd->a, sc);
	case N_TERNARY:
		return jv_truthy(rt, eval(rt, nd->a, sc)) ? eval(rt, nd->b, sc) : eval(rt, nd->c, sc);
	case N_MEMBER:
		return eval_member(rt, nd, sc);
	case N_CALL: {
		struct args a = {0};
		eval_args(rt, &nd->list, sc, &a);
		struct jval *fn = eval(rt, nd->a, sc);
		return invoke(rt, fn, &a);
	}
	case N_KWARG: {
		if (nd->a->kind != N_IDENT)
			FAIL("Keyword argument key must be identifiers");
		struct jval *k = jv_new(rt, JT_KWARG);
		k->kw = nd->a->s;
		k->kwval = eval(rt, nd->b, sc);
		return k;
	}
	default:
		FAIL("cannot evaluate this expression (node %d)", (int)nd->kind);
	}
}

/* ---- statements ---- */

static void bind_loop_var(struct rt *rt, const struct node *var, struct jval *item, int over_object,
			  struct scope *sc)
{
	if (var->kind == N_IDENT) {
		scope_set(rt, sc, var->s, over_object ? item->items[0] : item);
		return;
	}
	if (var->kind != N_TUPLE)
		FAIL("Invalid loop variable(s)");
	if (!jv_is_array(item))
		FAIL("Cannot unpack non-iterable type: %s", jv_type_name(item));
	if (var->list.n != item->n)
		FAIL("Too %s items to unpack", var->list.n > item->n ? "few" : "many");
	for (size_t j = 0; j < var->list.n; j++) {
		if (var->list.v[j]->kind != N_IDENT)
			FAIL("Cannot unpack non-identifier type");
		scope_set(rt, sc, var->list.v[j]->s, item->items[j]);
	}
}

static void exec_for(struct rt *rt, const struct node *nd, struct scope *ctx, struct jbuf *out)
{
	struct scope *sc = scope_new(rt, ctx);
	const struct node *iter = nd->b, *test = NULL;
	if (iter->kind == N_SELECT) {
		test = iter->b;
		iter = iter->a;
	}
	struct jval *it = eval(rt, iter, sc);
	if (it->t == JT_UNDEF)
		it = jv_array(rt, JT_ARRAY);
	if (!jv_is_array(it) && it->t != JT_OBJECT)
		FAIL("Expected iterable or object type in for loop: got %s", jv_type_name(it));
	int over_object = it->t == JT_OBJECT;
	size_t n = it->n;
	struct jval **items = arena_alloc(&rt->arena, (n + 1) * sizeof *items);
	if (!items)
		FAIL("out of memory");
	for (size_t i = 0; i < n; i++) {
		if (over_object) {
			struct jval *t = jv_array(rt, JT_TUPLE);
			jv_push(rt, t, it->keys[i]);
			jv_push(rt, t, it->items[i]);
			items[i] = t;
		} else {
			items[i] = it->items[i];
		}
	}
	/* The loop's if filters first, each test in a scope of its own. */
	size_t kept = 0;
	for (size_t i = 0; i < n; i++) {
		if (test) {
			struct scope *ls = scope_new(rt, sc);
			bind_loop_var(rt, nd->a, items[i], over_object, ls);
			if (!jv_truthy(rt, eval(rt, test, ls)))
				continue;
		}
		items[kept++] = items[i];
	}
	int none = 1;
	for (size_t i = 0; i < kept; i++) {
		struct jval *loop = jv_object(rt);
		loop->no_builtins = 1;
		jv_insert_str(rt, loop, "index", jv_int(rt, (int64_t)i + 1));
		jv_insert_str(rt, loop, "index0", jv_int(rt, (int64_t)i));
		jv_insert_str(rt, loop, "revindex", jv_int(rt, (int64_t)(kept - i)));
		jv_insert_str(rt, loop, "revindex0", jv_int(rt, (int64_t)(kept - i - 1)));
		jv_insert_str(rt, loop, "first", jv_bool(rt, i == 0));
		jv_insert_str(rt, loop, "last", jv_bool(rt, i == kept - 1));
		jv_insert_str(rt, loop, "length", jv_int(rt, (int64_t)kept));
		jv_insert_str(rt, loop, "previtem", i > 0 ? items[i - 1] : jv_undef(rt, "previtem"));
		jv_insert_str(rt, loop, "nextitem",
			      i + 1 < kept ? items[i + 1] : jv_undef(rt, "nextitem"));
		scope_set(rt, sc, "loop", loop);
		bind_loop_var(rt, nd->a, items[i], over_object, sc);
		enum flow f = exec_list(rt, &nd->list, sc, out);
		if (f == FLOW_CONTINUE)
			continue;
		if (f == FLOW_BREAK)
			break;
		/* llama.cpp counts an iteration only when its body ran through. */
		none = 0;
	}
	if (none) {
		enum flow f = exec_list(rt, &nd->list2, ctx, out);
		if (f != FLOW_NEXT)
			FAIL("break or continue outside a loop");
	}
}

static void exec_set(struct rt *rt, const struct node *nd, struct scope *sc)
{
	struct jval *rhs = nd->b ? eval(rt, nd->b, sc) : render_list(rt, &nd->list, sc);
	const struct node *t = nd->a;
	if (t->kind == N_IDENT) {
		scope_set(rt, sc, t->s, rhs);
	} else if (t->kind == N_TUPLE) {
		if (!jv_is_array(rhs))
			FAIL("Cannot unpack non-iterable type in set: %s", jv_type_name(rhs));
		if (rhs->n != t->list.n)
			FAIL("Too %s items to unpack in set", t->list.n > rhs->n ? "few" : "many");
		for (size_t i = 0; i < t->list.n; i++) {
			if (t->list.v[i]->kind != N_IDENT)
				FAIL("Cannot unpack to non-identifier in set");
			scope_set(rt, sc, t->list.v[i]->s, rhs->items[i]);
		}
	} else if (t->kind == N_MEMBER) {
		if (t->computed)
			FAIL("Cannot assign to computed member");
		if (t->b->kind != N_IDENT)
			FAIL("Cannot assign to member with non-identifier property");
		struct jval *obj = eval(rt, t->a, sc);
		if (obj->t != JT_OBJECT)
			FAIL("Cannot assign to member of non-object");
		jv_insert_str(rt, obj, t->b->s, rhs);
	} else {
		FAIL("Invalid LHS inside assignment expression");
	}
}

static enum flow exec_one(struct rt *rt, const struct node *nd, struct scope *sc, struct jbuf *out)
{
	switch (nd->kind) {
	case N_COMMENT:
	case N_NOOP:
		return FLOW_NEXT;
	case N_BREAK:
		return FLOW_BREAK;
	case N_CONTINUE:
		return FLOW_CONTINUE;
	case N_IF: {
		/* A break or continue inside the if discards what the if wrote
		 * (llama.cpp's if collects its output and is unwound past). */
		size_t mark = out->len, pmark = out->n_parts;
		const struct nodes *branch = jv_truthy(rt, eval(rt, nd->a, sc)) ? &nd->list : &nd->list2;
		enum flow f = exec_list(rt, branch, sc, out);
		if (f != FLOW_NEXT) {
			out->len = mark;
			out->n_parts = pmark;
			if (out->p)
				out->p[mark] = 0;
		}
		return f;
	}
	case N_FOR:
		exec_for(rt, nd, sc, out);
		return FLOW_NEXT;
	case N_SET:
		exec_set(rt, nd, sc);
		return FLOW_NEXT;
	case N_MACRO: {
		if (nd->a->kind != N_IDENT)
			FAIL("Macro name must be an identifier");
		struct jval *fn = jv_func(rt, nd->a->s, NULL, NULL);
		fn->macro = nd;
		fn->macro_scope = sc;
		scope_set(rt, sc, nd->a->s, fn);
		return FLOW_NEXT;
	}
	case N_FILTER_BLOCK: {
		struct jval *body = render_list(rt, &nd->list, sc);
		emit(rt, out, apply_filter(rt, body, nd->a, sc));
		return FLOW_NEXT;
	}
	case N_CALL_BLOCK:
		FAIL("cannot exec CallStatement");
	default:
		emit(rt, out, eval(rt, nd, sc));
		return FLOW_NEXT;
	}
}

static enum flow exec_list(struct rt *rt, const struct nodes *l, struct scope *sc, struct jbuf *out)
{
	if (++rt->depth > 200)
		FAIL("template nesting too deep");
	for (size_t i = 0; i < l->n; i++) {
		enum flow f = exec_one(rt, l->v[i], sc, out);
		if (f != FLOW_NEXT) {
			rt->depth--;
			return f;
		}
	}
	rt->depth--;
	return FLOW_NEXT;
}

/* ---- entry points ---- */

struct jinja_template *jinja_parse(const char *src, size_t len, char *err, size_t errlen)
{
	struct jinja_template *volatile t = calloc(1, sizeof *t);
	if (!t) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	struct jerr e;
	if (setjmp(e.jb)) {
		snprintf(err, errlen, "%s", e.msg);
		arena_free(&t->arena);
		free(t);
		return NULL;
	}
	size_t n;
	struct token *toks = jinja_lex(&t->arena, &e, src, len, &n);
	jinja_parse_tokens(&t->arena, &e, toks, n, &t->body);
	return t;
}

void jinja_free(struct jinja_template *t)
{
	if (!t)
		return;
	arena_free(&t->arena);
	free(t);
}

char *jinja_render(const struct jinja_template *t, json_t *globals, time_t now, size_t *len,
		   char *err, size_t errlen)
{
	struct rt *volatile rt = calloc(1, sizeof *rt);
	if (!rt) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	rt->now = now;
	rt->arena.limit = JINJA_MAX_RENDER_BYTES;
	char *result;
	if (setjmp(rt->err.jb)) {
		snprintf(err, errlen, "%s", rt->err.msg);
		arena_free(&rt->arena);
		free(rt);
		return NULL;
	}
	struct scope *root = scope_new(rt, NULL);
	scope_set(rt, root, "true", jv_bool(rt, 1));
	scope_set(rt, root, "True", jv_bool(rt, 1));
	scope_set(rt, root, "false", jv_bool(rt, 0));
	scope_set(rt, root, "False", jv_bool(rt, 0));
	scope_set(rt, root, "none", jv_none(rt));
	scope_set(rt, root, "None", jv_none(rt));
	const char *k;
	json_t *v;
	json_object_foreach(globals, k, v) scope_set(rt, root, k, jv_from_json(rt, v));
	struct jbuf out = {0};
	jbuf_append(rt, &out, "", 0);
	if (exec_list(rt, &t->body, root, &out) != FLOW_NEXT)
		FAIL("break or continue outside a loop");
	result = malloc(out.len + 1);
	if (result) {
		memcpy(result, out.p, out.len);
		result[out.len] = 0;
		*len = out.len;
	} else {
		snprintf(err, errlen, "out of memory");
	}
	arena_free(&rt->arena);
	free(rt);
	return result;
}
