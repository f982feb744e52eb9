/* The checks every routed request body goes through before anything else
 * reads it: the types of the fields toki and the backend rely on. Shared by
 * the proxy and the fuzz targets. */
#ifndef TOKI_REQUEST_CHECK_H
#define TOKI_REQUEST_CHECK_H

#include <jansson.h>

enum route_kind { KIND_CHAT, KIND_COMPLETION, KIND_ANTHROPIC, KIND_RESPONSES, KIND_COUNT };

/* NULL when body is fit for a route of this kind, else what is wrong, in
 * words for the client's 400. */
const char *request_check_types(json_t *body, enum route_kind kind);

/* The text of a completion request's prompt, as llama-server reads it
 * (tokenize_input_subprompt): a string, or its object form {"prompt_string":
 * S} without "multimodal_data", alone or as the one element of an array.
 * NULL for token ids, several prompts, media or anything else. */
json_t *request_prompt_text(json_t *body);

/* Removes what llama-server reads as unset: id_slot null or negative (-1 is
 * "any slot": the request is routed), n_predict null. */
void request_drop_unset(json_t *body);

#endif
