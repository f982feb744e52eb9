/* A llama-server that toki starts and keeps running: spawned as a child,
 * restarted with backoff when it dies (the death is logged and counted),
 * stopped with SIGTERM (then SIGKILL) when the daemon stops. */
#ifndef TOKI_SUPERVISE_H
#define TOKI_SUPERVISE_H

#include <event2/event.h>
#include <sys/types.h>

struct supervisor;

/* argv is copied; argv[0] is the binary. log_path receives the child's
 * stdout and stderr (appended). env_extra: NULL or "NAME=value" strings
 * added to the child's environment (e.g. HSA_OVERRIDE_GFX_VERSION). */
struct supervisor *supervisor_new(struct event_base *base, char *const argv[], const char *log_path,
                                  char *const env_extra[]);
/* Called when the child dies unexpectedly, before the restart is scheduled. */
void supervisor_on_exit(struct supervisor *s, void (*fn)(void *arg), void *arg);
int supervisor_start(struct supervisor *s, char *err, size_t errlen);
/* Stops the child and waits for it (up to timeout_s, then SIGKILL). */
void supervisor_stop(struct supervisor *s, int timeout_s);
void supervisor_free(struct supervisor *s);
/* Stops the child (as supervisor_stop) and starts it again at once with
 * env ("NAME=value") added to its environment: a deliberate restart, not
 * counted among the restarts. 0, or -1 with err set. */
int supervisor_restart_with(struct supervisor *s, const char *env, char *err, size_t errlen);
/* Whether the binary's device list (llama-server --list-devices, run now
 * with the child's environment) names text. */
int supervisor_devices_mention(const struct supervisor *s, const char *text);
/* What the child runs, as a JSON object (a new reference, or NULL when out
 * of memory): its argv (the value of --port left out: it is picked at each
 * start), its added environment, and its binary's size and mtime. What a verdict about this server,
 * kept across its restarts, is keyed by (selftest.c). */
struct json_t;
struct json_t *supervisor_describe(const struct supervisor *s);
pid_t supervisor_pid(const struct supervisor *s);
int supervisor_restarts(const struct supervisor *s);

#endif
