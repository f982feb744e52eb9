/* The slot-file index: the <name>.json sidecar beside each saved KV state in
 * --slot-dir, read back when toki starts (src/backend/slot_store.c,
 * load_from_disk and read_sidecar, which are static). The file is on disk
 * and may be damaged, truncated or edited. This repeats what load_from_disk
 * does with it, field for field, then indexes the state in a real router
 * (router_saved_add_tokens) and routes requests against it, restores it into
 * a slot and evicts it, as the daemon would next. Keep in step with
 * slot_store.c. */
#include <stdint.h>
#include <string.h>

#include "fuzz_common.h"
#include "router/router.h"

#define FINGERPRINT "cf332ffab67a651890281bcc70cd9a5d3c44bf8846615f3e43f701abff238e4c"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	json_error_t jerr;
	/* read_sidecar: json_load_file, then "must be an object". */
	json_t *o = json_loadb((const char *)data, size, 0, &jerr);
	if (!json_is_object(o)) {
		json_decref(o);
		return 0;
	}
	/* load_from_disk's checks. */
	const char *fp = json_string_value(json_object_get(o, "fingerprint"));
	json_t *toks = json_object_get(o, "tokens");
	size_t n = json_array_size(toks);
	if (!fp || strcmp(fp, FINGERPRINT) != 0 || !n ||
	    (size_t)json_integer_value(json_object_get(o, "n_tokens")) != n) {
		json_decref(o);
		return 0;
	}
	token_t *t = malloc(n * sizeof *t);
	FUZZ_CHECK(t != NULL);
	for (size_t i = 0; i < n; i++)
		t[i] = (token_t)json_integer_value(json_array_get(toks, i));

	struct router *r = router_new((size & 1) ? REUSE_FAST : REUSE_EXACT);
	FUZZ_CHECK(r != NULL);
	struct router_backend *b = router_add_backend(r, "http://127.0.0.1:1");
	FUZZ_CHECK(b != NULL);
	int ubatch = (size & 2) ? 64 : 512;
	FUZZ_CHECK(router_backend_set_slots(r, b, 2, 8192, ubatch) == 0);
	router_backend_set_up(r, b, 1);
	b->can_save = 1;

	struct router_saved *e = router_saved_add_tokens(
		r, b, "toki-cf332ffab67a-e7ae9c12-1", t, n,
		(size_t)json_integer_value(json_object_get(o, "aligned")),
		(uint64_t)json_integer_value(json_object_get(o, "bytes")),
		(unsigned)json_integer_value(json_object_get(o, "hits")), 1000000);
	if (e) {
		snprintf(e->fingerprint, sizeof e->fingerprint, "%s", fp);
		e->compressed = json_is_true(json_object_get(o, "compressed"));
		FUZZ_CHECK(router_saved_find(r, e->name) == e);

		/* Requests that continue the saved conversation, repeat it, or
		 * share only its start. */
		size_t lens[3] = {n, n > 1 ? n / 2 : 1, n};
		for (int k = 0; k < 3; k++) {
			size_t m = lens[k] + (k == 2 ? 7 : 0);
			token_t *req = malloc(m * sizeof *req);
			FUZZ_CHECK(req != NULL);
			for (size_t i = 0; i < m; i++)
				req[i] = i < n ? t[i] : (token_t)(100 + i);
			struct route_choice c;
			memset(&c, 0, sizeof c);
			enum route_status st = router_choose(r, req, m, 2000000 + k, -1, &c);
			if (st == ROUTE_CHOSEN) {
				FUZZ_CHECK(c.slot != NULL);
				FUZZ_CHECK(c.reuse <= m);
				FUZZ_CHECK(c.matched <= m);
				if (c.restore) {
					FUZZ_CHECK(c.restore == e);
					/* The state goes into the slot, which now holds
					 * its tokens; then the request runs there. */
					router_slot_begin(r, c.slot, 2000000 + k, c.est_prefill_s);
					FUZZ_CHECK(router_slot_restored(r, c.slot, e, 2000000 + k) == 0);
					FUZZ_CHECK(c.slot->n_tokens == e->n_tokens);
					size_t reuse = router_exact_reuse(m < n ? m : n, c.slot->aligned,
									  m, ubatch);
					FUZZ_CHECK(reuse < m);
					FUZZ_CHECK(router_slot_commit(r, c.slot, req, m, reuse,
								      2000000 + k) == 0);
					router_slot_end(r, c.slot, 2000000 + k);
				} else {
					router_slot_begin(r, c.slot, 2000000 + k, c.est_prefill_s);
					if (c.must_trim)
						router_slot_truncate(r, c.slot, c.reuse);
					FUZZ_CHECK(router_slot_commit(r, c.slot, req, m, c.reuse,
								      2000000 + k) == 0);
					router_slot_end(r, c.slot, 2000000 + k);
				}
			}
			free(req);
		}
		/* Evicted, or still indexed when the daemon shuts down
		 * (router_free must then free it). */
		struct router_saved *v = router_saved_victim(r);
		if (v && (size & 4))
			router_saved_remove(r, v);
	}
	free(t);
	json_decref(o);
	router_free(r);
	return 0;
}
