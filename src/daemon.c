#include "daemon.h"

#include "api/proxy.h"
#include "backend/backend.h"

void daemon_slots_changed(struct daemon *d)
{
	if (d->waiting_head)
		proxy_retry_waiting(d);
}

struct backend *daemon_any_backend(struct daemon *d)
{
	for (int i = 0; i < d->n_backends; i++)
		if (backend_is_up(d->backends[i]))
			return d->backends[i];
	return NULL;
}
