/* A Jinja engine for chat templates that renders exactly as llama-server's
 * does (llama.cpp's common/jinja), so that toki can turn a chat request into
 * the same prompt text without asking the server.
 *
 * "Exactly as llama-server" rather than "as Python's Jinja2": llama.cpp's
 * engine has its own rules, and a prompt that differs by one byte tokenizes
 * differently. So this follows them: None and undefined print as nothing,
 * an array prints as its items run together, floats print with six decimals
 * trimmed (and tojson with six significant digits), trim_blocks and
 * lstrip_blocks are on, a single trailing newline of the template is
 * dropped, capitalize and title work on each concatenated part, obj.name
 * prefers a built-in over a key of that name, "x is none" is false for an
 * undefined x, and the filters and tests are those llama.cpp has, with its
 * argument rules. Unsupported constructs fail the render (the caller then
 * asks the server); they never render something else.
 *
 * A template is parsed once (jinja_parse) and rendered many times; each
 * render allocates from its own arena and frees it whole, so values need no
 * individual ownership. Not thread-safe per template render state: renders
 * share nothing but the read-only parse tree. */
#ifndef TOKI_TEMPLATE_JINJA_H
#define TOKI_TEMPLATE_JINJA_H

#include <stddef.h>
#include <time.h>

#include <jansson.h>

struct jinja_template;

/* Parses a template. NULL with the reason (and position) in err. */
struct jinja_template *jinja_parse(const char *src, size_t len, char *err, size_t errlen);
void jinja_free(struct jinja_template *t);

/* Renders with globals, a JSON object whose members become the template's
 * variables in their order (messages, tools, bos_token, ...). now is the
 * time strftime_now formats (local time). Returns the text (malloc'd,
 * NUL-terminated, *len bytes), or NULL with the reason in err: a template
 * error, raise_exception, a construct llama.cpp's engine does not have. */
char *jinja_render(const struct jinja_template *t, json_t *globals, time_t now, size_t *len,
		   char *err, size_t errlen);

#endif
