#include "util/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The one piece of process-wide state outside the daemon context: the log
 * level is a property of the process, set once at start-up. */
static enum log_level current_level = LOG_INFO;

void log_init(void)
{
	const char *s = getenv("TOKI_LOG");
	if (!s)
		return;
	if (!strcmp(s, "error"))
		current_level = LOG_ERROR;
	else if (!strcmp(s, "warn"))
		current_level = LOG_WARN;
	else if (!strcmp(s, "info"))
		current_level = LOG_INFO;
	else if (!strcmp(s, "debug"))
		current_level = LOG_DEBUG;
}

void log_set_level(enum log_level level)
{
	current_level = level;
}

int log_enabled(enum log_level level)
{
	return level <= current_level;
}

void log_write(enum log_level level, const char *fmt, ...)
{
	static const char *names[] = {"error", "warn", "info", "debug"};
	if (!log_enabled(level))
		return;
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	gmtime_r(&ts.tv_sec, &tm);
	char stamp[32];
	strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%S", &tm);
	char line[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof line, fmt, ap);
	va_end(ap);
	fprintf(stderr, "%s.%03ldZ toki %s: %s\n", stamp, ts.tv_nsec / 1000000, names[level], line);
}
