#include "api/responses.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* The rules below follow llama-server's server_chat_convert_responses_to_chatcmpl
 * line by line, including where it is lenient (a wrongly typed "instructions"
 * becomes ""; unknown keys pass through) and where it throws (the messages are
 * llama-server's own, so a client sees the same 400 either way). Helpers
 * mirror nlohmann's semantics: contains() on a non-object is false,
 * json_value() falls back to the default on a missing, null or wrongly typed
 * value. */

static void set_err(char *err, size_t errlen, const char *msg)
{
	if (err && errlen)
		snprintf(err, errlen, "%s", msg);
}

static int is_string_key(const json_t *o, const char *key)
{
	return json_is_string(json_object_get(o, key));
}

static int is_array_key(const json_t *o, const char *key)
{
	return json_is_array(json_object_get(o, key));
}

/* json_value(o, key, std::string()) */
static const char *str_value(const json_t *o, const char *key)
{
	const json_t *v = json_object_get(o, key);
	return json_is_string(v) ? json_string_value(v) : "";
}

static int str_eq(const json_t *o, const char *key, const char *want)
{
	const json_t *v = json_object_get(o, key);
	return json_is_string(v) && !strcmp(json_string_value(v), want);
}

/* chatcmpl_messages.back().value("role", "") == "assistant" */
static int last_is_assistant(const json_t *msgs)
{
	size_t n = json_array_size(msgs);
	return n && str_eq(json_array_get(msgs, n - 1), "role", "assistant");
}

/* json_pack that reports failure as out of memory. */
#define OOM_IF(cond)                                                                               \
	do {                                                                                       \
		if (cond)                                                                          \
			goto oom;                                                                  \
	} while (0)

/* An input message's parts (role user/system/developer). */
static json_t *input_parts(const json_t *content, char *err, size_t errlen)
{
	json_t *parts = json_array();
	size_t i;
	json_t *p;
	if (!parts)
		goto oom;
	json_array_foreach(content, i, p)
	{
		const char *type = str_value(p, "type");
		if (!strcmp(type, "input_text")) {
			const json_t *t = json_object_get(p, "text");
			if (!t) {
				set_err(err, errlen, "'Input text' requires 'text'");
				goto fail;
			}
			/* Copied whatever its type, as llama-server does. */
			OOM_IF(json_array_append_new(
			    parts, json_pack("{s:O, s:s}", "text", t, "type", "text")));
		} else if (!strcmp(type, "input_image")) {
			const json_t *u = json_object_get(p, "image_url");
			if (!u) {
				set_err(err, errlen, "'image_url' is required");
				goto fail;
			}
			OOM_IF(
			    json_array_append_new(parts, json_pack("{s:{s:O}, s:s}", "image_url",
			                                           "url", u, "type", "image_url")));
		} else if (!strcmp(type, "input_file")) {
			set_err(err, errlen,
			        "'input_file' is not supported by llamacpp at this moment");
			goto fail;
		} else {
			set_err(
			    err, errlen,
			    "'type' must be one of 'input_text', 'input_image', or 'input_file'");
			goto fail;
		}
	}
	return parts;
oom:
	set_err(err, errlen, "out of memory");
fail:
	json_decref(parts);
	return NULL;
}

/* An output message's parts (role assistant, type message). */
static json_t *output_parts(const json_t *item, char *err, size_t errlen)
{
	json_t *parts = json_array();
	const json_t *content = json_object_get(item, "content");
	if (!parts)
		goto oom;
	if (json_is_string(content)) {
		OOM_IF(json_array_append_new(
		    parts, json_pack("{s:O, s:s}", "text", content, "type", "text")));
	} else if (json_is_array(content)) {
		size_t i;
		json_t *p;
		json_array_foreach(content, i, p)
		{
			const char *type = str_value(p, "type");
			if (!strcmp(type, "output_text") || !strcmp(type, "input_text")) {
				if (!is_string_key(p, "text")) {
					set_err(err, errlen, "'Output text' requires 'text'");
					goto fail;
				}
				OOM_IF(json_array_append_new(
				    parts, json_pack("{s:O, s:s}", "text",
				                     json_object_get(p, "text"), "type", "text")));
			} else if (!strcmp(type, "refusal")) {
				if (!is_string_key(p, "refusal")) {
					set_err(err, errlen, "'Refusal' requires 'refusal'");
					goto fail;
				}
				OOM_IF(json_array_append_new(
				    parts,
				    json_pack("{s:O, s:s}", "refusal",
				              json_object_get(p, "refusal"), "type", "refusal")));
			} else {
				set_err(err, errlen,
				        "'type' must be one of 'output_text' or 'refusal'");
				goto fail;
			}
		}
	}
	return parts;
oom:
	set_err(err, errlen, "out of memory");
fail:
	json_decref(parts);
	return NULL;
}

/* function_call_output with a list: each part's type is rewritten in place. */
static json_t *tool_output_parts(const json_t *output, char *err, size_t errlen)
{
	json_t *parts = json_deep_copy(output);
	size_t i;
	json_t *p;
	if (!parts)
		goto oom;
	json_array_foreach(parts, i, p)
	{
		if (!json_object_get(p, "type")) {
			set_err(err, errlen, "Output of tool call missing 'type' field");
			goto fail;
		}
		if (str_eq(p, "type", "input_text")) {
			OOM_IF(json_object_set_new(p, "type", json_string("text")));
		} else if (str_eq(p, "type", "input_image")) {
			json_t *u = json_object_get(p, "image_url");
			if (!u) {
				set_err(err, errlen, "'image_url' is required");
				goto fail;
			}
			OOM_IF(json_object_set_new(p, "type", json_string("image_url")));
			OOM_IF(json_object_set_new(p, "image_url", json_pack("{s:O}", "url", u)));
		} else {
			set_err(err, errlen,
			        "Output of tool call should be 'Input text' or 'Input image'");
			goto fail;
		}
	}
	return parts;
oom:
	set_err(err, errlen, "out of memory");
fail:
	json_decref(parts);
	return NULL;
}

/* One input item -> appended to (or merged into the last of) msgs. */
static int convert_item(json_t *msgs, const json_t *src, char *err, size_t errlen)
{
	int merge_prev = last_is_assistant(msgs);
	json_t *item = json_deep_copy(src);
	json_t *parts = NULL;
	if (!item)
		goto oom;

	if (is_string_key(item, "content")) {
		/* A plain-text content becomes one input_text part, so "input
		 * message" items of every shape take the same path below. */
		json_t *c = json_pack("[{s:O, s:s}]", "text", json_object_get(item, "content"),
		                      "type", "input_text");
		OOM_IF(json_object_set_new(item, "content", c));
	}

	const json_t *role = json_object_get(item, "role");
	if (is_array_key(item, "content") && json_is_string(role) &&
	    (str_eq(item, "role", "user") || str_eq(item, "role", "system") ||
	     str_eq(item, "role", "developer"))) {
		parts = input_parts(json_object_get(item, "content"), err, errlen);
		if (!parts)
			goto fail;
		/* The rest of the item (id, role "developer", ...) stays. */
		json_object_del(item, "type");
		json_object_del(item, "status");
		OOM_IF(json_object_set(item, "content", parts));
		OOM_IF(json_array_append(msgs, item));
	} else if (str_eq(item, "role", "assistant") && str_eq(item, "type", "message")) {
		parts = output_parts(item, err, errlen);
		if (!parts)
			goto fail;
		if (merge_prev) {
			json_t *prev = json_array_get(msgs, json_array_size(msgs) - 1);
			if (!is_array_key(prev, "content"))
				OOM_IF(json_object_set_new(prev, "content", json_array()));
			OOM_IF(json_array_extend(json_object_get(prev, "content"), parts));
		} else {
			json_object_del(item, "status");
			json_object_del(item, "type");
			OOM_IF(json_object_set(item, "content", parts));
			OOM_IF(json_array_append(msgs, item));
		}
	} else if (is_string_key(item, "arguments") && is_string_key(item, "call_id") &&
	           is_string_key(item, "name") && str_eq(item, "type", "function_call")) {
		json_t *call = json_pack("{s:{s:O, s:O}, s:O, s:s}", "function", "arguments",
		                         json_object_get(item, "arguments"), "name",
		                         json_object_get(item, "name"), "id",
		                         json_object_get(item, "call_id"), "type", "function");
		OOM_IF(!call);
		if (merge_prev) {
			json_t *prev = json_array_get(msgs, json_array_size(msgs) - 1);
			if (!is_array_key(prev, "tool_calls") &&
			    json_object_set_new(prev, "tool_calls", json_array())) {
				json_decref(call);
				goto oom;
			}
			OOM_IF(json_array_append_new(json_object_get(prev, "tool_calls"), call));
		} else {
			/* No "content" key: the chat parser accepts tool_calls alone. */
			OOM_IF(json_array_append_new(
			    msgs,
			    json_pack("{s:s, s:[o]}", "role", "assistant", "tool_calls", call)));
		}
	} else if (is_string_key(item, "call_id") &&
	           (is_string_key(item, "output") || is_array_key(item, "output")) &&
	           str_eq(item, "type", "function_call_output")) {
		const json_t *output = json_object_get(item, "output");
		json_t *content;
		if (json_is_string(output)) {
			content = json_incref((json_t *)output);
		} else {
			content = tool_output_parts(output, err, errlen);
			if (!content)
				goto fail;
		}
		OOM_IF(json_array_append_new(msgs, json_pack("{s:o, s:s, s:O}", "content", content,
		                                             "role", "tool", "tool_call_id",
		                                             json_object_get(item, "call_id"))));
	} else if (is_array_key(item, "summary") && str_eq(item, "type", "reasoning")) {
		const json_t *content = json_object_get(item, "content");
		if (!json_is_array(content)) {
			set_err(err, errlen, "item['content'] is not an array");
			goto fail;
		}
		if (!json_array_size(content)) {
			set_err(err, errlen, "item['content'] is empty");
			goto fail;
		}
		const json_t *text = json_object_get(json_array_get(content, 0), "text");
		if (!json_is_string(text)) {
			set_err(err, errlen, "item['content']['text'] is not a string");
			goto fail;
		}
		/* Only the first part counts; a reasoning item after an
		 * assistant message overwrites that message's reasoning. */
		if (merge_prev) {
			json_t *prev = json_array_get(msgs, json_array_size(msgs) - 1);
			OOM_IF(json_object_set(prev, "reasoning_content", (json_t *)text));
		} else {
			OOM_IF(json_array_append_new(msgs, json_pack("{s:s, s:[], s:O}", "role",
			                                             "assistant", "content",
			                                             "reasoning_content", text)));
		}
	} else {
		set_err(err, errlen, "Cannot determine type of 'item'");
		goto fail;
	}
	json_decref(parts);
	json_decref(item);
	return 0;
oom:
	set_err(err, errlen, "out of memory");
fail:
	json_decref(parts);
	json_decref(item);
	return -1;
}

static int convert_tools(json_t *chat, const json_t *tools, char *err, size_t errlen)
{
	if (!json_is_array(tools)) {
		set_err(err, errlen, "'tools' must be an array of objects");
		return -1;
	}
	json_t *out = json_array();
	size_t i;
	json_t *t;
	if (!out)
		goto oom;
	json_array_foreach(tools, i, t)
	{
		/* Non-function tools (web_search, local_shell, mcp, ...) have no
		 * chat equivalent; llama-server skips them with a warning. */
		if (strcmp(str_value(t, "type"), "function"))
			continue;
		json_t *fn = json_deep_copy(t);
		OOM_IF(!fn);
		json_object_del(fn, "type");
		if (!json_object_get(fn, "strict") &&
		    json_object_set_new(fn, "strict", json_true())) {
			json_decref(fn);
			goto oom;
		}
		OOM_IF(json_array_append_new(
		    out, json_pack("{s:s, s:o}", "type", "function", "function", fn)));
	}
	json_object_del(chat, "tools");
	if (json_array_size(out))
		OOM_IF(json_object_set(chat, "tools", out));
	json_decref(out);
	return 0;
oom:
	json_decref(out);
	set_err(err, errlen, "out of memory");
	return -1;
}

json_t *responses_to_chat(const json_t *req, char *err, size_t errlen)
{
	if (!json_is_object(req)) {
		set_err(err, errlen, "request body must be a JSON object");
		return NULL;
	}
	const json_t *input = json_object_get(req, "input");
	if (!input) {
		set_err(err, errlen, "'input' is required");
		return NULL;
	}
	if (str_value(req, "previous_response_id")[0]) {
		set_err(err, errlen, "llama.cpp does not support 'previous_response_id'.");
		return NULL;
	}

	json_t *chat = json_deep_copy(req);
	json_t *msgs = json_array();
	if (!chat || !msgs)
		goto oom;
	json_object_del(chat, "input");

	if (json_object_get(req, "instructions")) {
		/* Always role "system", and "" for anything but a string. The
		 * value is copied whole: it may hold a NUL. */
		json_t *ins = json_object_get(req, "instructions");
		OOM_IF(json_array_append_new(
		    msgs, json_pack("{s:s, s:o}", "role", "system", "content",
		                    json_is_string(ins) ? json_incref(ins) : json_string(""))));
		json_object_del(chat, "instructions");
	}

	if (json_is_string(input)) {
		OOM_IF(json_array_append_new(
		    msgs, json_pack("{s:s, s:O}", "role", "user", "content", input)));
	} else if (json_is_array(input)) {
		size_t i;
		json_t *item;
		json_array_foreach(input, i, item)
		{
			if (convert_item(msgs, item, err, errlen))
				goto fail;
		}
	} else {
		set_err(err, errlen, "'input' must be a string or array of objects");
		goto fail;
	}
	OOM_IF(json_object_set(chat, "messages", msgs));

	const json_t *tools = json_object_get(req, "tools");
	if (tools && convert_tools(chat, tools, err, errlen))
		goto fail;

	const json_t *mot = json_object_get(req, "max_output_tokens");
	if (mot) {
		json_object_del(chat, "max_output_tokens");
		OOM_IF(json_object_set_new(chat, "max_tokens", json_deep_copy(mot)));
	}

	const json_t *reasoning = json_object_get(req, "reasoning");
	if (reasoning) {
		/* Only the effort is kept; it can reach the template
		 * (reasoning_effort), so it matters for the prompt. */
		const json_t *effort = json_object_get(reasoning, "effort");
		if (effort)
			OOM_IF(
			    json_object_set_new(chat, "reasoning_effort", json_deep_copy(effort)));
		json_object_del(chat, "reasoning");
	}

	json_decref(msgs);
	return chat;
oom:
	set_err(err, errlen, "out of memory");
fail:
	json_decref(msgs);
	json_decref(chat);
	return NULL;
}
