/* Logging to stderr with a timestamp and a level. The level is read once
 * from TOKI_LOG (error|warn|info|debug) by log_init(). */
#ifndef TOKI_LOG_H
#define TOKI_LOG_H

enum log_level { LOG_ERROR = 0, LOG_WARN, LOG_INFO, LOG_DEBUG };

void log_init(void);
void log_set_level(enum log_level level);
int log_enabled(enum log_level level);
void log_write(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_error(...) log_write(LOG_ERROR, __VA_ARGS__)
#define log_warn(...) log_write(LOG_WARN, __VA_ARGS__)
#define log_info(...) log_write(LOG_INFO, __VA_ARGS__)
#define log_debug(...)                                                                             \
	do {                                                                                       \
		if (log_enabled(LOG_DEBUG))                                                        \
			log_write(LOG_DEBUG, __VA_ARGS__);                                         \
	} while (0)

#endif
