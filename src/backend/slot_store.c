#include "backend/slot_store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include "backend/backend.h"
#include "daemon.h"
#include "platform/platform.h"
#include "router/sched.h"
#include "util/bytes.h"
#include "util/clock.h"
#include "util/log.h"
#include "util/paths.h"
#include "util/json_body.h"

/* ---- checksums and fingerprints ---- */

/* XXH3-128 of a file as 32 hex digits: fast enough (tens of GB/s) to check a
 * multi-gigabyte KV state or model file without stalling the daemon long. */
static int hash_file(const char *path, char hex[33])
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	XXH3_state_t *st = XXH3_createState();
	if (!st) {
		close(fd);
		return -1;
	}
	XXH3_128bits_reset(st);
	static const size_t bufsz = 1 << 20;
	char *buf = malloc(bufsz);
	ssize_t n = 0;
	while (buf && (n = read(fd, buf, bufsz)) > 0)
		XXH3_128bits_update(st, buf, (size_t)n);
	XXH128_hash_t h = XXH3_128bits_digest(st);
	XXH3_freeState(st);
	free(buf);
	close(fd);
	if (!buf || n < 0)
		return -1;
	snprintf(hex, 33, "%016llx%016llx", (unsigned long long)h.high64,
	         (unsigned long long)h.low64);
	return 0;
}

/* A model file's content hash, remembered by path, size and mtime in
 * $TOKI_STATE_DIR/model-hashes.json so that it is computed once. */
static int model_hash(const char *path, char hex[33])
{
	struct stat st;
	if (stat(path, &st) != 0)
		return -1;
	char cache[4096];
	if (paths_state_sub(cache, sizeof cache, "model-hashes.json") != 0)
		return hash_file(path, hex);
	json_error_t jerr;
	json_t *all = json_load_file(cache, 0, &jerr);
	if (!json_is_object(all)) {
		json_decref(all);
		all = json_object();
	}
	json_t *e = json_object_get(all, path);
	const char *h = json_string_value(json_object_get(e, "hash"));
	if (h && strlen(h) == 32 &&
	    json_integer_value(json_object_get(e, "size")) == (json_int_t)st.st_size &&
	    json_integer_value(json_object_get(e, "mtime")) == (json_int_t)st.st_mtime) {
		snprintf(hex, 33, "%s", h);
		json_decref(all);
		return 0;
	}
	int64_t t0 = clock_now_us();
	if (hash_file(path, hex) != 0) {
		json_decref(all);
		return -1;
	}
	log_info("hashed %s (%lld bytes) in %.0f ms", path, (long long)st.st_size,
	         (double)(clock_now_us() - t0) / 1000.0);
	json_object_set_new(all, path,
	                    json_pack("{s:s, s:I, s:I}", "hash", hex, "size",
	                              (json_int_t)st.st_size, "mtime", (json_int_t)st.st_mtime));
	char dir[4096], tmp[4200];
	if (paths_state_dir(dir, sizeof dir) == 0 && paths_mkdir_p(dir, 0700) == 0) {
		snprintf(tmp, sizeof tmp, "%s.%d.tmp", cache, (int)getpid());
		if (json_dump_file(all, tmp, JSON_COMPACT) == 0)
			rename(tmp, cache);
	}
	json_decref(all);
	return 0;
}

static void compute_fingerprint(struct daemon *d, struct backend *b, const char *model_path)
{
	char mh[33];
	char model_id[4200];
	if (model_path && model_hash(model_path, mh) == 0)
		snprintf(model_id, sizeof model_id, "xxh128:%s", mh);
	else
		/* A remote model file: its path is all that can be known. */
		snprintf(model_id, sizeof model_id, "path:%s", model_path ? model_path : "?");
	/* "schedule": the micro-batch layout its rows were made by
	 * (SCHED_LAYOUT). Files from before it was recorded have none, so they
	 * never match and are dropped, not read as another layout's rows. */
	json_t *fp =
	    json_pack("{s:s, s:s, s:i, s:i, s:s, s:i}", "model", model_id, "build",
	              b->build_info ? b->build_info : "?", "n_ctx_slot", b->rb->n_ctx_slot,
	              "n_ubatch", b->rb->n_ubatch, "kv_settings",
	              d->cfg.kv_settings ? d->cfg.kv_settings : "", "schedule", SCHED_LAYOUT);
	/* LoRA adapters and their scales: the server restores a state and
	 * reuses its rows by tokens alone, whatever scales computed them. A
	 * server without adapters keeps the fingerprint it had before. */
	if (fp && b->adapters)
		json_object_set_new(fp, "adapters", json_string(b->adapters));
	char *s = json_dumps(fp, JSON_COMPACT | JSON_SORT_KEYS);
	json_decref(fp);
	bytes_sha256_hex(s ? s : "", s ? strlen(s) : 0, b->rb->fingerprint);
	log_info("backend %s fingerprint %.16s (%s)", b->rb->url, b->rb->fingerprint, s ? s : "");
	free(s);
}

/* ---- files ---- */

static void dir_path(struct daemon *d, const char *name, const char *ext, char *out, size_t n)
{
	snprintf(out, n, "%s/%s%s", d->cfg.slot_dir, name, ext);
}

/* Streams src through zstd (level > 0: compress; 0: decompress) into dst,
 * written as dst.tmp, fsynced and renamed. When hex is given, it gets the
 * XXH3-128 of the uncompressed bytes. */
static int zstd_copy(const char *src, const char *dst, int level, char hex[33])
{
	char tmp[4300];
	snprintf(tmp, sizeof tmp, "%s.tmp", dst);
	FILE *in = fopen(src, "rb");
	FILE *out = in ? fopen(tmp, "wb") : NULL;
	size_t inz = level ? ZSTD_CStreamInSize() : ZSTD_DStreamInSize();
	size_t outz = level ? ZSTD_CStreamOutSize() : ZSTD_DStreamOutSize();
	char *ib = malloc(inz), *ob = malloc(outz);
	ZSTD_CCtx *cc = level ? ZSTD_createCCtx() : NULL;
	ZSTD_DCtx *dc = level ? NULL : ZSTD_createDCtx();
	XXH3_state_t *st = XXH3_createState();
	int ok = in && out && ib && ob && st && (level ? cc != NULL : dc != NULL);
	if (ok) {
		XXH3_128bits_reset(st);
		if (cc)
			ZSTD_CCtx_setParameter(cc, ZSTD_c_compressionLevel, level);
	}
	size_t n;
	while (ok && (n = fread(ib, 1, inz, in)) > 0) {
		int last = n < inz && feof(in);
		if (cc)
			XXH3_128bits_update(st, ib, n);
		ZSTD_inBuffer zin = {ib, n, 0};
		for (;;) {
			ZSTD_outBuffer zout = {ob, outz, 0};
			size_t r = cc ? ZSTD_compressStream2(cc, &zout, &zin,
			                                     last ? ZSTD_e_end : ZSTD_e_continue)
			              : ZSTD_decompressStream(dc, &zout, &zin);
			if (ZSTD_isError(r) || fwrite(ob, 1, zout.pos, out) != zout.pos) {
				ok = 0;
				break;
			}
			if (dc)
				XXH3_128bits_update(st, ob, zout.pos);
			if (cc ? (last ? r == 0 : zin.pos == zin.size)
			       : (zin.pos == zin.size && zout.pos < outz))
				break;
		}
		if (last)
			break;
	}
	if (ok && cc) {
		/* An input whose size is a multiple of the buffer ends here. */
		ZSTD_inBuffer zin = {ib, 0, 0};
		size_t r;
		do {
			ZSTD_outBuffer zout = {ob, outz, 0};
			r = ZSTD_compressStream2(cc, &zout, &zin, ZSTD_e_end);
			if (ZSTD_isError(r) || fwrite(ob, 1, zout.pos, out) != zout.pos)
				ok = 0;
		} while (ok && r != 0);
	}
	ok = ok && in && !ferror(in) && fflush(out) == 0 && fsync(fileno(out)) == 0;
	if (out && fclose(out) != 0)
		ok = 0;
	if (in)
		fclose(in);
	if (ok && hex) {
		XXH128_hash_t h = XXH3_128bits_digest(st);
		snprintf(hex, 33, "%016llx%016llx", (unsigned long long)h.high64,
		         (unsigned long long)h.low64);
	}
	XXH3_freeState(st);
	ZSTD_freeCCtx(cc);
	ZSTD_freeDCtx(dc);
	free(ib);
	free(ob);
	if (ok && rename(tmp, dst) != 0)
		ok = 0;
	if (!ok)
		unlink(tmp);
	return ok ? 0 : -1;
}

void slot_store_delete(struct daemon *d, struct router_saved *e)
{
	if (!d->cfg.slot_dir) {
		/* The server's own folder: the file stays until its name is
		 * used again (slot_store_save), which bounds what it takes. */
		router_saved_remove(d->router, e);
		return;
	}
	char path[4200];
	const char *exts[] = {".bin", ".zst", ".json"};
	for (int i = 0; i < 3; i++) {
		dir_path(d, e->name, exts[i], path, sizeof path);
		if (unlink(path) != 0 && errno != ENOENT)
			log_warn("cannot delete %s: %s", path, strerror(errno));
	}
	router_saved_remove(d->router, e);
}

/* A saved state's schedule from its index: increasing chunk starts. An
 * index without one (written before there were schedules) is on the grid;
 * one that is not a list of increasing starts makes no row exact. */
static int load_bounds(struct router_saved *e, json_t *a)
{
	if (!a)
		return 0;
	size_t n = json_array_size(a);
	if (!json_is_array(a) || n > e->n_tokens)
		return -1;
	size_t *b = malloc((n ? n : 1) * sizeof *b);
	if (!b)
		return -1;
	json_int_t prev = 0;
	for (size_t i = 0; i < n; i++) {
		json_t *v = json_array_get(a, i);
		if (!json_is_integer(v) || json_integer_value(v) <= prev) {
			free(b);
			return -1;
		}
		prev = json_integer_value(v);
		b[i] = (size_t)prev;
	}
	int rc = router_saved_set_bounds(e, b, n);
	free(b);
	return rc;
}

static int write_sidecar(struct daemon *d, struct router_saved *e, const char *checksum)
{
	json_t *toks = json_array();
	for (size_t i = 0; i < e->n_tokens; i++)
		json_array_append_new(toks, json_integer(e->tokens[i]));
	json_t *o = json_pack("{s:i, s:s, s:s, s:I, s:I, s:I, s:i, s:o}", "version", 1,
	                      "fingerprint", e->fingerprint, "xxh128", checksum, "bytes",
	                      (json_int_t)e->bytes, "n_tokens", (json_int_t)e->n_tokens, "aligned",
	                      (json_int_t)e->aligned, "hits", (int)e->hits, "tokens", toks);
	json_object_set_new(o, "compressed", json_boolean(e->compressed));
	/* The arithmetic of the server that wrote it (router_saved.bits). */
	json_object_set_new(o, "bits", json_string(e->bits));
	/* The schedule the rows were computed on (exact mode's chunk starts;
	 * none: the grid). */
	json_t *bounds = json_array();
	for (size_t i = 0; i < e->n_bounds; i++)
		json_array_append_new(bounds, json_integer((json_int_t)e->bounds[i]));
	json_object_set_new(o, "bounds", bounds);
	char path[4200], tmp[4300];
	dir_path(d, e->name, ".json", path, sizeof path);
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	int rc = -1;
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd >= 0) {
		rc = json_dumpfd(o, fd, JSON_COMPACT) == 0 && fsync(fd) == 0 ? 0 : -1;
		close(fd);
	}
	json_decref(o);
	if (rc == 0 && rename(tmp, path) != 0)
		rc = -1;
	if (rc != 0)
		unlink(tmp);
	return rc;
}

/* ---- saving ---- */

struct save_op {
	struct daemon *d;
	struct backend *b;
	struct router_slot *slot;
	/* What the slot held when the save began: the file holds that, whatever
	 * happens to the slot meanwhile. */
	token_t *tokens;
	size_t n_tokens, aligned;
	size_t *bounds, n_bounds;
	unsigned hits;
	char name[96];
	int remote_k; /* without --slot-dir: the name's number (remote_name) */
	slot_store_done_fn done;
	void *arg;
	int64_t t0;
};

static void save_finish(struct save_op *op, struct router_saved *e)
{
	if (op->done)
		op->done(e, op->arg);
	free(op->tokens);
	free(op->bounds);
	free(op);
}

/* The router's record of what a finished save holds (written by this
 * daemon, so checked), and the slot's link to it while it holds the same. */
static struct router_saved *index_saved(struct save_op *op, uint64_t bytes)
{
	struct router_saved *e =
	    router_saved_add_tokens(op->d->router, op->b->rb, op->name, op->tokens, op->n_tokens,
	                            op->aligned, bytes, op->hits, clock_now_us());
	if (!e)
		return NULL;
	if (router_saved_set_bounds(e, op->bounds, op->n_bounds) != 0)
		e->aligned = 0; /* out of memory: the rows' schedule is unknown */
	e->verified = 1;
	struct router_slot *s = op->slot;
	if (s->n_tokens == op->n_tokens &&
	    !memcmp(s->tokens, op->tokens, op->n_tokens * sizeof *op->tokens))
		s->saved = e;
	return e;
}

/* A save into the server's own folder (no --slot-dir): toki cannot see the
 * file, so it keeps what the server said it wrote, and no index on disk. */
static void save_remote_done(struct save_op *op, long long written, double ms)
{
	struct daemon *d = op->d;
	op->b->remote_bytes[op->remote_k] = written > 0 ? (uint64_t)written : 1;
	router_backend_note_save(op->b->rb, (uint64_t)written, ms);
	struct router_saved *e = index_saved(op, (uint64_t)written);
	if (e) {
		snprintf(e->fingerprint, sizeof e->fingerprint, "%s", op->b->rb->fingerprint);
		snprintf(e->bits, sizeof e->bits, "%s", op->b->rb->bits);
		d->stats.saves++;
		log_info("saved slot %d as %s in the server's folder (%zu tokens, %lld bytes, "
		         "%.1f ms)",
		         op->slot->id, e->name, e->n_tokens, written,
		         (double)(clock_now_us() - op->t0) / 1000.0);
		e->pinned++;
		slot_store_enforce_budget(d);
		e->pinned--;
	}
	save_finish(op, e);
}

static void on_save_done(struct backend_call *call, int status, const char *body, size_t len,
                         void *arg)
{
	struct save_op *op = arg;
	struct daemon *d = op->d;
	json_t *o = json_body(status, body, len, -1);
	long long written = json_integer_value(json_object_get(o, "n_written"));
	double ms = json_number_value(json_object_get(json_object_get(o, "timings"), "save_ms"));
	json_decref(o);
	if (o && !d->cfg.slot_dir) {
		save_remote_done(op, written, ms);
		return;
	}
	char part[4200], bin[4200];
	dir_path(d, op->name, ".part", part, sizeof part);
	dir_path(d, op->name, ".bin", bin, sizeof bin);
	if (!o) {
		if (status == 501) {
			log_warn("backend %s has no --slot-save-path: slot files are off for it",
			         op->b->rb->url);
			op->b->rb->can_save = 0;
		} else {
			log_warn("saving slot %d failed (%d): %.*s", op->slot->id, status,
			         (int)(len > 200 ? 200 : len), body);
		}
		unlink(part);
		save_finish(op, NULL);
		return;
	}
	/* The server wrote the .part; make it durable and checked before it
	 * gets its final name. */
	char sum[33];
	int fd = open(part, O_RDONLY | O_CLOEXEC);
	int ok = fd >= 0 && fsync(fd) == 0;
	if (fd >= 0)
		close(fd);
	ok = ok && hash_file(part, sum) == 0 && rename(part, bin) == 0;
	if (!ok) {
		log_warn("slot file %s could not be finished (%s); is --slot-dir the backend's "
		         "--slot-save-path?",
		         part, strerror(errno));
		unlink(part);
		save_finish(op, NULL);
		return;
	}
	uint64_t stored = (uint64_t)written;
	int compressed = 0;
	if (d->cfg.slot_compress > 0) {
		char zst[4200];
		dir_path(d, op->name, ".zst", zst, sizeof zst);
		struct stat zs;
		if (zstd_copy(bin, zst, d->cfg.slot_compress, NULL) == 0 && stat(zst, &zs) == 0) {
			unlink(bin);
			stored = (uint64_t)zs.st_size;
			compressed = 1;
		} else {
			log_warn("compressing %s failed: kept as it is", bin);
		}
	}
	plat_fsync_dir(d->cfg.slot_dir);
	router_backend_note_save(op->b->rb, (uint64_t)written, ms);
	struct router_saved *e = index_saved(op, stored);
	if (e)
		e->compressed = compressed;
	if (!e) {
		unlink(bin);
		dir_path(d, op->name, ".zst", bin, sizeof bin);
		unlink(bin);
		save_finish(op, NULL);
		return;
	}
	snprintf(e->fingerprint, sizeof e->fingerprint, "%s", op->b->rb->fingerprint);
	snprintf(e->bits, sizeof e->bits, "%s", op->b->rb->bits);
	if (write_sidecar(d, e, sum) != 0) {
		log_warn("cannot write the index file of %s: %s", e->name, strerror(errno));
		slot_store_delete(d, e);
		save_finish(op, NULL);
		return;
	}
	plat_fsync_dir(d->cfg.slot_dir);
	d->stats.saves++;
	log_info("saved slot %d as %s (%zu tokens, %lld bytes, %.1f ms)", op->slot->id, e->name,
	         e->n_tokens, written, (double)(clock_now_us() - op->t0) / 1000.0);
	/* Older states make room first; a state larger than the whole cap
	 * does not stay. */
	e->pinned++;
	slot_store_enforce_budget(d);
	e->pinned--;
	if (d->router->saved_bytes > d->cfg.slot_disk_bytes) {
		d->stats.saved_evictions++;
		log_info("slot file %s evicted (%llu bytes): larger than the disk cap", e->name,
		         (unsigned long long)e->bytes);
		slot_store_delete(d, e);
		e = NULL;
	}
	save_finish(op, e);
}

static void on_save_error(struct backend_call *call, enum backend_error err, void *arg)
{
	struct save_op *op = arg;
	log_warn("saving slot %d failed: %s", op->slot->id, backend_error_text(err));
	save_finish(op, NULL);
}

static const struct backend_call_handlers save_handlers = {
    .on_done = on_save_done,
    .on_error = on_save_error,
};

/* Without --slot-dir toki saves into the server's --slot-save-path, which
 * it cannot list or clean. Its files there are toki-<settings>-n<k>.bin,
 * k < SLOT_REMOTE_MAX_NAMES; toki remembers what it wrote under each, and
 * takes, in this order: a name whose file it no longer keeps a state for
 * (overwriting it costs no room), a new name while everything it wrote
 * there, and this state, stay within the byte cap, the least valuable
 * state's name. A toki started again with the same settings uses the same
 * names, so the folder never holds more of toki's than that. Returns the
 * name's number, or -1 when every name is in use right now. */
static int remote_name(struct daemon *d, struct backend *b, const struct router_slot *s, char *out,
                       size_t n)
{
	uint64_t total = 0;
	for (int k = 0; k < SLOT_REMOTE_MAX_NAMES; k++)
		total += b->remote_bytes[k];
	uint64_t est = (uint64_t)(b->rb->kv_bytes_per_token * (double)s->n_tokens);
	for (int pass = 0; pass < 2; pass++) {
		for (int k = 0; k < SLOT_REMOTE_MAX_NAMES; k++) {
			snprintf(out, n, "toki-%.12s-n%d", b->rb->fingerprint, k);
			int used = b->remote_bytes[k] != 0;
			if (router_saved_find(d->router, out) || used != (pass == 0))
				continue;
			if (pass == 1 && total + est > d->cfg.slot_disk_bytes)
				break;
			return k;
		}
	}
	struct router_saved *victim = router_saved_victim_on(d->router, b->rb);
	if (!victim)
		return -1;
	const char *num = strrchr(victim->name, 'n');
	int k = num ? atoi(num + 1) : -1;
	if (k < 0 || k >= SLOT_REMOTE_MAX_NAMES)
		return -1;
	snprintf(out, n, "%s", victim->name);
	d->stats.saved_evictions++;
	router_saved_remove(d->router, victim);
	return k;
}

int slot_store_save(struct daemon *d, struct backend *b, struct router_slot *s,
                    slot_store_done_fn done, void *arg)
{
	if (!b->rb->can_save || !s->n_tokens)
		return -1;
	struct save_op *op = calloc(1, sizeof *op);
	if (!op)
		return -1;
	op->d = d;
	op->b = b;
	op->slot = s;
	op->done = done;
	op->arg = arg;
	op->t0 = clock_now_us();
	op->tokens = malloc(s->n_tokens * sizeof *op->tokens);
	if (!op->tokens) {
		free(op);
		return -1;
	}
	memcpy(op->tokens, s->tokens, s->n_tokens * sizeof *op->tokens);
	op->n_tokens = s->n_tokens;
	op->aligned = s->aligned;
	if (s->n_bounds) {
		op->bounds = malloc(s->n_bounds * sizeof *op->bounds);
		if (op->bounds) {
			memcpy(op->bounds, s->bounds, s->n_bounds * sizeof *op->bounds);
			op->n_bounds = s->n_bounds;
		} else {
			op->aligned = 0; /* without its schedule, no row is exact */
		}
	}
	op->hits = s->hits;
	if (d->cfg.slot_dir)
		snprintf(op->name, sizeof op->name, "toki-%.12s-%llx-%llx", b->rb->fingerprint,
		         (unsigned long long)d->started_us, (unsigned long long)++d->save_counter);
	else if ((op->remote_k = remote_name(d, b, s, op->name, sizeof op->name)) < 0) {
		free(op->tokens);
		free(op->bounds);
		free(op);
		return -1;
	} else if (!b->remote_bytes[op->remote_k]) {
		b->remote_bytes[op->remote_k] = 1; /* taken: no other save picks it */
	}
	char path[64], filename[128];
	snprintf(path, sizeof path, "/slots/%d?action=save", s->id);
	/* Into toki's own folder as a .part, renamed once checked; into the
	 * server's, straight under its name (toki cannot rename it there). */
	snprintf(filename, sizeof filename, "%s%s", op->name, d->cfg.slot_dir ? ".part" : ".bin");
	json_t *req = json_pack("{s:s}", "filename", filename);
	char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
	json_decref(req);
	struct backend_call *call =
	    body ? backend_call_start(b->http, "POST", path, body, strlen(body), &save_handlers, op)
	         : NULL;
	free(body);
	if (!call) {
		free(op->tokens);
		free(op->bounds);
		free(op);
		return -1;
	}
	return 0;
}

/* ---- checking and loading ---- */

static json_t *read_sidecar(struct daemon *d, const char *name)
{
	char path[4200];
	dir_path(d, name, ".json", path, sizeof path);
	json_error_t jerr;
	json_t *o = json_load_file(path, 0, &jerr);
	if (!json_is_object(o)) {
		json_decref(o);
		return NULL;
	}
	return o;
}

int slot_store_verify(struct daemon *d, struct router_saved *e)
{
	if (!d->cfg.slot_dir)
		return 0; /* out of sight: the server's restore says if it is gone */
	char bin[4200], stored[4200];
	dir_path(d, e->name, ".bin", bin, sizeof bin);
	dir_path(d, e->name, e->compressed ? ".zst" : ".bin", stored, sizeof stored);
	struct stat st;
	const char *why = NULL;
	if (stat(stored, &st) != 0)
		why = "missing";
	else if ((uint64_t)st.st_size != e->bytes)
		why = "truncated (size differs)";
	else if (e->compressed || !e->verified) {
		json_t *o = read_sidecar(d, e->name);
		const char *want = json_string_value(json_object_get(o, "xxh128"));
		char got[33] = "";
		/* A compressed state is expanded for every restore; the checksum
		 * of what comes out is checked each time, at no extra read. */
		int rc = e->compressed ? zstd_copy(stored, bin, 0, got) : hash_file(bin, got);
		if (!want || rc != 0 || strcmp(want, got) != 0)
			why = "corrupted (checksum differs)";
		json_decref(o);
	}
	if (why) {
		log_warn("slot file %s is %s: discarded", e->name, why);
		d->stats.discarded_files++;
		slot_store_delete(d, e);
		return -1;
	}
	e->verified = 1;
	return 0;
}

void slot_store_restored(struct daemon *d, struct router_saved *e)
{
	/* The expanded copy stays while another restore of it is in flight
	 * (each pins the state): that server may not have opened it yet. */
	if (!e->compressed || !d->cfg.slot_dir || e->pinned > 1)
		return;
	char bin[4200];
	dir_path(d, e->name, ".bin", bin, sizeof bin);
	unlink(bin);
}

static void load_from_disk(struct daemon *d, struct backend *b)
{
	DIR *dir = opendir(d->cfg.slot_dir);
	if (!dir)
		return;
	struct dirent *de;
	int loaded = 0, dropped = 0;
	while ((de = readdir(dir))) {
		size_t l = strlen(de->d_name);
		if (l < 6 || strcmp(de->d_name + l - 5, ".json") != 0 ||
		    strncmp(de->d_name, "toki-", 5) != 0)
			continue;
		char name[96];
		if (l - 5 >= sizeof name)
			continue;
		memcpy(name, de->d_name, l - 5);
		name[l - 5] = '\0';
		if (router_saved_find(d->router, name))
			continue;
		json_t *o = read_sidecar(d, name);
		const char *fp = json_string_value(json_object_get(o, "fingerprint"));
		json_t *toks = json_object_get(o, "tokens");
		size_t n = json_array_size(toks);
		/* The index must also describe the file beside it: a damaged one
		 * that claimed any size or grid length would skew the learned KV
		 * size and the disk budget until the next save. */
		char data_path[4200];
		struct stat ds;
		dir_path(d, name, json_is_true(json_object_get(o, "compressed")) ? ".zst" : ".bin",
		         data_path, sizeof data_path);
		int fits =
		    lstat(data_path, &ds) == 0 && S_ISREG(ds.st_mode) &&
		    json_integer_value(json_object_get(o, "bytes")) == (json_int_t)ds.st_size &&
		    json_integer_value(json_object_get(o, "aligned")) >= 0 &&
		    (size_t)json_integer_value(json_object_get(o, "aligned")) <= n;
		if (!o || !fp || strcmp(fp, b->rb->fingerprint) != 0 || !n || !fits ||
		    (size_t)json_integer_value(json_object_get(o, "n_tokens")) != n) {
			/* Made under another model, build or KV setting (or
			 * unreadable): never loaded. With one backend nothing
			 * else could use it, so it goes. */
			if (d->n_backends == 1) {
				char path[4200];
				log_warn("slot file %s does not match this backend (%s): discarded",
				         name,
				         !o      ? "unreadable index"
				         : !fits ? "its index does not describe the file"
				                 : "fingerprint differs");
				dir_path(d, name, ".json", path, sizeof path);
				unlink(path);
				dir_path(d, name, ".bin", path, sizeof path);
				unlink(path);
				dir_path(d, name, ".zst", path, sizeof path);
				unlink(path);
				d->stats.discarded_files++;
				dropped++;
			}
			json_decref(o);
			continue;
		}
		token_t *t = malloc(n * sizeof *t);
		if (t) {
			for (size_t i = 0; i < n; i++)
				t[i] = (token_t)json_integer_value(json_array_get(toks, i));
			struct router_saved *e = router_saved_add_tokens(
			    d->router, b->rb, name, t, n,
			    (size_t)json_integer_value(json_object_get(o, "aligned")),
			    (uint64_t)json_integer_value(json_object_get(o, "bytes")),
			    (unsigned)json_integer_value(json_object_get(o, "hits")),
			    clock_now_us());
			if (e && load_bounds(e, json_object_get(o, "bounds")) != 0)
				e->aligned = 0;
			if (e) {
				snprintf(e->fingerprint, sizeof e->fingerprint, "%s", fp);
				const char *bits = json_string_value(json_object_get(o, "bits"));
				snprintf(e->bits, sizeof e->bits, "%s",
				         bits && strlen(bits) < sizeof e->bits ? bits : "");
				e->compressed = json_is_true(json_object_get(o, "compressed"));
				loaded++;
			}
			free(t);
		}
		json_decref(o);
	}
	closedir(dir);
	if (loaded || dropped)
		log_info("slot files: %d states indexed from %s, %d discarded", loaded,
		         d->cfg.slot_dir, dropped);
	slot_store_enforce_budget(d);
}

void slot_store_backend_ready(struct daemon *d, struct backend *b, const char *model_path)
{
	compute_fingerprint(d, b, model_path);
	if (!b->rb->can_save)
		return;
	/* States of this backend made under other settings (it came back with
	 * another model or context) are dropped. */
	struct router_saved *e = d->router->saved_head;
	while (e) {
		struct router_saved *next = e->next;
		if (e->backend == b->rb && strcmp(e->fingerprint, b->rb->fingerprint) != 0 &&
		    !e->pinned) {
			log_warn("slot file %s was made under other settings: discarded", e->name);
			d->stats.discarded_files++;
			slot_store_delete(d, e);
		}
		e = next;
	}
	if (d->cfg.slot_dir)
		load_from_disk(d, b);
}

/* ---- idle and shutdown saves ---- */

struct idle_save {
	struct daemon *d;
	struct router_slot *slot;
};

static void idle_save_done(struct router_saved *e, void *arg)
{
	struct idle_save *is = arg;
	struct daemon *d = is->d;
	int index = is->slot->backend->index;
	router_slot_end(d->router, is->slot, clock_now_us());
	d->saving = 0;
	free(is);
	daemon_slots_changed(d, index);
}

/* A slot worth a file: long enough, not on disk already, idle. */
/* An idle save keeps what is long enough to cost more to recompute than to
 * restore (the router's save_min_tokens); a shutdown keeps everything, since
 * what it does not save is lost (a swap out of the endpoint, a restart). */
static int worth_saving(struct daemon *d, struct router_slot *s, size_t min_tokens)
{
	return !s->busy && !s->saved && s->n_tokens > 0 && s->n_tokens >= min_tokens;
}

void slot_store_tick(struct daemon *d)
{
	if (!d->cfg.slot_dir || d->saving || d->shutting_down || d->cfg.save_idle_ms <= 0)
		return;
	int64_t now = clock_now_us();
	for (int i = 0; i < d->n_backends; i++) {
		struct backend *b = d->backends[i];
		if (!b->rb->up || !b->rb->can_save)
			continue;
		/* Exact mode runs one thing at a time on a backend. */
		if (reuse_mode_is_exact(d->router->mode) && b->rb->in_flight > 0)
			continue;
		for (int k = 0; k < b->rb->n_slots; k++) {
			struct router_slot *s = &b->rb->slots[k];
			if (!worth_saving(d, s, d->router->save_min_tokens) ||
			    now - s->last_used_us < (int64_t)d->cfg.save_idle_ms * 1000)
				continue;
			struct idle_save *is = calloc(1, sizeof *is);
			if (!is)
				return;
			is->d = d;
			is->slot = s;
			int64_t last = s->last_used_us;
			router_slot_begin(d->router, s, now, 0);
			s->last_used_us = last; /* a save is not a use */
			if (slot_store_save(d, b, s, idle_save_done, is) != 0) {
				router_slot_end(d->router, s, last);
				s->last_used_us = last;
				free(is);
				continue;
			}
			d->saving = 1;
			return; /* one at a time */
		}
	}
}

struct save_all {
	struct daemon *d;
	int pending;
	void (*done)(void *arg);
	void *arg;
	struct event *timeout;
	int finished;
};

static void save_all_finish(struct save_all *sa)
{
	if (sa->finished)
		return;
	sa->finished = 1;
	if (sa->timeout)
		event_del(sa->timeout);
	sa->done(sa->arg);
}

static void save_all_one_done(struct router_saved *e, void *arg)
{
	struct save_all *sa = arg;
	if (--sa->pending == 0)
		save_all_finish(sa);
}

static void save_all_timeout(evutil_socket_t fd, short what, void *arg)
{
	struct save_all *sa = arg;
	log_warn("shutdown: %d slot saves still running after the time limit", sa->pending);
	save_all_finish(sa);
}

void slot_store_save_all(struct daemon *d, int timeout_s, void (*done)(void *arg), void *arg)
{
	/* Owned by the daemon until the loop ends (it may outlive a timeout). */
	struct save_all *sa = calloc(1, sizeof *sa);
	if (!sa) {
		done(arg);
		return;
	}
	sa->d = d;
	sa->done = done;
	sa->arg = arg;
	d->save_all = sa;
	for (int i = 0; d->cfg.slot_dir && i < d->n_backends; i++) {
		struct backend *b = d->backends[i];
		if (!b->rb->up || !b->rb->can_save)
			continue;
		for (int k = 0; k < b->rb->n_slots; k++) {
			struct router_slot *s = &b->rb->slots[k];
			if (!worth_saving(d, s, 1))
				continue;
			sa->pending++;
			if (slot_store_save(d, b, s, save_all_one_done, sa) != 0)
				sa->pending--;
		}
	}
	if (!sa->pending) {
		save_all_finish(sa);
		return;
	}
	log_info("shutdown: saving %d slot%s", sa->pending, sa->pending == 1 ? "" : "s");
	sa->timeout = evtimer_new(d->base, save_all_timeout, sa);
	struct timeval tv = {timeout_s, 0};
	if (sa->timeout)
		evtimer_add(sa->timeout, &tv);
}

void slot_store_free_pending(struct daemon *d)
{
	struct save_all *sa = d->save_all;
	if (!sa)
		return;
	if (sa->timeout)
		event_free(sa->timeout);
	free(sa);
	d->save_all = NULL;
}

void slot_store_enforce_budget(struct daemon *d)
{
	while (d->router->saved_bytes > d->cfg.slot_disk_bytes) {
		struct router_saved *e = router_saved_victim(d->router);
		if (!e)
			break;
		d->stats.saved_evictions++;
		log_info("slot file %s evicted (%zu tokens, %llu bytes): over the disk cap",
		         e->name, e->n_tokens, (unsigned long long)e->bytes);
		slot_store_delete(d, e);
	}
}
