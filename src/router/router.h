/* The router: what every slot of every backend holds, and where each request
 * should go. It keeps one radix tree over the token sequences of all slots,
 * so the longest exact prefix of a request is found in one walk, and it
 * chooses a slot by expected cost: tokens to prefill, time to wait for a busy
 * slot, and the value of what a slot would lose.
 *
 * The router does no I/O; the proxy asks it where to go and tells it what
 * happened. That keeps the policy testable on its own. */
#ifndef TOKI_ROUTER_H
#define TOKI_ROUTER_H

#include <stddef.h>
#include <stdint.h>

#include "router/radix.h"
#include "router/ram.h"
#include "router/sched.h"

enum reuse_mode {
	/* The answer is a function of the request alone: a prompt is evaluated
	 * on a schedule that depends only on its messages (chunks that end
	 * where a message starts, router/sched.h), and only rows computed on
	 * the same micro-batches are reused. Byte-identical, at temperature 0,
	 * to the same request sent uncached through toki. */
	REUSE_EXACT,
	/* Reuse every matching token. Faster, but llama.cpp's results depend on
	 * the micro-batch shape, so the text may differ from an uncached run. */
	REUSE_FAST,
	/* Exact on llama-server's own schedule (one chunk from position 0):
	 * identical to llama-server's own uncached answer, at the price of
	 * recomputing everything past the last full micro-batch it shares. */
	REUSE_GRID,
};
const char *reuse_mode_name(enum reuse_mode mode);
/* Whether the mode promises identical answers (one request per backend at a
 * time, reuse only on a shared schedule). */
int reuse_mode_is_exact(enum reuse_mode mode);
int reuse_mode_parse(const char *s, enum reuse_mode *mode);

struct router_backend;
struct router_saved;

/* Owners in the radix tree are slots or saved states; both begin with this
 * tag so that a match can tell them apart. */
enum owner_kind { OWNER_SLOT = 1, OWNER_SAVED = 2 };

struct router_slot {
	enum owner_kind kind; /* OWNER_SLOT */
	struct router_backend *backend;
	int id;
	token_t *tokens; /* the prompt tokens the slot's KV holds, in order */
	size_t n_tokens, cap;
	/* Rows [0, aligned) were computed on the schedule whose chunk starts
	 * are bounds[0..n_bounds) (none: the grid); aligned is a micro-batch
	 * end of it. What exact mode may reuse (router/sched.h). */
	size_t aligned;
	size_t *bounds, n_bounds;
	/* The last token is a cut's throw-away one (router_slot_cut): a
	 * request that matches all before it reuses all the slot can lend. */
	int junk_tail;
	/* The server holds exactly tokens[0..n_tokens), nothing after them
	 * (router_slot_kept): a request that matches all of them needs no cut
	 * first. Otherwise an answer's tokens may follow. */
	int whole;
	/* Where the kept answer after a prompt begins (router_slot_kept; 0:
	 * none): a request that holds all before it continues that prompt, and
	 * whatever it generates stands where the answer stood. */
	size_t answer_at;
	size_t generated; /* tokens the last answer added after the prompt */
	int busy;
	int64_t last_used_us;
	unsigned hits; /* requests that reused this content */
	/* A conversation's think time: the time between one of its answers and
	 * its next turn on this slot (a running mean; 0 before a second turn),
	 * and the wait before the request now on the slot (-1: none). */
	double think_s;
	double pending_gap_s;
	int64_t busy_until_us; /* estimated end of the running request */
	/* A saved state holding exactly this content, if any: evicting the
	 * slot then loses nothing. */
	struct router_saved *saved;
	/* The backend came back with another number of slots: this one is no
	 * longer routed to, holds nothing, and stays allocated only for the
	 * requests that still point at it. */
	int retired;
};

/* A slot state saved to a file by llama-server's slot save, which can be
 * restored into any slot of the same backend, and with shared files
 * (router.shared_saved) of any backend with the same fingerprint. */
struct router_saved {
	enum owner_kind kind; /* OWNER_SAVED */
	struct router_backend *backend;
	char name[96]; /* the file name inside the backend's slot-save directory */
	token_t *tokens;
	size_t n_tokens;
	size_t aligned;
	size_t *bounds, n_bounds; /* as a slot's */
	uint64_t bytes;
	int64_t last_used_us;
	unsigned hits;
	int pinned;           /* being restored or written right now: not evictable */
	int verified;         /* its checksum was checked since this daemon indexed it */
	int compressed;       /* stored as <name>.zst, expanded to <name>.bin to restore */
	char fingerprint[72]; /* model, server build and KV settings it was made under */
	char bits[65];        /* its writer's arithmetic (router_backend.bits); "" unknown */
	struct router_saved *prev, *next;
};

/* Routes by kind: a slot that held the whole match, part of it, nothing
 * of it, or a saved state restored. */
enum { ROUTE_HIT, ROUTE_PARTIAL, ROUTE_MISS, ROUTE_DISK, ROUTE_RAM, ROUTE_KINDS };
int router_route_kind(const char *kind);
extern const char *const router_route_kind_names[ROUTE_KINDS];

/* A latency histogram in Prometheus' shape: cumulative counts at fixed
 * upper bounds (seconds), their sum and count. */
#define ROUTER_HISTOGRAM_BOUNDS 14
extern const double router_histogram_bounds[ROUTER_HISTOGRAM_BOUNDS];
struct router_histogram {
	uint64_t le[ROUTER_HISTOGRAM_BOUNDS]; /* observations <= bound i */
	uint64_t count;
	double sum;
};
void router_histogram_observe(struct router_histogram *h, double seconds);

struct router_backend {
	int index;
	char *url;
	int up;
	int n_slots;
	struct router_slot *slots;
	int n_ctx_slot; /* context per slot */
	int n_ubatch;   /* micro-batch size: the exact mode's grid */
	int in_flight;
	double prefill_tps; /* measured prompt tokens per second (EWMA) */
	double decode_tps;
	double restore_bps; /* measured slot-restore bytes per second (EWMA) */
	double save_bps;
	double kv_bytes_per_token; /* learned from saved files */
	int can_save;              /* the backend has a slot-save path: save/restore works */
	/* What a saved state must have been made under to be restored here:
	 * the model, server build and KV settings, as hex (slot_store computes
	 * it at each discovery; its file names start with it); "" until then. */
	char fingerprint[72];
	/* What the server's arithmetic gives (exact mode's self-test: a hash of
	 * its answers' logprobs, bit for bit, backend/selftest.h); "" where the
	 * test did not verify the backend, or in fast mode. The fingerprint
	 * names the build, not the CPU or GPU: two servers with the same bits
	 * here compute the same rows, so in exact mode one restores the
	 * other's states (restorable_on). */
	char bits[65];
	/* A state another backend saved failed to restore here: this server's
	 * --slot-save-path is not the folder the others write. Only its own
	 * states are restored here from then on. */
	int foreign_restore_failed;
	/* The model has sliding-window attention: llama-server's restore of a
	 * state into its slot (a file's; seen too on the resend after a cancel)
	 * continues with other logprobs than the live slot's, so exact mode
	 * restores nothing there and keeps nothing of a cancelled request. */
	int restore_inexact;
	/* The model has sliding-window attention or a recurrent state (Mamba,
	 * Gated DeltaNet and other hybrids, RWKV, short convolutions): llama-
	 * server cannot cut its slot back to any position, only to a context
	 * checkpoint (the end of an earlier request's prompt), so what the
	 * slot holds after an answer must be what the next turn's prompt
	 * begins with: exact mode keeps an answer there by its text's tokens,
	 * never by the ids generation made (serve/exec.c, the keep). */
	int cut_to_checkpoint;
	/* Exact mode's self-test found that an answer's tokens evaluated one
	 * at a time give the rows generation gave them (backend/selftest.h,
	 * the steps check): exact mode's schedule evaluates earlier answers so
	 * here (steps, router/sched.h), and keeps an answer's rows after it. */
	int steps;
	/* The server empties its idle slots into its own RAM cache at every
	 * new task (a unified KV cache with --cache-idle-slots: llama-server's
	 * default without -np), and loads from that cache only into a slot it
	 * picks itself. What toki knows of its slots is then gone by the next
	 * request: fast mode lets the server pick (backend.c finds this out). */
	int self_cached;
	/* Its slots share one KV cache (llama-server without -np, or with
	 * -kvu): an answer on one slot depends on what the others hold, even
	 * with no RAM cache (exact mode's self-test finds it: backend/selftest.h;
	 * self_cached implies it). Exact mode then uses only the first slot. */
	int shared_kv;
	/* The server loaded a state from its RAM cache (--cache-ram) into a
	 * slot: it reused more than that slot could hold. Without slot files
	 * toki then lets it pick the slot in fast mode too, as it does alone:
	 * its RAM holds what toki evicted, which toki cannot see. */
	int ram_cache;
	/* Exact mode: the states toki's tasks put in that RAM cache
	 * (router/ram.h), which a cut on another content loads back. */
	struct router_ram ram;
	unsigned discoveries; /* times it was (re)discovered: each start or restart seen */
	uint64_t evaluated_tokens, cached_tokens, requests;
	/* For /metrics: requests routed here by kind (router_route_kind), slot
	 * files written and read here (count, bytes, seconds), and the time
	 * routed requests waited for a slot. */
	uint64_t routes[ROUTE_KINDS];
	uint64_t saves, save_bytes, restores, restore_bytes;
	double save_s, restore_s;
	struct router_histogram wait;
};

struct router {
	struct radix *tree;
	enum reuse_mode mode;
	struct router_backend **backends;
	int n_backends;
	/* Weight of a slot's content in the eviction choice, as a fraction of
	 * the same number of prompt tokens to prefill. */
	double cold_weight, hot_weight;
	/* ... and at least this while an empty slot could take the request
	 * (see loss_of in router.c). */
	double spare_weight;
	/* A slot's weight halves every stale_half_life_s it is not used, and a
	 * conversation's every think_half_lives of its think times (at least
	 * think_floor_s) once it has let one go by (loss_of in router.c). */
	double stale_half_life_s;
	double think_half_lives, think_floor_s;
	/* Content never continued weighs fresh_weight for two usual think
	 * times (think_s: every conversation's, averaged; at least fresh_s)
	 * after its request: its next turn, if it has one, is due. */
	double fresh_weight, fresh_s, think_s;
	/* Saved states, most recently used first. */
	struct router_saved *saved_head, *saved_tail;
	size_t n_saved;
	uint64_t saved_bytes;
	/* Only slot contents at least this long are worth a file. */
	size_t save_min_tokens;
	/* Saved states are files in one folder that every backend reads
	 * (--slot-dir): in fast mode one backend's state can be restored into
	 * another serving the same model under the same settings. */
	int shared_saved;
	/* Slot arrays replaced by a rediscovery, freed with the router. */
	struct retired_slots *retired;
};

struct route_choice {
	struct router_slot *slot;
	size_t matched; /* exact common prefix with the slot's content */
	size_t reuse;   /* tokens the request will reuse (mode applied) */
	int must_trim;  /* the slot holds more than `reuse` matching tokens: cut it back */
	double est_prefill_s;
	const char *kind; /* "hit", "partial", "miss", "disk", "ram" */
	/* Before the request: save the slot's current content (it is worth
	 * keeping), then restore this state into the slot (NULL: none). */
	int save_first;
	struct router_saved *restore;
	/* Exact mode: the reuse is a state in the server's RAM cache, which the
	 * plan's first step (a cut on the slot's other content) makes the
	 * server load (router/ram.h). */
	int from_ram;
};

enum route_status { ROUTE_CHOSEN = 0, ROUTE_WAIT = 1, ROUTE_NO_BACKEND = -1 };

struct router *router_new(enum reuse_mode mode);
void router_free(struct router *r);
struct router_backend *router_add_backend(struct router *r, const char *url);
/* (Re)declares a backend's slots after discovery: all content forgotten. */
int router_backend_set_slots(struct router *r, struct router_backend *b, int n_slots,
                             int n_ctx_slot, int n_ubatch);
void router_backend_set_up(struct router *r, struct router_backend *b, int up);

/* Chooses where a request of tokens[0..n) goes. `now_us` is the clock;
 * `only_backend` restricts the choice (-1: any). */
enum route_status router_choose(struct router *r, const token_t *tokens, size_t n, int64_t now_us,
                                int only_backend, struct route_choice *out);
/* The same among the backends whose bit is set in allowed (bit i: backend
 * i; backends past 63 are always allowed). */
enum route_status router_choose_among(struct router *r, const token_t *tokens, size_t n,
                                      int64_t now_us, uint64_t allowed, struct route_choice *out);
/* The same for a request whose exact-mode schedule has chunk starts
 * bounds[0..nb) (router/sched.h). */
enum route_status router_choose_sched(struct router *r, const token_t *tokens, size_t n,
                                      const size_t *bounds, size_t nb, int64_t now_us,
                                      uint64_t allowed, struct route_choice *out);

/* Bookkeeping around one request on a slot. */
void router_slot_begin(struct router *r, struct router_slot *s, int64_t now_us, double est_s);
/* The request finished: the slot now holds tokens[0..n) of which the first
 * `reused` came from the cache and the rest were evaluated in micro-batches
 * starting at `reused`. Returns -1 on allocation failure (slot forgotten). */
int router_slot_commit(struct router *r, struct router_slot *s, const token_t *tokens, size_t n,
                       size_t reused, int64_t now_us);
/* The request ran on the schedule bounds[0..nb): the slot holds
 * tokens[0..n), rows [0, aligned) computed on that schedule. */
int router_slot_commit_sched(struct router *r, struct router_slot *s, const token_t *tokens,
                             size_t n, const size_t *bounds, size_t nb, size_t aligned,
                             int64_t now_us);
/* Exact mode kept an answer's rows (serve/exec.c): the slot holds exactly
 * tokens[0..n) (the prompt's n_prompt, the answer's tokens, and a
 * throw-away token when junk_tail), rows [0, aligned) on the schedule
 * bounds[0..nb). */
int router_slot_kept(struct router *r, struct router_slot *s, const token_t *tokens, size_t n,
                     size_t n_prompt, int junk_tail, const size_t *bounds, size_t nb,
                     size_t aligned, int64_t now_us);
/* The slot was cut back: it holds tokens[0..keep) then one throw-away token
 * `junk` (what a cut request leaves), and those rows keep what they were
 * computed on. tokens may be the slot's own. */
int router_slot_cut(struct router *r, struct router_slot *s, const token_t *tokens, size_t keep,
                    token_t junk, int64_t now_us);
/* The request ended without a usable result (error, cancel): the slot's
 * content is no longer known. */
void router_slot_forget(struct router *r, struct router_slot *s);
void router_slot_end(struct router *r, struct router_slot *s, int64_t now_us);
/* After a cut-back, the slot holds only its first n tokens. */
void router_slot_truncate(struct router *r, struct router_slot *s, size_t n);

/* Folds one measurement of prompt tokens and milliseconds into the rate. */
void router_backend_note_prefill(struct router_backend *b, uint64_t tokens, double ms);
void router_backend_note_decode(struct router_backend *b, uint64_t tokens, double ms);
double router_estimate_prefill_s(const struct router_backend *b, size_t tokens);

/* Saved states. router_saved_add indexes a state that now exists as a file
 * (bytes long) holding tokens[0..n); the slot's content becomes that state.
 * Returns NULL on allocation failure. */
struct router_saved *router_saved_add(struct router *r, struct router_slot *from, const char *name,
                                      uint64_t bytes, int64_t now_us);
/* The same for a state found on disk (the daemon restarted). */
struct router_saved *router_saved_add_tokens(struct router *r, struct router_backend *b,
                                             const char *name, const token_t *tokens, size_t n,
                                             size_t aligned, uint64_t bytes, unsigned hits,
                                             int64_t now_us);
struct router_saved *router_saved_find(struct router *r, const char *name);
/* The schedule a saved state's rows were computed on (copied). */
int router_saved_set_bounds(struct router_saved *e, const size_t *bounds, size_t nb);
/* The state was restored into the slot: the slot now holds its tokens. */
int router_slot_restored(struct router *r, struct router_slot *s, struct router_saved *e,
                         int64_t now_us);
/* Forgets a saved state (its file is gone or must go); the caller deletes
 * the file. */
void router_saved_remove(struct router *r, struct router_saved *e);
/* The least valuable saved state that may be evicted, or NULL. */
struct router_saved *router_saved_victim(struct router *r);
/* The same among one backend's states (b NULL: any backend's). */
struct router_saved *router_saved_victim_on(struct router *r, const struct router_backend *b);
void router_backend_note_restore(struct router_backend *b, uint64_t bytes, double ms);
void router_backend_note_save(struct router_backend *b, uint64_t bytes, double ms);

/* Whether exact mode counts on backend b's RAM cache (router/ram.h): the
 * server has one (ram_cache), its slots have KV caches of their own, and
 * toki has no slot files for it (those serve instead). */
int router_ram_active(const struct router *r, const struct router_backend *b);
/* The slot now holds tokens[0..keep) and a cut's throw-away token, the rows
 * loaded from the server's RAM cache: on the request's schedule
 * bounds[0..nb) (the route checked that the state's agrees) up to keep. */
int router_slot_loaded(struct router *r, struct router_slot *s, const token_t *tokens, size_t keep,
                       token_t junk, const size_t *bounds, size_t nb, int64_t now_us);

/* The largest prefix exact mode may reuse for a request of n tokens given a
 * slot whose first `aligned` tokens are on the grid and `matched` match. */
size_t router_exact_reuse(size_t matched, size_t aligned, size_t n, int n_ubatch);

#endif
