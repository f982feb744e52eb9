/* OpenAI Responses API request -> chat completions request, as llama-server
 * converts it (server_chat_convert_responses_to_chatcmpl, build 11669).
 *
 * llama-server's native /v1/responses honours id_slot, so toki forwards those
 * requests unchanged; this conversion exists only so toki can ask
 * /apply-template for the prompt the native endpoint will build, and route by
 * its tokens. Fidelity to llama-server's conversion is therefore the point,
 * quirks included: every key the converter does not consume is copied through,
 * because llama-server copies it too and some (chat_template_kwargs,
 * reasoning_effort, ...) change the rendered prompt. */
#ifndef TOKI_API_RESPONSES_H
#define TOKI_API_RESPONSES_H

#include <stddef.h>

#include <jansson.h>

/* A new chat completions body, or NULL with llama-server's own message (where
 * it has one) in err: what the native endpoint would answer with a 400. */
json_t *responses_to_chat(const json_t *req, char *err, size_t errlen);

#endif
