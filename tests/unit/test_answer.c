/* Unit tests for the rewriting of backend answers (src/serve/answer.c): the
 * cache block, the whole-request counts of a multi-step request, the
 * progress rewrite, the held last event. Every byte but the rewritten ones
 * must stay as the server wrote it. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "serve/answer.h"

static struct cache_facts facts(void)
{
	return (struct cache_facts){
	    .backend = "http://127.0.0.1:8080",
	    .slot = 1,
	    .route = "partial",
	    .mode = "exact",
	    .prompt_tokens = 900,
	    .matched = 640,
	    .reuse = 600,
	    .have_counts = 1,
	    .cached = 600,
	    .evaluated = 300,
	    .exact = 1,
	    .schedule = "messages",
	    .chunks = 4,
	    .steps = 3,
	    .replayed = 2,
	    .verdict = "verified",
	    .trimmed = 1,
	    .max_tokens = 128,
	    .est_prefill_ms = 12.5,
	    .tokenized = "toki",
	    .templated = "toki",
	    .tokenize_ms = 0.25,
	};
}

static void test_cache_text_has_every_fact_in_order(void **state)
{
	struct cache_facts f = facts();
	char *t = answer_cache_text(&f);
	assert_non_null(t);
	assert_string_equal(
	    t,
	    "{\"backend\":\"http://127.0.0.1:8080\",\"slot\":1,\"route\":\"partial\","
	    "\"mode\":\"exact\",\"prompt_tokens\":900,\"matched\":640,\"reuse\":600,"
	    "\"cached\":600,\"evaluated\":300,\"schedule\":\"messages\",\"chunks\":4,"
	    "\"steps\":3,\"replayed\":2,\"exact\":\"verified\",\"trimmed\":true,\"max_tokens\":128,"
	    "\"est_prefill_ms\":12.5,\"tokenized\":\"toki\",\"templated\":\"toki\","
	    "\"tokenize_ms\":0.25}");
	free(t);
}

static void test_cache_text_optional_facts(void **state)
{
	struct cache_facts f = facts();
	f.slot = -1;
	f.have_counts = 0;
	f.exact = 0;
	f.trimmed = 0;
	f.max_tokens = -1;
	f.max_tokens_clamped = 1;
	f.restored = "ab\"c\n";
	f.est_prefill_ms = 0.0 / 0.0;
	f.templated = NULL;
	f.tokenize_ms = 0;
	char *t = answer_cache_text(&f);
	assert_non_null(t);
	assert_string_equal(t, "{\"backend\":\"http://127.0.0.1:8080\",\"slot\":null,"
	                       "\"route\":\"partial\",\"mode\":\"exact\",\"prompt_tokens\":900,"
	                       "\"matched\":640,\"reuse\":600,\"trimmed\":false,"
	                       "\"max_tokens\":-1,\"max_tokens_clamped\":true,"
	                       "\"restored\":\"ab\\\"c\\u000a\",\"est_prefill_ms\":null,"
	                       "\"tokenized\":\"toki\"}");
	/* It is JSON. */
	json_t *j = answer_cache_json(&f);
	assert_true(json_is_null(json_object_get(j, "slot")));
	assert_string_equal(json_string_value(json_object_get(j, "restored")), "ab\"c\n");
	json_decref(j);
	free(t);
}

static void test_cache_wanted(void **state)
{
	json_t *b = json_pack("{s:s}", "prompt", "x");
	assert_true(answer_cache_wanted(b));
	json_object_set_new(b, "response_fields", json_pack("[s]", "content"));
	assert_false(answer_cache_wanted(b));
	json_object_set_new(b, "response_fields", json_pack("[s,s]", "content", "cache/route"));
	assert_true(answer_cache_wanted(b));
	json_object_set_new(b, "response_fields", json_pack("[s]", "cache"));
	assert_true(answer_cache_wanted(b));
	json_object_set_new(b, "response_fields", json_pack("[s]", "cachex"));
	assert_false(answer_cache_wanted(b));
	json_decref(b);
}

static char *rewrite(const char *text, const struct answer_totals *t, const char *cache)
{
	size_t n = 0;
	char *out = answer_rewrite(text, strlen(text), t, cache, &n);
	if (out)
		assert_int_equal(strlen(out), n); /* n bytes and a NUL after them */
	return out;
}

static void test_inject_keeps_every_byte(void **state)
{
	/* Spacing and number forms the server wrote are kept. */
	char *out = rewrite("{\"content\":\"hi\", \"p\": 1.10000000000000009 }\n", NULL,
	                    "{\"route\":\"hit\"}");
	assert_non_null(out);
	assert_string_equal(out, "{\"content\":\"hi\", \"p\": 1.10000000000000009 ,"
	                         "\"cache\":{\"route\":\"hit\"}}\n");
	free(out);
	/* An empty object gets no leading comma. */
	out = rewrite("{ }", NULL, "{}");
	assert_string_equal(out, "{ \"cache\":{}}");
	free(out);
	/* An event: the object after "data:". */
	out = rewrite("data: {\"a\":1}\n\n", NULL, "{}");
	assert_string_equal(out, "data: {\"a\":1,\"cache\":{}}\n\n");
	free(out);
	/* Not an object: nothing to do. */
	assert_null(rewrite("data: [DONE]\n\n", NULL, "{}"));
	/* Nothing asked: nothing changes. */
	struct answer_totals one = {.steps = 0, .cached = 5};
	assert_null(rewrite("{\"a\":1}", &one, NULL));
}

static void test_whole_request_counts(void **state)
{
	/* The last "timings" is the real one (a content string may hold the
	 * word); logprobs' digits stay as they were. */
	const char *body = "{\"content\":\"\\\"timings\\\":{\\\"cache_n\\\":1}\","
	                   "\"logprob\":-0.12345678901234567,"
	                   "\"usage\":{\"prompt_tokens_details\":{\"cached_tokens\":100}},"
	                   "\"timings\":{\"cache_n\":100,\"prompt_n\":20,\"prompt_ms\":10,"
	                   "\"predicted_n\":5}}";
	struct answer_totals t = {.steps = 2, .cached = 64, .evaluated = 56, .prompt_ms = 28};
	char *out = rewrite(body, &t, NULL);
	assert_non_null(out);
	assert_non_null(strstr(out, "\"logprob\":-0.12345678901234567,"));
	assert_non_null(strstr(out, "\"cached_tokens\":64}"));
	assert_non_null(strstr(out, "\\\"timings\\\":{\\\"cache_n\\\":1}")); /* the string */
	json_error_t jerr;
	json_t *j = json_loads(out, 0, &jerr);
	assert_non_null(j);
	json_t *tm = json_object_get(j, "timings");
	assert_int_equal(json_integer_value(json_object_get(tm, "cache_n")), 64);
	assert_int_equal(json_integer_value(json_object_get(tm, "prompt_n")), 56);
	assert_int_equal(json_integer_value(json_object_get(tm, "predicted_n")), 5);
	assert_true(json_number_value(json_object_get(tm, "prompt_ms")) == 28.0);
	assert_true(json_number_value(json_object_get(tm, "prompt_per_token_ms")) == 0.5);
	assert_true(json_number_value(json_object_get(tm, "prompt_per_second")) == 2000.0);
	json_decref(j);
	free(out);
	/* Counts and the block together. */
	out = rewrite(body, &t, "{\"x\":1}");
	assert_non_null(strstr(out, "\"cached_tokens\":64}"));
	assert_non_null(strstr(out, ",\"cache\":{\"x\":1}}"));
	free(out);
	/* The Responses API: input_tokens_details too. */
	out = rewrite("{\"usage\":{\"input_tokens_details\":{\"cached_tokens\":7}}}", &t, NULL);
	assert_string_equal(out, "{\"usage\":{\"input_tokens_details\":{\"cached_tokens\":64}}}");
	free(out);
}

static void test_scan_timings(void **state)
{
	struct answer_timings t = {0};
	const char *ok = " { \"cache_n\": 3, \"prompt_n\":4,\"prompt_ms\":1.5e1,\"x\":-2,"
	                 "\"predicted_n\":9,\"predicted_ms\":2.25 }";
	assert_int_equal(answer_scan_timings(ok, ok + strlen(ok), &t), 1);
	assert_true(t.seen);
	assert_int_equal(t.cache_n, 3);
	assert_int_equal(t.prompt_n, 4);
	assert_true(t.prompt_ms == 15.0);
	assert_int_equal(t.predicted_n, 9);
	assert_true(t.predicted_ms == 2.25);
	struct answer_timings u = {0};
	const char *nested = "{\"cache_n\":3,\"prompt_n\":4,\"d\":{\"a\":1}}";
	assert_int_equal(answer_scan_timings(nested, nested + strlen(nested), &u), 0);
	const char *missing = "{\"prompt_n\":4}";
	assert_int_equal(answer_scan_timings(missing, missing + strlen(missing), &u), 0);
	const char *str = "{\"cache_n\":3,\"prompt_n\":4,\"s\":\"x\"}";
	assert_int_equal(answer_scan_timings(str, str + strlen(str), &u), 0);
	assert_false(u.seen);
}

static void test_timings_in_body(void **state)
{
	struct answer_timings t = {0};
	/* Not flat: the whole answer is parsed. */
	const char *b = "{\"timings\":{\"cache_n\":2,\"prompt_n\":3,\"note\":\"x\"}}";
	answer_timings_in_body(b, strlen(b), &t);
	assert_true(t.seen);
	assert_int_equal(t.cache_n, 2);
	assert_int_equal(t.prompt_n, 3);
	/* Usage only (the Responses API, not streamed). */
	struct answer_timings u = {0};
	const char *r = "{\"response\":{\"usage\":{\"input_tokens\":50,"
	                "\"input_tokens_details\":{\"cached_tokens\":30}}}}";
	answer_timings_in_body(r, strlen(r), &u);
	assert_true(u.seen);
	assert_int_equal(u.cache_n, 30);
	assert_int_equal(u.prompt_n, 20);
	/* Neither: nothing seen. */
	struct answer_timings v = {0};
	answer_timings_in_body("{\"a\":1}", 7, &v);
	assert_false(v.seen);
	/* A NUL the model generated does not hide the timings. */
	struct answer_timings w = {0};
	const char *z = "{\"content\":\"\\u0000\",\"timings\":{\"cache_n\":1,\"prompt_n\":1,"
	                "\"s\":\"y\"}}";
	answer_timings_in_body(z, strlen(z), &w);
	assert_true(w.seen);
}

static void test_progress_event(void **state)
{
	json_error_t jerr;
	json_t *e = json_loads("{\"choices\":[],\"prompt_progress\":{\"total\":900,\"cache\":40,"
	                       "\"processed\":100,\"time_ms\":10.5}}",
	                       0, &jerr);
	char *js = answer_progress_event(e, 600, 700, 30.5);
	json_t *o = json_loads(js, 0, &jerr);
	json_t *pp = json_object_get(o, "prompt_progress");
	assert_int_equal(json_integer_value(json_object_get(pp, "total")), 900);
	assert_int_equal(json_integer_value(json_object_get(pp, "cache")), 600);
	assert_int_equal(json_integer_value(json_object_get(pp, "processed")), 700);
	assert_true(json_number_value(json_object_get(pp, "time_ms")) == 30.5);
	assert_true(json_is_array(json_object_get(o, "choices"))); /* the rest as it was */
	json_decref(o);
	json_decref(e);
	free(js);
}

static void test_end_turn_at_cap(void **state)
{
	json_t *c = json_pack("{s:[{s:s},{s:s},{s:n}]}", "choices", "finish_reason", "length",
	                      "finish_reason", "tool_calls", "finish_reason");
	answer_end_turn_at_cap(c);
	json_t *ch = json_object_get(c, "choices");
	assert_string_equal(
	    json_string_value(json_object_get(json_array_get(ch, 0), "finish_reason")), "stop");
	assert_string_equal(
	    json_string_value(json_object_get(json_array_get(ch, 1), "finish_reason")),
	    "tool_calls");
	json_decref(c);
}

static void test_event_kind(void **state)
{
	assert_int_equal(answer_event_kind(NULL), ANSWER_EVENT_OTHER);
	assert_int_equal(answer_event_kind("[DONE]"), ANSWER_EVENT_DONE);
	assert_int_equal(answer_event_kind("{\"prompt_progress\":{}}"), ANSWER_EVENT_PROGRESS);
	assert_int_equal(answer_event_kind("{\"choices\":[],\"timings\":{}}"),
	                 ANSWER_EVENT_TIMINGS);
	assert_int_equal(answer_event_kind("{\"choices\":[]}"), ANSWER_EVENT_OTHER);
	/* With timings_per_token every token's chunk has timings: only one that
	 * may be the last is held back (as llama-server 11669 streams them). */
	assert_int_equal(answer_event_kind("{\"content\":\" a\",\"stop\":false,\"timings\":{}}"),
	                 ANSWER_EVENT_OTHER);
	assert_int_equal(answer_event_kind("{\"content\":\"\",\"stop\":true,\"timings\":{}}"),
	                 ANSWER_EVENT_TIMINGS);
	assert_int_equal(answer_event_kind("{\"choices\":[{\"finish_reason\":null,\"index\":0,"
	                                   "\"delta\":{\"content\":\"M\"}}],\"timings\":{}}"),
	                 ANSWER_EVENT_OTHER);
	assert_int_equal(
	    answer_event_kind("{\"choices\":[{\"finish_reason\":\"length\",\"index\":0,"
	                      "\"delta\":{}}],\"timings\":{}}"),
	    ANSWER_EVENT_TIMINGS);
	/* A choice without finish_reason, or one that is not JSON: held. */
	assert_int_equal(answer_event_kind("{\"choices\":[{\"index\":0}],\"timings\":{}}"),
	                 ANSWER_EVENT_TIMINGS);
	assert_int_equal(answer_event_kind("{\"timings\":"), ANSWER_EVENT_TIMINGS);
	assert_int_equal(
	    answer_event_kind("{\"type\":\"response.output_text.delta\",\"delta\":\"A\","
	                      "\"timings\":{}}"),
	    ANSWER_EVENT_OTHER);
	assert_int_equal(answer_event_kind("{\"type\":\"response.completed\",\"timings\":{}}"),
	                 ANSWER_EVENT_TIMINGS);
}

static void test_hold_back(void **state)
{
	struct answer_hold h = {0};
	struct strbuf out = {0};
	/* Nothing held: nothing written. */
	answer_hold_release(&h, NULL, "{}", &out);
	assert_int_equal(out.len, 0);
	const char *e1 = "data: {\"n\":1,\"timings\":{\"cache_n\":0,\"prompt_n\":3}}\n\n";
	const char *e2 = "data: {\"n\":2,\"timings\":{\"cache_n\":0,\"prompt_n\":3}}\n\n";
	assert_int_equal(answer_hold_keep(&h, e1, strlen(e1), &out), 0);
	assert_int_equal(out.len, 0); /* held back */
	assert_int_equal(answer_hold_keep(&h, e2, strlen(e2), &out), 0);
	assert_string_equal(out.p, e1); /* the earlier one goes as it was */
	strbuf_reset(&out);
	struct answer_totals t = {.steps = 1, .cached = 8, .evaluated = 5, .prompt_ms = 1};
	answer_hold_release(&h, &t, "{\"route\":\"hit\"}", &out);
	assert_non_null(strstr(out.p, "\"n\":2,\"timings\":{\"cache_n\":8,\"prompt_n\":5,"));
	assert_non_null(strstr(out.p, ",\"cache\":{\"route\":\"hit\"}}\n\n"));
	assert_null(h.p);
	strbuf_reset(&out);
	/* Released with nothing to add: as it was. */
	answer_hold_keep(&h, e1, strlen(e1), &out);
	answer_hold_release(&h, NULL, NULL, &out);
	assert_string_equal(out.p, e1);
	strbuf_free(&out);
	answer_hold_free(&h);
}

static void add_all(struct answer_msg *m, const char *const *events, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		json_t *o = json_loads(events[i], 0, NULL);
		assert_non_null(o);
		answer_msg_add(m, o);
		json_decref(o);
	}
}

static void assert_json_equal(json_t *got, const char *want)
{
	json_t *w = json_loads(want, 0, NULL);
	assert_non_null(w);
	if (!json_equal(got, w)) {
		char *g = json_dumps(got, JSON_SORT_KEYS);
		fail_msg("got %s, want %s", g, want);
	}
	json_decref(w);
}

/* The answer's text, from every shape an answer comes in; plain text is
 * not structured, and empty reasoning or an empty call list adds none. */
static void test_msg_text(void **state)
{
	(void)state;
	const char *shapes[] = {
	    "{\"choices\":[{\"delta\":{\"content\":\"Once \"}}]}",
	    "{\"choices\":[{\"delta\":{}}],\"timings\":{}}",
	    "{\"choices\":[{\"message\":{\"content\":\"upon \"}}]}",
	    "{\"choices\":[{\"text\":\"a \"}]}",
	    "{\"content\":\"time\",\"stop\":false}",
	    "{\"choices\":[{\"message\":{\"content\":\"!\","
	    "\"reasoning_content\":\"\",\"tool_calls\":[]}}]}",
	};
	struct answer_msg m = {0};
	add_all(&m, shapes, sizeof shapes / sizeof *shapes);
	assert_string_equal(m.text.p, "Once upon a time!");
	assert_false(answer_msg_structured(&m));
	assert_false(m.failed);
	json_t *j = answer_msg_json(&m);
	assert_json_equal(j, "{\"role\":\"assistant\",\"content\":\"Once upon a time!\"}");
	json_decref(j);
	answer_msg_reset(&m);
	assert_int_equal(m.text.len, 0);
	answer_msg_free(&m);
}

/* A stream's reasoning and tool calls, as llama-server splits them: a
 * call's id, type and name come with its first piece, its arguments in
 * pieces; a second call by its index. The message is the agent's. */
static void test_msg_stream_calls(void **state)
{
	(void)state;
	const char *events[] = {
	    "{\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":null}}]}",
	    "{\"choices\":[{\"delta\":{\"reasoning_content\":\"Look at \"}}]}",
	    "{\"choices\":[{\"delta\":{\"reasoning_content\":\"main.c\"}}]}",
	    "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"c1\",\"type\":"
	    "\"function\",\"function\":{\"name\":\"run\",\"arguments\":\"{\\\"cmd\\\"\"}}]}}]}",
	    "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":"
	    "{\"arguments\":\":\\\"ls\\\"}\"}}]}}]}",
	    "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"c2\",\"function\":"
	    "{\"name\":\"read\",\"arguments\":\"{}\"}}]}}]}",
	    "{\"choices\":[{\"delta\":{}, \"finish_reason\":\"tool_calls\"}],\"timings\":{}}",
	};
	struct answer_msg m = {0};
	add_all(&m, events, sizeof events / sizeof *events);
	assert_true(answer_msg_structured(&m));
	assert_false(m.failed);
	json_t *j = answer_msg_json(&m);
	assert_json_equal(
	    j,
	    "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"Look at main.c\","
	    "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"run\","
	    "\"arguments\":\"{\\\"cmd\\\":\\\"ls\\\"}\"}},{\"id\":\"c2\",\"type\":\"function\","
	    "\"function\":{\"name\":\"read\",\"arguments\":\"{}\"}}]}");
	json_decref(j);
	answer_msg_free(&m);

	/* A whole answer's calls have no index: their order is it. */
	const char *whole[] = {
	    "{\"choices\":[{\"message\":{\"content\":null,\"tool_calls\":[{\"type\":\"function\","
	    "\"function\":{\"name\":\"a\",\"arguments\":\"{}\"}},{\"type\":\"function\","
	    "\"function\":{\"name\":\"b\",\"arguments\":\"[]\"}}]}}]}",
	};
	add_all(&m, whole, 1);
	assert_int_equal(m.n_calls, 2);
	assert_string_equal(m.calls[1].name.p, "b");
	assert_string_equal(m.calls[1].arguments.p, "[]");
	assert_int_equal(m.calls[0].id.len, 0);
	answer_msg_free(&m);

	/* A call's piece for an index past the next is one it cannot place:
	 * the message is not the answer's, and nothing is kept by it. */
	const char *gap[] = {
	    "{\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":1,\"function\":{\"name\":\"x\"}}]"
	    "}}]}",
	};
	add_all(&m, gap, 1);
	assert_true(m.failed);
	answer_msg_free(&m);
}

/* The generated tokens' ids, from a stream's events and a whole answer
 * (each entry's own, not its top candidates'), and from /completion's
 * probabilities; an event without any adds none. */
static void test_msg_ids(void **state)
{
	(void)state;
	const char *events[] = {
	    "{\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":null}}]}",
	    "{\"choices\":[{\"delta\":{\"content\":\" carr\"},\"logprobs\":{\"content\":[{\"id\":"
	    "1028,\"token\":\" carr\",\"prob\":1.0,\"top_probs\":[{\"id\":7,\"prob\":1.0}]}]}}]}",
	    "{\"choices\":[{\"delta\":{\"content\":\" col\"},\"logprobs\":{\"content\":[{\"id\":"
	    "1071,\"token\":\" col\",\"bytes\":[32,99,111,108]}]}}]}",
	    "{\"choices\":[{\"delta\":{}}],\"timings\":{}}",
	};
	struct answer_msg m = {0};
	add_all(&m, events, sizeof events / sizeof *events);
	assert_int_equal(m.n_ids, 2);
	assert_int_equal(m.ids[0], 1028);
	assert_int_equal(m.ids[1], 1071);
	assert_string_equal(m.text.p, " carr col");
	assert_false(m.finished);
	answer_msg_reset(&m);
	assert_int_equal(m.n_ids, 0);

	const char *whole[] = {
	    "{\"choices\":[{\"message\":{\"content\":\"ab\"},\"logprobs\":{\"content\":[{\"id\":1},"
	    "{\"id\":2},{\"token\":\"no id\"},{\"id\":3}]}}]}",
	    "{\"content\":\"c\",\"completion_probabilities\":[{\"id\":4,\"logprob\":-1}]}",
	};
	add_all(&m, whole, 2);
	assert_false(m.finished);
	const char *end[] = {"{\"choices\":[{\"delta\":{},\"finish_reason\":\"length\"}]}"};
	add_all(&m, end, 1);
	assert_true(m.finished);
	assert_true(m.cut_at_length);
	assert_int_equal(m.n_ids, 4);
	assert_int_equal(m.ids[2], 3);
	assert_int_equal(m.ids[3], 4);
	answer_msg_free(&m);
}

/* Whether toki may ask for the ids: where the client says nothing of the
 * answer's probabilities, and the chain (the request's parameters over
 * the server's defaults) keeps at most ANSWER_IDS_MAX_TOP_K candidates. */
static void test_ids_cheap(void **state)
{
	(void)state;
	json_t *defaults = json_loads("{\"top_k\":40,\"temperature\":0.8,\"mirostat\":0,"
	                              "\"samplers\":[\"penalties\",\"top_k\",\"top_p\"]}",
	                              0, NULL);
	json_t *no_k = json_loads("{\"top_k\":0,\"temperature\":0.8}", 0, NULL);
	static const struct {
		const char *body;
		int server_k40, server_k0;
	} cases[] = {
	    {"{\"messages\":[]}", 1, 0},
	    {"{\"top_k\":20}", 1, 1},
	    {"{\"top_k\":0}", 0, 0},
	    {"{\"top_k\":1000}", 1, 1},
	    {"{\"top_k\":1001}", 0, 0},
	    {"{\"top_k\":null}", 1, 0},
	    {"{\"temperature\":0}", 1, 0}, /* greedy still sorts what top_k leaves */
	    {"{\"top_k\":20,\"samplers\":[\"top_p\",\"temperature\"]}", 0, 0},
	    {"{\"top_k\":20,\"samplers\":\"kpt\"}", 1, 1},
	    {"{\"top_k\":20,\"samplers\":\"pt\"}", 0, 0},
	    {"{\"mirostat\":2}", 0, 0},
	    {"{\"logprobs\":false}", 0, 0},
	    {"{\"top_logprobs\":2}", 0, 0},
	    {"{\"n_probs\":0}", 0, 0},
	    {"{\"response_fields\":[\"content\"]}", 0, 0},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		json_t *b = json_loads(cases[i].body, 0, NULL);
		assert_non_null(b);
		if (answer_ids_cheap(b, defaults) != cases[i].server_k40 ||
		    answer_ids_cheap(b, no_k) != cases[i].server_k0)
			fail_msg("%s: want %d with top_k 40 by default, %d with 0", cases[i].body,
			         cases[i].server_k40, cases[i].server_k0);
		json_decref(b);
	}
	json_t *b = json_object();
	assert_false(answer_probs_asked(b));
	assert_int_equal(answer_ids_ask(b), 0);
	assert_true(answer_probs_asked(b));
	assert_true(json_is_true(json_object_get(b, "post_sampling_probs")));
	json_decref(b);
	b = json_loads("{\"logprobs\":true}", 0, NULL);
	assert_true(answer_probs_asked(b));
	json_decref(b);
	json_decref(defaults);
	json_decref(no_k);
}

static void assert_dropped(const char *in, const char *want)
{
	size_t n = 0;
	char *out = answer_drop_probs(in, strlen(in), &n);
	if (!want) {
		assert_null(out);
		return;
	}
	assert_non_null(out);
	assert_int_equal(n, strlen(want));
	assert_string_equal(out, want);
	free(out);
}

/* The probabilities toki asked for go: the bytes left are those
 * llama-server writes without them (its event and answer, b11669, with
 * and without n_probs), whatever the text holds. */
static void test_drop_probs(void **state)
{
	(void)state;
	assert_dropped(
	    "data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"content\":\" "
	    "carr\"},\"logprobs\":{\"content\":[{\"id\":1028,\"token\":\" carr\",\"bytes\":[32,99,"
	    "97,114,114],\"prob\":1.0,\"top_probs\":[{\"id\":1028,\"token\":\" carr\",\"bytes\":"
	    "[32,99,97,114,114],\"prob\":1.0}]}]}}],\"created\":1796597166,\"id\":\"chatcmpl-u\","
	    "\"object\":\"chat.completion.chunk\"}\n\n",
	    "data: {\"choices\":[{\"finish_reason\":null,\"index\":0,\"delta\":{\"content\":\" "
	    "carr\"}}],\"created\":1796597166,\"id\":\"chatcmpl-u\",\"object\":\"chat.completion."
	    "chunk\"}\n\n");
	/* Text that looks like the key, inside strings (escaped quotes
	 * included), stays. */
	const char *text =
	    "{\"choices\":[{\"message\":{\"content\":\"say \\\"logprobs\\\": {1}\\\\\","
	    "\"reasoning_content\":\"logprobs\"},\"logprobs\":{\"content\":[{\"id\":"
	    "1,\"token\":\"\\\"logprobs\\\":\"}]}}],\"usage\":{}}";
	assert_dropped(text, "{\"choices\":[{\"message\":{\"content\":\"say \\\"logprobs\\\": "
	                     "{1}\\\\\",\"reasoning_content\":\"logprobs\"}}],\"usage\":{}}");
	/* First in its object, with blanks, or a bare value. */
	assert_dropped("{ \"logprobs\" : null , \"a\":1}", "{  \"a\":1}");
	assert_dropped("{\"a\":[1,{\"b\":2}] ,\n \"logprobs\":{\"x\":[]}}",
	               "{\"a\":[1,{\"b\":2}] }");
	assert_dropped("{\"logprobs\":{}}", "{}");
	/* Nothing to drop: NULL, the text goes as it is. */
	assert_dropped("{\"choices\":[{\"delta\":{\"content\":\"logprobs\"}}]}", NULL);
	assert_dropped("data: [DONE]\n\n", NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_cache_text_has_every_fact_in_order),
	    cmocka_unit_test(test_cache_text_optional_facts),
	    cmocka_unit_test(test_cache_wanted),
	    cmocka_unit_test(test_inject_keeps_every_byte),
	    cmocka_unit_test(test_whole_request_counts),
	    cmocka_unit_test(test_scan_timings),
	    cmocka_unit_test(test_timings_in_body),
	    cmocka_unit_test(test_progress_event),
	    cmocka_unit_test(test_end_turn_at_cap),
	    cmocka_unit_test(test_event_kind),
	    cmocka_unit_test(test_hold_back),
	    cmocka_unit_test(test_msg_text),
	    cmocka_unit_test(test_msg_stream_calls),
	    cmocka_unit_test(test_msg_ids),
	    cmocka_unit_test(test_ids_cheap),
	    cmocka_unit_test(test_drop_probs),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
