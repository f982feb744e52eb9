#ifndef TOKI_CLOCK_H
#define TOKI_CLOCK_H
#include <stdint.h>
#include <time.h>

/* Monotonic time in microseconds: all latencies and rates use this clock. */
static inline int64_t clock_now_us(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}
#endif
