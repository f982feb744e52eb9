#include "ui/web.h"

#include <jansson.h>
#include <openssl/rand.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api/auth.h"
#include "backend/backend_http.h"
#include "http/http_server.h"
#include "model/run.h"
#include "ui/client.h"
#include "util/bytes.h"
#include "util/log.h"

struct web {
	struct event_base *base;
	struct http_server *http;
	struct backend_http *daemon;
	char *host;
	char *daemon_url;
	char *secret;
	int allow_remote;
	int n_relays; /* calls to the daemon in flight */
};

/* One call relayed to the daemon for one browser request. */
struct relay {
	struct web *w;
	struct http_request *client;
	struct backend_call *call;
	int status;
	int began;        /* the response head went to the browser */
	int refused;      /* the daemon said 401: our token is not its token */
	int event_stream; /* the answer is SSE */
};

/* The daemon routes the UI may call, as /api<route>. Nothing else of the
 * daemon is reachable through toki web. */
static const struct {
	const char *method, *path;
} proxied[] = {
    {"POST", "/v1/chat/completions"},
    {"GET", "/v1/models"},
    {"GET", "/health"},
    {"GET", "/toki/stats"},
};

const struct web_asset *web_asset_find(const char *path)
{
	if (!strcmp(path, "/"))
		path = "/index.html";
	for (size_t i = 0; i < web_n_assets; i++)
		if (!strcmp(web_assets[i].path, path))
			return &web_assets[i];
	return NULL;
}

int web_make_secret(char *out, size_t n)
{
	unsigned char raw[32];
	if (n < 2 * sizeof raw + 1 || RAND_bytes(raw, sizeof raw) != 1)
		return -1;
	bytes_hex(raw, sizeof raw, out);
	return 0;
}

/* host_header is "name[:port]" or "[v6][:port]". */
int web_host_allowed(const char *host_header, const char *bind_host, int port, int tls)
{
	if (!host_header || !*host_header)
		return 0;
	char name[256];
	const char *colon;
	if (host_header[0] == '[') {
		const char *close = strchr(host_header, ']');
		if (!close)
			return 0;
		colon = close[1] == ':' ? close + 1 : (close[1] ? NULL : close + 1);
		if (!colon)
			return 0;
	} else {
		colon = strchr(host_header, ':');
		if (!colon)
			colon = host_header + strlen(host_header);
	}
	size_t nl = (size_t)(colon - host_header);
	if (nl == 0 || nl >= sizeof name)
		return 0;
	memcpy(name, host_header, nl);
	name[nl] = '\0';
	int p;
	if (*colon == ':') {
		char *end;
		long v = strtol(colon + 1, &end, 10);
		if (colon[1] < '0' || colon[1] > '9' || *end || v <= 0 || v > 65535)
			return 0;
		p = (int)v;
	} else {
		p = tls ? 443 : 80;
	}
	if (p != port)
		return 0;
	if (!strcasecmp(name, "127.0.0.1") || !strcasecmp(name, "localhost") ||
	    !strcasecmp(name, "[::1]"))
		return 1;
	if (bind_host && *bind_host) {
		if (!strcasecmp(name, bind_host))
			return 1;
		/* A v6 bind address is written bare; in Host it is bracketed. */
		if (name[0] == '[' && nl >= 2 && strlen(bind_host) == nl - 2 &&
		    !strncasecmp(name + 1, bind_host, nl - 2))
			return 1;
	}
	return 0;
}

int web_normalise_daemon_url(const char *in, char *out, size_t n)
{
	if (strncmp(in, "http://", 7) != 0 || !in[7])
		return -1;
	if ((size_t)snprintf(out, n, "%s", in) >= n)
		return -1;
	size_t l = strlen(out);
	while (l > 7 && out[l - 1] == '/')
		out[--l] = '\0';
	if (l > 10 && !strcmp(out + l - 3, "/v1")) {
		l -= 3;
		out[l] = '\0';
	}
	while (l > 7 && out[l - 1] == '/')
		out[--l] = '\0';
	return 0;
}

void web_find_daemon(char *url, size_t n, char *how, size_t hown)
{
	struct run_info ri;
	int nr;
	int pick = client_pick_run(&ri, &nr);
	if (pick >= 0) {
		run_info_url(&ri, url, n);
		snprintf(how, hown, "the running model %s%s", ri.name,
		         nr > 1
		             ? (pick ? " (the registry's active one)" : " (the first of several)")
		             : "");
		return;
	}
	snprintf(url, n, "http://127.0.0.1:8787");
	snprintf(how, hown, "the default (no run found by toki status)");
}

/* ---- responses ---- */

static void security_headers(struct http_request *req)
{
	http_response_header(req, "X-Content-Type-Options", "nosniff");
	http_response_header(req, "Referrer-Policy", "no-referrer");
	http_response_header(req, "X-Frame-Options", "DENY");
	http_response_header(req, "Cache-Control", "no-store");
}

static char *error_json(int status, const char *message, const char *type)
{
	json_t *o = json_pack("{s:{s:s, s:s, s:i}}", "error", "message", message, "type", type,
	                      "code", status);
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	return s;
}

/* The http server's own errors (limits, malformed requests). */
static char *web_error_body(int status, const char *message, const char *path)
{
	return error_json(status, message, "toki_web");
}

static void respond_json_error(struct http_request *req, int status, const char *message,
                               const char *type)
{
	char *body = error_json(status, message, type);
	security_headers(req);
	if (body) {
		http_respond(req, status, "application/json", body, strlen(body));
		free(body);
	} else {
		http_respond(req, status, "text/plain", message, strlen(message));
	}
}

static void serve_asset(struct http_request *req, const struct web_asset *a)
{
	security_headers(req);
	if (!strncmp(a->content_type, "text/html", 9))
		/* No inline script or style, nothing from elsewhere: the UI is
		 * the three files this binary carries. */
		http_response_header(req, "Content-Security-Policy",
		                     "default-src 'none'; script-src 'self'; style-src 'self'; "
		                     "img-src 'self' data:; connect-src 'self'; base-uri 'none'; "
		                     "form-action 'none'; frame-ancestors 'none'");
	http_respond(req, 200, a->content_type, (const char *)a->data, a->len);
}

static void serve_info(struct web *w, struct http_request *req)
{
	json_t *o = json_pack("{s:s, s:s, s:b}", "daemon", w->daemon_url, "version", TOKI_VERSION,
	                      "tls", http_server_is_tls(w->http));
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	if (!s) {
		respond_json_error(req, 500, "out of memory", "toki_web");
		return;
	}
	security_headers(req);
	http_respond(req, 200, "application/json", s, strlen(s));
	free(s);
}

/* ---- relaying to the daemon ---- */

static void relay_free(struct relay *r)
{
	r->w->n_relays--;
	free(r);
}

static void relay_client_closed(struct http_request *req, void *arg)
{
	struct relay *r = arg;
	/* The browser went away (stop button, closed tab): the daemon sees its
	 * connection close and cancels the generation. */
	backend_call_cancel(r->call);
	relay_free(r);
}

static void relay_fail(struct relay *r, int status, const char *message, const char *type)
{
	http_request_on_close(r->client, NULL, NULL);
	if (!r->began) {
		respond_json_error(r->client, status, message, type);
		return;
	}
	/* Mid-answer: say so in the stream's own form, then end it. */
	if (r->event_stream) {
		char *body = error_json(status, message, type);
		if (body) {
			http_stream_write(r->client, "data: ", 6);
			http_stream_write(r->client, body, strlen(body));
			http_stream_write(r->client, "\n\n", 2);
			free(body);
		}
	}
	http_stream_end(r->client);
}

static void on_daemon_head(struct backend_call *call, int status, void *arg)
{
	struct relay *r = arg;
	r->status = status;
	if (status == 401) {
		r->refused = 1;
		return;
	}
	const char *ct = backend_call_header(call, "Content-Type");
	if (!ct)
		ct = "application/json";
	r->event_stream = !strncasecmp(ct, "text/event-stream", 17);
	security_headers(r->client);
	r->began = 1;
	http_stream_begin(r->client, status, ct);
}

static void on_daemon_data(struct backend_call *call, const char *data, size_t len, void *arg)
{
	struct relay *r = arg;
	if (!r->refused && r->began)
		http_stream_write(r->client, data, len);
}

static void on_daemon_done(struct backend_call *call, int status, const char *body, size_t len,
                           void *arg)
{
	struct relay *r = arg;
	if (r->refused || status == 401) {
		char msg[1024];
		snprintf(msg, sizeof msg,
		         "the toki daemon at %s refused toki web's token: run toki web as the "
		         "daemon's user, with the same TOKI_STATE_DIR or TOKI_TOKEN",
		         r->w->daemon_url);
		r->began = 0;
		relay_fail(r, 502, msg, "daemon_auth");
	} else if (!r->began) {
		http_request_on_close(r->client, NULL, NULL);
		security_headers(r->client);
		http_respond(r->client, status, "application/json", body, len);
	} else {
		http_request_on_close(r->client, NULL, NULL);
		http_stream_end(r->client);
	}
	relay_free(r);
}

static void on_daemon_error(struct backend_call *call, enum backend_error err, void *arg)
{
	struct relay *r = arg;
	char msg[1024];
	if (err == BACKEND_ERR_CONNECT)
		snprintf(msg, sizeof msg,
		         "the toki daemon at %s is not reachable: start one (toki up --model "
		         "FILE, or toki model use NAME), or point toki web at it with --url",
		         r->w->daemon_url);
	else
		snprintf(msg, sizeof msg, "the toki daemon at %s: %s", r->w->daemon_url,
		         backend_error_text(err));
	log_warn("%s", msg);
	relay_fail(r, err == BACKEND_ERR_TIMEOUT ? 504 : 502, msg,
	           err == BACKEND_ERR_CONNECT ? "daemon_unreachable" : "daemon_error");
	relay_free(r);
}

static const struct backend_call_handlers relay_handlers = {
    .on_head = on_daemon_head,
    .on_data = on_daemon_data,
    .on_done = on_daemon_done,
    .on_error = on_daemon_error,
};

static void relay_start(struct web *w, struct http_request *req, const char *method,
                        const char *path)
{
	struct relay *r = calloc(1, sizeof *r);
	if (!r) {
		respond_json_error(req, 500, "out of memory", "toki_web");
		return;
	}
	r->w = w;
	r->client = req;
	w->n_relays++;
	size_t len = 0;
	const char *body = !strcmp(method, "POST") ? http_request_body(req, &len) : NULL;
	r->call = backend_call_start(w->daemon, method, path, body, len, &relay_handlers, r);
	if (!r->call) {
		relay_free(r);
		respond_json_error(req, 500, "out of memory", "toki_web");
		return;
	}
	http_request_on_close(req, relay_client_closed, r);
}

/* ---- the handler ---- */

static int same_origin(const char *origin, const char *host, int tls)
{
	const char *scheme = tls ? "https://" : "http://";
	size_t sl = strlen(scheme);
	return !strncasecmp(origin, scheme, sl) && !strcasecmp(origin + sl, host);
}

static void handle(struct http_request *req, void *ctx)
{
	struct web *w = ctx;
	const char *method = http_request_method(req);
	const char *path = http_request_path(req);
	const char *host = http_request_header(req, "Host");
	int tls = http_server_is_tls(w->http);
	if (!w->allow_remote && !web_host_allowed(host, w->host, http_server_port(w->http), tls)) {
		log_warn("refused a request for Host '%s' from %s", host ? host : "",
		         http_request_peer(req));
		respond_json_error(req, 403,
		                   "this Host is not toki web's: open the address toki web printed",
		                   "bad_host");
		return;
	}
	if (strncmp(path, "/api/", 5) != 0) {
		const struct web_asset *a = web_asset_find(path);
		if (!a) {
			respond_json_error(req, 404, "no such page", "not_found");
			return;
		}
		if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
			http_response_header(req, "Allow", "GET, HEAD");
			respond_json_error(req, 405, "method not allowed", "method");
			return;
		}
		serve_asset(req, a);
		return;
	}
	if (!auth_check(w->secret, http_request_header(req, "Authorization"), NULL)) {
		respond_json_error(req, 401,
		                   "toki web needs its session secret: open the link toki web "
		                   "printed (http://HOST:PORT/#k=...)",
		                   "unauthorized");
		return;
	}
	const char *origin = http_request_header(req, "Origin");
	if (origin && host && !same_origin(origin, host, tls)) {
		respond_json_error(req, 403, "cross-origin requests are refused", "bad_origin");
		return;
	}
	const char *route = path + 4; /* keeps the leading slash */
	if (!strcmp(route, "/info")) {
		if (strcmp(method, "GET") != 0) {
			respond_json_error(req, 405, "method not allowed", "method");
			return;
		}
		serve_info(w, req);
		return;
	}
	for (size_t i = 0; i < sizeof proxied / sizeof proxied[0]; i++) {
		if (strcmp(route, proxied[i].path) != 0)
			continue;
		if (strcmp(method, proxied[i].method) != 0) {
			http_response_header(req, "Allow", proxied[i].method);
			respond_json_error(req, 405, "method not allowed", "method");
			return;
		}
		relay_start(w, req, method, route);
		return;
	}
	respond_json_error(req, 404, "no such API route", "not_found");
}

struct web *web_new(struct event_base *base, const struct web_config *cfg, char *err, size_t errlen)
{
	struct web *w = calloc(1, sizeof *w);
	if (!w) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	w->base = base;
	w->allow_remote = cfg->allow_remote;
	w->host = strdup(cfg->host);
	w->daemon_url = strdup(cfg->daemon_url);
	w->secret = strdup(cfg->secret);
	if (!w->host || !w->daemon_url || !w->secret) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	w->daemon = backend_http_new(base, cfg->daemon_url,
	                             cfg->backend_timeout_s > 0 ? cfg->backend_timeout_s : 1800,
	                             err, errlen);
	if (!w->daemon)
		goto fail;
	char bearer[600];
	if ((size_t)snprintf(bearer, sizeof bearer, "Bearer %s", cfg->daemon_token) >=
	        sizeof bearer ||
	    backend_http_set_header(w->daemon, "Authorization", bearer) != 0) {
		snprintf(err, errlen, "the daemon's token cannot be used in a header");
		goto fail;
	}
	struct http_server_limits limits;
	http_server_default_limits(&limits);
	limits.max_body_bytes = 16u << 20; /* a long conversation, resent each turn */
	w->http = http_server_new(base, &limits, handle, w, web_error_body);
	if (!w->http) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	if (cfg->tls_cert && cfg->tls_key &&
	    http_server_set_tls(w->http, cfg->tls_cert, cfg->tls_key, err, errlen) != 0)
		goto fail;
	if (http_server_listen(w->http, cfg->host, cfg->port, err, errlen) != 0)
		goto fail;
	return w;
fail:
	web_free(w);
	return NULL;
}

int web_port(const struct web *w)
{
	return http_server_port(w->http);
}

int web_is_tls(const struct web *w)
{
	return http_server_is_tls(w->http);
}

void web_free(struct web *w)
{
	if (!w)
		return;
	/* Closing the browsers' connections cancels what they relay. */
	if (w->http)
		http_server_free(w->http);
	if (w->daemon)
		backend_http_free(w->daemon);
	free(w->host);
	free(w->daemon_url);
	free(w->secret);
	free(w);
}
