/* Whether a backend's prompts can be made in toki: after discovery, toki
 * builds a prompt engine (prompt/prompt.h) from the model file the server
 * reports in /props, when that file is readable here, and checks it against
 * the server before using it: a set of texts through /tokenize, a set of
 * chat requests through /apply-template (each with enable_thinking on and
 * off, which is how toki learns the default llama-server passes its
 * template). Only what matched is used: tokenizing, templating, or both.
 * Until the probes end, and wherever they failed, requests are tokenized by
 * the server as before. */
#ifndef TOKI_BACKEND_PROMPT_PROBE_H
#define TOKI_BACKEND_PROMPT_PROBE_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

struct backend;

/* Starts the probes for a backend just (re)discovered; props is its /props
 * answer (borrowed for the call). Replaces any engine the backend had. */
void prompt_probe_start(struct backend *b, json_t *props);
/* Stops probes in flight and frees the backend's engine. */
void prompt_probe_stop(struct backend *b);

/* After a request whose prompt toki made: now and then (every request at
 * first, then one in 64) the server makes it too, off the request's path,
 * and a difference turns the local engine off for this backend. chat: body
 * is a chat request (else a /completion whose "prompt" is a string). tokens
 * are what toki routed with (copied). */
void prompt_audit_start(struct backend *b, json_t *body, int chat, const int32_t *tokens, size_t n);
/* A difference from the server: turns the local template off (TEMPLATE:
 * the server rendered other text; its tokens still matched), or template and
 * tokenizer both (ALL: the tokens differ, or who is at fault is unknown). */
enum prompt_fault { PROMPT_FAULT_TEMPLATE, PROMPT_FAULT_ALL };
void prompt_engine_disable(struct backend *b, enum prompt_fault fault, const char *why);

#endif
