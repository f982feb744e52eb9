/* The endpoint: one `toki serve --registry` in front of every model in the
 * registry (toki up without --model). Each model runs as a child `toki
 * serve --model` on a private port, started on its first request (which
 * waits meanwhile; one start however many requests race), stopped with
 * SIGTERM (so that it saves its slots to run/NAME/slots, and a later start
 * restores them) when another model needs its memory or a max_loaded place
 * and it is the least recently used idle one, or after its ttl idle. A
 * request goes to the model its "model" names (pool_pick.h), relayed as the
 * child answers it, streams included. Everything runs on one event loop. */
#ifndef TOKI_POOL_H
#define TOKI_POOL_H

#include <stddef.h>

struct pool_config {
	const char *host;
	int port;
	const char *run_name;  /* the endpoint's run (serve.json): "endpoint" */
	size_t max_body_bytes; /* --max-body-mb, for the endpoint and its children */
	int client_timeout_s;  /* --client-timeout, likewise */
	int keepalive_ms;      /* SSE comments while a streaming request waits */
	int backend_timeout_s; /* how long a request waits, and a child may be silent */
	const char *mode;      /* --reuse for the children, or NULL */
	const char *token;     /* the local token */
	long max_loaded;       /* TOKI_MAX_LOADED (0: the registry's, else no cap) */
};

/* Runs the endpoint until SIGTERM/SIGINT, then stops every child (each
 * saving its slots). The exit status. */
int pool_serve(const struct pool_config *cfg);

#endif
