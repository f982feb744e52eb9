/* Slot states on disk that survive restarts of llama-server and of toki.
 *
 * llama-server writes a slot's KV to <dir>/<name>.part (its slot save);
 * toki then fsyncs it, checksums it (XXH3-128), renames it to <name>.bin and
 * writes <name>.json beside it: the token sequence, the grid-aligned length
 * (exact mode's reuse limit), the checksum and a fingerprint of everything
 * that shapes KV contents and layout (the model file's content hash, the
 * llama-server build, the context per slot, the micro-batch size and the KV
 * settings toki started the server with). A state is restored only into a
 * backend with the same fingerprint, after its size and (once per daemon
 * run) its checksum were checked; anything else is deleted, never loaded.
 *
 * Without --slot-dir toki cannot see the server's folder, but a server
 * started with --slot-save-path still saves and restores by name: toki then
 * saves a slot it evicts there under one of a bounded set of names (see
 * slot_store.c, remote_name), as many as the byte cap allows, keeps their
 * index in memory only, and checks nothing but what the server answers. */
#ifndef TOKI_SLOT_STORE_H
#define TOKI_SLOT_STORE_H

/* Names toki may use in a server's folder it cannot see, per backend; the
 * byte cap (--slot-disk-mb, 8 GiB by default there) decides how many. */
#define SLOT_REMOTE_MAX_NAMES 64

struct daemon;
struct backend;
struct router_slot;
struct router_saved;

typedef void (*slot_store_done_fn)(struct router_saved *saved, void *arg);

/* Saves the slot's content (the caller holds the slot busy); done gets the
 * new state, or NULL when the save failed. 0, or -1 when nothing started
 * (done is then not called). */
int slot_store_save(struct daemon *d, struct backend *b, struct router_slot *s,
                    slot_store_done_fn done, void *arg);
/* Checks a state before it is restored (and expands a compressed one to
 * <name>.bin for the server). 0, or -1 after deleting it. */
int slot_store_verify(struct daemon *d, struct router_saved *e);
/* After a restore: removes the expanded copy of a compressed state. */
void slot_store_restored(struct daemon *d, struct router_saved *e);
/* After discovery: computes the backend's fingerprint, drops states that do
 * not match it, and indexes the matching ones found on disk. */
void slot_store_backend_ready(struct daemon *d, struct backend *b, const char *model_path);
/* Once a second: saves slots that have been idle for --slot-save-idle-ms. */
void slot_store_tick(struct daemon *d);
/* At shutdown: saves every slot worth keeping, then calls done (also when
 * there is nothing to save, or after timeout_s). */
void slot_store_save_all(struct daemon *d, int timeout_s, void (*done)(void *arg), void *arg);
/* Deletes a state's files and forgets it. */
void slot_store_delete(struct daemon *d, struct router_saved *e);
/* Deletes the least worth keeping until the files are under the disk cap. */
void slot_store_enforce_budget(struct daemon *d);
/* Frees what slot_store_save_all left (after the event loop ended). */
void slot_store_free_pending(struct daemon *d);

#endif
