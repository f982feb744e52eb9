#include "api/request_check.h"

const char *request_check_types(json_t *body, enum route_kind kind)
{
	if (!json_is_object(body))
		return "the request body must be a JSON object";
	json_t *v;
	if ((v = json_object_get(body, "stream")) && !json_is_boolean(v) && !json_is_null(v))
		return "'stream' must be a boolean";
	if ((v = json_object_get(body, "max_tokens")) && !json_is_integer(v) && !json_is_null(v))
		return "'max_tokens' must be an integer";
	if ((v = json_object_get(body, "max_completion_tokens")) && !json_is_integer(v) &&
	    !json_is_null(v))
		return "'max_completion_tokens' must be an integer";
	if ((v = json_object_get(body, "n_predict")) && !json_is_integer(v) && !json_is_null(v))
		return "'n_predict' must be an integer";
	if ((v = json_object_get(body, "temperature")) && !json_is_number(v) && !json_is_null(v))
		return "'temperature' must be a number";
	if ((v = json_object_get(body, "model")) && !json_is_string(v) && !json_is_null(v))
		return "'model' must be a string";
	if ((v = json_object_get(body, "id_slot")) && !json_is_integer(v) && !json_is_null(v))
		return "'id_slot' must be an integer";
	if (kind == KIND_ANTHROPIC || kind == KIND_RESPONSES)
		return NULL; /* their converters check the rest */
	if (kind == KIND_CHAT) {
		v = json_object_get(body, "messages");
		if (!json_is_array(v) || json_array_size(v) == 0)
			return "'messages' must be a non-empty array";
		size_t i;
		json_t *m;
		json_array_foreach(v, i, m)
		{
			if (!json_is_object(m) || !json_is_string(json_object_get(m, "role")))
				return "each message must be an object with a string 'role'";
		}
	} else {
		v = json_object_get(body, "prompt");
		if (!v)
			return "'prompt' is required";
		/* An object is llama-server's form of a prompt with media,
		 * {"prompt_string", "multimodal_data"}: the server checks it. */
		if (!json_is_string(v) && !json_is_array(v) && !json_is_object(v))
			return "'prompt' must be a string, an array or an object";
	}
	return NULL;
}

json_t *request_prompt_text(json_t *body)
{
	json_t *p = json_object_get(body, "prompt");
	if (json_is_array(p) && json_array_size(p) == 1)
		p = json_array_get(p, 0);
	if (json_is_object(p) && !json_object_get(p, "multimodal_data"))
		p = json_object_get(p, "prompt_string");
	return json_is_string(p) ? p : NULL;
}

void request_drop_unset(json_t *body)
{
	json_t *v = json_object_get(body, "id_slot");
	if (v && (json_is_null(v) || json_integer_value(v) < 0))
		json_object_del(body, "id_slot");
	if (json_is_null(json_object_get(body, "n_predict")))
		json_object_del(body, "n_predict");
}
