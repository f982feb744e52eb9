/* Unit tests for the request side of the prompt engine (src/prompt/chat.c):
 * what a chat request becomes before the template sees it, what it leaves to
 * llama-server, and the JSON it writes the way nlohmann::json does.
 * tests/integration/test_chat_template.py checks whole prompts against the
 * server; these pin each rule on its own. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "prompt/chat.h"
#include "router/sched.h"
#include "template/jinja.h"

/* A template that prints what it was given, so that a test sees the
 * normalized messages, tools and context as text. */
static const char *echo_template =
    "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content|tojson }}"
    "{% if m.name is defined %} name={{ m.name }}{% endif %}"
    "{% if m.tool_call_id is defined %} id={{ m.tool_call_id }}{% endif %}"
    "{% if m.reasoning_content is defined %} think={{ m.reasoning_content }}{% endif %}"
    "{% if m.tool_calls is defined %} calls={{ m.tool_calls|tojson }}{% endif %}]"
    "{% endfor %}{% if tools is defined %}tools={{ tools|tojson }}{% endif %}"
    "{% if add_generation_prompt %}<gen>{% endif %}"
    "{% if enable_thinking %}<think>{% endif %}{{ eos_token }}";

struct fixture {
	struct jinja_template *tmpl;
	struct chat_env env;
};

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof *f);
	char err[256];
	f->tmpl = jinja_parse(echo_template, strlen(echo_template), err, sizeof err);
	if (!f->tmpl) {
		fprintf(stderr, "parse: %s\n", err);
		return -1;
	}
	f->env.tmpl = f->tmpl;
	chat_caps_from_json(NULL, &f->env.caps);
	f->env.bos_token = "<s>";
	f->env.eos_token = "</s>";
	f->env.now = 1796000000;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	jinja_free(f->tmpl);
	free(f);
	return 0;
}

/* Renders a request (JSON text); returns the prompt or NULL, with res. */
static char *render(const struct chat_env *env, const char *request, enum chat_result *res,
                    char *why, size_t whylen)
{
	json_error_t jerr;
	json_t *req = json_loads(request, JSON_ALLOW_NUL, &jerr);
	if (!req)
		fail_msg("bad request JSON in the test: %s", jerr.text);
	char *prompt = NULL;
	size_t len = 0;
	why[0] = 0;
	*res = chat_render(env, req, &prompt, &len, why, whylen);
	json_decref(req);
	if (*res == CHAT_OK)
		assert_int_equal(strlen(prompt), len);
	return prompt;
}

static void expect_prompt(const struct chat_env *env, const char *request, const char *want)
{
	enum chat_result res;
	char why[256];
	char *got = render(env, request, &res, why, sizeof why);
	if (res != CHAT_OK)
		fail_msg("request %s: result %d (%s)", request, res, why);
	if (strcmp(got, want))
		fail_msg("request %s\n  want: [%s]\n  got:  [%s]", request, want, got);
	free(got);
}

static void expect_declined(const struct chat_env *env, const char *request, const char *needle)
{
	enum chat_result res;
	char why[256];
	char *got = render(env, request, &res, why, sizeof why);
	if (res != CHAT_DECLINED)
		fail_msg("request %s: result %d [%s], expected declined", request, res,
		         got ? got : why);
	if (!strstr(why, needle))
		fail_msg("request %s: reason [%s] lacks [%s]", request, why, needle);
}

static void test_messages_written_back(void **state)
{
	struct fixture *f = *state;
	/* The generation prompt is on unless the request turns it off; empty
	 * or null content becomes ""; name, tool_call_id and reasoning_content
	 * only when non-empty. */
	expect_prompt(&f->env, "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}",
	              "<s>[user:\"hi\"]<gen></s>");
	expect_prompt(&f->env,
	              "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],"
	              "\"add_generation_prompt\":false}",
	              "<s>[user:\"hi\"]</s>");
	expect_prompt(
	    &f->env,
	    "{\"messages\":[{\"role\":\"user\",\"content\":null,\"name\":\"\"},"
	    "{\"role\":\"tool\",\"content\":\"4\",\"tool_call_id\":\"c1\",\"name\":\"calc\"}]}",
	    "<s>[user:\"\"][tool:\"4\" name=calc id=c1]<gen></s>");
	/* Text parts stay parts for a template that takes both kinds. */
	struct chat_env both = f->env;
	json_error_t jerr;
	json_t *caps = json_loads("{\"supports_string_content\":true,"
	                          "\"supports_typed_content\":true}",
	                          0, &jerr);
	chat_caps_from_json(caps, &both.caps);
	json_decref(caps);
	expect_prompt(&both,
	              "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
	              "\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}]}",
	              "<s>[user:[{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"text\", "
	              "\"text\": \"b\"}]]<gen></s>");
	/* developer is system to every template but GPT-OSS's. */
	expect_prompt(&f->env,
	              "{\"messages\":[{\"role\":\"developer\",\"content\":\"d\"},"
	              "{\"role\":\"user\",\"content\":\"u\"}]}",
	              "<s>[system:\"d\"][user:\"u\"]<gen></s>");
	f->env.template_is_gpt_oss = 1;
	expect_prompt(&f->env,
	              "{\"messages\":[{\"role\":\"developer\",\"content\":\"d\"},"
	              "{\"role\":\"user\",\"content\":\"u\"}]}",
	              "<s>[developer:\"d\"][user:\"u\"]<gen></s>");
	f->env.template_is_gpt_oss = 0;
}

static void test_capabilities(void **state)
{
	struct fixture *f = *state;
	struct chat_env env = f->env;
	json_error_t jerr;
	/* A template that only takes strings: parts joined by newlines. */
	json_t *caps = json_loads("{\"supports_string_content\":true,"
	                          "\"supports_typed_content\":false}",
	                          0, &jerr);
	chat_caps_from_json(caps, &env.caps);
	json_decref(caps);
	expect_prompt(&env,
	              "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"text\","
	              "\"text\":\"a\"},{\"type\":\"text\",\"text\":\"b\"}]}]}",
	              "<s>[user:\"a\\nb\"]<gen></s>");
	/* One that only takes parts: a string becomes one part. */
	caps = json_loads("{\"supports_string_content\":false,\"supports_typed_content\":true}", 0,
	                  &jerr);
	chat_caps_from_json(caps, &env.caps);
	json_decref(caps);
	expect_prompt(&env, "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
	              "<s>[user:[{\"type\": \"text\", \"text\": \"x\"}]]<gen></s>");
	/* No system role: the system prompt goes into the first user message. */
	caps = json_loads("{\"supports_system_role\":false}", 0, &jerr);
	chat_caps_from_json(caps, &env.caps);
	json_decref(caps);
	expect_prompt(&env,
	              "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},"
	              "{\"role\":\"user\",\"content\":\"U\"}]}",
	              "<s>[user:\"S\\nU\"]<gen></s>");
	expect_prompt(&env, "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"}]}",
	              "<s><gen></s>");
	/* Object arguments: tool-call arguments parsed for the template. */
	caps = json_loads("{\"supports_object_arguments\":true}", 0, &jerr);
	chat_caps_from_json(caps, &env.caps);
	json_decref(caps);
	expect_prompt(
	    &env,
	    "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
	    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"type\":\"function\","
	    "\"id\":\"c1\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"x\\\": 1}\"}}]},"
	    "{\"role\":\"tool\",\"content\":\"2\",\"tool_call_id\":\"c1\"}]}",
	    "<s>[user:\"q\"][assistant:\"\" calls=[{\"type\": \"function\", \"function\": "
	    "{\"name\": \"f\", \"arguments\": {\"x\": 1}}, \"id\": \"c1\"}]][tool:\"2\" "
	    "id=c1]<gen></s>");
	/* Without it, an object given as arguments is sent as its JSON text. */
	chat_caps_from_json(NULL, &env.caps);
	expect_prompt(
	    &env,
	    "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
	    "{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\","
	    "\"function\":{\"name\":\"f\",\"arguments\":{\"x\":1.0}}}]},"
	    "{\"role\":\"user\",\"content\":\"r\"}]}",
	    "<s>[user:\"q\"][assistant:\"\" calls=[{\"type\": \"function\", \"function\": "
	    "{\"name\": \"f\", \"arguments\": \"{\\\"x\\\":1.0}\"}}]][user:\"r\"]<gen></s>");
}

static void test_tools_and_context(void **state)
{
	struct fixture *f = *state;
	/* A tool gets a description and parameters when it has none. */
	expect_prompt(
	    &f->env,
	    "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
	    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"t\"}}]}",
	    "<s>[user:\"q\"]tools=[{\"type\": \"function\", \"function\": {\"name\": \"t\", "
	    "\"description\": \"\", \"parameters\": {}}}]<gen></s>");
	/* An empty tools list is no tools. */
	expect_prompt(&f->env,
	              "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tools\":[]}",
	              "<s>[user:\"q\"]<gen></s>");
	/* chat_template_kwargs reach the template, and win over the defaults. */
	expect_prompt(&f->env,
	              "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
	              "\"chat_template_kwargs\":{\"enable_thinking\":true}}",
	              "<s>[user:\"q\"]<gen><think></s>");
	/* The tokenizer's own BOS and EOS come off the text, when it adds them. */
	struct chat_env env = f->env;
	env.add_bos = 1;
	env.add_eos = 1;
	expect_prompt(&env, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}",
	              "[user:\"q\"]<gen>");
	/* The date variables, from the time given. */
	json_error_t jerr;
	json_t *req =
	    json_loads("{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", 0, &jerr);
	enum chat_result res;
	char why[128];
	json_t *g = chat_template_globals(&f->env, req, &res, why, sizeof why);
	assert_non_null(g);
	assert_int_equal(res, CHAT_OK);
	assert_true(json_is_string(json_object_get(g, "date_string")));
	assert_true(json_is_string(json_object_get(g, "datetime")));
	assert_true(json_is_false(json_object_get(g, "enable_thinking")));
	json_decref(g);
	json_decref(req);
}

/* The template's variables for a request (JSON text). */
static json_t *globals_of(const struct chat_env *env, const char *request)
{
	json_error_t jerr;
	json_t *req = json_loads(request, JSON_ALLOW_NUL, &jerr);
	if (!req)
		fail_msg("bad request JSON in the test: %s", jerr.text);
	enum chat_result res;
	char why[128];
	json_t *g = chat_template_globals(env, req, &res, why, sizeof why);
	json_decref(req);
	if (!g || res != CHAT_OK)
		fail_msg("request %s: result %d (%s)", request, res, why);
	return g;
}

/* reasoning_effort as llama-server reads it: "none" turns thinking off
 * unless a kwarg sets it and drops the kwarg of that name; another string
 * reaches the template over the kwarg; "" and non-strings change nothing. */
static void test_reasoning_effort(void **state)
{
	struct fixture *f = *state;
	struct chat_env env = f->env;
	env.enable_thinking = 1;
	static const struct {
		const char *rest;
		int thinking;
		const char *effort; /* NULL: not set */
	} cases[] = {
	    {"", 1, NULL},
	    {",\"reasoning_effort\":\"none\"", 0, NULL},
	    {",\"reasoning_effort\":\"high\"", 1, "high"},
	    {",\"reasoning_effort\":\"\"", 1, NULL},
	    {",\"reasoning_effort\":null", 1, NULL},
	    {",\"reasoning_effort\":3", 1, NULL},
	    {",\"reasoning_effort\":\"none\\u0000\"", 1, "none"},
	    {",\"reasoning_effort\":\"none\",\"chat_template_kwargs\":{\"enable_thinking\":true}",
	     1, NULL},
	    {",\"reasoning_effort\":\"none\",\"chat_template_kwargs\":{\"reasoning_effort\":"
	     "\"low\"}",
	     0, NULL},
	    {",\"reasoning_effort\":\"high\",\"chat_template_kwargs\":{\"reasoning_effort\":"
	     "\"low\"}",
	     1, "high"},
	    {",\"chat_template_kwargs\":{\"reasoning_effort\":\"low\"}", 1, "low"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		char req[256];
		snprintf(req, sizeof req,
		         "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]%s}", cases[i].rest);
		json_t *g = globals_of(&env, req);
		const json_t *t = json_object_get(g, "enable_thinking");
		if (!json_is_boolean(t) || json_is_true(t) != cases[i].thinking)
			fail_msg("%s: enable_thinking %s", req,
			         json_is_true(t) ? "true" : "not true");
		const json_t *e = json_object_get(g, "reasoning_effort");
		if (cases[i].effort) {
			/* The one with a NUL keeps it: "none\0" is not "none". */
			size_t n =
			    strlen(cases[i].effort) + (strstr(cases[i].rest, "u0000") != NULL);
			json_t *want = json_stringn(cases[i].effort, n);
			int same = json_equal(e, want);
			json_decref(want);
			if (!same)
				fail_msg("%s: reasoning_effort is not %s", req, cases[i].effort);
		} else if (e) {
			fail_msg("%s: reasoning_effort set", req);
		}
		json_decref(g);
	}
}

static void test_left_to_the_server(void **state)
{
	struct fixture *f = *state;
	expect_declined(&f->env, "{\"messages\":[]}", "no messages");
	expect_declined(&f->env, "{\"prompt\":\"x\"}", "no messages");
	expect_declined(&f->env,
	                "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
	                "{\"role\":\"assistant\",\"content\":\"Once\"}]}",
	                "prefill");
	expect_declined(&f->env,
	                "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
	                "\"continue_final_message\":true}",
	                "continue_final_message");
	expect_declined(&f->env,
	                "{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\","
	                "\"image_url\":{\"url\":\"data:\"}}]}]}",
	                "content part");
	expect_declined(&f->env, "{\"messages\":[{\"content\":\"q\"}]}", "without a role");
	expect_declined(&f->env, "{\"messages\":[{\"role\":\"user\"}]}", "without content");
	expect_declined(&f->env, "{\"messages\":[{\"role\":\"user\",\"content\":5}]}",
	                "neither a string");
	expect_declined(&f->env, "{\"messages\":[7]}", "not an object");
	expect_declined(&f->env,
	                "{\"messages\":[{\"role\":\"user\",\"content\":\"q\",\"name\":3}]}",
	                "not a string");
	expect_declined(&f->env,
	                "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
	                "\"add_generation_prompt\":1}",
	                "not a boolean");
	expect_declined(&f->env,
	                "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],\"tools\":{}}",
	                "tools that is not an array");
	expect_declined(&f->env,
	                "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}],"
	                "\"tools\":[{\"type\":\"retrieval\"}]}",
	                "a tool llama-server");
	expect_declined(&f->env,
	                "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
	                "{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\"}]},"
	                "{\"role\":\"user\",\"content\":\"r\"}]}",
	                "a tool call");
	struct chat_env env = f->env;
	json_error_t jerr;
	json_t *caps = json_loads("{\"supports_object_arguments\":true}", 0, &jerr);
	chat_caps_from_json(caps, &env.caps);
	json_decref(caps);
	expect_declined(&env,
	                "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"},"
	                "{\"role\":\"assistant\",\"tool_calls\":[{\"type\":\"function\","
	                "\"function\":{\"name\":\"f\",\"arguments\":\"{oops\"}}]},"
	                "{\"role\":\"user\",\"content\":\"r\"}]}",
	                "not JSON");
	caps = json_loads("{\"supports_system_role\":false,\"supports_typed_content\":true}", 0,
	                  &jerr);
	chat_caps_from_json(caps, &env.caps);
	json_decref(caps);
	expect_declined(&env,
	                "{\"messages\":[{\"role\":\"system\",\"content\":\"S\"},"
	                "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"U\"}]}]}",
	                "merge");
}

static void test_template_errors(void **state)
{
	(void)state;
	char err[256];
	const char *src = "{{ raise_exception('no tools here') }}";
	struct jinja_template *t = jinja_parse(src, strlen(src), err, sizeof err);
	assert_non_null(t);
	struct chat_env env = {.tmpl = t, .bos_token = "", .eos_token = ""};
	chat_caps_from_json(NULL, &env.caps);
	enum chat_result res;
	char why[256];
	char *got = render(&env, "{\"messages\":[{\"role\":\"user\",\"content\":\"q\"}]}", &res,
	                   why, sizeof why);
	assert_null(got);
	assert_int_equal(res, CHAT_ERROR);
	assert_non_null(strstr(why, "no tools here"));
	jinja_free(t);
}

static void test_special_handlers(void **state)
{
	(void)state;
	assert_true(chat_template_needs_server("{{ '<|channel|>analysis' }}"));
	assert_true(chat_template_needs_server("<|tool_calls_section_begin|><|tool_call_begin|>"));
	assert_true(chat_template_needs_server("<|tool_list_start|>x<|tool_list_end|>"));
	assert_true(chat_template_needs_server("[SYSTEM_PROMPT][TOOL_CALLS][ARGS]"));
	/* With [CALL_ID] it is a Mistral template llama-server applies directly. */
	assert_false(chat_template_needs_server("[SYSTEM_PROMPT][TOOL_CALLS][ARGS][CALL_ID]"));
	assert_false(chat_template_needs_server("<|im_start|>{{ m.content }}<|im_end|>"));
}

static void test_dump_like_nlohmann(void **state)
{
	(void)state;
	json_error_t jerr;
	struct {
		const char *in, *want;
	} cases[] = {
	    {"{\"b\":1,\"a\":[true,null,\"x\"]}", "{\"b\":1,\"a\":[true,null,\"x\"]}"},
	    {"[1.0, 0.5, 1e16, 1e17, 1e-5, -0.0]", "[1.0,0.5,1e+16,1e+17,1e-05,-0.0]"},
	    {"[\"\\u0001\\n\\t\\\"\\\\/\\u00e9\"]", "[\"\\u0001\\n\\t\\\"\\\\/\xc3\xa9\"]"},
	    {"{}", "{}"},
	    {"[]", "[]"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		json_t *v = json_loads(cases[i].in, JSON_DECODE_ANY, &jerr);
		assert_non_null(v);
		char *got = chat_dump_like_nlohmann(v);
		assert_non_null(got);
		if (strcmp(got, cases[i].want))
			fail_msg("dump %s\n  want: %s\n  got:  %s", cases[i].in, cases[i].want,
			         got);
		free(got);
		json_decref(v);
	}
}

static json_t *parse(const char *text)
{
	json_error_t jerr;
	json_t *v = json_loads(text, 0, &jerr);
	if (!v)
		fail_msg("bad JSON in the test: %s", jerr.text);
	return v;
}

/* chat_server_prefixes on a request (JSON text) must give exactly want
 * (n of them), and the same count when ks is NULL. */
static void expect_prefixes(const char *request, const size_t *want, size_t n)
{
	json_t *req = parse(request);
	size_t ks[16];
	memset(ks, 0xff, sizeof ks);
	size_t got = chat_server_prefixes(req, ks);
	if (got != n)
		fail_msg("request %s: %zu prefixes, want %zu", request, got, n);
	for (size_t i = 0; i < n; i++)
		if (ks[i] != want[i])
			fail_msg("request %s: prefix %zu is %zu, want %zu", request, i, ks[i],
			         want[i]);
	/* Nothing written past the count. */
	assert_int_equal(ks[n], (size_t)-1);
	assert_int_equal(chat_server_prefixes(req, NULL), n);
	json_decref(req);
}

#define MSG(role) "{\"role\":\"" role "\",\"content\":\"x\"}"

static void test_server_prefixes(void **state)
{
	(void)state;
	/* The first message's end, each assistant message's start and the
	 * generation prompt's; user turns past the first are no chunk starts. */
	expect_prefixes("{\"messages\":[" MSG("system") "," MSG("user") "," MSG(
	                    "assistant") "," MSG("user") "," MSG("assistant") "," MSG("user") "]}",
	                (size_t[]){1, 2, 4, 6}, 4);
	/* One user message: its end is the generation prompt's start (k = 1 = m). */
	expect_prefixes("{\"messages\":[" MSG("user") "]}", (size_t[]){1}, 1);
	/* Tool output is not an answer: only the assistant turns and the end. */
	expect_prefixes("{\"messages\":[" MSG("user") "," MSG("assistant") "," MSG("tool") "," MSG(
	                    "assistant") "," MSG("user") "]}",
	                (size_t[]){1, 3, 5}, 3);
	/* A final assistant message is continued (prefill): its start is one,
	 * but there is no generation prompt after it. */
	expect_prefixes("{\"messages\":[" MSG("system") "," MSG("user") "," MSG("assistant") "]}",
	                (size_t[]){1, 2}, 2);
	/* No generation prompt asked for. */
	expect_prefixes("{\"messages\":[" MSG("system") "," MSG("user") "," MSG(
	                    "assistant") "," MSG("user") "],\"add_generation_prompt\":false}",
	                (size_t[]){1, 2}, 2);
	/* Asked for explicitly: as by default. */
	expect_prefixes("{\"messages\":[" MSG("system") "," MSG("user") "," MSG(
	                    "assistant") "," MSG("user") "],\"add_generation_prompt\":true}",
	                (size_t[]){1, 2, 4}, 3);
	/* One message and no generation prompt: its end is the prompt's end,
	 * no start. */
	expect_prefixes("{\"messages\":[" MSG("user") "],\"add_generation_prompt\":false}", NULL,
	                0);
	expect_prefixes("{\"messages\":[" MSG("assistant") "]}", NULL, 0);
	/* No messages (or none at all). */
	expect_prefixes("{\"messages\":[]}", NULL, 0);
	expect_prefixes("{\"prompt\":\"x\"}", NULL, 0);
	assert_int_equal(chat_server_prefixes(NULL, NULL), 0);
}

static void test_start_kind(void **state)
{
	(void)state;
	json_t *msgs = parse("[" MSG("system") "," MSG("user") "," MSG("assistant") "," MSG(
	    "tool") ",{\"content\":\"no role\"},{\"role\":7,\"content\":\"x\"}]");
	assert_int_equal(chat_start_kind(msgs, 0), SCHED_START_MESSAGE);
	assert_int_equal(chat_start_kind(msgs, 1), SCHED_START_MESSAGE);
	assert_int_equal(chat_start_kind(msgs, 2), SCHED_START_ANSWER);
	assert_int_equal(chat_start_kind(msgs, 3), SCHED_START_MESSAGE);
	assert_int_equal(chat_start_kind(msgs, 4), SCHED_START_MESSAGE);
	assert_int_equal(chat_start_kind(msgs, 5), SCHED_START_MESSAGE);
	/* Past the messages: the generation prompt. */
	assert_int_equal(chat_start_kind(msgs, 6), SCHED_START_ANSWER);
	assert_int_equal(chat_start_kind(msgs, 100), SCHED_START_ANSWER);
	assert_int_equal(chat_start_kind(NULL, 0), SCHED_START_ANSWER);
	json_decref(msgs);
}

#undef MSG

/* finish()'s result must be exactly want (offsets and kinds, n of them) and
 * header. */
static void expect_starts(struct chat_starts *s, const char *prompt, const size_t *want_off,
                          const unsigned char *want_kind, size_t want_n, int want_header)
{
	size_t *off = (size_t *)1;
	unsigned char *kind = (unsigned char *)1;
	size_t n = 99;
	int header = 99;
	assert_int_equal(chat_starts_finish(s, prompt, &off, &kind, &n, &header), 0);
	assert_int_equal(n, want_n);
	assert_int_equal(header, want_header);
	if (!want_n) {
		assert_null(off);
		assert_null(kind);
	}
	for (size_t i = 0; i < want_n; i++) {
		if (off[i] != want_off[i] || kind[i] != want_kind[i])
			fail_msg("start %zu: %zu (kind %u), want %zu (kind %u)", i, off[i], kind[i],
			         want_off[i], want_kind[i]);
	}
	free(off);
	free(kind);
	/* finish empties s. */
	assert_null(s->off);
	assert_int_equal(s->n, 0);
	assert_int_equal(s->last, 0);
}

enum { SEC = SCHED_START_SECTION, MSG = SCHED_START_MESSAGE, ANS = SCHED_START_ANSWER };

static void test_starts(void **state)
{
	(void)state;
	/* Offsets: "SYS para one." 0-12, "\n\n" 13-14, "para two." 15, "<end>" 24,
	 * "USER hi" 29, "<end>" 36, "ASSIST" 41-46. */
	const char *prompt = "SYS para one.\n\npara two.<end>USER hi<end>ASSIST";
	size_t len = strlen(prompt);
	assert_int_equal(len, 47);
	const char *r1 = "SYS para one.\n\npara two.<end>"; /* the first message */
	const char *r2 = "SYS para one.\n\npara two.<end>USER hi<end>";
	struct chat_starts s = {0};

	/* Both renderings prefixes: the message starts, with the paragraph
	 * break of the first message (its begin and end) before them. */
	chat_starts_add(&s, prompt, len, r1, strlen(r1), MSG, 0);
	chat_starts_add(&s, prompt, len, r2, strlen(r2), ANS, 1);
	expect_starts(&s, prompt, (size_t[]){13, 15, 29, 41}, (unsigned char[]){SEC, SEC, MSG, ANS},
	              4, 1);

	/* A rendering that is not a prefix (a template that renders the first
	 * message differently once more follow) gives no start, nor moves the
	 * last one: a later shorter prefix still counts. No text (a failed
	 * rendering) is none either. */
	chat_starts_add(&s, prompt, len, NULL, 35, ANS, 0);
	chat_starts_add(&s, prompt, len, "SYS para one.\n\npara TWO.<end>USER hi<end>", 41, ANS, 1);
	chat_starts_add(&s, prompt, len, r1, strlen(r1), MSG, 0);
	expect_starts(&s, prompt, (size_t[]){13, 15, 29}, (unsigned char[]){SEC, SEC, MSG}, 3, 0);

	/* Not past the last start: skipped (equal or before), and the header
	 * flag stays the last added start's. */
	chat_starts_add(&s, prompt, len, r2, strlen(r2), ANS, 0);
	chat_starts_add(&s, prompt, len, r2, strlen(r2), MSG, 1);
	chat_starts_add(&s, prompt, len, r1, strlen(r1), MSG, 1);
	chat_starts_add(&s, prompt, len, prompt, 0, MSG, 1);
	expect_starts(&s, prompt, (size_t[]){13, 15, 41}, (unsigned char[]){SEC, SEC, ANS}, 3, 0);

	/* The whole prompt (or more) is no start: nothing follows it. As the
	 * rendering before the generation prompt, the whole prompt says that
	 * prompt is empty (Mistral's: generation begins at the prompt's end);
	 * as another message's, nothing. */
	chat_starts_add(&s, prompt, len, r1, strlen(r1), MSG, 0);
	chat_starts_add(&s, prompt, len, prompt, len, ANS, 0);
	char *more = malloc(len + 2);
	assert_non_null(more);
	memcpy(more, prompt, len);
	memcpy(more + len, "!", 2);
	chat_starts_add(&s, prompt, len, more, len + 1, ANS, 1);
	free(more);
	expect_starts(&s, prompt, (size_t[]){13, 15, 29}, (unsigned char[]){SEC, SEC, MSG}, 3, 0);
	chat_starts_add(&s, prompt, len, r1, strlen(r1), MSG, 0);
	chat_starts_add(&s, prompt, len, prompt, len, ANS, 1);
	expect_starts(&s, prompt, (size_t[]){13, 15, 29}, (unsigned char[]){SEC, SEC, MSG}, 3,
	              CHAT_HEADER_EMPTY);

	/* Nothing found: no starts at all, not even the paragraphs. */
	expect_starts(&s, prompt, NULL, NULL, 0, 0);
	chat_starts_add(&s, prompt, len, "SYS para one.\n\npara 2", 22, MSG, 0);
	chat_starts_add(&s, prompt, len, prompt, len, ANS, 1);
	chat_starts_add(&s, prompt, len, NULL, 29, MSG, 1);
	expect_starts(&s, prompt, NULL, NULL, 0, 0);

	/* No empty line before the first start: no paragraph starts (a single
	 * line end, "\r\n" too, is no break), and breaks in later messages
	 * are none either. */
	const char *p2 = "A\r\nB<end>C\n\nD<end>E";
	chat_starts_add(&s, p2, strlen(p2), p2, 9, MSG, 0);
	chat_starts_add(&s, p2, strlen(p2), p2, 18, ANS, 1);
	expect_starts(&s, p2, (size_t[]){9, 18}, (unsigned char[]){MSG, ANS}, 2, 1);

	/* Paragraph runs: one at the very start gives only the offset after
	 * it; "\r\n\r\n" and longer runs count once. */
	/* Offsets: "\n\n" 0-1, A 2, "\n" 3, B 4, "\r\n\r\n" 5-8, C 9,
	 * "\n\n\n" 10-12, D 13, "<end>" 14, U 19, "<end>" 20, ASSIST 25. */
	const char *p3 = "\n\nA\nB\r\n\r\nC\n\n\nD<end>U<end>ASSIST";
	chat_starts_add(&s, p3, strlen(p3), p3, 19, MSG, 0);
	chat_starts_add(&s, p3, strlen(p3), p3, 25, ANS, 1);
	expect_starts(&s, p3, (size_t[]){2, 5, 9, 10, 13, 19, 25},
	              (unsigned char[]){SEC, SEC, SEC, SEC, SEC, MSG, ANS}, 7, 1);
	/* A run that ends where the first start is gives none: that start is
	 * there already. */
	const char *p4 = "A\n\nB<end>C";
	chat_starts_add(&s, p4, strlen(p4), p4, 3, MSG, 0);
	chat_starts_add(&s, p4, strlen(p4), p4, 9, ANS, 1);
	expect_starts(&s, p4, (size_t[]){3, 9}, (unsigned char[]){MSG, ANS}, 2, 1);
}

/* chat_starts_apart: the rendering up to and including the assistant
 * message whose start was the last found, as the latest turn, marks where
 * the prompt parts from it (CHAT_CUT_APART), or nothing where it agrees. */
static void test_starts_apart(void **state)
{
	(void)state;
	enum { APART = CHAT_CUT_APART };
	/* Offsets: "SYS" 0, "<end>" 3, "USER hi" 8, "<end>" 15, "A:Hello there"
	 * 20, "<end>" 33, "USER more" 38, "<end>" 47, "A:" 52. */
	const char *prompt = "SYS<end>USER hi<end>A:Hello there<end>USER more<end>A:";
	size_t len = strlen(prompt);
	assert_int_equal(len, 54);
	struct chat_starts s = {0};
	/* Reasoning the prompt dropped from an earlier turn: it parts right
	 * after the answer's header. */
	const char *latest = "SYS<end>USER hi<end>A:<think>x</think>Hello there<end>";
	chat_starts_apart(&s, prompt, len, prompt, 8); /* no start yet */
	chat_starts_add(&s, prompt, len, prompt, 8, MSG, 0);
	chat_starts_apart(&s, prompt, len, prompt, 12); /* after a user's message */
	chat_starts_add(&s, prompt, len, prompt, 20, ANS, 0);
	chat_starts_apart(&s, prompt, len, latest, strlen(latest));
	chat_starts_add(&s, prompt, len, latest, strlen(latest), MSG, 0);
	chat_starts_add(&s, prompt, len, prompt, 52, ANS, 1);
	expect_starts(&s, prompt, (size_t[]){8, 20, 22, 52},
	              (unsigned char[]){MSG, ANS, APART, ANS}, 4, CHAT_HEADER_LAST);

	/* As the prompt has it (a prefix, or agreeing to the prompt's end):
	 * nothing. Parting before the answer's start: nothing to bound. */
	chat_starts_add(&s, prompt, len, prompt, 20, ANS, 0);
	chat_starts_apart(&s, prompt, len, prompt, 38);
	chat_starts_apart(&s, prompt, len,
	                  "SYS<end>USER hi<end>A:Hello there<end>USER more<end>A:B:", 57);
	chat_starts_apart(&s, prompt, len, "SYS<end>USER hx<end>A:Hello there<end>", 38);
	expect_starts(&s, prompt, (size_t[]){20}, (unsigned char[]){ANS}, 1, 0);

	/* Llama 3's: a header after every message, so the rendering parts
	 * after the answer's end of turn, where the next message starts. A
	 * start there is still one. */
	const char *header = "SYS<end>USER hi<end>A:Hello there<end>A:";
	chat_starts_add(&s, prompt, len, prompt, 20, ANS, 0);
	chat_starts_apart(&s, prompt, len, header, strlen(header));
	chat_starts_add(&s, prompt, len, prompt, 38, MSG, 0);
	chat_starts_add(&s, prompt, len, prompt, 52, ANS, 1);
	expect_starts(&s, prompt, (size_t[]){20, 38, 38, 52},
	              (unsigned char[]){ANS, APART, MSG, ANS}, 4, CHAT_HEADER_LAST);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_messages_written_back, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_capabilities, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_tools_and_context, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_reasoning_effort, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_left_to_the_server, setup, teardown),
	    cmocka_unit_test(test_template_errors),
	    cmocka_unit_test(test_special_handlers),
	    cmocka_unit_test(test_dump_like_nlohmann),
	    cmocka_unit_test(test_server_prefixes),
	    cmocka_unit_test(test_start_kind),
	    cmocka_unit_test(test_starts),
	    cmocka_unit_test(test_starts_apart),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
