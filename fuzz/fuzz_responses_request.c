/* POST /v1/responses bodies: json_loadb, the proxy's type checks, then
 * responses_to_chat (src/api/responses.c), whose result the proxy sends to
 * /apply-template. */
#include <stdint.h>
#include <string.h>

#include "api/responses.h"
#include "fuzz_common.h"
#include "util/json_body.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	json_error_t jerr;
	json_t *body = json_loadb((const char *)data, size, JSON_BODY_FLAGS, &jerr);
	if (!body)
		return 0;
	if (!fuzz_check_types(body, FUZZ_KIND_RESPONSES)) {
		char err[512];
		err[0] = '\0';
		json_t *copy = json_deep_copy(body);
		json_t *chat = responses_to_chat(body, err, sizeof err);
		/* The converter must not change the request it was given (the
		 * proxy forwards that request itself). */
		FUZZ_CHECK(json_equal(copy, body));
		json_decref(copy);
		if (chat) {
			fuzz_check_chat_body(chat);
		} else {
			FUZZ_CHECK(err[0] != '\0');
		}
		json_decref(chat);
	}
	json_decref(body);
	return 0;
}
