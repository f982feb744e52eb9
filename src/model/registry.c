#include "model/registry.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <yaml.h>

#include "platform/platform.h"
#include "util/err.h"
#include "util/paths.h"

/* A registry is a few kilobytes; anything past this is not one, and reading
 * it whole would only waste memory. */
#define REGISTRY_MAX_BYTES (16u << 20)
/* Largest context or output cap accepted: far above any model, low enough
 * that ctx * bytes-per-token arithmetic elsewhere cannot overflow. */
#define REGISTRY_MAX_TOKENS (1L << 30)
/* Deepest directory tree registry_purge_files() descends; a download
 * directory is one or two levels, so a deeper one is refused, not walked. */
#define PURGE_MAX_DEPTH 16

/* --- Freeing and copying -------------------------------------------------- */

static void model_free(struct registry_model *m)
{
	free(m->name);
	free(m->path);
	free(m->repo);
	free(m->file);
	free(m->binary);
	for (int i = 0; i < m->n_args; i++)
		free(m->args[i]);
	free(m->args);
	for (int i = 0; i < m->n_aliases; i++)
		free(m->aliases[i]);
	free(m->aliases);
	memset(m, 0, sizeof *m);
}

static void group_free(struct registry_group *g)
{
	free(g->name);
	for (int i = 0; i < g->n_members; i++)
		free(g->members[i]);
	free(g->members);
	memset(g, 0, sizeof *g);
}

void registry_free(struct registry *r)
{
	if (!r)
		return;
	for (int i = 0; i < r->n; i++)
		model_free(&r->models[i]);
	free(r->models);
	free(r->active);
	for (int i = 0; i < r->n_groups; i++)
		group_free(&r->groups[i]);
	free(r->groups);
	memset(r, 0, sizeof *r);
}

const struct registry_model *registry_find(const struct registry *r, const char *name)
{
	if (!r || !name)
		return NULL;
	for (int i = 0; i < r->n; i++)
		if (!strcmp(r->models[i].name, name))
			return &r->models[i];
	return NULL;
}

int registry_group_of(const struct registry *r, const char *name)
{
	if (!r || !name)
		return -1;
	for (int g = 0; g < r->n_groups; g++)
		for (int i = 0; i < r->groups[g].n_members; i++)
			if (!strcmp(r->groups[g].members[i], name))
				return g;
	return -1;
}

/* strdup that maps NULL to NULL, so optional fields copy in one line. Sets
 * *oom when a non-NULL string could not be copied. */
static char *dup_opt(const char *s, int *oom)
{
	if (!s)
		return NULL;
	char *d = strdup(s);
	if (!d)
		*oom = 1;
	return d;
}

/* Deep copy of src into *dst under the given name; *dst is all-or-nothing. */
static int model_copy(struct registry_model *dst, const char *name,
                      const struct registry_model *src)
{
	struct registry_model m = {0};
	int oom = 0;
	m.name = dup_opt(name, &oom);
	m.path = dup_opt(src->path, &oom);
	m.repo = dup_opt(src->repo, &oom);
	m.file = dup_opt(src->file, &oom);
	m.binary = dup_opt(src->binary, &oom);
	m.ctx = src->ctx;
	m.max_output = src->max_output;
	m.ttl = src->ttl;
	if (!oom && src->n_aliases > 0) {
		m.aliases = calloc((size_t)src->n_aliases, sizeof *m.aliases);
		if (!m.aliases)
			oom = 1;
		for (int i = 0; !oom && i < src->n_aliases; i++) {
			m.aliases[i] = dup_opt(src->aliases[i], &oom);
			if (!oom)
				m.n_aliases = i + 1;
		}
	}
	if (!oom && src->n_args > 0) {
		m.args = calloc((size_t)src->n_args, sizeof *m.args);
		if (!m.args)
			oom = 1;
		for (int i = 0; !oom && i < src->n_args; i++) {
			m.args[i] = dup_opt(src->args[i], &oom);
			if (!oom)
				m.n_args = i + 1;
		}
	}
	if (oom) {
		model_free(&m);
		return -1;
	}
	*dst = m;
	return 0;
}

/* --- Reading --------------------------------------------------------------- */

/* Reads a whole (small) file. Returns 0, 1 when it does not exist, or -1. */
static int read_whole(const char *path, char **out, size_t *len, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return 1;
		err_set(err, errlen, "%s: %s", path, strerror(errno));
		return -1;
	}
	struct stat st;
	if (fstat(fd, &st) != 0) {
		err_set(err, errlen, "%s: %s", path, strerror(errno));
		close(fd);
		return -1;
	}
	if (!S_ISREG(st.st_mode)) {
		err_set(err, errlen, "%s: %s", path,
		        S_ISDIR(st.st_mode) ? "is a directory" : "not a regular file");
		close(fd);
		return -1;
	}
	if ((unsigned long long)st.st_size > REGISTRY_MAX_BYTES) {
		err_set(err, errlen, "%s: %lld bytes is too large for a model registry", path,
		        (long long)st.st_size);
		close(fd);
		return -1;
	}
	char *buf = malloc((size_t)st.st_size + 1);
	if (!buf) {
		err_set(err, errlen, "%s: out of memory", path);
		close(fd);
		return -1;
	}
	size_t got = 0;
	while (got < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			err_set(err, errlen, "%s: %s", path, strerror(errno));
			free(buf);
			close(fd);
			return -1;
		}
		if (n == 0)
			break; /* shrank while reading: parse what is there */
		got += (size_t)n;
	}
	close(fd);
	buf[got] = '\0';
	*out = buf;
	*len = got;
	return 0;
}

/* Line and column (1-based) of a byte offset, for libyaml's reader errors,
 * which carry an offset rather than a mark. */
static void offset_to_mark(const char *buf, size_t len, size_t off, size_t *line, size_t *col)
{
	*line = 1;
	*col = 1;
	for (size_t i = 0; i < off && i < len; i++) {
		if (buf[i] == '\n') {
			(*line)++;
			*col = 1;
		} else {
			(*col)++;
		}
	}
}

static void parser_error(const yaml_parser_t *p, const char *path, const char *buf, size_t len,
                         char *err, size_t errlen)
{
	const char *problem = p->problem ? p->problem : "cannot parse";
	if (p->error == YAML_MEMORY_ERROR) {
		err_set(err, errlen, "%s: out of memory while parsing", path);
	} else if (p->error == YAML_READER_ERROR) {
		size_t line, col;
		offset_to_mark(buf, len, p->problem_offset, &line, &col);
		err_set(err, errlen, "%s:%zu:%zu: %s", path, line, col, problem);
	} else if (p->context) {
		err_set(err, errlen, "%s:%zu:%zu: %s (%s at line %zu)", path,
		        p->problem_mark.line + 1, p->problem_mark.column + 1, problem, p->context,
		        p->context_mark.line + 1);
	} else {
		err_set(err, errlen, "%s:%zu:%zu: %s", path, p->problem_mark.line + 1,
		        p->problem_mark.column + 1, problem);
	}
}

/* The walk over a loaded document: what it needs to report an error. */
struct walk {
	yaml_document_t *doc;
	const char *path;
	char *err;
	size_t errlen;
};

static size_t node_line(const yaml_node_t *n)
{
	return n->start_mark.line + 1;
}

static const char *node_kind(const yaml_node_t *n)
{
	switch (n->type) {
	case YAML_SCALAR_NODE:
		return "a scalar";
	case YAML_SEQUENCE_NODE:
		return "a list";
	case YAML_MAPPING_NODE:
		return "a mapping";
	default:
		return "nothing";
	}
}

static const char *scalar(const yaml_node_t *n)
{
	return (const char *)n->data.scalar.value;
}

/* A plain scalar that YAML reads as null: `key:`, `key: ~`, `key: null`. An
 * optional field written that way is absent, as any YAML reader would take it. */
static int is_null(const yaml_node_t *n)
{
	if (n->type != YAML_SCALAR_NODE || n->data.scalar.style != YAML_PLAIN_SCALAR_STYLE)
		return 0;
	const char *v = scalar(n);
	return !*v || !strcmp(v, "~") || !strcmp(v, "null") || !strcmp(v, "Null") ||
	       !strcmp(v, "NULL");
}

static int walk_fail(struct walk *w, const yaml_node_t *n, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int walk_fail(struct walk *w, const yaml_node_t *n, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	err_set(w->err, w->errlen, "%s:%zu: %s", w->path, node_line(n), msg);
	return -1;
}

/* A scalar's value as a string. libyaml allows "\0" in double-quoted
 * scalars; a NUL cannot be part of a path or argument, so it is an error. */
static int want_string(struct walk *w, const yaml_node_t *n, const char *what, char **out)
{
	if (n->type != YAML_SCALAR_NODE)
		return walk_fail(w, n, "%s: expected a string, got %s", what, node_kind(n));
	if (strlen(scalar(n)) != n->data.scalar.length)
		return walk_fail(w, n, "%s: contains a NUL byte", what);
	char *s = strdup(scalar(n));
	if (!s)
		return walk_fail(w, n, "out of memory");
	free(*out); /* a duplicate key is caught before; this only guards leaks */
	*out = s;
	return 0;
}

/* A plain (unquoted) decimal integer in 1..REGISTRY_MAX_TOKENS. A quoted
 * "16384" is a string in YAML, so it is refused as the wrong type rather than
 * guessed at. */
static int want_tokens(struct walk *w, const yaml_node_t *n, const char *what, long *out)
{
	if (n->type != YAML_SCALAR_NODE)
		return walk_fail(w, n, "%s: expected a positive integer, got %s", what,
		                 node_kind(n));
	const char *v = scalar(n);
	int ok = n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE && *v >= '0' && *v <= '9';
	char *end = NULL;
	long x = 0;
	if (ok) {
		errno = 0;
		x = strtol(v, &end, 10);
		ok = errno == 0 && *end == '\0' && x > 0 && x <= REGISTRY_MAX_TOKENS;
	}
	if (!ok)
		return walk_fail(w, n,
		                 "%s: expected a positive integer (at most %ld), got \"%.40s\"",
		                 what, REGISTRY_MAX_TOKENS, v);
	*out = x;
	return 0;
}

static int want_list(struct walk *w, const yaml_node_t *n, const char *what, char ***out,
                     int *n_out)
{
	if (n->type != YAML_SEQUENCE_NODE)
		return walk_fail(w, n, "%s: expected a list of strings, got %s", what,
		                 node_kind(n));
	yaml_node_item_t *it = n->data.sequence.items.start;
	size_t count = (size_t)(n->data.sequence.items.top - it);
	if (count > 4096)
		return walk_fail(w, n, "%s: more than 4096 arguments", what);
	if (count == 0)
		return 0;
	char **args = calloc(count, sizeof *args);
	if (!args)
		return walk_fail(w, n, "out of memory");
	*out = args;
	for (size_t i = 0; i < count; i++) {
		yaml_node_t *e = yaml_document_get_node(w->doc, it[i]);
		char item[256];
		snprintf(item, sizeof item, "%s[%zu]", what, i);
		if (!e || e->type != YAML_SCALAR_NODE)
			return walk_fail(w, e ? e : n, "%s: expected a string, got %s", item,
			                 e ? node_kind(e) : "nothing");
		if (want_string(w, e, item, &args[i]) != 0)
			return -1;
		*n_out = (int)i + 1;
	}
	return 0;
}

/* Aliases are names a request's "model" holds: plain, non-empty, no
 * control characters, and none twice in one model. */
static int want_aliases(struct walk *w, const yaml_node_t *n, const char *what,
                        struct registry_model *m)
{
	if (want_list(w, n, what, &m->aliases, &m->n_aliases) != 0)
		return -1;
	for (int i = 0; i < m->n_aliases; i++) {
		const char *a = m->aliases[i];
		int bad = !*a || strlen(a) > 256;
		for (const char *p = a; *p && !bad; p++)
			bad = (unsigned char)*p < 0x20 || *p == 0x7f;
		if (bad)
			return walk_fail(w, n, "%s[%d]: an alias is 1 to 256 printable characters",
			                 what, i);
		for (int j = 0; j < i; j++)
			if (!strcmp(m->aliases[j], a))
				return walk_fail(w, n, "%s: '%.40s' is listed twice", what, a);
	}
	return 0;
}

/* One entry under models:. *m is filled as far as it got, even on error, so
 * the caller frees it either way. */
static int walk_model(struct walk *w, const yaml_node_t *key, const yaml_node_t *val,
                      struct registry_model *m)
{
	const char *name = m->name;
	if (val->type != YAML_MAPPING_NODE)
		return walk_fail(w, val, "models.%s: expected a mapping (path:, ...), got %s", name,
		                 node_kind(val));
	unsigned seen = 0;
	static const char *const fields[] = {"path",       "repo", "file",    "binary", "ctx",
	                                     "max_output", "args", "aliases", "ttl"};
	for (yaml_node_pair_t *p = val->data.mapping.pairs.start; p < val->data.mapping.pairs.top;
	     p++) {
		yaml_node_t *k = yaml_document_get_node(w->doc, p->key);
		yaml_node_t *v = yaml_document_get_node(w->doc, p->value);
		if (!k || !v || k->type != YAML_SCALAR_NODE)
			return walk_fail(w, k ? k : val, "models.%s: keys must be plain names",
			                 name);
		const char *f = scalar(k);
		unsigned idx = 0;
		while (idx < sizeof fields / sizeof fields[0] && strcmp(fields[idx], f))
			idx++;
		if (idx == sizeof fields / sizeof fields[0])
			return walk_fail(w, k,
			                 "models.%s: unknown key '%.40s' (known: path, repo, file, "
			                 "binary, ctx, max_output, args, aliases, ttl)",
			                 name, f);
		if (seen & (1u << idx))
			return walk_fail(w, k, "models.%s: duplicate key '%s'", name, f);
		seen |= 1u << idx;
		if (is_null(v) && idx != 0)
			continue; /* an optional field left empty is absent */
		char what[192];
		snprintf(what, sizeof what, "models.%s.%s", name, f);
		int rc = 0;
		switch (idx) {
		case 0:
			if (is_null(v) || (v->type == YAML_SCALAR_NODE && !*scalar(v)))
				rc = walk_fail(w, v, "%s: must not be empty", what);
			else
				rc = want_string(w, v, what, &m->path);
			break;
		case 1:
			rc = want_string(w, v, what, &m->repo);
			break;
		case 2:
			rc = want_string(w, v, what, &m->file);
			break;
		case 3:
			rc = want_string(w, v, what, &m->binary);
			break;
		case 4:
			rc = want_tokens(w, v, what, &m->ctx);
			break;
		case 5:
			rc = want_tokens(w, v, what, &m->max_output);
			break;
		case 6:
			rc = want_list(w, v, what, &m->args, &m->n_args);
			break;
		case 7:
			rc = want_aliases(w, v, what, m);
			break;
		default:
			rc = want_tokens(w, v, what, &m->ttl);
			break;
		}
		if (rc != 0)
			return -1;
	}
	if (!m->path)
		return walk_fail(w, key, "models.%s: missing 'path' (the GGUF file)", name);
	return 0;
}

/* A request's "model" must name one model: no alias is a model's name or
 * another model's alias. */
static int check_aliases(struct walk *w, const yaml_node_t *n, const struct registry *r)
{
	for (int i = 0; i < r->n; i++)
		for (int a = 0; a < r->models[i].n_aliases; a++) {
			const char *al = r->models[i].aliases[a];
			const struct registry_model *o = registry_find(r, al);
			if (o)
				return walk_fail(w, n,
				                 "models.%s.aliases: '%.40s' is a model's name",
				                 r->models[i].name, al);
			for (int j = 0; j < i; j++)
				for (int b = 0; b < r->models[j].n_aliases; b++)
					if (!strcmp(r->models[j].aliases[b], al))
						return walk_fail(w, n,
						                 "models.%s.aliases: '%.40s' is "
						                 "also an alias of %s",
						                 r->models[i].name, al,
						                 r->models[j].name);
		}
	return 0;
}

/* A top-level mapping of names (models:, groups:): its size, checked, and
 * an array of that many elements for it (*out; NULL when empty or null). 0,
 * or -1 with the walk's error. */
static int walk_map_alloc(struct walk *w, const yaml_node_t *n, const char *key, size_t elem,
                          void **out, size_t *count)
{
	*out = NULL;
	*count = 0;
	if (is_null(n))
		return 0; /* `key:` with nothing under it */
	if (n->type != YAML_MAPPING_NODE)
		return walk_fail(w, n, "%s: expected a mapping of %s names, got %s", key,
		                 !strcmp(key, "models") ? "model" : "group", node_kind(n));
	*count = (size_t)(n->data.mapping.pairs.top - n->data.mapping.pairs.start);
	if (*count > 100000)
		return walk_fail(w, n, "%s: more than 100000 %s", key, key);
	if (*count && !(*out = calloc(*count, elem)))
		return walk_fail(w, n, "out of memory");
	return 0;
}

/* The i-th name of such a mapping, checked (a string, a safe name), and its
 * value; NULL with the walk's error. */
static const char *walk_map_name(struct walk *w, const yaml_node_t *n, size_t i, const char *key,
                                 yaml_node_t **k, yaml_node_t **v)
{
	const char *noun = !strcmp(key, "models") ? "model" : "group";
	yaml_node_pair_t *p = &n->data.mapping.pairs.start[i];
	*k = yaml_document_get_node(w->doc, p->key);
	*v = yaml_document_get_node(w->doc, p->value);
	if (!*k || !*v || (*k)->type != YAML_SCALAR_NODE) {
		walk_fail(w, *k ? *k : n, "%s: a %s name must be a string", key, noun);
		return NULL;
	}
	const char *name = scalar(*k);
	if (strlen(name) != (*k)->data.scalar.length || !paths_is_safe_name(name)) {
		walk_fail(w, *k,
		          "%s: '%.40s' is not a valid %s name (letters, digits, '.', '_', '-'; at "
		          "most 128)",
		          key, name, noun);
		return NULL;
	}
	return name;
}

static int walk_models(struct walk *w, const yaml_node_t *n, struct registry *r)
{
	size_t count;
	void *arr;
	if (walk_map_alloc(w, n, "models", sizeof *r->models, &arr, &count) != 0)
		return -1;
	if (!count)
		return 0;
	r->models = arr;
	for (size_t i = 0; i < count; i++) {
		yaml_node_t *k, *v;
		const char *name = walk_map_name(w, n, i, "models", &k, &v);
		if (!name)
			return -1;
		if (registry_find(r, name))
			return walk_fail(w, k, "models: '%s' is listed twice", name);
		struct registry_model *m = &r->models[r->n];
		m->name = strdup(name);
		if (!m->name)
			return walk_fail(w, k, "out of memory");
		r->n++; /* owned by r from here on, complete or not */
		if (walk_model(w, k, v, m) != 0)
			return -1;
	}
	return check_aliases(w, n, r);
}

/* groups: {name: [model, ...]}. The members are checked against the
 * models by check_groups(), once the whole file is read (groups: may come
 * before models:). */
static int walk_groups(struct walk *w, const yaml_node_t *n, struct registry *r)
{
	size_t count;
	void *arr;
	if (walk_map_alloc(w, n, "groups", sizeof *r->groups, &arr, &count) != 0)
		return -1;
	if (!count)
		return 0;
	r->groups = arr;
	for (size_t i = 0; i < count; i++) {
		yaml_node_t *k, *v;
		const char *name = walk_map_name(w, n, i, "groups", &k, &v);
		if (!name)
			return -1;
		for (int j = 0; j < r->n_groups; j++)
			if (!strcmp(r->groups[j].name, name))
				return walk_fail(w, k, "groups: '%s' is listed twice", name);
		struct registry_group *g = &r->groups[r->n_groups];
		g->name = strdup(name);
		if (!g->name)
			return walk_fail(w, k, "out of memory");
		r->n_groups++; /* owned by r from here on, complete or not */
		char what[192];
		snprintf(what, sizeof what, "groups.%s", name);
		if (want_list(w, v, what, &g->members, &g->n_members) != 0)
			return -1;
		if (g->n_members == 0)
			return walk_fail(w, v, "%s: a group lists its models", what);
	}
	return 0;
}

/* Every member is a model of the registry, and a model is in one group: a
 * typo in a member would otherwise leave its model free to be stopped. */
static int check_groups(struct walk *w, const yaml_node_t *n, const struct registry *r)
{
	for (int g = 0; g < r->n_groups; g++) {
		const yaml_node_pair_t *p = &n->data.mapping.pairs.start[g];
		const yaml_node_t *v = yaml_document_get_node(w->doc, p->value);
		const struct registry_group *gr = &r->groups[g];
		for (int i = 0; i < gr->n_members; i++) {
			const char *m = gr->members[i];
			if (!registry_find(r, m))
				return walk_fail(
				    w, v, "groups.%s: '%.40s' is not a model of the registry",
				    gr->name, m);
			for (int j = 0; j < i; j++)
				if (!strcmp(gr->members[j], m))
					return walk_fail(w, v, "groups.%s: '%.40s' is listed twice",
					                 gr->name, m);
			int other = registry_group_of(r, m);
			if (other != g)
				return walk_fail(
				    w, v,
				    "groups.%s: '%.40s' is already in group %s (a model "
				    "is in one group at most)",
				    gr->name, m, r->groups[other].name);
		}
	}
	return 0;
}

static int walk_root(struct walk *w, const yaml_node_t *root, struct registry *r)
{
	if (is_null(root))
		return 0; /* a file holding only comments or `~` */
	if (root->type != YAML_MAPPING_NODE)
		return walk_fail(w, root, "expected a mapping with 'models:' at the top, got %s",
		                 node_kind(root));
	int seen_models = 0, seen_active = 0, seen_max = 0, seen_ttl = 0;
	const yaml_node_t *groups = NULL;
	for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
	     p++) {
		yaml_node_t *k = yaml_document_get_node(w->doc, p->key);
		yaml_node_t *v = yaml_document_get_node(w->doc, p->value);
		if (!k || !v || k->type != YAML_SCALAR_NODE)
			return walk_fail(w, k ? k : root, "top-level keys must be plain names");
		const char *key = scalar(k);
		if (!strcmp(key, "models")) {
			if (seen_models++)
				return walk_fail(w, k, "duplicate key 'models'");
			if (walk_models(w, v, r) != 0)
				return -1;
		} else if (!strcmp(key, "active")) {
			if (seen_active++)
				return walk_fail(w, k, "duplicate key 'active'");
			if (is_null(v))
				continue;
			if (want_string(w, v, "active", &r->active) != 0)
				return -1;
			if (!paths_is_safe_name(r->active))
				return walk_fail(w, v, "active: '%.40s' is not a valid model name",
				                 r->active);
		} else if (!strcmp(key, "max_loaded") || !strcmp(key, "ttl")) {
			int max = !strcmp(key, "max_loaded");
			int *seen = max ? &seen_max : &seen_ttl;
			if ((*seen)++)
				return walk_fail(w, k, "duplicate key '%s'", key);
			if (is_null(v))
				continue;
			if (want_tokens(w, v, key, max ? &r->max_loaded : &r->ttl) != 0)
				return -1;
		} else if (!strcmp(key, "groups")) {
			if (groups)
				return walk_fail(w, k, "duplicate key 'groups'");
			groups = v;
			if (walk_groups(w, v, r) != 0)
				return -1;
		} else {
			return walk_fail(w, k,
			                 "unknown key '%.40s' (known: models, active, max_loaded, "
			                 "ttl, groups)",
			                 key);
		}
	}
	return r->n_groups ? check_groups(w, groups, r) : 0;
}

static int parse_registry(const char *path, const char *buf, size_t len, struct registry *r,
                          char *err, size_t errlen)
{
	yaml_parser_t parser;
	if (!yaml_parser_initialize(&parser)) {
		err_set(err, errlen, "%s: out of memory", path);
		return -1;
	}
	yaml_parser_set_input_string(&parser, (const unsigned char *)buf, len);
	yaml_document_t doc;
	if (!yaml_parser_load(&parser, &doc)) {
		parser_error(&parser, path, buf, len, err, errlen);
		yaml_parser_delete(&parser);
		return -1;
	}
	int rc = 0;
	yaml_node_t *root = yaml_document_get_root_node(&doc);
	if (root) {
		struct walk w = {&doc, path, err, errlen};
		rc = walk_root(&w, root, r);
		/* A second document ("---" then more) would be silently ignored by
		 * a one-document reader; say so instead. */
		if (rc == 0) {
			yaml_document_t doc2;
			if (!yaml_parser_load(&parser, &doc2)) {
				parser_error(&parser, path, buf, len, err, errlen);
				rc = -1;
			} else {
				yaml_node_t *root2 = yaml_document_get_root_node(&doc2);
				if (root2) {
					err_set(
					    err, errlen,
					    "%s:%zu: a second YAML document; the registry is one "
					    "document",
					    path, node_line(root2));
					rc = -1;
				}
				yaml_document_delete(&doc2);
			}
		}
	}
	yaml_document_delete(&doc);
	yaml_parser_delete(&parser);
	return rc;
}

int registry_load_file(const char *path, struct registry *r, char *err, size_t errlen)
{
	memset(r, 0, sizeof *r);
	char *buf = NULL;
	size_t len = 0;
	int rc = read_whole(path, &buf, &len, err, errlen);
	if (rc == 1)
		return 0; /* no file yet: nothing registered */
	if (rc < 0)
		return -1;
	rc = parse_registry(path, buf, len, r, err, errlen);
	free(buf);
	if (rc != 0)
		registry_free(r);
	return rc;
}

int registry_load(struct registry *r, char *err, size_t errlen)
{
	char path[4096];
	memset(r, 0, sizeof *r);
	if (paths_registry_file(path, sizeof path) != 0) {
		err_set(err, errlen, "the registry path is too long");
		return -1;
	}
	return registry_load_file(path, r, err, errlen);
}

/* --- Writing ----------------------------------------------------------------- */

/* Whether a string, written as a plain YAML scalar, would read back as
 * something else in YAML 1.1 or 1.2 (null, a boolean, a number): those are
 * written double-quoted so every YAML reader sees the string. */
static int needs_quotes(const char *s)
{
	static const char *const words[] = {"~",  "null", "true", "false", "yes",
	                                    "no", "on",   "off",  "y",     "n"};
	if (!*s)
		return 1;
	for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
		if (!strcasecmp(s, words[i]))
			return 1;
	if (strchr("0123456789+-.", *s)) {
		char *end;
		errno = 0;
		(void)strtod(s, &end);
		if (*end == '\0')
			return 1;
	}
	return 0;
}

static int emit(yaml_emitter_t *e, yaml_event_t *ev)
{
	/* yaml_emitter_emit takes ownership of the event, even on failure. */
	return yaml_emitter_emit(e, ev) ? 0 : -1;
}

static int emit_str(yaml_emitter_t *e, const char *s, int force_quotes)
{
	yaml_event_t ev;
	yaml_scalar_style_t style = force_quotes || needs_quotes(s)
	                                ? YAML_DOUBLE_QUOTED_SCALAR_STYLE
	                                : YAML_ANY_SCALAR_STYLE;
	if (!yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)s, (int)strlen(s), 1, 1,
	                                  style))
		return -1;
	return emit(e, &ev);
}

static int emit_long(yaml_emitter_t *e, long v)
{
	char buf[32];
	snprintf(buf, sizeof buf, "%ld", v);
	yaml_event_t ev;
	if (!yaml_scalar_event_initialize(&ev, NULL, NULL, (yaml_char_t *)buf, (int)strlen(buf), 1,
	                                  0, YAML_PLAIN_SCALAR_STYLE))
		return -1;
	return emit(e, &ev);
}

static int emit_map_start(yaml_emitter_t *e)
{
	yaml_event_t ev;
	if (!yaml_mapping_start_event_initialize(&ev, NULL, NULL, 1, YAML_BLOCK_MAPPING_STYLE))
		return -1;
	return emit(e, &ev);
}

static int emit_map_end(yaml_emitter_t *e)
{
	yaml_event_t ev;
	if (!yaml_mapping_end_event_initialize(&ev))
		return -1;
	return emit(e, &ev);
}

static int emit_kv_str(yaml_emitter_t *e, const char *k, const char *v)
{
	if (!v)
		return 0;
	return emit_str(e, k, 0) || emit_str(e, v, 0) ? -1 : 0;
}

static int emit_kv_long(yaml_emitter_t *e, const char *k, long v)
{
	if (v <= 0)
		return 0;
	return emit_str(e, k, 0) || emit_long(e, v) ? -1 : 0;
}

/* A flow list of quoted strings, as people write it by hand:
 * args: ["-ngl", "99"]; quoting keeps "99" a string. */
static int emit_list(yaml_emitter_t *e, const char *key, char *const *v, int n)
{
	if (n <= 0)
		return 0;
	yaml_event_t ev;
	if (emit_str(e, key, 0) ||
	    !yaml_sequence_start_event_initialize(&ev, NULL, NULL, 1, YAML_FLOW_SEQUENCE_STYLE) ||
	    emit(e, &ev))
		return -1;
	for (int i = 0; i < n; i++)
		if (emit_str(e, v[i], 1))
			return -1;
	if (!yaml_sequence_end_event_initialize(&ev) || emit(e, &ev))
		return -1;
	return 0;
}

static int emit_model(yaml_emitter_t *e, const struct registry_model *m)
{
	if (emit_str(e, m->name, 0) || emit_map_start(e) || emit_kv_str(e, "path", m->path) ||
	    emit_kv_str(e, "repo", m->repo) || emit_kv_str(e, "file", m->file) ||
	    emit_kv_str(e, "binary", m->binary) || emit_kv_long(e, "ctx", m->ctx) ||
	    emit_kv_long(e, "max_output", m->max_output))
		return -1;
	if (emit_list(e, "args", m->args, m->n_args) ||
	    emit_list(e, "aliases", m->aliases, m->n_aliases) || emit_kv_long(e, "ttl", m->ttl))
		return -1;
	return emit_map_end(e);
}

static int emit_registry(FILE *f, const struct registry *r)
{
	yaml_emitter_t e;
	if (!yaml_emitter_initialize(&e))
		return -1;
	yaml_emitter_set_output_file(&e, f);
	yaml_emitter_set_unicode(&e, 1); /* keep non-ASCII paths readable */
	yaml_emitter_set_width(&e, -1);  /* never fold a long path over lines */
	yaml_emitter_set_indent(&e, 2);
	yaml_event_t ev;
	int rc = -1;
	if (!yaml_stream_start_event_initialize(&ev, YAML_UTF8_ENCODING) || emit(&e, &ev))
		goto out;
	if (!yaml_document_start_event_initialize(&ev, NULL, NULL, NULL, 1) || emit(&e, &ev))
		goto out;
	if (emit_map_start(&e) || emit_str(&e, "models", 0) || emit_map_start(&e))
		goto out;
	for (int i = 0; i < r->n; i++)
		if (emit_model(&e, &r->models[i]))
			goto out;
	if (emit_map_end(&e) || emit_kv_str(&e, "active", r->active) ||
	    emit_kv_long(&e, "max_loaded", r->max_loaded) || emit_kv_long(&e, "ttl", r->ttl))
		goto out;
	if (r->n_groups > 0) {
		if (emit_str(&e, "groups", 0) || emit_map_start(&e))
			goto out;
		for (int g = 0; g < r->n_groups; g++)
			if (emit_list(&e, r->groups[g].name, r->groups[g].members,
			              r->groups[g].n_members))
				goto out;
		if (emit_map_end(&e))
			goto out;
	}
	if (emit_map_end(&e))
		goto out;
	if (!yaml_document_end_event_initialize(&ev, 1) || emit(&e, &ev))
		goto out;
	if (!yaml_stream_end_event_initialize(&ev) || emit(&e, &ev))
		goto out;
	rc = yaml_emitter_flush(&e) ? 0 : -1;
out:
	yaml_emitter_delete(&e);
	return rc;
}

/* Directory part of a path ("." when it has none). */
static void dir_of(const char *path, char *out, size_t n)
{
	const char *slash = strrchr(path, '/');
	if (!slash)
		snprintf(out, n, ".");
	else if (slash == path)
		snprintf(out, n, "/");
	else
		snprintf(out, n, "%.*s", (int)(slash - path), path);
}

/* Writes r to path via path.tmp, fsync and rename, then fsyncs the directory
 * so the rename itself survives a crash. The new file keeps the old one's
 * permissions, so a registry a user made private stays private. */
static int write_registry(const char *path, const struct registry *r, char *err, size_t errlen)
{
	char tmp[4200];
	if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) {
		err_set(err, errlen, "%s: path too long", path);
		return -1;
	}
	struct stat old;
	mode_t mode = stat(path, &old) == 0 ? (old.st_mode & 07777) : 0644;
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0) {
		err_set(err, errlen, "%s: %s", tmp, strerror(errno));
		return -1;
	}
	FILE *f = fdopen(fd, "w");
	if (!f) {
		err_set(err, errlen, "%s: %s", tmp, strerror(errno));
		close(fd);
		unlink(tmp);
		return -1;
	}
	int ok = fputs("# toki model registry. toki rewrites this file (comments are not kept);\n"
	               "# see `toki model list`.\n",
	               f) >= 0;
	ok = ok && emit_registry(f, r) == 0;
	ok = ok && fflush(f) == 0;
	int saved = errno;
	ok = ok && fchmod(fd, mode) == 0;
	ok = ok && fsync(fd) == 0;
	if (!ok)
		saved = errno ? errno : saved;
	if (fclose(f) != 0 && ok) {
		ok = 0;
		saved = errno;
	}
	if (!ok) {
		err_set(err, errlen, "%s: write failed: %s", tmp, strerror(saved ? saved : EIO));
		unlink(tmp);
		return -1;
	}
	if (rename(tmp, path) != 0) {
		err_set(err, errlen, "%s: rename to %s failed: %s", tmp, path, strerror(errno));
		unlink(tmp);
		return -1;
	}
	char dir[4096];
	dir_of(path, dir, sizeof dir);
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd >= 0) {
		(void)fsync(dfd); /* best effort: some filesystems refuse it */
		close(dfd);
	}
	return 0;
}

typedef int (*mutate_fn)(struct registry *r, const char *path, const void *arg, char *err,
                         size_t errlen);

/* Read-modify-write of the registry under its lock. A registry that does not
 * parse is left as it is and its parse error returned. */
static int registry_update(mutate_fn fn, const void *arg, char *err, size_t errlen)
{
	char cfg[4096], path[4096], dir[4096], lock[4200];
	if (paths_registry_file(cfg, sizeof cfg) != 0) {
		err_set(err, errlen, "the registry path is too long");
		return -1;
	}
	/* Write through a symbolic link (dotfile managers link ~/.config files)
	 * rather than replacing the link with a plain file. */
	struct stat lst;
	char *real = NULL;
	if (lstat(cfg, &lst) == 0 && S_ISLNK(lst.st_mode))
		real = realpath(cfg, NULL);
	snprintf(path, sizeof path, "%s", real ? real : cfg);
	free(real);
	dir_of(path, dir, sizeof dir);
	if (paths_mkdir_p(dir, 0700) != 0) {
		err_set(err, errlen, "cannot create %s: %s", dir, strerror(errno));
		return -1;
	}
	if (snprintf(lock, sizeof lock, "%s.lock", path) >= (int)sizeof lock) {
		err_set(err, errlen, "%s: path too long", path);
		return -1;
	}
	int lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (lfd < 0) {
		err_set(err, errlen, "%s: %s", lock, strerror(errno));
		return -1;
	}
	if (plat_lock(lfd, 1, 1) != 0) {
		err_set(err, errlen, "%s: cannot lock: %s", lock, strerror(errno));
		close(lfd);
		return -1;
	}
	struct registry r;
	char perr[1024];
	if (registry_load_file(path, &r, perr, sizeof perr) != 0) {
		err_set(err, errlen, "not changing the registry, which has an error: %s", perr);
		close(lfd);
		return -1;
	}
	int rc = fn(&r, path, arg, err, errlen);
	if (rc == 0)
		rc = write_registry(path, &r, err, errlen);
	registry_free(&r);
	close(lfd); /* releases the lock */
	return rc;
}

static int check_name(const char *name, char *err, size_t errlen)
{
	if (name && paths_is_safe_name(name))
		return 0;
	err_set(err, errlen,
	        "'%.40s' is not a valid model name: use letters, digits, '.', '_' and '-' "
	        "(not '.' or '..', at most 128)",
	        name ? name : "(null)");
	return -1;
}

struct set_arg {
	const char *name;
	const struct registry_model *m;
};

static int mutate_set(struct registry *r, const char *path, const void *arg, char *err,
                      size_t errlen)
{
	const struct set_arg *a = arg;
	struct registry_model copy;
	if (model_copy(&copy, a->name, a->m) != 0) {
		err_set(err, errlen, "out of memory");
		return -1;
	}
	for (int i = 0; i < r->n; i++) {
		if (!strcmp(r->models[i].name, a->name)) {
			/* A model pulled again keeps the names and ttl its entry
			 * was given by hand, unless the new entry sets its own. */
			if (!copy.n_aliases) {
				copy.aliases = r->models[i].aliases;
				copy.n_aliases = r->models[i].n_aliases;
				r->models[i].aliases = NULL;
				r->models[i].n_aliases = 0;
			}
			if (!copy.ttl)
				copy.ttl = r->models[i].ttl;
			model_free(&r->models[i]);
			r->models[i] = copy;
			return 0;
		}
	}
	struct registry_model *grown = realloc(r->models, ((size_t)r->n + 1) * sizeof *grown);
	if (!grown) {
		model_free(&copy);
		err_set(err, errlen, "out of memory");
		return -1;
	}
	r->models = grown;
	r->models[r->n++] = copy;
	return 0;
}

int registry_set_model(const char *name, const struct registry_model *m, char *err, size_t errlen)
{
	if (check_name(name, err, errlen) != 0)
		return -1;
	if (!m || !m->path || !*m->path) {
		err_set(err, errlen, "model '%s': a path to the GGUF file is required", name);
		return -1;
	}
	if (m->ctx < 0 || m->ctx > REGISTRY_MAX_TOKENS || m->max_output < 0 ||
	    m->max_output > REGISTRY_MAX_TOKENS) {
		err_set(err, errlen, "model '%s': ctx and max_output must be 0 (unset) to %ld",
		        name, REGISTRY_MAX_TOKENS);
		return -1;
	}
	if (m->n_args < 0 || (m->n_args > 0 && !m->args)) {
		err_set(err, errlen, "model '%s': bad argument list", name);
		return -1;
	}
	for (int i = 0; i < m->n_args; i++) {
		if (!m->args[i]) {
			err_set(err, errlen, "model '%s': argument %d is missing", name, i);
			return -1;
		}
	}
	struct set_arg a = {name, m};
	return registry_update(mutate_set, &a, err, errlen);
}

static int mutate_remove(struct registry *r, const char *path, const void *arg, char *err,
                         size_t errlen)
{
	const char *name = arg;
	for (int i = 0; i < r->n; i++) {
		if (strcmp(r->models[i].name, name))
			continue;
		model_free(&r->models[i]);
		memmove(&r->models[i], &r->models[i + 1],
		        (size_t)(r->n - i - 1) * sizeof *r->models);
		r->n--;
		if (r->active && !strcmp(r->active, name)) {
			free(r->active);
			r->active = NULL;
		}
		/* A member left behind would make the registry unreadable. */
		int g = registry_group_of(r, name);
		if (g >= 0) {
			struct registry_group *gr = &r->groups[g];
			for (int j = 0; j < gr->n_members; j++)
				if (!strcmp(gr->members[j], name)) {
					free(gr->members[j]);
					memmove(&gr->members[j], &gr->members[j + 1],
					        (size_t)(gr->n_members - j - 1) *
					            sizeof *gr->members);
					gr->n_members--;
					break;
				}
			if (gr->n_members == 0) {
				group_free(gr);
				memmove(gr, gr + 1,
				        (size_t)(r->n_groups - g - 1) * sizeof *r->groups);
				r->n_groups--;
			}
		}
		return 0;
	}
	err_set(err, errlen, "no model named '%s' in %s", name, path);
	return -1;
}

int registry_remove_model(const char *name, char *err, size_t errlen)
{
	if (check_name(name, err, errlen) != 0)
		return -1;
	return registry_update(mutate_remove, name, err, errlen);
}

static int mutate_active(struct registry *r, const char *path, const void *arg, char *err,
                         size_t errlen)
{
	const char *name = arg;
	char *dup = NULL;
	if (name) {
		if (!registry_find(r, name)) {
			err_set(err, errlen, "no model named '%s' in %s", name, path);
			return -1;
		}
		dup = strdup(name);
		if (!dup) {
			err_set(err, errlen, "out of memory");
			return -1;
		}
	}
	free(r->active);
	r->active = dup;
	return 0;
}

int registry_set_active(const char *name, char *err, size_t errlen)
{
	if (name && check_name(name, err, errlen) != 0)
		return -1;
	return registry_update(mutate_active, name, err, errlen);
}

/* --- Run state and weights ----------------------------------------------------- */

pid_t registry_running_pid(const char *name)
{
	if (!name || !paths_is_safe_name(name))
		return 0;
	char sub[256], path[4096];
	snprintf(sub, sizeof sub, "run/%s/serve.pid", name);
	if (paths_state_sub(path, sizeof path, sub) != 0)
		return 0;
	FILE *f = fopen(path, "re");
	if (!f)
		return 0;
	char buf[64];
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	char *p = buf;
	while (*p == ' ' || *p == '\t')
		p++;
	if (*p < '1' || *p > '9')
		return 0;
	errno = 0;
	char *end;
	long pid = strtol(p, &end, 10);
	while (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')
		end++;
	if (errno || *end || pid <= 0 || pid > INT_MAX)
		return 0;
	/* A zombie no parent has reaped yet is not running (toki down returns
	 * once its run has exited, reaped or not). */
	return plat_alive((pid_t)pid) ? (pid_t)pid : 0;
}

/* Removes the entry `name` in the directory dfd: a directory is emptied first
 * (depth-first), a symbolic link is removed as a link. Opening with O_NOFOLLOW
 * relative to the parent's descriptor means a link swapped in while we walk
 * is never followed out of the tree. */
static int purge_at(int dfd, const char *name, int depth, struct registry_purge *out, char *err,
                    size_t errlen)
{
	struct stat st;
	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
		if (errno == ENOENT)
			return 0;
		err_set(err, errlen, "%s/.../%s: %s", out->dir, name, strerror(errno));
		return -1;
	}
	if (!S_ISDIR(st.st_mode)) {
		if (unlinkat(dfd, name, 0) != 0) {
			err_set(err, errlen, "cannot delete %s/.../%s: %s", out->dir, name,
			        strerror(errno));
			return -1;
		}
		out->n_files++;
		if (S_ISREG(st.st_mode))
			out->bytes += (unsigned long long)st.st_size;
		return 0;
	}
	if (depth >= PURGE_MAX_DEPTH) {
		err_set(err, errlen, "%s: nested more than %d directories deep; not deleting",
		        out->dir, PURGE_MAX_DEPTH);
		return -1;
	}
	int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		err_set(err, errlen, "%s/.../%s: %s", out->dir, name, strerror(errno));
		return -1;
	}
	DIR *d = fdopendir(fd);
	if (!d) {
		err_set(err, errlen, "%s/.../%s: %s", out->dir, name, strerror(errno));
		close(fd);
		return -1;
	}
	int rc = 0;
	struct dirent *e;
	/* Deleting while iterating is allowed by POSIX (entries may or may not be
	 * returned again); the loop repeats until a pass finds nothing, so none
	 * is missed either way. */
	for (int again = 1; again && rc == 0;) {
		again = 0;
		rewinddir(d);
		while (rc == 0 && (errno = 0, e = readdir(d))) {
			if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
				continue;
			rc = purge_at(fd, e->d_name, depth + 1, out, err, errlen);
			again = 1;
		}
	}
	closedir(d);
	if (rc != 0)
		return -1;
	if (unlinkat(dfd, name, AT_REMOVEDIR) != 0) {
		err_set(err, errlen, "cannot delete %s: %s", out->dir, strerror(errno));
		return -1;
	}
	return 0;
}

/* Whether path lies strictly inside dir (both made absolute and free of
 * links and "..", as far as they exist). A path that cannot be resolved is
 * compared as written, so "<dir>/x.gguf" that was already deleted counts as
 * inside and "/home/u/x.gguf" as outside. */
static int path_inside(const char *path, const char *dir)
{
	char *rdir = realpath(dir, NULL);
	char *rpath = realpath(path, NULL);
	const char *d = rdir ? rdir : dir;
	const char *p = rpath ? rpath : path;
	size_t n = strlen(d);
	int inside = !strncmp(p, d, n) && p[n] == '/' && !strstr(p + n, "/../");
	free(rdir);
	free(rpath);
	return inside;
}

int registry_purge_files(const char *name, const char *model_path, struct registry_purge *out,
                         char *err, size_t errlen)
{
	memset(out, 0, sizeof *out);
	if (check_name(name, err, errlen) != 0)
		return -1;
	char sub[256];
	snprintf(sub, sizeof sub, "models/%s", name);
	if (paths_state_sub(out->dir, sizeof out->dir, sub) != 0) {
		err_set(err, errlen, "the state directory path is too long");
		return -1;
	}
	struct stat st;
	if (model_path && *model_path && !path_inside(model_path, out->dir) &&
	    lstat(model_path, &st) == 0)
		out->kept_outside = 1;
	if (lstat(out->dir, &st) != 0) {
		if (errno == ENOENT)
			return 0;
		err_set(err, errlen, "%s: %s", out->dir, strerror(errno));
		return -1;
	}
	char parent[1024];
	dir_of(out->dir, parent, sizeof parent);
	int pfd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (pfd < 0) {
		err_set(err, errlen, "%s: %s", parent, strerror(errno));
		return -1;
	}
	/* models/<name> itself a link (to a user's directory, say): only the
	 * link goes, as purge_at treats any link. */
	int rc = purge_at(pfd, name, 0, out, err, errlen);
	close(pfd);
	if (rc == 0)
		out->deleted_dir = 1;
	return rc;
}
