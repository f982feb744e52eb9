/* Chat templates (src/template/) and the request handling before them
 * (src/prompt/chat.c): the template is text from a model file (GGUF
 * tokenizer.chat_template, or the server's --chat-template), the request is
 * any client's. The first byte picks what the rest is:
 *   even: a template, parsed and rendered with a fixed conversation;
 *   odd:  a chat request (JSON), rendered through a fixed template that
 *         uses most of what real ones do (tools, tool calls, reasoning,
 *         loops with loop.*, macros, filters, namespace).
 * A render must end (the engine's depth and memory caps) and give a string
 * whose length it reports. */
#include <stdint.h>
#include <string.h>

#include "fuzz_common.h"
#include "prompt/chat.h"
#include "template/jinja.h"
#include "util/json_body.h"

static const char *conversation =
    "{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
    "{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
    "{\"role\":\"assistant\",\"content\":\"\",\"reasoning_content\":\"look it up\","
    "\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\",\"function\":{\"name\":\"get\","
    "\"arguments\":{\"city\":\"Paris\",\"n\":[1,2.5,null,true]}}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"18C\"},"
    "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Thanks\"}]}],"
    "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"description\":\"d\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}}],"
    "\"bos_token\":\"<s>\",\"eos_token\":\"</s>\",\"add_generation_prompt\":true,"
    "\"enable_thinking\":false}";

static const char *rich_template =
    "{%- macro render_tool(t, prefix='') -%}{{ prefix }}{{ t.function.name }}: "
    "{{ t.function|tojson(indent=2) }}{%- endmacro -%}"
    "{{- bos_token -}}{%- set ns = namespace(last_user=-1, sys='') -%}"
    "{%- for m in messages -%}{%- if m.role == 'user' %}{% set ns.last_user = loop.index0 %}"
    "{% endif -%}{%- endfor -%}"
    "{%- if tools is defined and tools -%}<tools>{% for t in tools %}{{ render_tool(t, "
    "prefix='- ') }}{% if not loop.last %}\n{% endif %}{% endfor %}</tools>{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.content is string %}{% set c = m.content %}{% else %}"
    "{% set c = m.content|map(attribute='text')|join('\\n') %}{% endif -%}"
    "<|im_start|>{{ m.role }}\n"
    "{%- if m.role == 'assistant' and m.reasoning_content is defined and loop.index0 > "
    "ns.last_user %}<think>{{ m.reasoning_content|trim }}</think>{% endif -%}"
    "{{ c|trim }}"
    "{%- for tc in m.tool_calls|default([]) %}<call>{{ tc.function.name|upper }} "
    "{{ tc.function.arguments|tojson }}{{ tc.id|default('')|replace('c', 'C') }}</call>"
    "{%- endfor -%}"
    "<|im_end|>\n{%- endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% if not enable_thinking %}"
    "<think>\n\n</think>{% endif %}{% endif -%}"
    "{{ messages|length }} {{ (messages|selectattr('role', 'equalto', 'user')|list)|length }}"
    " {{ messages[-1].role|title }} {{ [3, 1, 2]|sort|reverse|list }}"
    " {{ {'b': 1, 'a': 2}|dictsort }} {{ 7 % 3 }}"
    " {{ 'ab' * 2 }} {{ 'a,b'.split(',') }} {{ range(3)|list|length }}";

static json_t *globals;
static struct jinja_template *rich;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	json_error_t e;
	globals = json_loads(conversation, 0, &e);
	char err[256];
	rich = jinja_parse(rich_template, strlen(rich_template), err, sizeof err);
	if (!globals || !rich) {
		fprintf(stderr, "fuzz_chat_template: %s\n", globals ? err : e.text);
		abort();
	}
	/* The fixed template renders the fixed conversation. */
	struct chat_env env = {.tmpl = rich, .bos_token = "<s>", .eos_token = "</s>"};
	chat_caps_from_json(NULL, &env.caps);
	char *prompt = NULL, why[256];
	size_t len = 0;
	if (chat_render(&env, globals, &prompt, &len, why, sizeof why) != CHAT_OK) {
		fprintf(stderr, "fuzz_chat_template: the fixed template fails: %s\n", why);
		abort();
	}
	free(prompt);
	return 0;
}

static void check_render(const struct jinja_template *t, json_t *g)
{
	char err[512];
	size_t len = 0;
	char *out = jinja_render(t, g, 1796000000, &len, err, sizeof err);
	if (out) {
		FUZZ_CHECK(out[len] == '\0');
		free(out);
	} else {
		FUZZ_CHECK(err[0] != '\0');
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	const char *rest = (const char *)data + 1;
	size_t n = size - 1;
	char err[512];
	if (!(data[0] & 1)) {
		struct jinja_template *t = jinja_parse(rest, n, err, sizeof err);
		if (!t) {
			FUZZ_CHECK(err[0] != '\0');
			return 0;
		}
		check_render(t, globals);
		jinja_free(t);
		return 0;
	}
	json_error_t jerr;
	json_t *req = json_loadb(rest, n, JSON_BODY_FLAGS, &jerr);
	if (!req)
		return 0;
	json_t *before = json_deep_copy(req);
	struct chat_env env = {.tmpl = rich,
	                       .bos_token = "<s>",
	                       .eos_token = "</s>",
	                       .add_bos = data[0] & 2,
	                       .enable_thinking = data[0] & 4};
	json_t *caps = json_pack("{s:b, s:b, s:b, s:b}", "supports_string_content", data[0] & 8,
	                         "supports_typed_content", data[0] & 16, "supports_system_role",
	                         data[0] & 32, "supports_object_arguments", data[0] & 64);
	chat_caps_from_json(caps, &env.caps);
	json_decref(caps);
	char *prompt = NULL, why[256] = "";
	size_t len = 0;
	enum chat_result r = chat_render(&env, req, &prompt, &len, why, sizeof why);
	if (r == CHAT_OK) {
		FUZZ_CHECK(prompt && prompt[len] == '\0');
		free(prompt);
	} else {
		FUZZ_CHECK(why[0] != '\0');
	}
	/* The request is the client's: rendering must not change it. */
	FUZZ_CHECK(json_equal(req, before));
	json_decref(before);
	json_decref(req);
	return 0;
}
