#include "ui/tui.h"

#ifndef NCURSES_WIDECHAR
#define NCURSES_WIDECHAR 1
#endif
#include <curses.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <langinfo.h>
#include <locale.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <wchar.h>

#include "platform/platform.h"
#include "ui/client.h"
#include "util/clock.h"
#include "util/grow.h"

/* ---- text: UTF-8 <-> wide characters, display widths -------------------- */

struct wbuf {
	wchar_t *s;
	size_t len, cap;
};

static int wbuf_reserve(struct wbuf *b, size_t need)
{
	return GROW(b->s, b->cap, need + 1, 64);
}

static int wbuf_insert(struct wbuf *b, size_t at, const wchar_t *s, size_t n)
{
	if (wbuf_reserve(b, b->len + n) != 0)
		return -1;
	memmove(b->s + at + n, b->s + at, (b->len - at) * sizeof *b->s);
	memcpy(b->s + at, s, n * sizeof *s);
	b->len += n;
	b->s[b->len] = 0;
	return 0;
}

static void wbuf_erase(struct wbuf *b, size_t at, size_t n)
{
	if (at >= b->len)
		return;
	if (n > b->len - at)
		n = b->len - at;
	memmove(b->s + at, b->s + at + n, (b->len - at - n) * sizeof *b->s);
	b->len -= n;
	b->s[b->len] = 0;
}

static int wbuf_set(struct wbuf *b, const wchar_t *s, size_t n)
{
	b->len = 0;
	if (wbuf_reserve(b, n) != 0)
		return -1;
	if (n)
		memcpy(b->s, s, n * sizeof *s);
	b->len = n;
	b->s[n] = 0;
	return 0;
}

static void wbuf_free(struct wbuf *b)
{
	free(b->s);
	memset(b, 0, sizeof *b);
}

/* Decodes UTF-8 into out (which must hold n + 1 characters). Invalid bytes
 * become U+FFFD; an incomplete sequence at the very end (a stream cut inside
 * a character) is left out; a tab becomes a space, other control characters
 * but the newline are dropped. Returns the number of characters. */
static size_t utf8_decode(const char *in, size_t n, wchar_t *out)
{
	const unsigned char *s = (const unsigned char *)in;
	size_t i = 0, o = 0;
	while (i < n) {
		unsigned c = s[i];
		unsigned cp;
		size_t len;
		if (c < 0x80) {
			cp = c;
			len = 1;
		} else if (c >= 0xc2 && c < 0xe0) {
			cp = c & 0x1f;
			len = 2;
		} else if (c >= 0xe0 && c < 0xf0) {
			cp = c & 0x0f;
			len = 3;
		} else if (c >= 0xf0 && c < 0xf5) {
			cp = c & 0x07;
			len = 4;
		} else {
			out[o++] = 0xfffd;
			i++;
			continue;
		}
		if (i + len > n) {
			int ok = 1;
			for (size_t k = 1; i + k < n; k++)
				ok &= (s[i + k] & 0xc0) == 0x80;
			if (ok)
				break; /* the rest is still to come */
		}
		size_t k;
		for (k = 1; k < len && i + k < n && (s[i + k] & 0xc0) == 0x80; k++)
			cp = cp << 6 | (s[i + k] & 0x3f);
		if (k < len || (len == 3 && cp < 0x800) ||
		    (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) ||
		    (cp >= 0xd800 && cp < 0xe000)) {
			out[o++] = 0xfffd;
			i += k > 1 ? k : 1;
			continue;
		}
		i += len;
		if (cp == '\t')
			cp = ' ';
		else if ((cp < 0x20 && cp != '\n') || cp == 0x7f || (cp >= 0x80 && cp < 0xa0))
			continue;
		out[o++] = (wchar_t)cp;
	}
	out[o] = 0;
	return o;
}

/* A new wide string from UTF-8 (NULL when out of memory); *n its length. */
static wchar_t *wide_of(const char *s, size_t len, size_t *n)
{
	wchar_t *w = malloc((len + 1) * sizeof *w);
	if (!w)
		return NULL;
	*n = utf8_decode(s, len, w);
	return w;
}

/* A new UTF-8 string from wide characters (NULL when out of memory). */
static char *utf8_of(const wchar_t *w, size_t n)
{
	char *s = malloc(n * 4 + 1), *p = s;
	if (!s)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		unsigned c = (unsigned)w[i];
		if (c >= 0xd800 && c < 0xe000)
			c = 0xfffd;
		if (c < 0x80) {
			*p++ = (char)c;
		} else if (c < 0x800) {
			*p++ = (char)(0xc0 | c >> 6);
			*p++ = (char)(0x80 | (c & 0x3f));
		} else if (c < 0x10000) {
			*p++ = (char)(0xe0 | c >> 12);
			*p++ = (char)(0x80 | (c >> 6 & 0x3f));
			*p++ = (char)(0x80 | (c & 0x3f));
		} else {
			*p++ = (char)(0xf0 | c >> 18);
			*p++ = (char)(0x80 | (c >> 12 & 0x3f));
			*p++ = (char)(0x80 | (c >> 6 & 0x3f));
			*p++ = (char)(0x80 | (c & 0x3f));
		}
	}
	*p = '\0';
	return s;
}

static int cw(wchar_t c)
{
	int w = wcwidth(c);
	return w < 0 ? 1 : w;
}

static int wswidth(const wchar_t *s, size_t n)
{
	int w = 0;
	for (size_t i = 0; i < n; i++)
		w += cw(s[i]);
	return w;
}

/* ---- the conversation --------------------------------------------------- */

enum answer_state { A_WAIT, A_STREAM, A_DONE, A_FAILED, A_CANCELLED, A_SKIPPED };

struct answer {
	int raw;
	enum answer_state state;
	char *text; /* content so far, UTF-8 */
	size_t len, cap;
	char *think; /* reasoning_content so far */
	size_t tlen, tcap;
	int64_t t0_us;
	char route[16];
	double est_ms;
	double ttft_ms, total_ms;
	long prompt_tokens, evaluated, cached, predicted;
	char err[512];
};

enum entry_kind { E_USER, E_ANSWER, E_COMPARE, E_INFO, E_ERROR };

struct entry {
	enum entry_kind kind;
	char *text;         /* E_USER, E_INFO, E_ERROR */
	int repeat;         /* E_ERROR: the same message again, this many times */
	struct answer a[2]; /* E_ANSWER: a[0]; E_COMPARE: a[0] raw, a[1] cached */
};

enum job_kind { JOB_NONE, JOB_PROBE, JOB_CHAT };

struct tui {
	struct tui_opts o;
	char url[1024];
	struct client cl;
	int have_client;
	char model[256];
	int connected; /* 1 yes, -1 no, 0 not known yet */

	json_t *history; /* the messages so far (system, user, assistant, ...) */

	pthread_mutex_t lock; /* guards entries' answers while a job runs */
	struct entry **ent;
	size_t n_ent, cap_ent;

	/* The job: one at a time, on its own thread. */
	enum job_kind job;
	pthread_t th;
	atomic_int job_done, cancel;
	struct entry *job_entry;
	json_t *job_messages;
	char *job_prompt;
	int probe_rc;
	char probe_err[1024], probe_model[256];
	int send_after_probe;
	int wake_r, wake_w;

	/* The terminal side. */
	enum tui_mode mode;
	struct wbuf input;
	size_t cur;
	wchar_t **hist;
	size_t n_hist, hist_pos;
	struct wbuf draft;
	int scroll, last_total;
	int in_paste;
	char last[256];
	int colors;
	int quit;
};

static const char *const mode_name[] = {"raw", "cached", "compare"};

static void wake(struct tui *t)
{
	char c = 1;
	ssize_t r = write(t->wake_w, &c, 1);
	(void)r; /* a full pipe already wakes the terminal thread */
}

static struct entry *entry_add(struct tui *t, enum entry_kind kind, const char *text)
{
	if (GROW(t->ent, t->cap_ent, t->n_ent + 1, 32) != 0)
		return NULL;
	struct entry *e = calloc(1, sizeof *e);
	if (!e)
		return NULL;
	e->kind = kind;
	if (text && !(e->text = strdup(text))) {
		free(e);
		return NULL;
	}
	pthread_mutex_lock(&t->lock);
	t->ent[t->n_ent++] = e;
	pthread_mutex_unlock(&t->lock);
	t->scroll = 0;
	return e;
}

static void entry_addf(struct tui *t, enum entry_kind kind, const char *fmt, ...)
{
	char buf[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	struct entry *last = t->n_ent ? t->ent[t->n_ent - 1] : NULL;
	if (kind == E_ERROR && last && last->kind == E_ERROR && !strcmp(last->text, buf)) {
		last->repeat++;
		t->scroll = 0;
		return;
	}
	entry_add(t, kind, buf);
}

static void entry_free(struct entry *e)
{
	if (!e)
		return;
	free(e->text);
	for (int i = 0; i < 2; i++) {
		free(e->a[i].text);
		free(e->a[i].think);
	}
	free(e);
}

static int buf_append(char **p, size_t *len, size_t *cap, const char *s, size_t n)
{
	if (GROW(*p, *cap, *len + n + 1, 256) != 0)
		return -1;
	memcpy(*p + *len, s, n);
	*len += n;
	(*p)[*len] = '\0';
	return 0;
}

/* ---- the worker thread -------------------------------------------------- */

struct stream_arg {
	struct tui *t;
	struct answer *a;
	struct client_stream_result *r;
};

static void on_comment(const char *text, void *arg)
{
	struct stream_arg *sa = arg;
	if (strncmp(text, "toki ", 5) != 0)
		return;
	pthread_mutex_lock(&sa->t->lock);
	snprintf(sa->a->route, sizeof sa->a->route, "%s", sa->r->route);
	sa->a->est_ms = sa->r->est_prefill_ms;
	pthread_mutex_unlock(&sa->t->lock);
	wake(sa->t);
}

static void on_delta(enum client_delta_kind kind, const char *s, size_t n, void *arg)
{
	struct stream_arg *sa = arg;
	struct answer *a = sa->a;
	pthread_mutex_lock(&sa->t->lock);
	if (kind == CLIENT_DELTA_CONTENT)
		buf_append(&a->text, &a->len, &a->cap, s, n);
	else
		buf_append(&a->think, &a->tlen, &a->tcap, s, n);
	if (a->state == A_WAIT) {
		a->state = A_STREAM;
		a->ttft_ms = sa->r->ttft_ms;
	}
	pthread_mutex_unlock(&sa->t->lock);
	wake(sa->t);
}

/* Streams one answer; its state and numbers land in *a. */
static int run_answer(struct tui *t, struct answer *a)
{
	json_t *body = client_chat_body(t->job_messages, t->o.temperature, t->o.max_tokens, a->raw);
	struct client_stream_result r;
	struct stream_arg sa = {t, a, &r};
	static const struct client_stream_handlers h = {
	    .on_comment = on_comment,
	    .on_delta = on_delta,
	};
	pthread_mutex_lock(&t->lock);
	a->t0_us = clock_now_us();
	pthread_mutex_unlock(&t->lock);
	int rc;
	if (body) {
		rc = client_chat_stream(&t->cl, NULL, body, &h, &sa, &t->cancel, &r);
	} else {
		memset(&r, 0, sizeof r);
		snprintf(r.err, sizeof r.err, "out of memory");
		rc = CLIENT_ERROR;
	}
	json_decref(body);
	pthread_mutex_lock(&t->lock);
	a->ttft_ms = r.ttft_ms >= 0 ? r.ttft_ms : r.total_ms;
	a->total_ms = r.total_ms;
	a->prompt_tokens = r.prompt_tokens;
	a->evaluated = r.evaluated;
	a->cached = r.cached;
	a->predicted = r.predicted;
	if (*r.route)
		snprintf(a->route, sizeof a->route, "%s", r.route);
	/* The whole answer as the client has it (the same bytes as the deltas). */
	if (r.text && r.text_len != a->len) {
		a->len = 0;
		buf_append(&a->text, &a->len, &a->cap, r.text, r.text_len);
	}
	if (rc == CLIENT_OK)
		a->state = A_DONE;
	else if (rc == CLIENT_CANCELLED)
		a->state = A_CANCELLED;
	else
		a->state = A_FAILED;
	snprintf(a->err, sizeof a->err, "%s", rc == CLIENT_OK ? "" : r.err);
	pthread_mutex_unlock(&t->lock);
	client_stream_result_free(&r);
	wake(t);
	return rc;
}

static void *worker(void *arg)
{
	struct tui *t = arg;
	if (t->job == JOB_PROBE) {
		t->probe_rc = client_probe(&t->cl, t->probe_model, sizeof t->probe_model,
		                           t->probe_err, sizeof t->probe_err);
	} else {
		struct entry *e = t->job_entry;
		int rc = run_answer(t, &e->a[0]);
		t->probe_rc = rc;
		if (e->kind == E_COMPARE) {
			if (rc == CLIENT_OK) {
				t->probe_rc = run_answer(t, &e->a[1]);
			} else {
				pthread_mutex_lock(&t->lock);
				e->a[1].state = A_SKIPPED;
				pthread_mutex_unlock(&t->lock);
			}
		}
	}
	atomic_store(&t->job_done, 1);
	wake(t);
	return NULL;
}

static int job_start(struct tui *t, enum job_kind kind)
{
	t->job = kind;
	atomic_store(&t->job_done, 0);
	atomic_store(&t->cancel, 0);
	if (pthread_create(&t->th, NULL, worker, t) != 0) {
		t->job = JOB_NONE;
		entry_addf(t, E_ERROR, "cannot start a thread: %s", strerror(errno));
		return -1;
	}
	return 0;
}

static void start_probe(struct tui *t, int send_after)
{
	if (t->job != JOB_NONE)
		return;
	/* Without --url, look again: a model may have started meanwhile. */
	char url[1024];
	client_find_daemon(t->o.url, url, sizeof url, NULL, 0);
	if (!t->have_client || strcmp(url, t->url) != 0) {
		if (t->have_client)
			client_free(&t->cl);
		t->have_client = 0;
		if (client_init(&t->cl, url) != 0) {
			entry_add(t, E_ERROR, "out of memory");
			return;
		}
		t->have_client = 1;
		snprintf(t->url, sizeof t->url, "%s", t->cl.base_url);
	}
	t->send_after_probe = send_after;
	job_start(t, JOB_PROBE);
}

static void input_clear(struct tui *t)
{
	t->input.len = 0;
	if (t->input.s)
		t->input.s[0] = 0;
	t->cur = 0;
}

static void history_add(struct tui *t, const wchar_t *s, size_t n)
{
	if (t->n_hist && wcslen(t->hist[t->n_hist - 1]) == n &&
	    !wmemcmp(t->hist[t->n_hist - 1], s, n)) {
		t->hist_pos = t->n_hist;
		return;
	}
	wchar_t **nv = realloc(t->hist, (t->n_hist + 1) * sizeof *nv);
	if (!nv)
		return;
	t->hist = nv;
	wchar_t *c = malloc((n + 1) * sizeof *c);
	if (!c)
		return;
	wmemcpy(c, s, n);
	c[n] = 0;
	t->hist[t->n_hist++] = c;
	t->hist_pos = t->n_hist;
}

/* Sends the input as the next turn in the current mode. */
static void send_input(struct tui *t)
{
	size_t n = t->input.len;
	while (n && (t->input.s[n - 1] == ' ' || t->input.s[n - 1] == '\n'))
		n--;
	size_t start = 0;
	while (start < n && (t->input.s[start] == ' ' || t->input.s[start] == '\n'))
		start++;
	if (start == n)
		return;
	char *prompt = utf8_of(t->input.s + start, n - start);
	json_t *msgs = json_deep_copy(t->history);
	json_t *user = prompt ? json_pack("{s:s, s:s}", "role", "user", "content", prompt) : NULL;
	if (!prompt || !msgs || !user || json_array_append_new(msgs, user) != 0) {
		if (!msgs || !prompt)
			json_decref(user);
		free(prompt);
		json_decref(msgs);
		entry_add(t, E_ERROR, "out of memory");
		return;
	}
	struct entry *ue = entry_add(t, E_USER, prompt);
	struct entry *e = entry_add(t, t->mode == TUI_MODE_COMPARE ? E_COMPARE : E_ANSWER, NULL);
	if (!ue || !e) {
		free(prompt);
		json_decref(msgs);
		return;
	}
	if (e->kind == E_COMPARE) {
		e->a[0].raw = 1;
		e->a[1].raw = 0;
	} else {
		e->a[0].raw = t->mode == TUI_MODE_RAW;
	}
	history_add(t, t->input.s + start, n - start);
	input_clear(t);
	t->job_entry = e;
	t->job_messages = msgs;
	t->job_prompt = prompt;
	if (job_start(t, JOB_CHAT) != 0) {
		json_decref(t->job_messages);
		free(t->job_prompt);
		t->job_messages = NULL;
		t->job_prompt = NULL;
	}
}

static void fmt_ms(char *buf, size_t n, double ms)
{
	if (ms < 0)
		snprintf(buf, n, "?");
	else if (ms < 10000)
		snprintf(buf, n, "%.0fms", ms);
	else
		snprintf(buf, n, "%.1fs", ms / 1000.0);
}

static void set_last(struct tui *t, const struct entry *e)
{
	char a[32], b[32];
	if (e->kind == E_COMPARE && e->a[1].state == A_DONE) {
		const struct answer *r = &e->a[0], *c = &e->a[1];
		fmt_ms(a, sizeof a, r->ttft_ms);
		fmt_ms(b, sizeof b, c->ttft_ms);
		snprintf(t->last, sizeof t->last, "TTFT %s→%s %.1fx · eval %ld→%ld/%ld", a, b,
		         c->ttft_ms > 0 ? r->ttft_ms / c->ttft_ms : 0.0, r->evaluated, c->evaluated,
		         c->prompt_tokens);
	} else if (e->kind == E_ANSWER && e->a[0].state == A_DONE) {
		const struct answer *x = &e->a[0];
		fmt_ms(a, sizeof a, x->ttft_ms);
		snprintf(t->last, sizeof t->last, "%s TTFT %s · eval %ld/%ld",
		         x->raw ? "raw" : "cached", a, x->evaluated, x->prompt_tokens);
	}
}

/* The job ended: join its thread and take its results (terminal thread). */
static void job_finish(struct tui *t)
{
	pthread_join(t->th, NULL);
	enum job_kind kind = t->job;
	t->job = JOB_NONE;
	if (kind == JOB_PROBE) {
		if (t->probe_rc == CLIENT_OK) {
			int was = t->connected;
			t->connected = 1;
			snprintf(t->model, sizeof t->model, "%s", t->probe_model);
			if (was != 1)
				entry_addf(t, E_INFO, "connected to %s (model %s)", t->url,
				           *t->model ? t->model : "?");
			if (t->send_after_probe)
				send_input(t);
		} else {
			t->connected = t->probe_rc == CLIENT_DOWN ? -1 : t->connected;
			if (t->probe_rc == CLIENT_DOWN)
				entry_addf(
				    t, E_ERROR,
				    "The toki daemon is not running at %s. Start one with `toki "
				    "model use NAME` or `toki up --model FILE.gguf`, then press "
				    "Enter to retry.",
				    t->url);
			else
				entry_addf(t, E_ERROR, "%s. Press Enter to retry.", t->probe_err);
		}
		t->send_after_probe = 0;
		return;
	}
	struct entry *e = t->job_entry;
	int ok = e->kind == E_COMPARE ? e->a[1].state == A_DONE : e->a[0].state == A_DONE;
	if (ok) {
		const struct answer *x = e->kind == E_COMPARE ? &e->a[1] : &e->a[0];
		json_t *u = json_pack("{s:s, s:s}", "role", "user", "content", t->job_prompt);
		json_t *asst = json_pack("{s:s, s:s%}", "role", "assistant", "content",
		                         x->text ? x->text : "", x->len);
		if (u && asst) {
			json_array_append_new(t->history, u);
			json_array_append_new(t->history, asst);
		} else {
			json_decref(u);
			json_decref(asst);
			entry_add(t, E_ERROR, "out of memory: this turn is not in the history");
		}
		set_last(t, e);
		t->connected = 1;
	} else if (t->probe_rc == CLIENT_DOWN) {
		t->connected = -1;
		entry_addf(t, E_ERROR,
		           "The toki daemon is not running at %s. Start one with `toki model use "
		           "NAME` or `toki up --model FILE.gguf`, then press Enter to retry.",
		           t->url);
		/* Enter sends it again. */
		if (t->input.len == 0) {
			size_t n;
			wchar_t *w = wide_of(t->job_prompt, strlen(t->job_prompt), &n);
			if (w) {
				wbuf_set(&t->input, w, n);
				t->cur = n;
				free(w);
			}
		}
	}
	json_decref(t->job_messages);
	free(t->job_prompt);
	t->job_messages = NULL;
	t->job_prompt = NULL;
	t->job_entry = NULL;
}

/* ---- drawing ------------------------------------------------------------ */

enum { PAIR_STATUS = 1, PAIR_USER, PAIR_RAW, PAIR_CACHED, PAIR_ERROR, PAIR_DIM, PAIR_MODE };

struct seg {
	int x;
	wchar_t *s;
	int n;
	attr_t attr;
	short pair;
};

struct dline {
	struct seg seg[3];
	int nseg;
};

struct dlines {
	struct dline *v;
	size_t n, cap;
	int oom;
};

static void dlines_free(struct dlines *d)
{
	for (size_t i = 0; i < d->n; i++)
		for (int k = 0; k < d->v[i].nseg; k++)
			free(d->v[i].seg[k].s);
	free(d->v);
	memset(d, 0, sizeof *d);
}

static struct dline *dline_new(struct dlines *d)
{
	if (GROW(d->v, d->cap, d->n + 1, 128) != 0) {
		d->oom = 1;
		return NULL;
	}
	struct dline *l = &d->v[d->n++];
	memset(l, 0, sizeof *l);
	return l;
}

static void dline_seg(struct dlines *d, struct dline *l, int x, const wchar_t *s, size_t n,
                      attr_t attr, short pair)
{
	if (!l || l->nseg == 3)
		return;
	wchar_t *c = malloc((n + 1) * sizeof *c);
	if (!c) {
		d->oom = 1;
		return;
	}
	wmemcpy(c, s, n);
	c[n] = 0;
	l->seg[l->nseg++] = (struct seg){x, c, (int)n, attr, pair};
}

/* Word-wraps s to width columns: each line is appended at column x. */
static void add_wrapped(struct dlines *d, int x, int width, const wchar_t *s, size_t n, attr_t attr,
                        short pair)
{
	if (width < 1)
		width = 1;
	size_t i = 0;
	for (;;) {
		size_t start = i, j = i, last_space = (size_t)-1;
		int col = 0;
		while (j < n && s[j] != '\n') {
			int w = cw(s[j]);
			if (col + w > width && j > start) {
				size_t end = j, next = j;
				if (last_space != (size_t)-1 && last_space > start) {
					end = last_space;
					next = last_space + 1;
				}
				dline_seg(d, dline_new(d), x, s + start, end - start, attr, pair);
				start = next;
				col = wswidth(s + next, j - next);
				last_space = (size_t)-1;
				continue;
			}
			if (s[j] == ' ')
				last_space = j;
			col += w;
			j++;
		}
		dline_seg(d, dline_new(d), x, s + start, j - start, attr, pair);
		if (j >= n)
			break;
		i = j + 1;
	}
}

static void add_wrapped_utf8(struct dlines *d, int x, int width, const char *s, size_t len,
                             attr_t attr, short pair)
{
	size_t n;
	wchar_t *w = wide_of(s ? s : "", s ? len : 0, &n);
	if (!w) {
		d->oom = 1;
		return;
	}
	add_wrapped(d, x, width, w, n, attr, pair);
	free(w);
}

static void add_text(struct dlines *d, int x, int width, const char *s, attr_t attr, short pair)
{
	add_wrapped_utf8(d, x, width, s, s ? strlen(s) : 0, attr, pair);
}

static void add_blank(struct dlines *d)
{
	dline_new(d);
}

/* One line about an answer: where it stands, or its numbers. */
static void answer_stats(const struct answer *a, char *buf, size_t n, int compact)
{
	char t1[32], t2[32];
	double now = (double)(clock_now_us() - a->t0_us) / 1000.0;
	switch (a->state) {
	case A_WAIT:
		if (!a->t0_us) {
			snprintf(buf, n, "waiting for the raw run…");
			break;
		}
		snprintf(t1, sizeof t1, "%.1fs", now / 1000.0);
		if (a->raw) {
			snprintf(buf, n, "prefilling… %s (cache off: the whole prompt)", t1);
		} else if (a->est_ms >= 0 && *a->route) {
			fmt_ms(t2, sizeof t2, a->est_ms);
			snprintf(buf, n, "prefilling… %s (route %s, estimated %s)", t1, a->route,
			         t2);
		} else {
			snprintf(buf, n, "prefilling… %s", t1);
		}
		break;
	case A_STREAM:
		fmt_ms(t1, sizeof t1, a->ttft_ms);
		snprintf(buf, n, "TTFT %s · streaming… %.1fs", t1, now / 1000.0);
		break;
	case A_DONE:
		fmt_ms(t1, sizeof t1, a->ttft_ms);
		fmt_ms(t2, sizeof t2, a->total_ms);
		if (compact)
			snprintf(buf, n, "TTFT %s · eval %ld/%ld · total %s · %ld tok", t1,
			         a->evaluated, a->prompt_tokens, t2, a->predicted);
		else if (a->raw)
			snprintf(
			    buf, n,
			    "TTFT %s · total %s · evaluated %ld of %ld prompt tokens (cache off) "
			    "· %ld output tokens",
			    t1, t2, a->evaluated, a->prompt_tokens, a->predicted);
		else
			snprintf(buf, n,
			         "TTFT %s · total %s · evaluated %ld of %ld prompt tokens (%ld "
			         "reused%s%s) · %ld output tokens",
			         t1, t2, a->evaluated, a->prompt_tokens, a->cached,
			         *a->route ? ", route " : "", a->route, a->predicted);
		break;
	case A_FAILED:
		snprintf(buf, n, "✗ %s", a->err);
		break;
	case A_CANCELLED:
		snprintf(buf, n, "stopped");
		break;
	case A_SKIPPED:
		snprintf(buf, n, "not run");
		break;
	}
}

static void add_answer_text(struct dlines *d, int x, int width, const struct answer *a, short pair)
{
	if (a->tlen)
		add_wrapped_utf8(d, x, width, a->think, a->tlen, A_DIM, PAIR_DIM);
	if (a->len)
		add_wrapped_utf8(d, x, width, a->text, a->len, A_NORMAL, 0);
	else if (a->state == A_DONE && !a->tlen)
		add_text(d, x, width, "(empty answer)", A_DIM, PAIR_DIM);
	(void)pair;
}

static void build_compare(struct dlines *d, int W, const struct entry *e)
{
	int lw = (W - 3) / 2, rx = lw + 3, rw = W - rx;
	struct dlines L = {0}, R = {0};
	add_text(&L, 0, lw, "raw (no cache)", A_BOLD, PAIR_RAW);
	add_text(&R, 0, rw, "cached (toki router)", A_BOLD, PAIR_CACHED);
	add_answer_text(&L, 0, lw, &e->a[0], PAIR_RAW);
	add_answer_text(&R, 0, rw, &e->a[1], PAIR_CACHED);
	char s[600];
	answer_stats(&e->a[0], s, sizeof s, 1);
	add_text(&L, 0, lw, s, A_DIM, PAIR_DIM);
	answer_stats(&e->a[1], s, sizeof s, 1);
	add_text(&R, 0, rw, s, A_DIM, PAIR_DIM);
	size_t rows = L.n > R.n ? L.n : R.n;
	static const wchar_t bar[] = L" │ ";
	for (size_t i = 0; i < rows; i++) {
		struct dline *l = dline_new(d);
		if (!l)
			break;
		if (i < L.n && L.v[i].nseg)
			dline_seg(d, l, 0, L.v[i].seg[0].s, (size_t)L.v[i].seg[0].n,
			          L.v[i].seg[0].attr, L.v[i].seg[0].pair);
		dline_seg(d, l, lw, bar, 3, A_DIM, PAIR_DIM);
		if (i < R.n && R.v[i].nseg)
			dline_seg(d, l, rx, R.v[i].seg[0].s, (size_t)R.v[i].seg[0].n,
			          R.v[i].seg[0].attr, R.v[i].seg[0].pair);
	}
	d->oom |= L.oom | R.oom;
	dlines_free(&L);
	dlines_free(&R);
	const struct answer *r = &e->a[0], *c = &e->a[1];
	if (r->state == A_DONE && c->state == A_DONE) {
		int same = r->len == c->len && (!r->len || !memcmp(r->text, c->text, r->len));
		snprintf(
		    s, sizeof s,
		    "speed-up: TTFT %.1fx, total %.1fx · evaluated %ld → %ld of %ld prompt tokens "
		    "· outputs %s",
		    c->ttft_ms > 0 ? r->ttft_ms / c->ttft_ms : 0.0,
		    c->total_ms > 0 ? r->total_ms / c->total_ms : 0.0, r->evaluated, c->evaluated,
		    c->prompt_tokens, same ? "identical" : "differ");
		add_text(d, 0, W, s, A_BOLD, PAIR_CACHED);
	}
}

static void build_lines(struct tui *t, struct dlines *d, int W)
{
	char s[700];
	for (size_t i = 0; i < t->n_ent; i++) {
		const struct entry *e = t->ent[i];
		switch (e->kind) {
		case E_USER:
			add_text(d, 0, W, "you", A_BOLD, PAIR_USER);
			add_text(d, 2, W - 2, e->text, A_NORMAL, 0);
			break;
		case E_ANSWER:
			snprintf(s, sizeof s, "toki · %s",
			         e->a[0].raw ? "raw (no cache)" : "cached");
			add_text(d, 0, W, s, A_BOLD, e->a[0].raw ? PAIR_RAW : PAIR_CACHED);
			add_answer_text(d, 2, W - 2, &e->a[0], 0);
			answer_stats(&e->a[0], s, sizeof s, 0);
			add_text(d, 2, W - 2, s, e->a[0].state == A_FAILED ? A_BOLD : A_DIM,
			         e->a[0].state == A_FAILED ? PAIR_ERROR : PAIR_DIM);
			break;
		case E_COMPARE:
			add_text(d, 0, W, "toki · compare: raw, then cached", A_BOLD, PAIR_MODE);
			build_compare(d, W, e);
			break;
		case E_INFO:
			add_text(d, 0, W, e->text, A_DIM, PAIR_DIM);
			break;
		case E_ERROR:
			if (e->repeat) {
				snprintf(s, sizeof s, "%.600s (%d times)", e->text, e->repeat + 1);
				add_text(d, 0, W, s, A_BOLD, PAIR_ERROR);
			} else {
				add_text(d, 0, W, e->text, A_BOLD, PAIR_ERROR);
			}
			break;
		}
		add_blank(d);
	}
}

static attr_t attr_of(struct tui *t, attr_t attr, short pair)
{
	if (t->colors && pair)
		return attr | COLOR_PAIR(pair);
	if (!t->colors && pair == PAIR_ERROR)
		return attr | A_BOLD;
	return attr;
}

/* Draws UTF-8 text at (y, x), cut to maxw columns (with … when cut). */
static void put_text(struct tui *t, int y, int x, int maxw, const char *s, attr_t attr, short pair)
{
	if (maxw <= 0)
		return;
	size_t n;
	wchar_t *w = wide_of(s, strlen(s), &n);
	if (!w)
		return;
	int col = 0;
	size_t k = 0;
	while (k < n && w[k] != '\n' && col + cw(w[k]) <= maxw) {
		col += cw(w[k]);
		k++;
	}
	if (k < n && w[k] != '\n' && k > 0) {
		while (k > 0 && col + 1 > maxw)
			col -= cw(w[--k]);
		w[k++] = L'…';
	}
	attrset(attr_of(t, attr, pair));
	mvaddnwstr(y, x, w, (int)k);
	attrset(A_NORMAL);
	free(w);
}

struct input_layout {
	int *row, *col; /* per character index, and one past the end */
	int rows;
};

/* Character-wraps the input to width (a wrapped character starts the next row). */
static int layout_input(const struct wbuf *in, int width, struct input_layout *lo)
{
	lo->row = malloc((in->len + 1) * sizeof *lo->row);
	lo->col = malloc((in->len + 1) * sizeof *lo->col);
	if (!lo->row || !lo->col) {
		free(lo->row);
		free(lo->col);
		return -1;
	}
	int r = 0, c = 0;
	for (size_t i = 0; i < in->len; i++) {
		int w = in->s[i] == '\n' ? 0 : cw(in->s[i]);
		if (c + w > width && c > 0) {
			r++;
			c = 0;
		}
		lo->row[i] = r;
		lo->col[i] = c;
		if (in->s[i] == '\n') {
			r++;
			c = 0;
		} else {
			c += w;
		}
	}
	if (c >= width) {
		r++;
		c = 0;
	}
	lo->row[in->len] = r;
	lo->col[in->len] = c;
	lo->rows = r + 1;
	return 0;
}

static void layout_free(struct input_layout *lo)
{
	free(lo->row);
	free(lo->col);
}

static int input_max_rows(int H)
{
	int m = (H - 4) / 3;
	return m < 1 ? 1 : m > 8 ? 8 : m;
}

static void draw(struct tui *t)
{
	int H = LINES, W = COLS;
	erase();
	if (H < 8 || W < 30) {
		put_text(t, 0, 0, W, "terminal too small (30x8 at least)", A_BOLD, PAIR_ERROR);
		refresh();
		return;
	}
	/* Input first: its height decides the rest. */
	int iw = W - 2;
	struct input_layout lo = {0};
	int have_lo = layout_input(&t->input, iw, &lo) == 0;
	int in_rows = have_lo ? lo.rows : 1;
	int in_h = in_rows < input_max_rows(H) ? in_rows : input_max_rows(H);
	int tr_top = 1, tr_h = H - 3 - in_h;
	int sep_y = tr_top + tr_h, in_y = sep_y + 1, help_y = H - 1;

	/* The transcript, anchored at the bottom unless scrolled. */
	struct dlines d = {0};
	pthread_mutex_lock(&t->lock);
	build_lines(t, &d, W);
	pthread_mutex_unlock(&t->lock);
	int total = (int)d.n;
	if (t->scroll > 0 && total > t->last_total)
		t->scroll += total - t->last_total; /* keep the view still while text arrives */
	t->last_total = total;
	int max_scroll = total > tr_h ? total - tr_h : 0;
	if (t->scroll > max_scroll)
		t->scroll = max_scroll;
	if (t->scroll < 0)
		t->scroll = 0;
	int first = total - tr_h - t->scroll;
	if (first < 0)
		first = 0;
	for (int y = 0; y < tr_h && first + y < total; y++) {
		const struct dline *l = &d.v[first + y];
		for (int k = 0; k < l->nseg; k++) {
			const struct seg *g = &l->seg[k];
			attrset(attr_of(t, g->attr, g->pair));
			mvaddnwstr(tr_top + y, g->x, g->s, g->n);
		}
		attrset(A_NORMAL);
	}
	dlines_free(&d);

	/* The status line: mode, keys, last turn, endpoint, model. */
	char st[1400];
	attrset(attr_of(t, A_REVERSE, PAIR_STATUS));
	mvhline(0, 0, ' ', W);
	int x = 0;
	snprintf(st, sizeof st, " %s ", mode_name[t->mode]);
	put_text(t, 0, x, W - x, st, A_BOLD | A_REVERSE, PAIR_MODE);
	x += (int)strlen(st);
	static const char *const keys[] = {"F1 raw", "F2 cached", "F3 compare"};
	for (int i = 0; i < 3 && x < W; i++) {
		snprintf(st, sizeof st, " %s%s%s", i == (int)t->mode ? "[" : "", keys[i],
		         i == (int)t->mode ? "]" : "");
		put_text(t, 0, x, W - x, st, (i == (int)t->mode ? A_BOLD : 0) | A_REVERSE,
		         PAIR_STATUS);
		x += (int)strlen(st);
	}
	const char *host = strstr(t->url, "://");
	host = host ? host + 3 : t->url;
	if (t->connected < 0)
		snprintf(st, sizeof st, " │ %.255s │ %.300s │ not connected: Enter retries ",
		         *t->last ? t->last : "no turn yet", host);
	else
		snprintf(st, sizeof st, " │ %.255s │ %.300s │ %.255s ",
		         *t->last ? t->last : "no turn yet", host,
		         *t->model      ? t->model
		         : t->connected ? "?"
		                        : "connecting…");
	if (x < W)
		put_text(t, 0, x, W - x, st, A_REVERSE, PAIR_STATUS);
	attrset(A_NORMAL);

	/* The separator, with what Enter will do and where the view is. */
	attrset(attr_of(t, A_DIM, PAIR_DIM));
	mvhline(sep_y, 0, ACS_HLINE, W);
	attrset(A_NORMAL);
	if (t->job == JOB_CHAT)
		snprintf(st, sizeof st, " answering (%s) · Esc stops ", mode_name[t->mode]);
	else if (t->job == JOB_PROBE)
		snprintf(st, sizeof st, " connecting to %s… ", host);
	else
		snprintf(st, sizeof st, " prompt · Enter sends (%s) ", mode_name[t->mode]);
	put_text(t, sep_y, 2, W - 4, st, A_DIM, PAIR_DIM);
	if (t->scroll > 0) {
		snprintf(st, sizeof st, " ↓ %d more lines · PgDn ", t->scroll);
		int sw = (int)strlen(st) - 4; /* two 3-byte arrows/dots count as one column each */
		put_text(t, sep_y, W - sw - 2, sw + 1, st, A_BOLD, PAIR_MODE);
	}

	/* The help line. */
	put_text(
	    t, help_y, 0, W - 1,
	    "Enter send · Alt+Enter/^J newline · ↑↓ history · PgUp/Dn scroll · Alt/Ctrl+1-3 mode · "
	    "Esc stop · ^N new · F10/^C quit",
	    A_DIM, PAIR_DIM);

	/* The input, scrolled so that the cursor row shows. */
	int cy = in_y, cx = 2;
	if (have_lo) {
		int crow = lo.row[t->cur], top = 0;
		if (crow >= in_h)
			top = crow - in_h + 1;
		for (int r = 0; r < in_h; r++)
			mvaddstr(in_y + r, 0, r + top == 0 ? "› " : "  ");
		size_t i = 0;
		while (i < t->input.len) {
			int r = lo.row[i];
			size_t j = i;
			while (j < t->input.len && lo.row[j] == r && t->input.s[j] != '\n')
				j++;
			if (r >= top && r < top + in_h && j > i)
				mvaddnwstr(in_y + r - top, 2 + lo.col[i], t->input.s + i,
				           (int)(j - i));
			i = j < t->input.len && t->input.s[j] == '\n' ? j + 1 : j;
		}
		cy = in_y + crow - top;
		cx = 2 + lo.col[t->cur];
		layout_free(&lo);
	}
	move(cy, cx < W ? cx : W - 1);
	refresh();
}

/* ---- keys --------------------------------------------------------------- */

static void set_mode(struct tui *t, enum tui_mode m)
{
	t->mode = m;
}

static void insert(struct tui *t, const wchar_t *s, size_t n)
{
	if (wbuf_insert(&t->input, t->cur, s, n) == 0)
		t->cur += n;
}

static void history_move(struct tui *t, int dir)
{
	if (!t->n_hist)
		return;
	if (dir < 0) {
		if (t->hist_pos == 0)
			return;
		if (t->hist_pos == t->n_hist)
			wbuf_set(&t->draft, t->input.s ? t->input.s : L"", t->input.len);
		t->hist_pos--;
		wbuf_set(&t->input, t->hist[t->hist_pos], wcslen(t->hist[t->hist_pos]));
	} else {
		if (t->hist_pos >= t->n_hist)
			return;
		t->hist_pos++;
		if (t->hist_pos == t->n_hist)
			wbuf_set(&t->input, t->draft.s ? t->draft.s : L"", t->draft.len);
		else
			wbuf_set(&t->input, t->hist[t->hist_pos], wcslen(t->hist[t->hist_pos]));
	}
	t->cur = t->input.len;
}

/* Up/Down: a row up or down in a multi-line input; at its first (last) row,
 * or in an empty input, the previous (next) prompt of the session. */
static void vertical(struct tui *t, int dir)
{
	struct input_layout lo;
	int iw = COLS - 2 > 1 ? COLS - 2 : 1;
	if (layout_input(&t->input, iw, &lo) != 0)
		return;
	int row = lo.row[t->cur], col = lo.col[t->cur];
	int target = row + dir;
	if (t->input.len == 0 || target < 0 || target >= lo.rows) {
		layout_free(&lo);
		history_move(t, dir);
		return;
	}
	size_t best = t->cur;
	int found = 0;
	for (size_t i = 0; i <= t->input.len; i++) {
		if (lo.row[i] != target)
			continue;
		if (!found || lo.col[i] <= col) {
			best = i;
			found = 1;
		}
		if (lo.col[i] >= col)
			break;
	}
	layout_free(&lo);
	t->cur = best;
}

static void line_bounds(const struct tui *t, size_t *start, size_t *end)
{
	size_t s = t->cur, e = t->cur;
	while (s > 0 && t->input.s[s - 1] != '\n')
		s--;
	while (e < t->input.len && t->input.s[e] != '\n')
		e++;
	*start = s;
	*end = e;
}

static void on_enter(struct tui *t)
{
	if (t->job == JOB_CHAT) {
		beep();
		return;
	}
	if (t->job == JOB_PROBE)
		return;
	int empty = 1;
	for (size_t i = 0; i < t->input.len; i++)
		if (t->input.s[i] != ' ' && t->input.s[i] != '\n')
			empty = 0;
	if (t->connected != 1) {
		start_probe(t, !empty);
		return;
	}
	if (!empty)
		send_input(t);
}

/* Forgets the conversation (the system message stays); the screen keeps
 * what was said, below a line that says so. */
static void new_conversation(struct tui *t)
{
	if (t->job == JOB_CHAT) {
		beep();
		return;
	}
	const char *role =
	    json_string_value(json_object_get(json_array_get(t->history, 0), "role"));
	size_t keep = role && !strcmp(role, "system") ? 1 : 0;
	while (json_array_size(t->history) > keep)
		json_array_remove(t->history, json_array_size(t->history) - 1);
	entry_add(t, E_INFO, "── new conversation: the next prompt starts afresh ──");
}

static void scroll_by(struct tui *t, int n)
{
	t->scroll += n;
	if (t->scroll < 0)
		t->scroll = 0;
}

/* A CSI sequence the terminal sent that curses did not know: xterm's
 * modifyOtherKeys (CSI 27;mod;code ~), the CSI-u form (CSI code;mod u) and
 * bracketed paste (CSI 200~ / 201~). */
static void on_csi(struct tui *t, const char *params, int final)
{
	long a = 0, b = 0, c = 0;
	int n = sscanf(params, "%ld;%ld;%ld", &a, &b, &c);
	long code = -1, mods = 1;
	if (final == '~' && n >= 1 && a == 200) {
		t->in_paste = 1;
		return;
	}
	if (final == '~' && n >= 1 && a == 201) {
		t->in_paste = 0;
		return;
	}
	if (final == '~' && n == 3 && a == 27) {
		mods = b;
		code = c;
	} else if (final == 'u' && n >= 1) {
		code = a;
		mods = n >= 2 ? b : 1;
	}
	if (code < 0)
		return;
	long m = mods - 1; /* 1 shift, 2 alt, 4 ctrl */
	if ((m & 4 || m & 2) && code >= '1' && code <= '3') {
		set_mode(t, (enum tui_mode)(code - '1'));
	} else if (code == 13 && m) {
		insert(t, L"\n", 1); /* Shift/Ctrl/Alt+Enter */
	} else if (code == 13) {
		on_enter(t);
	} else if (m & 4 && (code == 'c' || code == 'd')) {
		t->quit = 1;
	} else if (m & 4 && code == 'j') {
		insert(t, L"\n", 1);
	}
}

/* After an ESC: Alt+key, a CSI sequence, or Esc alone (stop the answer). */
static void on_escape(struct tui *t)
{
	wint_t ch;
	timeout(40);
	int r = get_wch(&ch);
	if (r == ERR) {
		if (t->job == JOB_CHAT)
			atomic_store(&t->cancel, 1);
	} else if (r == OK && ch == 'O') {
		/* SS3 keys curses did not know: F1-F4 as some terminals send them. */
		if (get_wch(&ch) == OK && ch >= 'P' && ch <= 'R')
			set_mode(t, (enum tui_mode)(ch - 'P'));
	} else if (r == OK && ch == '[') {
		char params[32];
		size_t n = 0;
		int final = 0;
		while ((r = get_wch(&ch)) == OK) {
			if (ch >= 0x40 && ch <= 0x7e) {
				final = (int)ch;
				break;
			}
			if (n + 1 < sizeof params)
				params[n++] = (char)ch;
		}
		params[n] = '\0';
		if (final)
			on_csi(t, params, final);
	} else if (r == OK && (ch == '\r' || ch == '\n')) {
		insert(t, L"\n", 1);
	} else if (r == OK && ch >= '1' && ch <= '3') {
		set_mode(t, (enum tui_mode)(ch - '1'));
	} else if (r == OK && (ch == 'b' || ch == 'B')) {
		while (t->cur > 0 && t->input.s[t->cur - 1] == ' ')
			t->cur--;
		while (t->cur > 0 && t->input.s[t->cur - 1] != ' ' &&
		       t->input.s[t->cur - 1] != '\n')
			t->cur--;
	} else if (r == OK && (ch == 'f' || ch == 'F')) {
		while (t->cur < t->input.len && t->input.s[t->cur] == ' ')
			t->cur++;
		while (t->cur < t->input.len && t->input.s[t->cur] != ' ' &&
		       t->input.s[t->cur] != '\n')
			t->cur++;
	}
	nodelay(stdscr, TRUE);
}

static void on_key(struct tui *t, int r, wint_t ch)
{
	int H = LINES;
	int page = H - 6 > 1 ? H - 6 : 1;
	if (r == KEY_CODE_YES) {
		switch (ch) {
		case KEY_F(1):
			set_mode(t, TUI_MODE_RAW);
			break;
		case KEY_F(2):
			set_mode(t, TUI_MODE_CACHED);
			break;
		case KEY_F(3):
			set_mode(t, TUI_MODE_COMPARE);
			break;
		case KEY_F(10):
			t->quit = 1;
			break;
		case KEY_ENTER:
			on_enter(t);
			break;
		case KEY_BACKSPACE:
			if (t->cur > 0) {
				wbuf_erase(&t->input, t->cur - 1, 1);
				t->cur--;
			}
			break;
		case KEY_DC:
			wbuf_erase(&t->input, t->cur, 1);
			break;
		case KEY_LEFT:
			if (t->cur > 0)
				t->cur--;
			break;
		case KEY_RIGHT:
			if (t->cur < t->input.len)
				t->cur++;
			break;
		case KEY_UP:
			vertical(t, -1);
			break;
		case KEY_DOWN:
			vertical(t, 1);
			break;
		case KEY_HOME: {
			size_t s, e;
			line_bounds(t, &s, &e);
			t->cur = s;
			break;
		}
		case KEY_END: {
			size_t s, e;
			line_bounds(t, &s, &e);
			t->cur = e;
			break;
		}
		case KEY_PPAGE:
			scroll_by(t, page);
			break;
		case KEY_NPAGE:
			scroll_by(t, -page);
			break;
		case KEY_SR:
			scroll_by(t, 1);
			break; /* Shift+Up */
		case KEY_SF:
			scroll_by(t, -1);
			break;
		case KEY_MOUSE: {
			MEVENT me;
			if (getmouse(&me) == OK) {
				if (me.bstate & BUTTON4_PRESSED)
					scroll_by(t, 3);
#ifdef BUTTON5_PRESSED
				else if (me.bstate & BUTTON5_PRESSED)
					scroll_by(t, -3);
#endif
			}
			break;
		}
		case KEY_RESIZE:
			break; /* the redraw follows */
		default:
			break;
		}
		return;
	}
	if (r != OK)
		return;
	switch (ch) {
	case 3: /* Ctrl+C */
	case 4: /* Ctrl+D */
		t->quit = 1;
		break;
	case 27:
		on_escape(t);
		break;
	case '\r':
		if (t->in_paste)
			insert(t, L"\n", 1);
		else
			on_enter(t);
		break;
	case '\n':
		insert(t, L"\n", 1);
		break; /* Ctrl+J, or a pasted line break */
	case 127:
	case 8:
		if (t->cur > 0) {
			wbuf_erase(&t->input, t->cur - 1, 1);
			t->cur--;
		}
		break;
	case 1: { /* Ctrl+A */
		size_t s, e;
		line_bounds(t, &s, &e);
		t->cur = s;
		break;
	}
	case 5: { /* Ctrl+E */
		size_t s, e;
		line_bounds(t, &s, &e);
		t->cur = e;
		break;
	}
	case 11: { /* Ctrl+K */
		size_t s, e;
		line_bounds(t, &s, &e);
		wbuf_erase(&t->input, t->cur, e - t->cur);
		break;
	}
	case 21: /* Ctrl+U */
		input_clear(t);
		break;
	case 23: { /* Ctrl+W */
		size_t e = t->cur;
		while (t->cur > 0 && t->input.s[t->cur - 1] == ' ')
			t->cur--;
		while (t->cur > 0 && t->input.s[t->cur - 1] != ' ' &&
		       t->input.s[t->cur - 1] != '\n')
			t->cur--;
		wbuf_erase(&t->input, t->cur, e - t->cur);
		break;
	}
	case 12: /* Ctrl+L */
		clearok(curscr, TRUE);
		break;
	case 14: /* Ctrl+N: a new conversation */
		new_conversation(t);
		break;
	case '\t':
		insert(t, L"    ", 4);
		break;
	default:
		if (ch >= 0x20 && ch != 0x7f) {
			wchar_t w = (wchar_t)ch;
			insert(t, &w, 1);
		}
		break;
	}
}

/* ---- the loop ----------------------------------------------------------- */

static int job_answering(struct tui *t)
{
	return t->job == JOB_CHAT;
}

/* A UTF-8 locale, so that curses reads and writes wide characters. */
static void utf8_locale(void)
{
	setlocale(LC_ALL, "");
	const char *cs = nl_langinfo(CODESET);
	if (cs && (!strcmp(cs, "UTF-8") || !strcmp(cs, "utf8")))
		return;
	if (!setlocale(LC_CTYPE, "C.UTF-8"))
		setlocale(LC_CTYPE, "en_US.UTF-8");
}

static void term_modes(int on)
{
	/* Bracketed paste; xterm's modifyOtherKeys (so that Ctrl+1..3 are
	 * reported where the terminal can). Terminals that do not know them
	 * ignore them. */
	fputs(on ? "\033[?2004h\033[>4;1m" : "\033[?2004l\033[>4m", stdout);
	fflush(stdout);
}

static void tui_free(struct tui *t)
{
	for (size_t i = 0; i < t->n_ent; i++)
		entry_free(t->ent[i]);
	free(t->ent);
	for (size_t i = 0; i < t->n_hist; i++)
		free(t->hist[i]);
	free(t->hist);
	wbuf_free(&t->input);
	wbuf_free(&t->draft);
	json_decref(t->history);
	json_decref(t->job_messages);
	free(t->job_prompt);
	if (t->have_client)
		client_free(&t->cl);
	if (t->wake_r >= 0)
		close(t->wake_r);
	if (t->wake_w >= 0)
		close(t->wake_w);
	pthread_mutex_destroy(&t->lock);
}

int tui_run(const struct tui_opts *o)
{
	if (!isatty(STDIN_FILENO) || !isatty(STDOUT_FILENO)) {
		fprintf(stderr, "toki tui: needs a terminal (stdin and stdout)\n");
		return 1;
	}
	char err[512];
	if (client_global_init(err, sizeof err) != 0) {
		fprintf(stderr, "toki tui: %s\n", err);
		return 1;
	}
	static struct tui tt; /* big; one per process */
	struct tui *t = &tt;
	memset(t, 0, sizeof *t);
	t->o = *o;
	t->mode = o->mode;
	t->wake_r = t->wake_w = -1;
	pthread_mutex_init(&t->lock, NULL);
	int p[2];
	t->history = json_array();
	if (plat_pipe(p, 1) != 0 || !t->history) {
		fprintf(stderr, "toki tui: %s\n", t->history ? strerror(errno) : "out of memory");
		tui_free(t);
		return 1;
	}
	t->wake_r = p[0];
	t->wake_w = p[1];
	if (o->system && *o->system &&
	    json_array_append_new(
	        t->history, json_pack("{s:s, s:s}", "role", "system", "content", o->system)) != 0) {
		fprintf(stderr, "toki tui: the system message is not UTF-8\n");
		tui_free(t);
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	utf8_locale();
	if (!newterm(NULL, stdout, stdin)) {
		fprintf(stderr, "toki tui: cannot use this terminal (TERM=%s)\n",
		        getenv("TERM") ? getenv("TERM") : "");
		tui_free(t);
		return 1;
	}
	set_escdelay(25);
	raw();
	noecho();
	nonl();
	keypad(stdscr, TRUE);
	nodelay(stdscr, TRUE);
	if (has_colors()) {
		start_color();
		use_default_colors();
		init_pair(PAIR_STATUS, COLOR_CYAN, -1);
		init_pair(PAIR_USER, COLOR_CYAN, -1);
		init_pair(PAIR_RAW, COLOR_YELLOW, -1);
		init_pair(PAIR_CACHED, COLOR_GREEN, -1);
		init_pair(PAIR_ERROR, COLOR_RED, -1);
		init_pair(PAIR_DIM, -1, -1);
		init_pair(PAIR_MODE, COLOR_MAGENTA, -1);
		t->colors = 1;
	}
	mousemask(BUTTON4_PRESSED
#ifdef BUTTON5_PRESSED
	              | BUTTON5_PRESSED
#endif
	          ,
	          NULL);
	mouseinterval(0);
	term_modes(1);
	entry_addf(t, E_INFO,
	           "toki tui · raw evaluates the whole conversation every turn, cached goes "
	           "through the router, compare runs both (raw first) side by side.");
	start_probe(t, 0);

	/* At most one frame per FRAME_US: a fast stream wakes the loop per
	 * token, the screen follows at a steady rate. */
	const int64_t FRAME_US = 33000;
	int64_t last_draw = 0;
	int dirty = 1;
	while (!t->quit) {
		int64_t now = clock_now_us();
		if (dirty && now - last_draw >= FRAME_US) {
			draw(t);
			last_draw = now;
			dirty = 0;
		}
		int wait_ms = -1;
		if (dirty)
			wait_ms = (int)((last_draw + FRAME_US - now) / 1000) + 1;
		else if (job_answering(t))
			wait_ms = 100; /* the prefill clock */
		struct pollfd pf[2] = {{STDIN_FILENO, POLLIN, 0}, {t->wake_r, POLLIN, 0}};
		int n = poll(pf, 2, wait_ms);
		if (n < 0 && errno != EINTR)
			break;
		dirty = 1; /* a key, a wake-up, a signal (resize) or the clock */
		if (n > 0 && pf[1].revents & POLLIN) {
			char buf[256];
			while (read(t->wake_r, buf, sizeof buf) > 0)
				;
		}
		if (t->job != JOB_NONE && atomic_load(&t->job_done))
			job_finish(t);
		if (n > 0 && pf[0].revents & (POLLHUP | POLLERR) && !(pf[0].revents & POLLIN))
			break; /* the terminal went away */
		wint_t ch;
		int r;
		while (!t->quit && (r = get_wch(&ch)) != ERR)
			on_key(t, r, ch);
	}

	if (t->job != JOB_NONE) {
		atomic_store(&t->cancel, 1);
		pthread_join(t->th, NULL);
		t->job = JOB_NONE;
	}
	term_modes(0);
	endwin();
	tui_free(t);
	return 0;
}
