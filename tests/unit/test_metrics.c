/* Unit tests for merging Prometheus expositions (src/api/metrics.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api/metrics.h"

static char *merged(const char *a, const char *la, const char *b, const char *lb)
{
	struct metrics_merge *m = metrics_merge_new();
	assert_non_null(m);
	assert_int_equal(metrics_merge_add(m, a, strlen(a), la), 0);
	if (b)
		assert_int_equal(metrics_merge_add(m, b, strlen(b), lb), 0);
	struct strbuf out = {0};
	assert_int_equal(metrics_merge_write(m, &out), 0);
	metrics_merge_free(m);
	char *s = strdup(out.p ? out.p : "");
	strbuf_free(&out);
	return s;
}

/* Two llama-servers' families: HELP and TYPE once, then both servers'
 * samples together, each labelled with its backend. */
static void test_two_backends_grouped(void **state)
{
	const char *a = "# HELP llamacpp:prompt_tokens_total Number of prompt tokens\n"
	                "# TYPE llamacpp:prompt_tokens_total counter\n"
	                "llamacpp:prompt_tokens_total 1140\n"
	                "# HELP llamacpp:requests_processing Requests processing\n"
	                "# TYPE llamacpp:requests_processing gauge\n"
	                "llamacpp:requests_processing 0\n";
	const char *b = "# HELP llamacpp:prompt_tokens_total Number of prompt tokens\n"
	                "# TYPE llamacpp:prompt_tokens_total counter\n"
	                "llamacpp:prompt_tokens_total 7\n"
	                "# HELP llamacpp:requests_processing Requests processing\n"
	                "# TYPE llamacpp:requests_processing gauge\n"
	                "llamacpp:requests_processing 2\n";
	char *s = merged(a, "http://a:1", b, "http://b:2");
	assert_string_equal(s, "# HELP llamacpp:prompt_tokens_total Number of prompt tokens\n"
	                       "# TYPE llamacpp:prompt_tokens_total counter\n"
	                       "llamacpp:prompt_tokens_total{backend=\"http://a:1\"} 1140\n"
	                       "llamacpp:prompt_tokens_total{backend=\"http://b:2\"} 7\n"
	                       "# HELP llamacpp:requests_processing Requests processing\n"
	                       "# TYPE llamacpp:requests_processing gauge\n"
	                       "llamacpp:requests_processing{backend=\"http://a:1\"} 0\n"
	                       "llamacpp:requests_processing{backend=\"http://b:2\"} 2\n");
	free(s);
}

/* A sample's own labels follow the backend's; an empty label set and a
 * timestamp survive; a histogram's suffixed samples stay in its family. */
static void test_labels_and_histogram(void **state)
{
	const char *a = "# TYPE x_seconds histogram\n"
	                "x_seconds_bucket{le=\"0.1\"} 1\n"
	                "x_seconds_bucket{le=\"+Inf\"} 2\n"
	                "x_seconds_sum 0.3\n"
	                "x_seconds_count 2\n"
	                "y{} 5 1700000000000\n";
	const char *b = "# TYPE x_seconds histogram\n"
	                "x_seconds_count 9\n";
	char *s = merged(a, "A", b, "B");
	assert_string_equal(s, "# TYPE x_seconds histogram\n"
	                       "x_seconds_bucket{backend=\"A\",le=\"0.1\"} 1\n"
	                       "x_seconds_bucket{backend=\"A\",le=\"+Inf\"} 2\n"
	                       "x_seconds_sum{backend=\"A\"} 0.3\n"
	                       "x_seconds_count{backend=\"A\"} 2\n"
	                       "x_seconds_count{backend=\"B\"} 9\n"
	                       "y{backend=\"A\"} 5 1700000000000\n");
	free(s);
}

/* Comments, blank lines, CRLF and lines that are no sample are dropped;
 * the backend label value is escaped. */
static void test_noise_and_escaping(void **state)
{
	const char *a = "# a comment\r\n"
	                "\r\n"
	                "up 1\r\n"
	                "{not a sample} 3\n"
	                "justaname\n"
	                "# HELP\n";
	char *s = merged(a, "we\"ird\\url\n", NULL, NULL);
	assert_string_equal(s, "up{backend=\"we\\\"ird\\\\url\\n\"} 1\n");
	free(s);
	s = merged("", "A", NULL, NULL);
	assert_string_equal(s, "");
	free(s);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_two_backends_grouped),
	    cmocka_unit_test(test_labels_and_histogram),
	    cmocka_unit_test(test_noise_and_escaping),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
