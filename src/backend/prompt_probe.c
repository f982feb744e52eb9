#include "backend/prompt_probe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "api/request_check.h"
#include "backend/backend.h"
#include "backend/prefix_render.h"
#include "daemon.h"
#include "prompt/prompt.h"
#include "util/log.h"
#include "util/json_body.h"

/* Texts that exercise the tokenizer where a port goes wrong: spacing,
 * unicode categories, digits, contractions, code; the special tokens of the
 * model are added from /props. */
static const char *const probe_texts[] = {
    "Hello, world!",
    " leading space and trailing space ",
    "multiple   spaces\tand\ttabs\n\nnew\r\nlines\n",
    "\xc3\x9c"
    "n\xc3\xaf"
    "c\xc3\xb6"
    "d\xc3\xa9 \xe2\x80\x94 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 "
    "\xc2\xa0nbsp \xe2\x82\xac"
    "5",
    "numbers 1 12 123 1234 12345 3.14159 -42 0x1F",
    "I'm sure they've said it's what we'd do. DON'T",
    "def f(x):\n    return {'a': [x, x * 2]}  # comment\n",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
};
#define N_TEXTS (sizeof probe_texts / sizeof probe_texts[0])

/* A conversation with a tool call, sent twice: without `tools` (every
 * server takes it), then with them, only where the server takes them. */
#define TOOL_CHAT_MESSAGES                                                                         \
	"{\"messages\":[{\"role\":\"system\",\"content\":\"Use tools.\"},{\"role\":\"user\","      \
	"\"content\":\"Weather in "                                                                \
	"Paris?\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"                       \
	"[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","        \
	"\"arguments\":\"{\\\"city\\\": \\\"Paris\\\"}\"}}]},{\"role\":\"tool\",\"tool_call_id\":" \
	"\"call_1\",\"content\":\"18C\"},{\"role\":\"user\",\"content\":\"Thanks\"}]"

static const char *const probe_chats[] = {
    "{\"messages\":[{\"role\":\"system\",\"content\":\"You are a test. Answer briefly.\"},"
    "{\"role\":\"user\",\"content\":\"Hello there\"}]}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\","
    "\"content\":\"Hello! How can I help?\"},{\"role\":\"user\",\"content\":\"Tell me a joke.\"}]}",
    TOOL_CHAT_MESSAGES "}",
    TOOL_CHAT_MESSAGES
    ",\"tools\":"
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":"
    "\"Weather for a city.\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":"
    "{\"type\":\"string\"}},\"required\":[\"city\"]}}}]}",
    "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"add_generation_prompt\":false}",
};
#define N_CHATS (sizeof probe_chats / sizeof probe_chats[0])
#define CHAT_TOOL_CALLS 2 /* the tool conversation without tools */
#define CHAT_TOOLS 3      /* the same with tools */

struct prompt_probe {
	struct backend *b;
	struct prompt_engine *pe;
	struct backend_call *call;
	size_t step;   /* texts, then chats, then the last chat's tokens */
	json_t *texts; /* strings to tokenize */
	int tokens_ok, thinking_ok[2], chats_seen;
	/* Whether the tools probe may be sent: the template takes tools
	 * (/props chat_template_caps), and the server renders with it. A
	 * --no-jinja server answers `tools` with a 500 (and logs it), and /props
	 * does not tell it from a jinja one: it shows in the tool-call probe,
	 * whose call a --no-jinja server leaves out of the prompt. */
	int template_takes_tools, server_takes_tools;
	char *last_prompt; /* the server's prompt of the last chat probe */
	char why[160];
};

static void probe_next(struct prompt_probe *p);

/* A /tokenize body for text, as the server tokenizes prompts (BOS added,
 * special tokens parsed); malloc'd, NULL when out of memory. */
static char *tokenize_body(const char *text, size_t len)
{
	json_t *req = json_pack("{s:s%, s:b, s:b}", "content", text, len, "add_special", 1,
	                        "parse_special", 1);
	char *body = req ? json_dumps(req, JSON_COMPACT) : NULL;
	json_decref(req);
	return body;
}

static void probe_free(struct prompt_probe *p)
{
	if (p->call)
		backend_call_cancel(p->call);
	prompt_engine_free(p->pe);
	json_decref(p->texts);
	free(p->last_prompt);
	free(p);
}

static void audits_free(struct backend *b);

void prompt_probe_stop(struct backend *b)
{
	audits_free(b);
	if (b->probe) {
		b->probe->b = NULL;
		probe_free(b->probe);
		b->probe = NULL;
	}
	prompt_engine_free(b->prompt);
	b->prompt = NULL;
	b->prompt_tokens_ok = b->prompt_chat_ok = 0;
	prefix_render_cache_free(b);
}

/* The probes ended: hand the engine to the backend if any part matched. */
static void probe_finish(struct prompt_probe *p)
{
	struct backend *b = p->b;
	int chat = p->tokens_ok && prompt_engine_has_chat(p->pe) && p->chats_seen &&
	           (p->thinking_ok[0] || p->thinking_ok[1]);
	if (p->tokens_ok) {
		if (chat)
			prompt_engine_set_thinking(p->pe, p->thinking_ok[1]);
		b->prompt = p->pe;
		p->pe = NULL;
		b->prompt_tokens_ok = 1;
		b->prompt_chat_ok = chat;
	}
	if (chat)
		snprintf(b->prompt_status, sizeof b->prompt_status,
		         "local: tokenizer and chat template match the server (enable_thinking %s)",
		         p->thinking_ok[1] ? "on" : "off");
	else if (p->tokens_ok)
		snprintf(b->prompt_status, sizeof b->prompt_status,
		         "local tokenizer; chat templates by the server: %.120s",
		         p->why[0] ? p->why : "the template did not match");
	else
		snprintf(b->prompt_status, sizeof b->prompt_status, "server: %.150s", p->why);
	log_info("backend %s prompts: %s", b->rb->url, b->prompt_status);
	b->probe = NULL;
	probe_free(p);
	/* Exact mode holds chat requests while the probes run (their
	 * schedule depends on who makes the prompt): they go now. */
	daemon_slots_changed(b->d, b->rb->index);
}

static void probe_error(struct backend_call *call, enum backend_error err, void *arg)
{
	struct prompt_probe *p = arg;
	p->call = NULL;
	p->tokens_ok = 0;
	snprintf(p->why, sizeof p->why, "probe failed: %s", backend_error_text(err));
	probe_finish(p);
}

static int same_tokens(json_t *server, const struct token_list *mine)
{
	if (!json_is_array(server) || json_array_size(server) != mine->n)
		return 0;
	for (size_t i = 0; i < mine->n; i++)
		if (json_integer_value(json_array_get(server, i)) != mine->v[i])
			return 0;
	return 1;
}

static void on_text_tokens(struct backend_call *call, int status, const char *body, size_t len,
                           void *arg)
{
	struct prompt_probe *p = arg;
	p->call = NULL;
	json_t *o = json_body(status, body, len, -1);
	json_t *text = json_array_get(p->texts, p->step);
	struct token_list mine = {0};
	int rc =
	    prompt_engine_tokenize(p->pe, json_string_value(text), json_string_length(text), &mine);
	if (rc != 0 || !same_tokens(json_object_get(o, "tokens"), &mine)) {
		p->tokens_ok = 0;
		snprintf(p->why, sizeof p->why,
		         "the tokenizer differs from the server's on probe %zu", p->step + 1);
	}
	token_list_free(&mine);
	json_decref(o);
	if (!p->tokens_ok) {
		probe_finish(p);
		return;
	}
	p->step++;
	probe_next(p);
}

static void on_last_tokens(struct backend_call *call, int status, const char *body, size_t len,
                           void *arg)
{
	struct prompt_probe *p = arg;
	p->call = NULL;
	json_t *o = json_body(status, body, len, -1);
	struct token_list mine = {0};
	int rc = prompt_engine_tokenize(p->pe, p->last_prompt, strlen(p->last_prompt), &mine);
	if (rc != 0 || !same_tokens(json_object_get(o, "tokens"), &mine)) {
		p->thinking_ok[0] = p->thinking_ok[1] = 0;
		snprintf(p->why, sizeof p->why, "a chat prompt tokenizes differently");
	}
	token_list_free(&mine);
	json_decref(o);
	probe_finish(p);
}

static void on_chat_prompt(struct backend_call *call, int status, const char *body, size_t len,
                           void *arg)
{
	struct prompt_probe *p = arg;
	p->call = NULL;
	size_t k = p->step - json_array_size(p->texts);
	json_error_t jerr;
	json_t *o = json_body(status, body, len, -1);
	const char *server = json_string_value(json_object_get(o, "prompt"));
	if (server) {
		/* A probe the server refuses (tools a template cannot take) says
		 * nothing either way. */
		p->chats_seen++;
		json_t *req = json_loads(probe_chats[k], 0, &jerr);
		for (int on = 0; on <= 1; on++) {
			if (!p->thinking_ok[on])
				continue;
			prompt_engine_set_thinking(p->pe, on);
			char *prompt = NULL, why[256];
			size_t plen = 0;
			struct token_list t = {0};
			enum chat_result r = prompt_engine_chat(p->pe, req, time(NULL), &prompt,
			                                        &plen, &t, why, sizeof why);
			if (r != CHAT_OK || plen != strlen(server) ||
			    memcmp(prompt, server, plen)) {
				p->thinking_ok[on] = 0;
				if (!p->thinking_ok[!on])
					snprintf(
					    p->why, sizeof p->why, "chat probe %zu: %.120s", k + 1,
					    r == CHAT_OK ? "the prompt differs from the server's"
					                 : why);
			}
			free(prompt);
			token_list_free(&t);
		}
		json_decref(req);
		free(p->last_prompt);
		p->last_prompt = strdup(server);
		if (k == CHAT_TOOL_CALLS)
			p->server_takes_tools =
			    p->template_takes_tools && strstr(server, "get_weather") != NULL;
	}
	json_decref(o);
	p->step++;
	probe_next(p);
}

static const struct backend_call_handlers text_handlers = {.on_done = on_text_tokens,
                                                           .on_error = probe_error};
static const struct backend_call_handlers chat_handlers = {.on_done = on_chat_prompt,
                                                           .on_error = probe_error};
static const struct backend_call_handlers last_handlers = {.on_done = on_last_tokens,
                                                           .on_error = probe_error};

static void start_tokenize(struct prompt_probe *p, const char *text, size_t len,
                           const struct backend_call_handlers *h)
{
	char *body = tokenize_body(text, len);
	p->call =
	    body ? backend_call_start(p->b->http, "POST", "/tokenize", body, strlen(body), h, p)
	         : NULL;
	free(body);
	if (!p->call) {
		snprintf(p->why, sizeof p->why, "out of memory");
		p->tokens_ok = 0;
		probe_finish(p);
	}
}

static void probe_next(struct prompt_probe *p)
{
	size_t n_texts = json_array_size(p->texts);
	if (p->step < n_texts) {
		json_t *t = json_array_get(p->texts, p->step);
		start_tokenize(p, json_string_value(t), json_string_length(t), &text_handlers);
		return;
	}
	size_t k = p->step - n_texts;
	if (!prompt_engine_has_chat(p->pe)) {
		snprintf(p->why, sizeof p->why,
		         "the template is one llama-server renders its own way");
		probe_finish(p);
		return;
	}
	if (k == CHAT_TOOLS && !p->server_takes_tools) {
		p->step++; /* a probe the server would refuse tells nothing */
		probe_next(p);
		return;
	}
	if (k < N_CHATS) {
		p->call = backend_call_start(p->b->http, "POST", "/apply-template", probe_chats[k],
		                             strlen(probe_chats[k]), &chat_handlers, p);
		if (!p->call) {
			snprintf(p->why, sizeof p->why, "out of memory");
			probe_finish(p);
		}
		return;
	}
	if (p->last_prompt && (p->thinking_ok[0] || p->thinking_ok[1])) {
		start_tokenize(p, p->last_prompt, strlen(p->last_prompt), &last_handlers);
		return;
	}
	probe_finish(p);
}

void prompt_probe_start(struct backend *b, json_t *props)
{
	prompt_probe_stop(b);
	snprintf(b->prompt_status, sizeof b->prompt_status, "server");
	if (!b->d->cfg.local_prompts) {
		snprintf(b->prompt_status, sizeof b->prompt_status, "server (--tokenize server)");
		return;
	}
	const char *model = json_string_value(json_object_get(props, "model_path"));
	if (!model || access(model, R_OK) != 0) {
		snprintf(b->prompt_status, sizeof b->prompt_status,
		         "server: the model file is not readable here");
		return;
	}
	struct prompt_engine_config cfg = {
	    .model_path = model,
	    .chat_template = json_string_value(json_object_get(props, "chat_template")),
	    .tool_use_template =
	        json_string_value(json_object_get(props, "chat_template_tool_use")),
	    .caps = json_object_get(props, "chat_template_caps"),
	    .bos_token = json_string_value(json_object_get(props, "bos_token")),
	    .eos_token = json_string_value(json_object_get(props, "eos_token")),
	    .enable_thinking = 1,
	};
	char err[256];
	struct prompt_engine *pe = prompt_engine_new(&cfg, err, sizeof err);
	if (!pe) {
		snprintf(b->prompt_status, sizeof b->prompt_status, "server: %.180s", err);
		log_info("backend %s prompts: %s", b->rb->url, b->prompt_status);
		return;
	}
	struct prompt_probe *p = calloc(1, sizeof *p);
	json_t *texts = json_array();
	if (!p || !texts) {
		free(p);
		json_decref(texts);
		prompt_engine_free(pe);
		return;
	}
	for (size_t i = 0; i < N_TEXTS; i++)
		json_array_append_new(texts, json_string(probe_texts[i]));
	/* The model's own BOS and EOS text, glued to words. */
	const char *bos = cfg.bos_token, *eos = cfg.eos_token;
	if ((bos && *bos) || (eos && *eos)) {
		char buf[512];
		snprintf(buf, sizeof buf, "%sHi there%s\nagain%s", bos ? bos : "", eos ? eos : "",
		         eos ? eos : "");
		json_array_append_new(texts, json_string(buf));
	}
	p->b = b;
	p->pe = pe;
	p->texts = texts;
	p->tokens_ok = 1;
	p->thinking_ok[0] = p->thinking_ok[1] = 1;
	p->template_takes_tools = json_is_true(json_object_get(cfg.caps, "supports_tools")) &&
	                          json_is_true(json_object_get(cfg.caps, "supports_tool_calls"));
	b->probe = p;
	snprintf(b->prompt_status, sizeof b->prompt_status, "server (probing the local tokenizer)");
	probe_next(p);
}

/* ---- audits ---- */

struct prompt_audit {
	struct backend *b;
	struct backend_call *call;
	int chat;
	token_t *tokens;
	size_t n;
	char *server_prompt; /* chat: the server's prompt text */
	struct prompt_audit *next;
};

static void audit_unlink_free(struct prompt_audit *a)
{
	struct prompt_audit **pp = &a->b->audits;
	while (*pp && *pp != a)
		pp = &(*pp)->next;
	if (*pp)
		*pp = a->next;
	if (a->call)
		backend_call_cancel(a->call);
	free(a->tokens);
	free(a->server_prompt);
	free(a);
}

static void audits_free(struct backend *b)
{
	while (b->audits)
		audit_unlink_free(b->audits);
}

void prompt_engine_disable(struct backend *b, enum prompt_fault fault, const char *why)
{
	b->prompt_mismatches++;
	if (fault == PROMPT_FAULT_TEMPLATE && b->prompt_chat_ok) {
		b->prompt_chat_ok = 0;
		snprintf(b->prompt_status, sizeof b->prompt_status,
		         "local tokenizer; chat templates by the server since a difference: %.100s",
		         why);
	} else if (fault == PROMPT_FAULT_ALL && b->prompt_tokens_ok) {
		b->prompt_tokens_ok = 0;
		b->prompt_chat_ok = 0;
		snprintf(b->prompt_status, sizeof b->prompt_status,
		         "server, since a difference: %.150s", why);
	} else {
		return;
	}
	log_warn("backend %s prompts: %s", b->rb->url, b->prompt_status);
}

static void audit_error(struct backend_call *call, enum backend_error err, void *arg)
{
	struct prompt_audit *a = arg;
	a->call = NULL;
	audit_unlink_free(a); /* the backend went away: nothing learned */
}

static void on_audit_tokens(struct backend_call *call, int status, const char *body, size_t len,
                            void *arg)
{
	struct prompt_audit *a = arg;
	a->call = NULL;
	json_t *o = json_body(status, body, len, -1);
	json_t *server = json_object_get(o, "tokens");
	struct token_list mine = {a->tokens, a->n, a->n};
	if (json_is_array(server)) {
		a->b->prompt_audits++;
		if (!same_tokens(server, &mine)) {
			/* Whose fault: when this tokenizer makes the server's tokens
			 * from the server's prompt text, the template differs. */
			enum prompt_fault fault = PROMPT_FAULT_ALL;
			struct token_list again = {0};
			if (a->chat && a->server_prompt && a->b->prompt &&
			    prompt_engine_tokenize(a->b->prompt, a->server_prompt,
			                           strlen(a->server_prompt), &again) == 0 &&
			    same_tokens(server, &again))
				fault = PROMPT_FAULT_TEMPLATE;
			token_list_free(&again);
			char why[160];
			snprintf(
			    why, sizeof why, "an audited %s came to %zu tokens here, %zu there",
			    a->chat ? "chat request" : "prompt", a->n, json_array_size(server));
			prompt_engine_disable(a->b, fault, why);
		}
	}
	json_decref(o);
	audit_unlink_free(a);
}

static const struct backend_call_handlers audit_tokens_handlers = {.on_done = on_audit_tokens,
                                                                   .on_error = audit_error};

static void audit_tokenize(struct prompt_audit *a, const char *text, size_t len)
{
	char *body = tokenize_body(text, len);
	a->call = body ? backend_call_start(a->b->http, "POST", "/tokenize", body, strlen(body),
	                                    &audit_tokens_handlers, a)
	               : NULL;
	free(body);
	if (!a->call)
		audit_unlink_free(a);
}

static void on_audit_template(struct backend_call *call, int status, const char *body, size_t len,
                              void *arg)
{
	struct prompt_audit *a = arg;
	a->call = NULL;
	json_t *o = json_body(status, body, len, -1);
	json_t *prompt = json_object_get(o, "prompt");
	if (json_is_string(prompt) && (a->server_prompt = strdup(json_string_value(prompt))))
		audit_tokenize(a, json_string_value(prompt), json_string_length(prompt));
	else
		audit_unlink_free(a);
	json_decref(o);
}

static const struct backend_call_handlers audit_template_handlers = {.on_done = on_audit_template,
                                                                     .on_error = audit_error};

void prompt_audit_start(struct backend *b, json_t *body, int chat, const int32_t *tokens, size_t n)
{
	uint64_t k = b->prompt_local;
	if (!(k <= 16 || k % 64 == 0) || !b->prompt)
		return;
	struct prompt_audit *a = calloc(1, sizeof *a);
	if (!a)
		return;
	a->b = b;
	a->chat = chat;
	a->n = n;
	a->tokens = malloc((n ? n : 1) * sizeof *a->tokens);
	if (!a->tokens) {
		free(a);
		return;
	}
	memcpy(a->tokens, tokens, n * sizeof *tokens);
	a->next = b->audits;
	b->audits = a;
	if (!chat) {
		json_t *p = request_prompt_text(body);
		if (!p) {
			audit_unlink_free(a);
			return;
		}
		audit_tokenize(a, json_string_value(p), json_string_length(p));
		return;
	}
	char *raw = json_dumps(body, JSON_COMPACT);
	a->call = raw ? backend_call_start(b->http, "POST", "/apply-template", raw, strlen(raw),
	                                   &audit_template_handlers, a)
	              : NULL;
	free(raw);
	if (!a->call)
		audit_unlink_free(a);
}
