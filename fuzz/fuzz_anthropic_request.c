/* POST /v1/messages and /v1/messages/count_tokens bodies: json_loadb, the
 * proxy's type checks, then the Anthropic -> chat converters
 * (src/api/anthropic.c), as serve/req.c's req_start runs them. Also the
 * chat and completion checks on the same body (POST /v1/chat/completions,
 * /v1/completions), and the converted body's serialisation. */
#include <stdint.h>
#include <string.h>

#include "api/anthropic.h"
#include "fuzz_common.h"
#include "util/json_body.h"

static void convert(json_t *body, int count_only)
{
	char err[512];
	err[0] = '\0';
	json_t *chat = count_only ? anthropic_count_tokens_request_to_chat(body, err, sizeof err)
				  : anthropic_to_chat(body, err, sizeof err);
	if (!chat) {
		FUZZ_CHECK(err[0] != '\0'); /* a 400 always says why */
		FUZZ_CHECK(memchr(err, '\0', sizeof err) != NULL);
		return;
	}
	fuzz_check_chat_body(chat);
	/* What the proxy reads from the converted body. */
	(void)json_is_true(json_object_get(chat, "stream"));
	(void)json_integer_value(json_object_get(chat, "max_tokens"));
	char *dump = anthropic_dump_json(chat);
	FUZZ_CHECK(dump != NULL);
	json_error_t e;
	json_t *back = json_loads(dump, JSON_ALLOW_NUL, &e);
	FUZZ_CHECK(back && json_equal(back, chat));
	json_decref(back);
	free(dump);
	json_decref(chat);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	json_error_t jerr;
	json_t *body = json_loadb((const char *)data, size, JSON_BODY_FLAGS, &jerr);
	if (!body)
		return 0;
	(void)fuzz_check_types(body, FUZZ_KIND_CHAT);
	(void)fuzz_check_types(body, FUZZ_KIND_COMPLETION);
	if (!fuzz_check_types(body, FUZZ_KIND_ANTHROPIC)) {
		convert(body, 0);
		convert(body, 1);
	}
	json_decref(body);
	return 0;
}
