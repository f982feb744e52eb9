/* The endpoint's parts (pool.h; the map is src/pool/README.md): the pool,
 * its models and its waiters, and the calls between pool.c (the pool and its
 * queue), pool_child.c (each model's child), pool_relay.c (what the client
 * gets) and pool_routes.c (the endpoint's routes). Nothing outside src/pool/
 * includes this. */
#ifndef TOKI_POOL_IMPL_H
#define TOKI_POOL_IMPL_H

#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include <event2/event.h>

#include "model/registry.h"
#include "pool/pool.h"

struct backend_call;
struct backend_http;
struct http_request;
struct http_server;
struct launch_plan;
struct plat_child_watch;

enum pm_state { PM_UNLOADED, PM_STARTING, PM_LOADED, PM_STOPPING };

/* Each state's name, as /v1/models, /toki/stats and the load events say it. */
extern const char *const pool_state_names[];

/* The client of one child: shared by the requests relayed to it, so that a
 * child that exits under them leaves their calls to end on their own
 * (freeing it would free their calls without a word to them). */
struct pool_conn {
	struct pool *pool;
	struct backend_http *http;
	int users;   /* relays using it */
	int retired; /* its child is gone: freed when the last relay ends */
	struct pool_conn *next_dead;
};

/* One registry model, by name: kept across registry re-reads, so that a
 * running child stays known. */
struct pool_model {
	struct pool *pool;
	char name[160];
	enum pm_state state;
	pid_t pid;
	int port;
	long ctx; /* the context it was sized to at its first start (kept, so
	             that its slot files' fingerprint holds across swaps) */
	long max_output;
	uint64_t used;      /* its memory at ctx */
	int in_flight;      /* requests relayed to it and not ended */
	int computing;      /* of those, the ones that compute (pool_request_computes) */
	int cpu;            /* computes on the CPU, as its last sizing found: takes turns */
	int threads;        /* its server's CPU threads, as its last sizing read them (0: a
	                     * thread per core): whether it may share the turn */
	int draining;       /* chosen to stop: new requests queue instead */
	int64_t last_used;  /* when its last request ended (us) */
	int64_t started_us; /* when its start began */
	int starts;
	long log_offset;        /* where its serve.log stood when it last started */
	int polls;              /* of its start */
	struct pool_conn *conn; /* while it runs */
	struct event *poll;     /* while starting: is it listening and healthy yet */
	struct backend_call *probe;
	char error[1200]; /* why its last start failed, for the waiters */
	/* What operators see of it (/toki/stats, /metrics, toki status): */
	int loads;                  /* starts that became ready */
	int unloads;                /* stops the pool asked of a ready child */
	int exits;                  /* deaths nobody asked for */
	double last_start_s;        /* its last start, to ready */
	double total_start_s;       /* every start's, to ready */
	double last_stop_s;         /* its last asked stop: SIGTERM to exit (the save) */
	int64_t stop_began_us;      /* when its SIGTERM went */
	int stop_unloads;           /* this stop is of a ready child: an unload */
	struct timespec start_wall; /* when its start began, as file times say it */
	uint64_t saved_bytes;       /* slot files its children wrote, over every run */
	uint64_t restored_bytes;    /* slot files there at its starts, over every start */
	int turn_waits;             /* its requests and starts that waited for the CPU turn */
	int turn_held;              /* its start waits for the CPU turn now (logged once) */
	/* On the CPU, after a relay that computed: GET /toki/idle, out until
	 * the child's work after its answers is done (pool_model_settle). */
	struct backend_call *settle;
	int64_t settle_since; /* its last relay's end, while that call is out */
	int64_t settle_from;  /* ... and since when no request of its computes (0: one does) */
	double settle_s;      /* the time its turn was held so, no request of its computing */
};

struct pool_waiter;

struct pool {
	struct event_base *base;
	struct pool_config cfg;
	struct http_server *http;
	char reg_path[4096];
	struct registry reg;
	struct timespec reg_mtime;
	off_t reg_size;
	struct pool_model **models;
	int n_models;
	struct pool_waiter *head, *tail; /* requests waiting for their model, in order */
	struct plat_child_watch *watch;
	/* Clients whose last relay ended, freed on the next loop turn: the last
	 * release runs inside the client's own callback, which uses its call
	 * after the handler returns. */
	struct pool_conn *dead;
	struct event *reap;
	struct event *tick, *sigint, *sigterm, *shutdown_poll;
	int shutting_down;
	int64_t shutdown_deadline;
	int cpus;        /* the CPUs this endpoint may use: what models on the CPU share */
	char self[4096]; /* the toki binary the children run */
	char info_path[4200];
};

/* A request waiting for its model; or `toki model use`'s load, which is
 * answered once the model is ready instead of relayed. */
struct pool_waiter {
	struct pool *p;
	struct pool_model *m;
	struct http_request *req;
	int load_only;
	int stream;      /* the client asked for a stream: keep-alives while it waits */
	int progress;    /* and for progress (return_progress): load events too */
	int64_t since;   /* when it began to wait */
	int began;       /* the stream began with those keep-alives */
	int turn_waited; /* counted in its model's turn_waits */
	int64_t deadline;
	struct event *keepalive;
	struct pool_waiter *next;
};

/* ---- pool.c: the pool, its queue, time ---- */

/* The model of that name, added (unloaded) when new; NULL when out of
 * memory. */
struct pool_model *pool_model_get(struct pool *p, const char *name);
/* Its ttl: the registry's for it, else the registry's default. */
long pool_model_ttl(struct pool *p, const struct pool_model *m);
/* How many models may run at once (0: no cap). */
long pool_max_loaded(struct pool *p);
/* Reads the registry again when its file changed (first: at the start, and
 * quietly), adding its new models. */
void pool_registry_refresh(struct pool *p, int first);

/* Queues a request (or a load, load_only) for model m, and makes progress. */
void pool_wait(struct pool *p, struct pool_model *m, struct http_request *req, int load_only,
               int stream, int progress);
void pool_waiter_unlink(struct pool *p, struct pool_waiter *w);
void pool_waiter_free(struct pool_waiter *w);
/* Every waiter of m ends with this error. */
void pool_fail_waiters(struct pool *p, struct pool_model *m, int status, const char *msg);
/* Makes progress on the queue: serves, starts, stops. Called
 * whenever something changed: a request came or ended, a child started or
 * exited, a second went by. */
void pool_pump(struct pool *p);
/* Whether a request computes (pool_pick.h, the CPU turn): any but a GET or
 * HEAD. */
int pool_request_computes(const struct http_request *req);
/* Whether m may relay a request that computes now, with nobody queued:
 * the CPU turn is free or its own. */
int pool_turn_free_for(struct pool *p, const struct pool_model *m);
/* Whether m starts, answers a request that computes, or finishes the work
 * after one (settle): on the CPU, it has the turn then (pool_view.busy). */
int pool_model_busy(const struct pool_model *m);

/* ---- pool_child.c: a model's child toki serve ---- */

/* Sizes and starts m's child. 0, or -1 with m->error (its waiters are
 * failed by the caller). */
int pool_model_start(struct pool *p, struct pool_model *m, const struct registry_model *rm,
                     const struct launch_plan *plan);
/* SIGTERM to a starting or running child: it saves its slots and exits. */
void pool_model_stop(struct pool *p, struct pool_model *m, const char *why);
/* m as unloaded: its start's poll, probe and settle ended, its client
 * retired. */
void pool_model_reset(struct pool_model *m);
/* A relay of m's that computed ended: on the CPU, m keeps the turn until
 * its child says that its work after the answer is done as well (exact
 * mode's keep, tail cut, the settle after a cancel). */
void pool_model_settle(struct pool_model *m);
/* A request of m's that computes was relayed: the time its turn is held for
 * the work after answers stops counting (settle_s) until it ends. */
void pool_model_settle_pause(struct pool_model *m);
/* plat_child_watch's callback: a child exited. */
void pool_on_child_exit(pid_t pid, int status, void *arg);
/* One user fewer of a child's client: once retired and unused, freed on
 * the next loop turn (pool_conn_reap). */
void pool_conn_release(struct pool_conn *c);
/* Frees the clients released since the last turn (p->reap's callback, and
 * once more when the endpoint stops). */
void pool_conn_reap(struct pool *p);

/* ---- pool_relay.c: what the client gets ---- */

/* Sends the request on to its model's child, as it came; began: a stream
 * of keep-alives began it. */
void pool_relay_start(struct pool *p, struct pool_model *m, struct http_request *req, int began);
/* A waiter whose model is ready: relayed, or (a load) answered; freed. */
void pool_waiter_serve(struct pool *p, struct pool_waiter *w);
/* Ends a waiter with an error, in the stream when one began; freed. */
void pool_waiter_fail(struct pool_waiter *w, int status, const char *msg);
/* A waiting stream's keep-alive timer (w->keepalive). */
void pool_on_keepalive(evutil_socket_t fd, short what, void *arg);

/* ---- pool_routes.c: the endpoint's routes ---- */

/* The http_server's handler: every request to the endpoint. */
void pool_handle(struct http_request *req, void *ctx);

#endif
