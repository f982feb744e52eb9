/* toki web: a browser chat UI in front of the running daemon (src/ui/web.c). */
#include <getopt.h>
#include <openssl/crypto.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <event2/event.h>

#include "api/auth.h"
#include "cmd/cmd.h"
#include "ui/web.h"
#include "util/log.h"
#include "util/net.h"

static void usage(FILE *out)
{
	fprintf(out,
		"usage: toki web [--port 7778] [--host 127.0.0.1] [--url DAEMON]\n"
		"                [--tls-cert cert.pem --tls-key key.pem] [--allow-remote]\n"
		"\n"
		"Serves a chat UI for the browser that talks to the running toki daemon:\n"
		"raw, cached and side-by-side turns with their TTFT, evaluated and cached\n"
		"tokens, and a chart of them over the conversation. The UI is built into\n"
		"this binary and loads nothing from elsewhere.\n"
		"\n"
		"  --port N           port to bind (default 7778; 0 picks a free one)\n"
		"  --host ADDR        address to bind (default 127.0.0.1)\n"
		"  --allow-remote     allow binding to a non-loopback address (then any Host\n"
		"                     header is accepted; use TLS)\n"
		"  --url URL          the daemon (default: the running model, as toki status\n"
		"                     shows it, else http://127.0.0.1:8787)\n"
		"  --tls-cert FILE    serve HTTPS with this PEM certificate (chain) ...\n"
		"  --tls-key FILE     ... and this PEM private key\n"
		"\n"
		"toki web prints the link to open: it carries a secret made for this process\n"
		"in its #fragment, which the browser keeps to itself; without it the UI's\n"
		"API answers 401. toki web adds the daemon's token ($TOKI_TOKEN, else\n"
		"$TOKI_STATE_DIR/token) to what it relays; the browser never sees it.\n"
		"\n"
		"environment: TOKI_BACKEND_TIMEOUT, TOKI_LOG, TOKI_STATE_DIR, TOKI_TOKEN\n");
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	event_base_loopbreak(arg);
}

int cmd_web(int argc, char **argv)
{
	static const struct option opts[] = {
		{"port", required_argument, NULL, 'p'},
		{"host", required_argument, NULL, 'H'},
		{"url", required_argument, NULL, 'u'},
		{"tls-cert", required_argument, NULL, 'c'},
		{"tls-key", required_argument, NULL, 'k'},
		{"allow-remote", no_argument, NULL, 'R'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct web_config cfg = {.host = "127.0.0.1", .port = 7778, .backend_timeout_s = 1800};
	const char *url_arg = NULL;
	log_init();
	const char *env_timeout = getenv("TOKI_BACKEND_TIMEOUT");
	if (env_timeout && atoi(env_timeout) > 0)
		cfg.backend_timeout_s = atoi(env_timeout);
	optind = 1;
	int c;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'p': {
			char *end;
			long v = strtol(optarg, &end, 10);
			if (!*optarg || *end || v < 0 || v > 65535) {
				fprintf(stderr, "toki web: --port takes 0..65535\n");
				return 2;
			}
			cfg.port = (int)v;
			break;
		}
		case 'H': cfg.host = optarg; break;
		case 'u': url_arg = optarg; break;
		case 'c': cfg.tls_cert = optarg; break;
		case 'k': cfg.tls_key = optarg; break;
		case 'R': cfg.allow_remote = 1; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "toki web: unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		return 2;
	}
	if (!cfg.tls_cert != !cfg.tls_key) {
		fprintf(stderr, "toki web: --tls-cert and --tls-key go together\n");
		return 2;
	}
	if (!net_host_is_loopback(cfg.host) && !cfg.allow_remote) {
		fprintf(stderr,
			"toki web: refusing to bind %s, which is not loopback: anyone who can "
			"reach it and learns the link could use your model. Pass --allow-remote "
			"(and --tls-cert/--tls-key) to do it anyway.\n",
			cfg.host);
		return 2;
	}

	char daemon_url[1024], how[256];
	if (url_arg) {
		if (web_normalise_daemon_url(url_arg, daemon_url, sizeof daemon_url) != 0) {
			fprintf(stderr, "toki web: --url takes http://host:port (got '%s')\n",
				url_arg);
			return 2;
		}
		snprintf(how, sizeof how, "--url");
	} else {
		web_find_daemon(daemon_url, sizeof daemon_url, how, sizeof how);
	}
	cfg.daemon_url = daemon_url;

	char token[256], secret[80], err[1024];
	if (auth_load_token(token, sizeof token, err, sizeof err) != 0) {
		fprintf(stderr, "toki web: the daemon's token: %s\n", err);
		return 1;
	}
	cfg.daemon_token = token;
	if (web_make_secret(secret, sizeof secret) != 0) {
		fprintf(stderr, "toki web: cannot make a random session secret\n");
		return 1;
	}
	cfg.secret = secret;

	signal(SIGPIPE, SIG_IGN);
	struct event_base *base = event_base_new();
	if (!base) {
		fprintf(stderr, "toki web: cannot create the event loop\n");
		return 1;
	}
	struct web *w = web_new(base, &cfg, err, sizeof err);
	if (!w) {
		fprintf(stderr, "toki web: %s\n", err);
		event_base_free(base);
		return 1;
	}
	struct event *sigint = evsignal_new(base, SIGINT, on_signal, base);
	struct event *sigterm = evsignal_new(base, SIGTERM, on_signal, base);
	if (sigint)
		event_add(sigint, NULL);
	if (sigterm)
		event_add(sigterm, NULL);

	const char *scheme = web_is_tls(w) ? "https" : "http";
	int v6 = strchr(cfg.host, ':') != NULL;
	char where[600];
	snprintf(where, sizeof where, "%s://%s%s%s:%d", scheme, v6 ? "[" : "", cfg.host,
		 v6 ? "]" : "", web_port(w));
	log_info("listening on %s; daemon %s (%s)", where, daemon_url, how);
	/* Tests and scripts read these lines: the port, then the link. */
	printf("toki web: listening on %s\n", where);
	printf("toki web: daemon %s (%s)\n", daemon_url, how);
	printf("toki web: open %s/#k=%s\n", where, secret);
	fflush(stdout);

	event_base_dispatch(base);

	log_info("stopped");
	web_free(w);
	if (sigint)
		event_free(sigint);
	if (sigterm)
		event_free(sigterm);
	event_base_free(base);
	/* The secret dies with the process; leave no copy behind in memory. */
	OPENSSL_cleanse(secret, sizeof secret);
	OPENSSL_cleanse(token, sizeof token);
	return 0;
}
