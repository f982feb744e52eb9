/* toki serve: the cache-routing daemon. */
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <event2/event.h>

#include "api/api_error.h"
#include "api/proxy.h"
#include "backend/backend.h"
#include "cmd/cmd.h"
#include "daemon.h"
#include "http/http_server.h"
#include "util/clock.h"
#include "util/log.h"

static void usage(FILE *out)
{
	fprintf(out,
		"usage: toki serve --backend URL [--backend URL ...] [options]\n"
		"\n"
		"Runs the cache-routing daemon: an OpenAI-compatible API that sends each\n"
		"request to the llama-server slot holding its longest token prefix.\n"
		"\n"
		"  --backend URL      a llama-server base URL (repeatable)\n"
		"  --host ADDR        address to bind (default 127.0.0.1)\n"
		"  --port N           port to bind (default 8787; 0 picks a free one)\n"
		"  --allow-remote     allow binding to a non-loopback address\n"
		"  --reuse MODE       exact (byte-identical output, default) or fast\n"
		"  --ubatch N         the backends' micro-batch size, -ub (default 512)\n"
		"  --keepalive-ms N   SSE keep-alive interval while the backend is silent\n"
		"                     (default 5000)\n"
		"  --max-body-mb N    largest request body accepted (default 64)\n"
		"  --slot-dir DIR     the backends' --slot-save-path: toki saves a slot's\n"
		"                     content there before evicting it and restores it later\n"
		"  --slot-disk-mb N   cap on the files in --slot-dir (default: a quarter of the\n"
		"                     free space there, at most 32 GiB)\n"
		"\n"
		"environment: TOKI_BACKEND_TIMEOUT (seconds, default 1800), TOKI_LOG\n");
}

static int is_loopback(const char *host)
{
	return !strcmp(host, "127.0.0.1") || !strcmp(host, "localhost") || !strcmp(host, "::1") ||
	       !strncmp(host, "127.", 4);
}

static void on_signal(evutil_socket_t sig, short what, void *arg)
{
	struct daemon *d = arg;
	if (d->shutting_down) {
		event_base_loopexit(d->base, NULL);
		return;
	}
	log_info("signal %d: shutting down", (int)sig);
	d->shutting_down = 1;
	http_server_stop_listening(d->http);
	proxy_abort_all(d, "toki is shutting down");
	/* One more turn of the loop lets the last bytes reach the clients. */
	struct timeval tv = {0, 200000};
	event_base_loopexit(d->base, &tv);
}

int cmd_serve(int argc, char **argv)
{
	static const struct option opts[] = {
		{"backend", required_argument, NULL, 'b'},
		{"host", required_argument, NULL, 'H'},
		{"port", required_argument, NULL, 'p'},
		{"allow-remote", no_argument, NULL, 'R'},
		{"reuse", required_argument, NULL, 'r'},
		{"ubatch", required_argument, NULL, 'u'},
		{"keepalive-ms", required_argument, NULL, 'k'},
		{"max-body-mb", required_argument, NULL, 'm'},
		{"slot-dir", required_argument, NULL, 's'},
		{"slot-disk-mb", required_argument, NULL, 'S'},
		{"help", no_argument, NULL, 'h'},
		{0},
	};
	struct daemon d = {0};
	d.cfg.host = "127.0.0.1";
	d.cfg.port = 8787;
	d.cfg.mode = REUSE_EXACT;
	d.cfg.n_ubatch = 512;
	d.cfg.keepalive_ms = 5000;
	d.cfg.health_interval_ms = 2000;
	d.cfg.max_body_bytes = 64u << 20;
	d.cfg.backend_timeout_s = 1800;
	const char *urls[64];
	int n_urls = 0;

	log_init();
	const char *env_timeout = getenv("TOKI_BACKEND_TIMEOUT");
	if (env_timeout && atoi(env_timeout) > 0)
		d.cfg.backend_timeout_s = atoi(env_timeout);

	optind = 1;
	int c;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'b':
			if (n_urls == 64) {
				fprintf(stderr, "toki serve: at most 64 backends\n");
				return 2;
			}
			urls[n_urls++] = optarg;
			break;
		case 'H': d.cfg.host = optarg; break;
		case 'p': d.cfg.port = atoi(optarg); break;
		case 'R': d.cfg.allow_remote = 1; break;
		case 'r':
			if (reuse_mode_parse(optarg, &d.cfg.mode) != 0) {
				fprintf(stderr, "toki serve: --reuse takes exact or fast\n");
				return 2;
			}
			break;
		case 'u': d.cfg.n_ubatch = atoi(optarg); break;
		case 'k': d.cfg.keepalive_ms = atoi(optarg); break;
		case 'm': d.cfg.max_body_bytes = (size_t)atoi(optarg) << 20; break;
		case 's': d.cfg.slot_dir = optarg; break;
		case 'S': d.cfg.slot_disk_bytes = (uint64_t)atoll(optarg) << 20; break;
		case 'h': usage(stdout); return 0;
		default: usage(stderr); return 2;
		}
	}
	if (optind < argc || n_urls == 0 || d.cfg.n_ubatch <= 0 || d.cfg.keepalive_ms <= 0 ||
	    d.cfg.port < 0 || d.cfg.port > 65535 || d.cfg.max_body_bytes == 0) {
		if (n_urls == 0)
			fprintf(stderr, "toki serve: give at least one --backend URL\n");
		usage(stderr);
		return 2;
	}
	if (!is_loopback(d.cfg.host) && !d.cfg.allow_remote) {
		fprintf(stderr,
			"toki serve: refusing to bind %s, which is not loopback: anyone who can "
			"reach it could use your model. Pass --allow-remote to do it anyway.\n",
			d.cfg.host);
		return 2;
	}
	if (d.cfg.slot_dir) {
		struct statvfs vfs;
		if (access(d.cfg.slot_dir, W_OK) != 0 || statvfs(d.cfg.slot_dir, &vfs) != 0) {
			fprintf(stderr, "toki serve: --slot-dir %s is not a writable directory\n",
				d.cfg.slot_dir);
			return 2;
		}
		if (!d.cfg.slot_disk_bytes) {
			uint64_t quarter = (uint64_t)vfs.f_bavail * vfs.f_frsize / 4;
			d.cfg.slot_disk_bytes = quarter < (32ull << 30) ? quarter : (32ull << 30);
		}
	}
	d.cfg.backend_urls = urls;
	d.cfg.n_backends = n_urls;

	signal(SIGPIPE, SIG_IGN);
	d.base = event_base_new();
	d.router = router_new(d.cfg.mode);
	d.backends = calloc((size_t)n_urls, sizeof *d.backends);
	if (!d.base || !d.router || !d.backends) {
		fprintf(stderr, "toki serve: out of memory\n");
		return 1;
	}
	d.started_us = clock_now_us();
	char err[256];
	for (int i = 0; i < n_urls; i++) {
		d.backends[i] = backend_new(&d, urls[i], err, sizeof err);
		if (!d.backends[i]) {
			fprintf(stderr, "toki serve: %s\n", err);
			return 2;
		}
		d.n_backends++;
	}
	struct http_server_limits limits;
	http_server_default_limits(&limits);
	limits.max_body_bytes = d.cfg.max_body_bytes;
	d.http = http_server_new(d.base, &limits, proxy_handle, &d, api_error_body);
	if (!d.http || http_server_listen(d.http, d.cfg.host, d.cfg.port, err, sizeof err) != 0) {
		fprintf(stderr, "toki serve: %s\n", d.http ? err : "out of memory");
		return 1;
	}
	d.sigint = evsignal_new(d.base, SIGINT, on_signal, &d);
	d.sigterm = evsignal_new(d.base, SIGTERM, on_signal, &d);
	event_add(d.sigint, NULL);
	event_add(d.sigterm, NULL);
	for (int i = 0; i < d.n_backends; i++)
		backend_start(d.backends[i]);
	log_info("listening on http://%s:%d (reuse %s, ubatch %d, %d backend%s)", d.cfg.host,
		 http_server_port(d.http), reuse_mode_name(d.cfg.mode), d.cfg.n_ubatch, d.n_backends,
		 d.n_backends == 1 ? "" : "s");
	/* Tests and scripts read the chosen port from this line. */
	printf("toki serve: listening on http://%s:%d\n", d.cfg.host, http_server_port(d.http));
	fflush(stdout);

	event_base_dispatch(d.base);

	log_info("stopped");
	http_server_free(d.http);
	for (int i = 0; i < d.n_backends; i++)
		backend_free(d.backends[i]);
	free(d.backends);
	router_free(d.router);
	event_free(d.sigint);
	event_free(d.sigterm);
	event_base_free(d.base);
	return 0;
}
