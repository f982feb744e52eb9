/* /metrics: one Prometheus scrape for the fleet. toki's own series
 * (toki_*, each backend's with a backend label) and every backend's own
 * llama-server series (llamacpp:*, started with --metrics), each sample
 * labelled with the backend it came from; docs/metrics.md lists them. */
#ifndef TOKI_API_METRICS_H
#define TOKI_API_METRICS_H

#include <stddef.h>

#include "util/strbuf.h"

struct daemon;
struct http_request;

/* Answers the request once every backend that is up has answered its own
 * /metrics (or failed: it is then left out, and toki_backend_metrics_up
 * says so). */
void metrics_handle(struct daemon *d, struct http_request *req);

/* Prometheus text expositions merged into one: each family's HELP and
 * TYPE once, then its samples from every exposition added, each with a
 * backend="..." label first (the format wants a family's lines together). */
struct metrics_merge;
struct metrics_merge *metrics_merge_new(void);
void metrics_merge_free(struct metrics_merge *m);
/* Adds one exposition. Lines that are not HELP, TYPE or a sample are
 * dropped. 0, or -1 when out of memory. */
int metrics_merge_add(struct metrics_merge *m, const char *text, size_t len, const char *backend);
/* Appends the merged exposition to out. 0, or -1 when out of memory. */
int metrics_merge_write(const struct metrics_merge *m, struct strbuf *out);

/* Appends s as a label value: backslash, double quote and newline escaped. */
int metrics_label_value(struct strbuf *out, const char *s);

/* toki's own series, appended to out. 0, or -1 when out of memory. */
int metrics_write_toki(struct daemon *d, const int *backend_metrics_up, struct strbuf *out);

#endif
