/* The prompt engine: a chat or completion request turned into the tokens
 * llama-server would evaluate, inside toki, so that routing costs no round
 * trip to the server. It joins a model's vocabulary (tokenizer/vocab.h), the
 * chat template the server reports (template/jinja.h) and llama-server's
 * request handling (prompt/chat.h).
 *
 * It keeps a cache of tokenized fragments: the text between two special
 * tokens tokenizes the same wherever it appears (llama.cpp tokenizes each
 * such fragment on its own), so a conversation's earlier messages, resent
 * on every turn, are tokenized once. */
#ifndef TOKI_PROMPT_PROMPT_H
#define TOKI_PROMPT_PROMPT_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include <jansson.h>

#include "prompt/chat.h"
#include "tokenizer/vocab.h"

struct prompt_engine;

struct prompt_engine_config {
	const char *model_path;            /* the GGUF the server runs */
	const char *chat_template;         /* /props chat_template (NULL: the model's own) */
	const char *tool_use_template;     /* NULL when none */
	json_t *caps;                      /* /props chat_template_caps (NULL: defaults) */
	const char *bos_token, *eos_token; /* /props (NULL: from the vocabulary) */
	int enable_thinking;
	size_t cache_tokens; /* fragment cache budget (0: default) */
};

/* NULL with the reason when the model's tokenizer or template is one toki
 * does not reproduce (the caller then asks the server). */
struct prompt_engine *prompt_engine_new(const struct prompt_engine_config *cfg, char *err,
                                        size_t errlen);
void prompt_engine_free(struct prompt_engine *pe);

const struct vocab *prompt_engine_vocab(const struct prompt_engine *pe);
/* Whether chat requests can be templated here (a template that llama-server
 * renders through a handler of its own cannot). */
int prompt_engine_has_chat(const struct prompt_engine *pe);

/* llama_tokenize(text, add_special=true, parse_special=true), through the
 * fragment cache. 0, -1 (out of memory), -2 (leave it to the server). */
int prompt_engine_tokenize(struct prompt_engine *pe, const char *text, size_t len,
                           struct token_list *out);

/* A chat request's prompt text (*prompt, malloc'd) and its tokens. */
enum chat_result prompt_engine_chat(struct prompt_engine *pe, json_t *request, time_t now,
                                    char **prompt, size_t *prompt_len, struct token_list *out,
                                    char *why, size_t whylen);

/* Where a chat prompt's messages start, in tokens: the chunk boundaries of
 * exact mode's schedule (router/sched.h). pos[0..n) increasing, each in
 * (0, n_tokens); header (CHAT_HEADER_*, prompt/chat.h): the last one is
 * where the generation prompt starts, or that prompt is empty. messages:
 * how many starts the template gave (some may not map to a token
 * boundary). */
struct prompt_starts {
	size_t *pos, n;
	unsigned char *kind; /* kind[i]: what starts at pos[i] (enum sched_start) */
	size_t messages;
	int header;
	/* The joined header: the template writes an answer right after the
	 * whole prompt once the conversation goes on (chat_message_starts),
	 * so the last token of the header generation began after is a step
	 * of the answer's region, and of this request's own schedule: the
	 * generation prompt's last token is evaluated alone, in the
	 * generating request as on a resend, where llama-server evaluates
	 * only it. Its start (SCHED_START_PLAIN) is the schedule's without
	 * steps only. */
	int joins;
};

/* The tokens of request's conversation followed by answer (an assistant
 * message) as the template writes its latest turn (chat_render_answer):
 * the prompt's tokens, then the answer's as a model of the family writes
 * them, then the template's end of the turn. */
enum chat_result prompt_engine_chat_answer(struct prompt_engine *pe, json_t *request,
                                           json_t *answer, time_t now, struct token_list *out,
                                           char *why, size_t whylen);

/* prompt_engine_chat, and with starts non-NULL the message starts too
 * (starts->pos and starts->kind malloc'd; free them). */
enum chat_result prompt_engine_chat_starts(struct prompt_engine *pe, json_t *request, time_t now,
                                           char **prompt, size_t *prompt_len,
                                           struct token_list *out, struct prompt_starts *starts,
                                           char *why, size_t whylen);

/* Tokenizes text as prompt_engine_tokenize and, with starts non-NULL, maps
 * the byte offsets cuts[0..n_cuts) (chat_message_starts's, with their kind
 * and header; taken over and freed) to token positions as
 * prompt_engine_chat_starts gives them (joins: the joined header). 0, -1
 * (out of memory), -2 (leave it to the server). */
int prompt_engine_tokenize_starts(struct prompt_engine *pe, const char *text, size_t len,
                                  size_t *cuts, unsigned char *kind, size_t n_cuts, int header,
                                  int joins, struct token_list *out, struct prompt_starts *starts);

/* The enable_thinking llama-server passes when the request does not say. */
void prompt_engine_set_thinking(struct prompt_engine *pe, int on);
int prompt_engine_thinking(const struct prompt_engine *pe);

struct prompt_engine_stats {
	uint64_t fragments, fragment_hits, cached_tokens;
};
void prompt_engine_get_stats(const struct prompt_engine *pe, struct prompt_engine_stats *st);

#endif
