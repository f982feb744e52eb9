/* A chat completions request turned into prompt text the way llama-server
 * does it (tools/server: oaicompat_chat_params_parse; common/chat.cpp:
 * common_chat_templates_apply_jinja and common_chat_template_direct_apply):
 * messages normalized as common_chat_msg::to_json_oaicompat writes them back
 * (role, content, reasoning_content, name, tool_call_id, tool_calls), the
 * template's workarounds for its capabilities (developer -> system, a system
 * prompt merged into the first message when the template has no system role,
 * tool-call arguments parsed when the template wants objects), tools
 * normalized to {type, function: {name, description, parameters}}, the
 * context llama-server adds (bos_token, eos_token, enable_thinking,
 * datetime, date_string, chat_template_kwargs, add_generation_prompt), then
 * the template, then the leading BOS / trailing EOS text the tokenizer adds
 * itself cut off.
 *
 * What llama-server treats specially is left to it: a template it renders
 * through a dedicated handler (GPT-OSS, Ministral, Kimi K2, LFM2, ...), a
 * final assistant message (prefill), continue_final_message, content parts
 * other than text. chat_render returns CHAT_DECLINED for those, with the
 * reason, and the caller asks the server. */
#ifndef TOKI_PROMPT_CHAT_H
#define TOKI_PROMPT_CHAT_H

#include <stddef.h>
#include <time.h>

#include <jansson.h>

struct jinja_template;

/* chat_template_caps, as llama-server's /props reports them. */
struct chat_caps {
	int supports_string_content, supports_typed_content, supports_system_role;
	int supports_tool_calls, supports_object_arguments;
};
/* Reads /props' chat_template_caps (absent keys keep the defaults a plain
 * template has: string content and a system role). */
void chat_caps_from_json(json_t *caps, struct chat_caps *out);

struct chat_env {
	const struct jinja_template *tmpl;
	const struct jinja_template *tmpl_tool_use; /* for requests with tools; may be NULL */
	int template_is_gpt_oss;                    /* "<|channel|>" in the source */
	struct chat_caps caps;
	const char *bos_token, *eos_token;
	int add_bos, add_eos; /* the vocabulary adds them when tokenizing */
	int enable_thinking;  /* the server's default */
	time_t now;
	struct chat_dates *dates; /* a cache of the date strings; may be NULL */
};

/* The two date strings templates get, for the minute of `at`: formatting
 * local time is slow (localtime, strftime) and they change once a day, so
 * a caller that renders often keeps them here. */
struct chat_dates {
	time_t at;
	char datetime[32], date_string[32];
};

/* Whether llama-server renders this template through a handler of its own
 * (one that changes the messages) rather than directly. */
int chat_template_needs_server(const char *src);

enum chat_result { CHAT_OK = 0, CHAT_DECLINED = 1, CHAT_ERROR = -1 };

/* Renders request's prompt into *prompt (malloc'd, *len bytes). DECLINED
 * with why: the request is one toki leaves to the server; ERROR with why:
 * out of memory or the template failed (the server will say why, in its
 * own words). */
enum chat_result chat_render(const struct chat_env *env, json_t *request, char **prompt,
                             size_t *len, char *why, size_t whylen);

/* Renders request's conversation followed by answer (an assistant message)
 * as the template writes its latest turn, without a generation prompt:
 * what a model of the template's family writes after request's prompt, its
 * training format. Results as chat_render's. */
enum chat_result chat_render_answer(const struct chat_env *env, json_t *request, json_t *answer,
                                    char **prompt, size_t *len, char *why, size_t whylen);

/* Where each message after the first starts in request's prompt (the text
 * chat_render gave, len bytes), as byte offsets in increasing order, and
 * where the generation prompt starts (the last offset, *last_is_header
 * CHAT_HEADER_LAST; CHAT_HEADER_EMPTY when the template's generation
 * prompt is empty, as Mistral's: it starts at the prompt's end, where
 * generation begins); (*kind)[i] says what starts there (enum sched_start,
 * router/sched.h): an assistant message or the generation prompt, another
 * message, or a paragraph of the first message (a line after an empty
 * line, before the first message start found). A message start is known
 * only where rendering the messages before it gives a prefix of the
 * prompt; a template that is not prefix-stable there gives none. Returns
 * 0 (perhaps with no offsets) or -1 when out of memory; *offsets and *kind
 * are malloc'd. *joins: the template writes an answer right after the
 * whole prompt once the conversation goes on (the joined header,
 * prompt/prompt.h). */
int chat_message_starts(const struct chat_env *env, json_t *request, const char *prompt, size_t len,
                        size_t **offsets, unsigned char **kind, size_t *n, int *last_is_header,
                        int *joins);

/* What starts at message k of msgs (enum sched_start): an assistant message
 * (k = size: the generation prompt) or another message. */
unsigned char chat_start_kind(json_t *msgs, size_t k);

/* Where the generation prompt starts (chat_message_starts). */
enum { CHAT_HEADER_NONE, CHAT_HEADER_LAST, CHAT_HEADER_EMPTY };

/* A kind among the starts that is no start: where the prompt parts from
 * the template's rendering of the assistant message before it as the
 * latest turn, the format generation wrote it in (a template that drops
 * reasoning from earlier turns parts right after the message's header).
 * It bounds that message's step region (prompt/prompt.h) and never
 * reaches the schedule. */
#define CHAT_CUT_APART 0xff

/* Exact mode's starts in a chat prompt, gathered one rendering of the first
 * messages at a time: by toki's template (chat_message_starts) or by the
 * server's (backend/prefix_render.h). All-zero is empty. */
struct chat_starts {
	size_t *off;
	unsigned char *kind;
	size_t n, cap, last;
	int header; /* CHAT_HEADER_*: the last start is the generation prompt's,
	             * or that prompt is empty (the whole prompt rendered without) */
	int failed; /* out of memory */
};

/* The rendering (text, tl bytes; NULL: none) of the messages before a start
 * of kind (header: the generation prompt's) gives a start where it ends, if
 * it is a prefix of the prompt (len bytes) past the last start found. Call
 * in the order of the messages. */
void chat_starts_add(struct chat_starts *s, const char *prompt, size_t len, const char *text,
                     size_t tl, unsigned char kind, int header);

/* The rendering (text, tl bytes) of the messages up to and including an
 * assistant message whose start was the last one added: where it parts
 * from the prompt before its end, a CHAT_CUT_APART there. */
void chat_starts_apart(struct chat_starts *s, const char *prompt, size_t len, const char *text,
                       size_t tl);

/* The starts found, with the first message's paragraphs before them, as
 * chat_message_starts returns them (s is emptied). 0, or -1 when out of
 * memory. */
int chat_starts_finish(struct chat_starts *s, const char *prompt, size_t **offsets,
                       unsigned char **kind, size_t *n, int *last_is_header);

/* For a chat request that llama-server templates, the prefixes of its
 * messages (k, the first k messages) whose renderings, without a generation
 * prompt, give exact mode's chunk starts: the first message's end, each
 * assistant message's start and the generation prompt's (router/sched.h:
 * the starts of other messages are never chunk starts past the first).
 * Writes them in increasing order to ks (when not NULL); returns how many
 * (at most the number of messages). */
size_t chat_server_prefixes(json_t *request, size_t *ks);

/* The template variables chat_render would use (for tests and toki
 * tokenize --chat), or NULL with why. */
json_t *chat_template_globals(const struct chat_env *env, json_t *request, enum chat_result *res,
                              char *why, size_t whylen);

/* JSON written as nlohmann::json::dump() writes it (no spaces; control
 * characters as \u00xx, no other escapes; floats as util/dtoa.h); NULL for
 * NaN or infinity, or when out of memory. */
char *chat_dump_like_nlohmann(json_t *v);

#endif
