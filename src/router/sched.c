#include "router/sched.h"

#include <stdlib.h>

size_t sched_tail_split(size_t cs, size_t ce, int ub)
{
	size_t u = ub > 0 ? (size_t)ub : 0, len = ce > cs ? ce - cs : 0;
	if (u < 2 * SCHED_MIN_BATCH || len <= u)
		return 0;
	size_t r = len % u;
	if (r == 0 || r >= SCHED_MIN_BATCH)
		return 0;
	/* The last micro-batch takes SCHED_MIN_BATCH rows from the one before:
	 * that one keeps a multiple of the tile, the last has 64 + r rows. */
	return ce - SCHED_MIN_BATCH - r;
}

/* The end of the micro-batch that starts at pos: n_ubatch rows, or fewer
 * where a chunk (or the computed rows) ends first, or where a closed
 * chunk's tail splits (sched_tail_split). *i walks the starts; the chunk
 * holding pos begins at the start before s[*i] (or 0) and, when s[*i]
 * exists, ends there. */
static size_t batch_end(const size_t *s, size_t ns, size_t *i, size_t end, size_t pos, int ub)
{
	while (*i < ns && s[*i] <= pos)
		(*i)++;
	size_t e = pos + (size_t)ub;
	if (*i < ns) {
		size_t t = sched_tail_split(*i ? s[*i - 1] : 0, s[*i], ub);
		if (t > pos && t < e)
			e = t;
		if (s[*i] < e)
			e = s[*i];
	}
	return end < e ? end : e;
}

size_t sched_common(const size_t *a, size_t na, size_t aend, const size_t *b, size_t nb,
                    size_t bend, size_t limit, int ub)
{
	if (ub <= 0)
		return 0;
	size_t ia = 0, ib = 0, pos = 0;
	/* pos is a micro-batch end in both (0 to begin with), hence the start
	 * of the next one in both. */
	while (pos < aend && pos < bend) {
		size_t ea = batch_end(a, na, &ia, aend, pos, ub);
		size_t eb = batch_end(b, nb, &ib, bend, pos, ub);
		if (ea != eb || ea > limit)
			break;
		pos = ea;
	}
	return pos;
}

size_t sched_floor(const size_t *b, size_t nb, size_t end, size_t x, int ub)
{
	if (ub <= 0)
		return 0;
	size_t i = 0, pos = 0;
	while (pos < end) {
		size_t e = batch_end(b, nb, &i, end, pos, ub);
		if (e > x)
			break;
		pos = e;
	}
	return pos;
}

size_t sched_chunks(size_t *b, const unsigned char *kind, size_t n)
{
	size_t kept = 0, prev = 0;
	int first = 1; /* inside the first message */
	for (size_t i = 0; i < n; i++) {
		int keep;
		if (b[i] <= prev || kind[i] == SCHED_START_PLAIN)
			keep = 0; /* not increasing (never a chunk of no rows), or
			           * the schedule without steps' only */
		else if (kind[i] == SCHED_START_ANSWER || kind[i] == SCHED_START_STEP)
			keep = 1;
		else if (kind[i] == SCHED_START_SECTION)
			keep = first && b[i] - prev >= SCHED_MIN_SECTION;
		else
			keep = first && b[i] - prev >= SCHED_MIN_CHUNK;
		if (kind[i] != SCHED_START_SECTION)
			first = 0;
		if (keep)
			b[kept++] = prev = b[i];
	}
	return kept;
}

size_t sched_max_step(int ub)
{
	size_t u = ub > 0 ? (size_t)ub : 512;
	return u >= 2048 ? u : 2048 / u * u;
}

/* Adds (when p->steps) or counts the prefill steps from *from to upto, a
 * micro-batch end: max_step at a time (0: no limit). Returns how many. */
static size_t steps_to(struct plan *p, size_t *from, size_t upto, size_t max_step)
{
	size_t k = 0;
	while (max_step && upto - *from > max_step) {
		*from += max_step;
		if (p->steps)
			p->steps[p->n++] = (struct plan_step){STEP_PREFILL, *from};
		k++;
	}
	if (p->steps)
		p->steps[p->n++] = (struct plan_step){STEP_PREFILL, upto};
	*from = upto;
	return k + 1;
}

/* The prefill steps (added or counted, as steps_to) up to each chunk start
 * past reuse: a chunk whose tail splits ends a step at the split, since
 * llama-server would cut one request across it into ub and a few rows. */
static size_t prefill_steps(struct plan *p, const size_t *b, size_t nb, size_t n, size_t reuse,
                            size_t max_step, int ub)
{
	size_t k = 0, from = reuse;
	for (size_t i = 0; i < nb; i++) {
		if (b[i] <= reuse || b[i] >= n)
			continue;
		size_t t = sched_tail_split(i ? b[i - 1] : 0, b[i], ub);
		if (t > from)
			k += steps_to(p, &from, t, max_step);
		k += steps_to(p, &from, b[i], max_step);
		p->final_cache = b[i];
	}
	return k;
}

int plan_build(struct plan *p, const size_t *b, size_t nb, size_t n, size_t reuse, int save_first,
               int restore, int cut, size_t max_step, int ub)
{
	p->steps = NULL;
	p->n = p->next = 0;
	size_t prefills = prefill_steps(p, b, nb, n, reuse, max_step, ub);
	p->steps = calloc(prefills + 4, sizeof *p->steps);
	if (!p->steps)
		return -1;
	p->reuse = reuse;
	p->final_cache = reuse;
	if (save_first)
		p->steps[p->n++] = (struct plan_step){STEP_SAVE, 0};
	if (restore)
		p->steps[p->n++] = (struct plan_step){STEP_RESTORE, 0};
	if (cut)
		p->steps[p->n++] = (struct plan_step){STEP_CUT, reuse};
	prefill_steps(p, b, nb, n, reuse, max_step, ub);
	p->steps[p->n++] = (struct plan_step){STEP_GENERATE, n};
	return 0;
}

size_t plan_ones_from(const struct plan *p, size_t i, size_t done, size_t max)
{
	size_t k = 0;
	while (k < max && i + k < p->n && p->steps[i + k].kind == STEP_PREFILL &&
	       p->steps[i + k].upto == done + k + 1)
		k++;
	return k;
}

size_t plan_forced_run(const struct plan *p, size_t i, size_t done)
{
	if (done == 0)
		return 0;
	size_t k = plan_ones_from(p, i, done, PLAN_RUN_MAX);
	return k >= 2 ? k : 0;
}

void plan_free(struct plan *p)
{
	free(p->steps);
	p->steps = NULL;
	p->n = p->next = 0;
}
