#include "daemon.h"

#include <event2/event.h>

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "api/proxy.h"
#include "backend/backend.h"
#include "backend/slot_store.h"
#include "util/log.h"

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	struct daemon *d = arg;
	if (d->waiting_head)
		proxy_retry_waiting(d);
}

void daemon_slots_changed(struct daemon *d)
{
	if (!d->wake)
		d->wake = event_new(d->base, -1, 0, on_wake, d);
	if (d->wake)
		event_active(d->wake, 0, 0);
	else if (d->waiting_head)
		proxy_retry_waiting(d); /* out of memory: now rather than never */
}

void daemon_free_events(struct daemon *d)
{
	if (d->wake)
		event_free(d->wake);
	d->wake = NULL;
}

struct backend *daemon_any_backend(struct daemon *d)
{
	for (int i = 0; i < d->n_backends; i++)
		if (backend_is_up(d->backends[i]))
			return d->backends[i];
	return NULL;
}

void daemon_saved_delete(struct daemon *d, struct router_saved *e)
{
	slot_store_delete(d, e);
}

void daemon_saved_enforce_budget(struct daemon *d)
{
	while (d->router->saved_bytes > d->cfg.slot_disk_bytes) {
		struct router_saved *e = router_saved_victim(d->router);
		if (!e)
			break;
		d->stats.saved_evictions++;
		log_info("slot file %s evicted (%zu tokens, %llu bytes): over the disk cap", e->name,
			 e->n_tokens, (unsigned long long)e->bytes);
		daemon_saved_delete(d, e);
	}
}
