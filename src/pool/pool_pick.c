#include "pool/pool_pick.h"

#include <stdio.h>
#include <string.h>

#include "model/registry.h"

int pool_resolve(const struct registry *r, const char *model)
{
	if (!r || r->n == 0)
		return -1;
	if (!model || !*model) {
		for (int i = 0; r->active && i < r->n; i++)
			if (!strcmp(r->models[i].name, r->active))
				return i;
		return 0;
	}
	for (int i = 0; i < r->n; i++)
		if (!strcmp(r->models[i].name, model))
			return i;
	for (int i = 0; i < r->n; i++) {
		for (int a = 0; a < r->models[i].n_aliases; a++)
			if (!strcmp(r->models[i].aliases[a], model))
				return i;
		if (r->models[i].path && !strcmp(r->models[i].path, model))
			return i;
	}
	return -1;
}

int pool_unknown_message(const struct registry *r, const char *model, char *buf, size_t n)
{
	size_t off = 0;
	int len = snprintf(buf, n, "no model '%.200s' here; the models are:", model ? model : "");
	if (len < 0)
		return len;
	off = (size_t)len;
#define PUT(...)                                                                                   \
	do {                                                                                       \
		int k_ = snprintf(buf + (off < n ? off : n), off < n ? n - off : 0, __VA_ARGS__);  \
		if (k_ > 0)                                                                        \
			off += (size_t)k_;                                                         \
	} while (0)
	for (int i = 0; r && i < r->n; i++) {
		const struct registry_model *m = &r->models[i];
		PUT("%s %s", i ? "," : "", m->name);
		for (int a = 0; a < m->n_aliases; a++)
			PUT("%s%s", a ? ", " : " (aliases ", m->aliases[a]);
		if (m->n_aliases)
			PUT(")");
	}
	if (!r || r->n == 0)
		PUT(" none (toki model pull adds one)");
#undef PUT
	return (int)off;
}

/* Whether v[i] is in the target's group (never stopped to make room for it). */
static int partner(const struct pool_view *v, int i, int target)
{
	return i != target && v[target].group > 0 && v[i].group == v[target].group;
}

int pool_pick(const struct pool_view *v, int n, int target, uint64_t need, uint64_t capacity,
              long max_loaded)
{
	uint64_t held = 0, kept = 0;
	long running = 0, kept_n = 0;
	for (int i = 0; i < n; i++) {
		if (i == target || !v[i].running)
			continue;
		held += v[i].used;
		running++;
		/* A member on its way out (its ttl, a re-read) is not kept: the
		 * target waits for it to go rather than being refused. */
		if (partner(v, i, target) && !v[i].stopping) {
			kept += v[i].used;
			kept_n++;
		}
	}
	if (need > capacity)
		return POOL_NEVER;
	if (kept + need > capacity || (max_loaded > 0 && kept_n >= max_loaded))
		return POOL_NEVER_GROUP;
	if (held + need <= capacity && (max_loaded <= 0 || running < max_loaded))
		return POOL_FITS;
	int lru = -1;
	for (int i = 0; i < n; i++)
		if (i != target && v[i].running && v[i].stoppable && !partner(v, i, target) &&
		    (lru < 0 || v[i].last_used < v[lru].last_used))
			lru = i;
	return lru >= 0 ? lru : POOL_WAIT;
}

int pool_pick_drain(const struct pool_view *v, int n, int target)
{
	int lru = -1;
	for (int i = 0; i < n; i++)
		if (i != target && v[i].ready && !partner(v, i, target) &&
		    (lru < 0 || v[i].last_used < v[lru].last_used))
			lru = i;
	return lru;
}

int pool_turn_free(const struct pool_view *v, int n, int target, int cpus)
{
	if (!v[target].cpu)
		return 1;
	long threads = v[target].threads;
	int others = 0;
	for (int i = 0; i < n; i++) {
		if (i == target || !v[i].cpu || !v[i].busy)
			continue;
		if (!v[i].threads || !v[target].threads)
			return 0;
		threads += v[i].threads;
		others++;
	}
	/* Alone it may take more threads than there are CPUs (its own
	 * choice); beside another, they must fit. */
	return !others || threads <= cpus;
}

int pool_turn_queue(struct pool_view *v, int n, const struct pool_queue_view *q, int k, int cpus,
                    unsigned char *go)
{
	int held = 0, gone = 0;
	for (int j = 0; j < k; j++) {
		const struct pool_view *m = &v[q[j].model];
		go[j] = 0;
		if (!m->takes) {
			/* Its start (or the room for it) comes first: a start on
			 * the CPU takes the turn. */
			held |= m->cpu;
			continue;
		}
		if (!q[j].computes || !m->cpu) {
			go[j] = 1;
		} else if (!held && pool_turn_free(v, n, q[j].model, cpus)) {
			go[j] = 1;
			v[q[j].model].busy = 1;
		} else {
			held = 1;
		}
		gone += go[j];
	}
	return gone;
}
