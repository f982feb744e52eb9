/* Anthropic Messages API <-> OpenAI chat completions, for llama-server.
 *
 * llama-server's native /v1/messages ignores id_slot and cache_prompt, so toki
 * cannot pin an Anthropic request to a slot through it. Toki instead converts
 * the request to a chat completions request (which honours id_slot), and the
 * answer back. The request conversion reproduces llama-server's own
 * (server_chat_convert_anthropic_to_oai, build 11669): the chat messages it
 * yields render through the chat template exactly as a native /v1/messages
 * request would, so toki's routing tokens (/apply-template of this output) and
 * the model's view are what a native client would get.
 *
 * Everything here is pure data transformation: no I/O, no libevent. The
 * request's translation is in anthropic.c, the answer's (whole and streamed)
 * in anthropic_answer.c. */
#ifndef TOKI_API_ANTHROPIC_H
#define TOKI_API_ANTHROPIC_H

#include <stddef.h>

#include <jansson.h>

#include "util/strbuf.h"

/* An Anthropic Messages request (POST /v1/messages body) -> a new OpenAI chat
 * completions body, or NULL with a message for a 400 in err. The caller adds
 * id_slot / cache_prompt and owns the result.
 *
 * What llama-server does, and so this does: `system` (string, or text blocks
 * concatenated with no separator) becomes one leading system message, with
 * Claude Code's per-request "cch=" billing stamp masked; text and image blocks
 * become content parts; thinking blocks become the message's reasoning_content;
 * tool_use blocks become tool_calls (input serialised as llama-server does);
 * each tool_result becomes a "tool" message placed AFTER the rest of its
 * message; other block types are dropped; max_tokens defaults to 4096;
 * tool_choice any/tool -> "required" (the tool's name is lost). Where it
 * departs: tool_choice none -> "none" (llama-server drops it, i.e. auto),
 * and wrongly typed fields are rejected instead of silently turned into empty
 * strings. "model" is copied (llama-server omits it; a router needs it). */
json_t *anthropic_to_chat(const json_t *req, char *err, size_t errlen);

/* The same conversion for POST /v1/messages/count_tokens: max_tokens is not
 * needed and stream is not copied. Apply-template + tokenize on the result
 * gives the count llama-server's native count_tokens would. */
json_t *anthropic_count_tokens_request_to_chat(const json_t *req, char *err, size_t errlen);

/* A non-streaming chat completion (llama-server's /v1/chat/completions body)
 * -> a new Anthropic message, or NULL if chat_resp has no choices[0].message.
 * model: what to report (the request's model). cache_n / prompt_n: the
 * cached and evaluated prompt tokens (Anthropic's cache_read_input_tokens and
 * input_tokens); a negative value takes the number from chat_resp's timings
 * (or usage). stop_reason "stop_sequence" is reported only when chat_resp says
 * which stop word ended it ("stopping_word" at the top level or in
 * "__verbose"); llama-server's chat endpoint does not, so a stop-sequence hit
 * normally reads "end_turn", as on llama-server's own /v1/messages. */
json_t *anthropic_from_chat(const json_t *chat_resp, const char *model, long long cache_n,
                            long long prompt_n);

/* Streaming: one translator per response. Feed it each chat.completion.chunk
 * (the parsed JSON of each `data:` line; not "[DONE]") and send what it appends
 * to out, which is whole SSE events ("event: <type>\ndata: <json>\n\n").
 * Blocks are strictly sequential: each content_block_start is closed by its
 * content_block_stop before the next starts, thinking -> thinking_delta (and an
 * empty signature_delta before its stop, as llama-server sends), text ->
 * text_delta, each tool call index -> its own tool_use block with
 * input_json_delta. The finish chunk (finish_reason set) closes the open block
 * and gives message_delta with stop_reason, stop_sequence (always null: the
 * chat stream does not say which stop word hit) and usage {input_tokens,
 * cache_read_input_tokens from timings, output_tokens}; if the finish chunk
 * carries no numbers (stream_options.include_usage moves llama-server's
 * timings to a last, choice-less chunk) message_delta waits for that chunk or
 * for finish. */
struct anthropic_stream;

/* expected_input_tokens: the prompt tokens expected to be evaluated (not the
 * cached ones; Anthropic's input_tokens); expected_cached: the tokens expected
 * to be reused. Both go into message_start's usage, which is sent before the
 * backend's real numbers are known. NULL when out of memory. */
struct anthropic_stream *anthropic_stream_new(const char *model, long long expected_input_tokens,
                                              long long expected_cached);
void anthropic_stream_free(struct anthropic_stream *s);

/* Appends message_start now unless it was sent already (feed sends it before
 * the first chunk's events otherwise). Lets the caller open the stream before
 * the backend answers. 0, or -1 when out of memory. */
int anthropic_stream_start(struct anthropic_stream *s, struct strbuf *out);

/* 0, or -1 when out of memory. Chunks of an unknown shape (no choices, usage
 * only, prompt progress) add nothing; an {"error": ...} chunk becomes an
 * Anthropic error event, after which the stream is over. */
int anthropic_stream_feed(struct anthropic_stream *s, const json_t *chat_chunk, struct strbuf *out);

/* Ends the stream: closes an open block, sends message_delta if the finish
 * chunk never came (stop_reason "end_turn"), then message_stop, with
 * cache_block (toki's cache object; may be NULL) as its "cache" member.
 * Nothing after an error event. 0, or -1 when out of memory. */
int anthropic_stream_finish(struct anthropic_stream *s, const json_t *cache_block,
                            struct strbuf *out);

/* Appends an error event ({"type":"error","error":{"type":type,"message":...}})
 * and ends the stream; use it when the backend fails mid-stream. type is an
 * Anthropic error type such as "api_error" or "overloaded_error". */
int anthropic_stream_error(struct anthropic_stream *s, const char *type, const char *message,
                           struct strbuf *out);

/* True once message_stop or an error event has been appended. */
int anthropic_stream_done(const struct anthropic_stream *s);

/* "event: ping\ndata: {\"type\": \"ping\"}\n\n": a keep-alive Anthropic clients
 * accept (SSE comments also work, but this is what Anthropic itself sends). */
const char *anthropic_ping_event(void);

/* Serialises v exactly as llama-server's JSON library (nlohmann) dumps it:
 * compact, keys in order, UTF-8 unescaped, control characters as \u00xx,
 * doubles in shortest round-trip form ("0.1", "1.0", "1e-05"). Used for tool
 * call arguments, whose text goes into the prompt verbatim. A new string, or
 * NULL when out of memory. */
char *anthropic_dump_json(const json_t *v);

#endif
