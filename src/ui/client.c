#include "ui/client.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/auth.h"
#include "http/sse.h"
#include "model/registry.h"
#include "model/run.h"
#include "util/clock.h"
#include "util/err.h"
#include "util/grow.h"
#include "util/json_body.h"

#define ERRBODY_MAX (64 * 1024)
#define STREAM_EVENT_MAX (64 * 1024 * 1024)

/* --- set-up ---------------------------------------------------------------- */

static pthread_mutex_t global_lock = PTHREAD_MUTEX_INITIALIZER;
static int global_done;

int client_global_init(char *err, size_t errlen)
{
	pthread_mutex_lock(&global_lock);
	CURLcode rc = CURLE_OK;
	if (!global_done) {
		rc = curl_global_init(CURL_GLOBAL_DEFAULT);
		global_done = rc == CURLE_OK;
	}
	pthread_mutex_unlock(&global_lock);
	if (rc != CURLE_OK) {
		err_set(err, errlen, "cannot initialise libcurl: %s", curl_easy_strerror(rc));
		return -1;
	}
	return 0;
}

/* "host:8787", "http://host:8787/", "http://host:8787/v1" -> "http://host:8787". */
static void normalise_url(const char *in, char *out, size_t n)
{
	while (*in == ' ' || *in == '\t')
		in++;
	if (strstr(in, "://"))
		snprintf(out, n, "%s", in);
	else
		snprintf(out, n, "http://%s", in);
	size_t len = strlen(out);
	for (;;) {
		while (len && (out[len - 1] == '/' || out[len - 1] == ' '))
			out[--len] = '\0';
		if (len >= 3 && !strcmp(out + len - 3, "/v1")) {
			len -= 3;
			out[len] = '\0';
			continue;
		}
		break;
	}
}

int client_pick_run(struct run_info *ri, int *nr)
{
	struct run_info *runs = NULL;
	*nr = 0;
	if (run_list(&runs, nr) != 0 || *nr <= 0) {
		free(runs);
		return -1;
	}
	int pick = 0;
	if (*nr > 1) {
		struct registry reg;
		char err[512];
		if (registry_load(&reg, err, sizeof err) == 0) {
			for (int i = 0; reg.active && i < *nr; i++)
				if (!strcmp(runs[i].name, reg.active))
					pick = i;
			registry_free(&reg);
		}
	}
	*ri = runs[pick];
	free(runs);
	return pick;
}

enum client_url_source client_find_daemon(const char *url, char *out, size_t n, char *run_name,
                                          size_t run_name_len)
{
	if (run_name && run_name_len)
		run_name[0] = '\0';
	if (url && *url) {
		normalise_url(url, out, n);
		return CLIENT_URL_GIVEN;
	}
	struct run_info ri;
	int nr;
	if (client_pick_run(&ri, &nr) >= 0) {
		run_info_url(&ri, out, n);
		if (run_name && run_name_len)
			snprintf(run_name, run_name_len, "%s", ri.name);
		return CLIENT_URL_RUN;
	}
	snprintf(out, n, "%s", CLIENT_DEFAULT_URL);
	return CLIENT_URL_DEFAULT;
}

int client_init(struct client *c, const char *base_url)
{
	memset(c, 0, sizeof *c);
	char url[1024];
	normalise_url(base_url, url, sizeof url);
	c->base_url = strdup(url);
	if (!c->base_url)
		return -1;
	char token[512], err[256];
	if (auth_load_token(token, sizeof token, err, sizeof err) == 0 && *token) {
		c->token = strdup(token);
		if (!c->token) {
			client_free(c);
			return -1;
		}
	}
	c->connect_timeout_ms = 3000;
	return 0;
}

void client_free(struct client *c)
{
	free(c->base_url);
	free(c->token);
	memset(c, 0, sizeof *c);
}

/* --- plumbing -------------------------------------------------------------- */

struct membuf {
	char *p;
	size_t len, cap;
	size_t max; /* 0: no limit; beyond it bytes are dropped */
	int oom;
};

static int membuf_add(struct membuf *m, const char *data, size_t len)
{
	if (m->max && m->len + len > m->max)
		len = m->len < m->max ? m->max - m->len : 0;
	if (GROW(m->p, m->cap, m->len + len + 1, 256) != 0) {
		m->oom = 1;
		return -1;
	}
	memcpy(m->p + m->len, data, len);
	m->len += len;
	m->p[m->len] = '\0';
	return 0;
}

static size_t on_body(char *data, size_t size, size_t nmemb, void *arg)
{
	struct membuf *m = arg;
	return membuf_add(m, data, size * nmemb) == 0 ? size * nmemb : 0;
}

static int is_down(CURLcode rc)
{
	return rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
	       rc == CURLE_OPERATION_TIMEDOUT;
}

static void down_message(const struct client *c, CURLcode rc, char *err, size_t errlen)
{
	err_set(err, errlen,
	        "no toki daemon answers at %s (%s); start one with `toki model use NAME` or "
	        "`toki up --model FILE.gguf`, or name another with --url",
	        c->base_url, curl_easy_strerror(rc));
}

/* The server's own words for an error status: OpenAI's {"error": {"message"}},
 * llama-server's {"error": {"message"}}, or the start of the body. */
static void http_error_message(const struct client *c, long status, const char *body, char *err,
                               size_t errlen)
{
	const char *msg = NULL;
	json_error_t jerr;
	json_t *j = body ? json_loads(body, 0, &jerr) : NULL;
	json_t *e = json_object_get(j, "error");
	if (json_is_string(e))
		msg = json_string_value(e);
	else
		msg = json_string_value(json_object_get(e, "message"));
	if (!msg)
		msg = json_string_value(json_object_get(j, "message"));
	char snippet[200] = "";
	if (!msg && body) {
		snprintf(snippet, sizeof snippet, "%s", body);
		snippet[strcspn(snippet, "\r\n")] = '\0';
		msg = snippet;
	}
	if (status == 401)
		err_set(err, errlen,
		        "%s refused the token (401: %s); the token comes from $TOKI_TOKEN, else "
		        "$TOKI_STATE_DIR/token (~/.local/state/tokirecur/token): use the daemon's",
		        c->base_url, msg && *msg ? msg : "unauthorized");
	else
		err_set(err, errlen, "%s answered %ld: %s", c->base_url, status,
		        msg && *msg ? msg : "(no message)");
	json_decref(j);
}

static struct curl_slist *headers_for(const struct client *c, int json_body, int sse, int *oom)
{
	struct curl_slist *h = NULL, *t;
	char line[600];
	*oom = 0;
	if (json_body) {
		t = curl_slist_append(h, "Content-Type: application/json");
		if (!t)
			goto fail;
		h = t;
	}
	if (sse) {
		t = curl_slist_append(h, "Accept: text/event-stream");
		if (!t)
			goto fail;
		h = t;
	}
	if (c->token) {
		snprintf(line, sizeof line, "Authorization: Bearer %s", c->token);
		t = curl_slist_append(h, line);
		if (!t)
			goto fail;
		h = t;
	}
	/* No "Expect: 100-continue" round trip for large bodies. */
	t = curl_slist_append(h, "Expect:");
	if (!t)
		goto fail;
	return t;
fail:
	curl_slist_free_all(h);
	*oom = 1;
	return NULL;
}

static void common_options(const struct client *c, CURL *curl, const char *url,
                           struct curl_slist *h)
{
	curl_easy_setopt(curl, CURLOPT_URL, url);
	curl_easy_setopt(curl, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, c->connect_timeout_ms);
	/* A proxy from the environment must not swallow requests to loopback. */
	curl_easy_setopt(curl, CURLOPT_NOPROXY, "localhost,127.0.0.1,::1");
	curl_easy_setopt(curl, CURLOPT_USERAGENT, "toki/" TOKI_VERSION);
}

int client_request(const struct client *c, const char *method, const char *path, const char *body,
                   long timeout_ms, long *status, char **resp, char *err, size_t errlen)
{
	*status = 0;
	if (resp)
		*resp = NULL;
	char url[2048];
	snprintf(url, sizeof url, "%s%s", c->base_url, path);
	CURL *curl = curl_easy_init();
	int oom;
	struct curl_slist *h = curl ? headers_for(c, body != NULL, 0, &oom) : NULL;
	if (!curl || !h) {
		curl_easy_cleanup(curl);
		err_set(err, errlen, "out of memory");
		return CLIENT_ERROR;
	}
	struct membuf m = {0};
	common_options(c, curl, url, h);
	curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, method);
	if (body) {
		curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body);
		curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
	}
	if (!strcmp(method, "HEAD"))
		curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
	curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(curl, CURLOPT_WRITEDATA, &m);
	if (timeout_ms > 0)
		curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, timeout_ms);
	CURLcode rc = curl_easy_perform(curl);
	int ret = CLIENT_OK;
	if (rc == CURLE_OK) {
		curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, status);
	} else if (is_down(rc)) {
		down_message(c, rc, err, errlen);
		ret = CLIENT_DOWN;
	} else if (m.oom) {
		err_set(err, errlen, "out of memory");
		ret = CLIENT_ERROR;
	} else {
		err_set(err, errlen, "%s %s: %s", method, url, curl_easy_strerror(rc));
		ret = CLIENT_ERROR;
	}
	curl_slist_free_all(h);
	curl_easy_cleanup(curl);
	if (ret == CLIENT_OK && resp) {
		if (!m.p)
			m.p = calloc(1, 1);
		if (!m.p) {
			err_set(err, errlen, "out of memory");
			return CLIENT_ERROR;
		}
		*resp = m.p;
	} else {
		free(m.p);
	}
	return ret;
}

int client_probe(const struct client *c, char *model, size_t model_len, char *err, size_t errlen)
{
	if (model && model_len)
		model[0] = '\0';
	long status;
	char *body;
	int rc = client_request(c, "GET", "/v1/models", NULL, 5000, &status, &body, err, errlen);
	if (rc != CLIENT_OK)
		return rc;
	if (status != 200) {
		http_error_message(c, status, body, err, errlen);
		free(body);
		return CLIENT_HTTP_ERROR;
	}
	json_error_t jerr;
	json_t *j = json_loads(body, 0, &jerr);
	free(body);
	const char *id =
	    json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
	if (model && model_len && id) {
		/* A path as the id (llama-server's default): its last component. */
		const char *slash = strrchr(id, '/');
		snprintf(model, model_len, "%s", slash && slash[1] ? slash + 1 : id);
	}
	json_decref(j);
	return CLIENT_OK;
}

/* --- streamed chat --------------------------------------------------------- */

struct stream_ctx {
	const struct client *c;
	const struct client_stream_handlers *h;
	void *arg;
	const atomic_int *cancel;
	struct client_stream_result *r;
	CURL *curl;
	struct sse_parser sse;
	int status_known;
	struct membuf errbody, text, reasoning;
	int64_t t0_us;
	int done, error_event, overflow, got_data;
};

static double ms_since(int64_t t0_us)
{
	return (double)(clock_now_us() - t0_us) / 1000.0;
}

/* ": toki route=hit slot=0 prompt=30412 reuse=30208 evaluate=204 est_prefill_ms=410" */
static void parse_toki_note(struct client_stream_result *r, const char *s)
{
	if (strncmp(s, "toki ", 5) != 0)
		return;
	const char *p;
	if ((p = strstr(s, "route="))) {
		size_t n = strcspn(p + 6, " ");
		if (n >= sizeof r->route)
			n = sizeof r->route - 1;
		memcpy(r->route, p + 6, n);
		r->route[n] = '\0';
	}
	if ((p = strstr(s, " reuse=")))
		r->reuse = strtol(p + 7, NULL, 10);
	if ((p = strstr(s, " prompt=")))
		r->prompt_tokens = strtol(p + 8, NULL, 10);
	if ((p = strstr(s, "est_prefill_ms=")))
		r->est_prefill_ms = strtod(p + 15, NULL);
}

static void take_delta(struct stream_ctx *x, enum client_delta_kind kind, const char *s, size_t n)
{
	if (!n)
		return;
	if (x->r->ttft_ms < 0)
		x->r->ttft_ms = ms_since(x->t0_us);
	membuf_add(kind == CLIENT_DELTA_CONTENT ? &x->text : &x->reasoning, s, n);
	if (x->h && x->h->on_delta)
		x->h->on_delta(kind, s, n, x->arg);
}

static void take_chunk(struct stream_ctx *x, json_t *j)
{
	struct client_stream_result *r = x->r;
	json_t *e = json_object_get(j, "error");
	if (e) {
		const char *m = json_is_string(e)
		                    ? json_string_value(e)
		                    : json_string_value(json_object_get(e, "message"));
		snprintf(r->err, sizeof r->err, "the server reported an error in the stream: %s",
		         m ? m : "(no message)");
		x->error_event = 1;
	}
	json_t *choices = json_object_get(j, "choices");
	json_t *ch = json_array_get(choices, 0);
	if (ch) {
		json_t *delta = json_object_get(ch, "delta");
		const char *s;
		if (delta) {
			json_t *rc = json_object_get(delta, "reasoning_content");
			if ((s = json_string_value(rc)))
				take_delta(x, CLIENT_DELTA_REASONING, s, json_string_length(rc));
			json_t *cc = json_object_get(delta, "content");
			if ((s = json_string_value(cc)))
				take_delta(x, CLIENT_DELTA_CONTENT, s, json_string_length(cc));
		} else {
			json_t *t = json_object_get(ch, "text");
			if ((s = json_string_value(t)))
				take_delta(x, CLIENT_DELTA_CONTENT, s, json_string_length(t));
		}
		const char *fr = json_string_value(json_object_get(ch, "finish_reason"));
		if (fr)
			snprintf(r->finish_reason, sizeof r->finish_reason, "%s", fr);
	} else if (!choices) {
		/* llama-server's /completion: {"content": "...", "stop": bool} */
		json_t *cc = json_object_get(j, "content");
		if (json_is_string(cc))
			take_delta(x, CLIENT_DELTA_CONTENT, json_string_value(cc),
			           json_string_length(cc));
		const char *st = json_string_value(json_object_get(j, "stop_type"));
		if (st && json_is_true(json_object_get(j, "stop")))
			snprintf(r->finish_reason, sizeof r->finish_reason, "%s", st);
	}
	json_t *t = json_object_get(j, "timings");
	if (json_is_object(t)) {
		json_decref(r->timings);
		r->timings = json_incref(t);
	}
	json_t *cb = json_object_get(j, "cache");
	if (json_is_object(cb)) {
		json_decref(r->cache);
		r->cache = json_incref(cb);
	}
	if (x->h && x->h->on_chunk)
		x->h->on_chunk(j, x->arg);
}

static void on_event(const char *raw, size_t len, void *arg)
{
	struct stream_ctx *x = arg;
	/* Comment lines first: they come alone in toki's streams. */
	for (size_t i = 0; i < len;) {
		size_t e = i;
		while (e < len && raw[e] != '\n' && raw[e] != '\r')
			e++;
		if (e > i && raw[i] == ':') {
			size_t s = i + 1;
			if (s < e && raw[s] == ' ')
				s++;
			char line[1024];
			size_t n = e - s < sizeof line - 1 ? e - s : sizeof line - 1;
			memcpy(line, raw + s, n);
			line[n] = '\0';
			parse_toki_note(x->r, line);
			if (x->h && x->h->on_comment)
				x->h->on_comment(line, x->arg);
		}
		i = e + 1;
	}
	size_t dl;
	char *data = sse_event_data(raw, len, &dl);
	if (!data)
		return;
	x->got_data = 1;
	if (dl == 6 && !memcmp(data, "[DONE]", 6)) {
		x->done = 1;
	} else {
		json_error_t jerr;
		json_t *j = json_loadb(data, dl, JSON_BODY_FLAGS, &jerr);
		if (json_is_object(j))
			take_chunk(x, j);
		json_decref(j);
	}
	free(data);
}

static size_t on_stream_data(char *data, size_t size, size_t nmemb, void *arg)
{
	struct stream_ctx *x = arg;
	size_t len = size * nmemb;
	if (!x->status_known) {
		curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &x->r->status);
		x->status_known = 1;
	}
	if (x->r->status != 200) {
		membuf_add(&x->errbody, data, len);
		return len;
	}
	if (sse_parser_feed(&x->sse, data, len, on_event, x) != 0) {
		x->overflow = 1;
		return 0;
	}
	return len;
}

static int on_progress(void *arg, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
	struct stream_ctx *x = arg;
	return x->cancel && atomic_load(x->cancel) ? 1 : 0;
}

static void result_init(struct client_stream_result *r)
{
	memset(r, 0, sizeof *r);
	r->ttft_ms = r->total_ms = r->prompt_ms = r->predicted_ms = r->est_prefill_ms = -1;
	r->prompt_tokens = r->evaluated = r->cached = r->predicted = r->reuse = -1;
}

static long int_field(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);
	return json_is_number(v) ? (long)json_number_value(v) : -1;
}

static double num_field(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);
	return json_is_number(v) ? json_number_value(v) : -1;
}

static void result_numbers(struct client_stream_result *r)
{
	if (r->timings) {
		r->evaluated = int_field(r->timings, "prompt_n");
		r->cached = int_field(r->timings, "cache_n");
		r->predicted = int_field(r->timings, "predicted_n");
		r->prompt_ms = num_field(r->timings, "prompt_ms");
		r->predicted_ms = num_field(r->timings, "predicted_ms");
		if (r->evaluated >= 0 && r->cached >= 0)
			r->prompt_tokens = r->evaluated + r->cached;
	}
	if (r->cache) {
		long v;
		if ((v = int_field(r->cache, "prompt_tokens")) >= 0)
			r->prompt_tokens = v;
		if (r->evaluated < 0)
			r->evaluated = int_field(r->cache, "evaluated");
		if (r->cached < 0)
			r->cached = int_field(r->cache, "cached");
		if ((v = int_field(r->cache, "reuse")) >= 0)
			r->reuse = v;
		const char *route = json_string_value(json_object_get(r->cache, "route"));
		if (route)
			snprintf(r->route, sizeof r->route, "%s", route);
	}
}

json_t *client_chat_body(json_t *messages, double temperature, long max_tokens, int raw)
{
	json_t *b = json_object();
	if (!b || json_object_set(b, "messages", messages) != 0) {
		json_decref(b);
		return NULL;
	}
	int bad = 0;
	if (temperature >= 0)
		bad |= json_object_set_new(b, "temperature", json_real(temperature));
	if (max_tokens > 0)
		bad |= json_object_set_new(b, "max_tokens", json_integer(max_tokens));
	if (raw)
		bad |= json_object_set_new(b, "cache_prompt", json_false());
	if (bad) {
		json_decref(b);
		return NULL;
	}
	return b;
}

int client_chat_stream(const struct client *c, const char *path, json_t *body,
                       const struct client_stream_handlers *h, void *arg, const atomic_int *cancel,
                       struct client_stream_result *r)
{
	result_init(r);
	struct stream_ctx x = {.c = c, .h = h, .arg = arg, .cancel = cancel, .r = r};
	x.errbody.max = ERRBODY_MAX;
	sse_parser_init(&x.sse, STREAM_EVENT_MAX);
	int ret = CLIENT_ERROR;
	char *payload = NULL;
	struct curl_slist *hl = NULL;
	json_t *b = json_copy(body);
	if (!b || json_object_set_new(b, "stream", json_true()) != 0 ||
	    !(payload = json_dumps(b, JSON_COMPACT))) {
		snprintf(r->err, sizeof r->err, "out of memory");
		goto out;
	}
	char url[2048];
	snprintf(url, sizeof url, "%s%s", c->base_url, path ? path : "/v1/chat/completions");
	int oom;
	x.curl = curl_easy_init();
	hl = x.curl ? headers_for(c, 1, 1, &oom) : NULL;
	if (!x.curl || !hl) {
		snprintf(r->err, sizeof r->err, "out of memory");
		goto out;
	}
	common_options(c, x.curl, url, hl);
	curl_easy_setopt(x.curl, CURLOPT_POST, 1L);
	curl_easy_setopt(x.curl, CURLOPT_POSTFIELDS, payload);
	curl_easy_setopt(x.curl, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(payload));
	curl_easy_setopt(x.curl, CURLOPT_WRITEFUNCTION, on_stream_data);
	curl_easy_setopt(x.curl, CURLOPT_WRITEDATA, &x);
	curl_easy_setopt(x.curl, CURLOPT_NOPROGRESS, 0L);
	curl_easy_setopt(x.curl, CURLOPT_XFERINFOFUNCTION, on_progress);
	curl_easy_setopt(x.curl, CURLOPT_XFERINFODATA, &x);
	curl_easy_setopt(x.curl, CURLOPT_TCP_NODELAY, 1L);

	x.t0_us = clock_now_us();
	CURLcode rc = curl_easy_perform(x.curl);
	r->total_ms = ms_since(x.t0_us);
	if (!x.status_known && rc == CURLE_OK)
		curl_easy_getinfo(x.curl, CURLINFO_RESPONSE_CODE, &r->status);
	/* What arrived stays in the result, whatever happened after. */
	r->text = x.text.p ? x.text.p : strdup("");
	r->text_len = x.text.len;
	r->reasoning = x.reasoning.p ? x.reasoning.p : strdup("");
	r->reasoning_len = x.reasoning.len;
	x.text.p = x.reasoning.p = NULL;
	result_numbers(r);
	if (!r->text || !r->reasoning || x.text.oom || x.reasoning.oom) {
		snprintf(r->err, sizeof r->err, "out of memory");
		ret = CLIENT_ERROR;
	} else if (rc == CURLE_ABORTED_BY_CALLBACK && cancel && atomic_load(cancel)) {
		snprintf(r->err, sizeof r->err, "cancelled");
		ret = CLIENT_CANCELLED;
	} else if (rc != CURLE_OK && !x.status_known && is_down(rc)) {
		down_message(c, rc, r->err, sizeof r->err);
		ret = CLIENT_DOWN;
	} else if (r->status && r->status != 200) {
		http_error_message(c, r->status, x.errbody.p, r->err, sizeof r->err);
		ret = CLIENT_HTTP_ERROR;
	} else if (x.overflow) {
		snprintf(r->err, sizeof r->err, "an event in the stream from %.300s is too large",
		         url);
	} else if (x.error_event) {
		ret = CLIENT_ERROR; /* r->err says what */
	} else if (rc != CURLE_OK) {
		snprintf(r->err, sizeof r->err, "the stream from %.300s broke off: %.100s", url,
		         curl_easy_strerror(rc));
	} else if (!x.done && !*r->finish_reason) {
		snprintf(r->err, sizeof r->err,
		         "the stream from %.300s ended before its end (no [DONE])", url);
	} else {
		ret = CLIENT_OK;
	}
out:
	free(x.errbody.p);
	free(x.text.p);
	free(x.reasoning.p);
	sse_parser_free(&x.sse);
	curl_slist_free_all(hl);
	if (x.curl)
		curl_easy_cleanup(x.curl);
	free(payload);
	json_decref(b);
	if (!r->text)
		r->text = strdup("");
	if (!r->reasoning)
		r->reasoning = strdup("");
	return ret;
}

void client_stream_result_free(struct client_stream_result *r)
{
	free(r->text);
	free(r->reasoning);
	json_decref(r->timings);
	json_decref(r->cache);
	memset(r, 0, sizeof *r);
}
