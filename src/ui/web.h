/* toki web: a browser chat UI for the daemon. One process serves the UI's
 * files (embedded in the binary at build time, from src/ui/web_assets/) and
 * relays the UI's API calls to a running `toki serve`, adding the daemon's
 * token itself, so that the browser never holds it.
 *
 * toki web protects itself with a per-process random session secret: the
 * user opens http://HOST:PORT/#k=SECRET (the fragment never leaves the
 * browser), the page moves the secret to sessionStorage and sends it as
 * `Authorization: Bearer SECRET` on every /api/ call; without it /api/ is 401.
 * Every request's Host header must name this server (a loopback name and the
 * port) unless remote access was allowed, which defeats DNS rebinding; a
 * cross-origin Origin on /api/ is refused too. See docs/web.md. */
#ifndef TOKI_UI_WEB_H
#define TOKI_UI_WEB_H

#include <stddef.h>
#include <event2/event.h>

/* A file of the UI, compiled into the binary (see src/ui/web_assets/embed.cmake). */
struct web_asset {
	const char *path; /* "/index.html", "/app.js", ... */
	const char *content_type;
	const unsigned char *data;
	size_t len;
};
extern const struct web_asset web_assets[];
extern const size_t web_n_assets;

/* The asset served at a request path ("/" is "/index.html"), or NULL. */
const struct web_asset *web_asset_find(const char *path);

struct web_config {
	const char *host; /* the address bound */
	int port;	  /* 0 picks a free one */
	int allow_remote; /* any Host header is accepted (the secret still guards /api/) */
	const char *daemon_url;	  /* http://host:port of toki serve */
	const char *daemon_token; /* sent to the daemon, never to the browser */
	const char *secret;	  /* what the browser must present */
	const char *tls_cert, *tls_key; /* both set: HTTPS */
	int backend_timeout_s;		/* a silent daemon fails the call after this */
};

struct web;

/* Listens and serves on base until web_free(). The strings in cfg are
 * copied. NULL with a message in err. */
struct web *web_new(struct event_base *base, const struct web_config *cfg, char *err,
		    size_t errlen);
int web_port(const struct web *w);
int web_is_tls(const struct web *w);
void web_free(struct web *w);

/* A fresh session secret: 32 random bytes as 64 hex digits (n >= 65). 0 or -1. */
int web_make_secret(char *out, size_t n);

/* Whether a request's Host header names this server: a loopback name
 * (127.0.0.1, localhost, [::1]) or the bound host, with the port (which may
 * be left out when it is the scheme's default). */
int web_host_allowed(const char *host_header, const char *bind_host, int port, int tls);

/* The daemon to talk to when none is given: the running run (the registry's
 * active model when several run, else the first), else http://127.0.0.1:8787.
 * url gets "http://host:port", how says where it came from. */
void web_find_daemon(char *url, size_t n, char *how, size_t hown);

/* Normalises a daemon URL given by the user: trims trailing slashes and a
 * trailing /v1 (as `toki status` prints it). 0, or -1 when it is not http://. */
int web_normalise_daemon_url(const char *in, char *out, size_t n);

#endif
