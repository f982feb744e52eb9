#include "daemon.h"

#include <event2/event.h>

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
	(void)fd;
	(void)what;
	struct daemon *d = arg;
	uint64_t changed = d->changed;
	d->changed = 0;
	if (d->on_slots_changed && d->n_waiting)
		d->on_slots_changed(d, changed);
}

void daemon_slots_changed(struct daemon *d, int index)
{
	/* Backends past 63 share the masks' last meaning: any. */
	d->changed |= index >= 0 && index < 64 ? (uint64_t)1 << index : ~(uint64_t)0;
	if (!d->wake)
		d->wake = event_new(d->base, -1, 0, on_wake, d);
	if (d->wake)
		event_active(d->wake, 0, 0);
	else
		on_wake(-1, 0, d); /* out of memory: now rather than never */
}

void daemon_free_events(struct daemon *d)
{
	if (d->wake)
		event_free(d->wake);
	d->wake = NULL;
}
