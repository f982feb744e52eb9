/* Unit tests for the Jinja engine (src/template/) and the number formatting
 * it shares (src/util/dtoa.c). tests/integration/test_chat_template.py
 * compares whole templates with llama-server; these pin the rules one by
 * one, and the errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "template/jinja.h"
#include "util/bytes.h"
#include "util/dtoa.h"

/* Renders src with globals (JSON text, or NULL for none); returns the text
 * (caller frees) or NULL with the error in err. */
static char *render(const char *src, const char *globals_json, char *err, size_t errlen)
{
	struct jinja_template *t = jinja_parse(src, strlen(src), err, errlen);
	if (!t)
		return NULL;
	json_error_t jerr;
	json_t *g = globals_json ? json_loads(globals_json, 0, &jerr) : json_object();
	assert_non_null(g);
	size_t len;
	char *out = jinja_render(t, g, 0, &len, err, errlen);
	if (out)
		assert_int_equal(strlen(out), len);
	json_decref(g);
	jinja_free(t);
	return out;
}

static void expect(const char *src, const char *globals, const char *want)
{
	char err[512] = "";
	char *got = render(src, globals, err, sizeof err);
	if (!got)
		fail_msg("render failed: %s\n  template: %s", err, src);
	if (strcmp(got, want))
		fail_msg("template: %s\n  want: [%s]\n  got:  [%s]", src, want, got);
	free(got);
}

static void expect_error(const char *src, const char *globals, const char *needle)
{
	char err[512] = "";
	char *got = render(src, globals, err, sizeof err);
	if (got)
		fail_msg("template %s rendered [%s], expected an error", src, got);
	if (!strstr(err, needle))
		fail_msg("template %s: error [%s] lacks [%s]", src, err, needle);
}

static void test_printing(void **state)
{
	(void)state;
	/* None, undefined and objects print as nothing; arrays as their items. */
	expect("[{{ none }}][{{ nope }}][{{ {'a': 1} }}][{{ [1, 'b', [2.5, true]] }}]", NULL,
	       "[][][][1b2.5True]");
	expect("{{ 1.0 }} {{ 0.1 + 0.2 }} {{ 7 / 2 }} {{ 2.5 * 2 }} {{ -4 }} {{ 7 % 3 }}", NULL,
	       "1.0 0.3 3.5 5.0 -4 1");
	expect("{{ true }} {{ False }} {{ 'a' ~ 1 ~ none }}", NULL, "True False a1");
	expect("{{ [1, 'x', \"it's\", none]|string }} {{ {'k': 'v'}|string }} {{ (1, 2)|string }}",
	       NULL, "[1, 'x', \"it's\", None] {'k': 'v'} (1, 2)");
	expect("{{ 'ab' 'cd' }}", NULL, "abcd");
}

static void test_whitespace(void **state)
{
	(void)state;
	/* trim_blocks and lstrip_blocks are on; one trailing newline goes. */
	expect("a\n  {% if true %}\nb\n  {% endif %}\nc\n", NULL, "a\nb\nc");
	expect("x  {{- 'y' -}}  z", NULL, "xyz");
	expect("{%- for i in [1, 2] -%}\n {{ i }} \n{%- endfor %}", NULL, "12");
	/* llama-server's lexer (build 11669) drops a one-character text that
	 * starts the template and stands before a {#- or {%- tag: measured
	 * against /apply-template, and matched here on purpose. */
	expect("a {#- c -#} b", NULL, "b");
	expect("{{ 'x' }}a {#- c -#} b", NULL, "xab");
	expect("{{ 'x' }}\na {#- c -#} b", NULL, "x\nab");
	expect("ab {#- c -#} b", NULL, "abb");
	expect("a\r\nb\rc", NULL, "a\nb\nc");
}

static void test_loops(void **state)
{
	(void)state;
	expect(
	    "{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.first }}"
	    "{{ loop.last }}{{ loop.length }};{% endfor %}",
	    "{\"xs\": [\"a\", \"b\"]}", "102TrueFalse2;211FalseTrue2;");
	expect(
	    "{% for x in xs if x > 1 %}{{ x }}{% if loop.previtem is defined %}<{{ loop.previtem }}"
	    "{% endif %}{% endfor %}",
	    "{\"xs\": [1, 2, 3]}", "23<2");
	expect("{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}{% for k in d %}{{ k }}{% "
	       "endfor %}",
	       "{\"d\": {\"b\": 1, \"a\": 2}}", "b=1,a=2,ba");
	expect("{% for x in [] %}x{% else %}empty{% endfor %}", NULL, "empty");
	expect("{% for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
	       NULL, "012");
	expect("{% for i in range(1, 7, 2) %}{% if i == 3 %}{% continue %}{% endif %}{{ i }}{% "
	       "endfor %}",
	       NULL, "15");
	/* Text an if wrote before its break is lost, as in llama.cpp. */
	expect("{% for i in [1, 2] %}{% if i == 2 %}lost{% break %}{% endif %}{{ i }}{% endfor %}",
	       NULL, "1");
	/* Sets inside a loop stay there; a namespace carries out. */
	expect("{% set x = 1 %}{% set ns = namespace(y=1) %}{% for i in [1] %}{% set x = 2 %}"
	       "{% set ns.y = 2 %}{% endfor %}{{ x }}{{ ns.y }}",
	       NULL, "12");
}

static void test_macros(void **state)
{
	(void)state;
	expect("{% macro m(a, b='B', c=none) %}[{{ a }}{{ b }}{{ c if c is not none else '-' }}]"
	       "{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(1, c=3) }}{{ m(c=4, a=5) }}",
	       NULL, "[1B-][12-][1B3][5B4]");
	expect("{% macro outer(x) %}{{ inner(x) ~ '!' }}{% endmacro %}"
	       "{% macro inner(y) %}<{{ y }}>{% endmacro %}{{ outer('z') }}",
	       NULL, "<z>!");
	expect_error("{% macro m(a) %}{{ a }}{% endmacro %}{{ m() }}", NULL,
	             "Not enough arguments");
}

static void test_filters(void **state)
{
	(void)state;
	expect("{{ '  a b  '|trim }}|{{ 'Hi'|upper }}{{ 'Hi'|lower }}|{{ 'hello wORLD'|title }}|"
	       "{{ ('ab ' ~ 'cd')|title }}|{{ ('ab' ~ 'CD')|capitalize }}",
	       NULL, "a b|HIhi|Hello World|Ab Cd|AbCd");
	expect(
	    "{{ 'a,b,,c'.split(',') }}|{{ 'a b c'.split(' ', 1)|length }}|{{ 'x.y.z'.rsplit('.', "
	    "1) }}"
	    "|{{ 'aXbX'.replace('X', '-') }}|{{ 'abc'[1:] }}{{ [1, 2, 3][::-1] }}|{{ 'xyz'[0:2] }}",
	    NULL, "abc|2|x.yz|a-b-|bc321|xy");
	expect("{{ xs|selectattr('on')|map(attribute='n')|join(',') }}|"
	       "{{ xs|rejectattr('n', 'equalto', 1)|map(attribute='n')|join }}|"
	       "{{ xs|selectattr('n', 'gt', 1)|list|length }}|{{ xs|map(attribute='zz', "
	       "default=0)|join }}",
	       "{\"xs\": [{\"n\": 1, \"on\": true}, {\"n\": 2}, {\"n\": 3, \"on\": true}]}",
	       "1,3|23|2|000");
	expect("{{ ''|default('e', true) }}{{ nope|default('d') }}{{ 0|default(5) }}{{ "
	       "none|default(6) }}",
	       NULL, "ed06");
	expect(
	    "{{ [3, 1, 2]|sort|join }}{{ [3, 1, 2]|sort(reverse=true)|join }}{{ ['b', 'a']|first }}"
	    "{{ ['b', 'a']|last }}{{ [1, 2]|length }}{% for k, v in {'b': 1, 'a': 2}|dictsort %}{{ "
	    "k }}"
	    "{% endfor %}",
	    NULL, "123321ba2ab");
	expect("{{ '42'|int + 1 }} {{ 'x'|int }} {{ '2.5'|float }} {{ 3.9|int }} {{ 5|float }} {{ "
	       "-3|abs }}",
	       NULL, "43 0 2.5 3 5.0 3");
	expect("{{ 'ab'|indent(2) }}|{{ 'abc'|length }}|{{ 'abc'.startswith('ab') }}{{ "
	       "'abc'.endswith('c') }}",
	       NULL, "  ab|3|TrueTrue");
	/* Undefined answers most filters with an empty result. */
	expect("[{{ nope|length }}{{ nope|join }}{{ nope|list|length }}{{ nope|upper }}]", NULL,
	       "[00]");
	expect_error("{{ {'a': 1}|default(2) }}", NULL, "Unknown (built-in) filter 'default'");
	expect_error("{{ 'abc'|nosuchfilter }}", NULL, "Unknown (built-in) filter");
}

static void test_json(void **state)
{
	(void)state;
	expect("{{ {'a': [1, 2.0, 'x', none, false], 'b': 'q\"\\n'}|tojson }}", NULL,
	       "{\"a\": [1, 2.0, \"x\", null, false], \"b\": \"q\\\"\\n\"}");
	expect("{{ [1, [2]]|tojson(indent=2) }}", NULL, "[\n  1,\n  [\n    2\n  ]\n]");
	expect("{{ {'a': 1, 'b': 2}|tojson(separators=(',', ':')) }}", NULL, "{\"a\":1,\"b\":2}");
	expect("{{ xs|tojson }} {{ xs[0]|string }}",
	       "{\"xs\": [0.30000000000000004, 1e20, 1.5e-7]}",
	       "[0.30000000000000004, 1e+20, 1.5e-07] 0.30000000000000004");
	/* Object keys keep the document's order. */
	expect("{{ d|tojson }}", "{\"d\": {\"z\": 1, \"a\": 2, \"m\": 3}}",
	       "{\"z\": 1, \"a\": 2, \"m\": 3}");
}

static void test_tests_and_operators(void **state)
{
	(void)state;
	expect("{{ x is string }}{{ x is defined }}{{ nope is defined }}{{ none is none }}"
	       "{{ nope is none }}{{ 3 is number }}{{ 3 is even }}{{ xs is iterable }}{{ d is "
	       "mapping }}",
	       "{\"x\": \"s\", \"xs\": [1], \"d\": {}}", "TrueTrueFalseTrueFalseTrueFalseTrueTrue");
	expect("{{ 'a' in 'cat' }}{{ 2 in [1, 2] }}{{ 'k' in {'k': 1} }}{{ 3 not in [1] }}{{ 'x' "
	       "in nope }}",
	       NULL, "TrueTrueTrueTrueFalse");
	expect(
	    "{{ 1 == 1.0 }}{{ 'a' == 'a' }}{{ [1] == [1] }}{{ [[1]] == [[1]] }}{{ nope == nope }}",
	    NULL, "TrueTrueTrueFalseTrue");
	expect(
	    "{{ 'y' if false else 'n' }}{{ 'z' if false }}{{ 1 and 'b' }}{{ 0 or 'c' }}{{ not 0 }}",
	    NULL, "nbcTrue");
	expect("{{ [1] + [2] }}{{ 'a' + 'b' }}{{ 10 - 2.5 }}", NULL, "12ab7.5");
	expect_error("{{ 'a' < 'b' }}", NULL, "Unknown operator");
	expect_error("{{ nope + 1 }}", NULL, "undefined");
}

static void test_objects_and_methods(void **state)
{
	(void)state;
	expect("{{ d.get('a') }}{{ d.get('zz', 'dflt') }}{{ d.keys()|join }}{{ d.values()|join }}",
	       "{\"d\": {\"a\": 1, \"b\": 2}}", "1dfltab12");
	/* obj.name prefers the built-in; obj['name'] the key. */
	expect("{{ d['items'] }}{{ d.items is defined }}", "{\"d\": {\"items\": 7}}", "7True");
	expect("{% set xs = [] %}{% set _ = xs.append(1) %}{{ xs|length }}{{ xs.pop() }}{{ "
	       "xs|length }}",
	       NULL, "110");
	expect("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t %}block{% endset %}{{ t|upper }}", NULL,
	       "12BLOCK");
	expect("{% filter upper %}shout{% endfilter %}", NULL, "SHOUT");
}

/* A template is text from a model file and runs in the daemon's loop: one
 * that recurses, loops or grows without end fails instead. */
/* Found against llama-server's /apply-template (build 11669). */
static void test_server_quirks(void **state)
{
	(void)state;
	expect("{{ 'x' * 3 }}|{{ 3 * 'x' }}|{{ 'x' * 0 }}|{{ 'x' * -1 }}|{{ '' * 1000000000000 }}",
	       NULL, "xxx|xxx|||");
	expect_error("{{ 'ab' * 2.0 }}", NULL, "Unknown operator");
	expect("{{ '%s-%d'|format('a', 7) }}|{{ 'q'|format }}", NULL, "%s-%d|q");
	expect_error("{{ [1]|format }}", NULL, "format");
	expect_error("{{ 1.5|round }}", NULL, "round");
	expect_error("{{ 2 ** 10 }}", NULL, "parser");
	expect_error("{{ 7 // 2 }}", NULL, "parser");
}

static void test_limits(void **state)
{
	(void)state;
	size_t n = 100000;
	char *src = malloc(4 * n + 16);
	assert_non_null(src);
	/* Nesting the parser would recurse through without end. */
	size_t k = (size_t)sprintf(src, "{{ ");
	for (size_t i = 0; i < n; i++)
		src[k++] = '(';
	src[k++] = '1';
	for (size_t i = 0; i < n; i++)
		src[k++] = ')';
	strcpy(src + k, " }}");
	expect_error(src, NULL, "nested too deep");
	k = (size_t)sprintf(src, "{{ ");
	for (size_t i = 0; i < n; i++)
		k += (size_t)sprintf(src + k, "not ");
	strcpy(src + k, "1 }}");
	expect_error(src, NULL, "nested too deep");
	k = 0;
	for (size_t i = 0; i < 1000; i++)
		k += (size_t)sprintf(src + k, "{%% if 1 %%}");
	src[k] = 0;
	expect_error(src, NULL, "nested too deep");
	/* A left-deep sum parses in a loop, but evaluates by recursion. */
	k = (size_t)sprintf(src, "{{ 1");
	for (size_t i = 0; i < 50000; i++)
		k += (size_t)sprintf(src + k, "+1");
	strcpy(src + k, " }}");
	expect_error(src, NULL, "nested too deep");
	free(src);
	/* Macros that call themselves. */
	expect_error("{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}", NULL, "too deep");
	/* Loops without end in practice, and a string that doubles: each step
	 * allocates, and the render's memory cap ends them. */
	expect_error("{% set r = range(5000) %}{% for i in r %}{% for j in r %}{% endfor %}"
	             "{% endfor %}",
	             NULL, "out of memory");
	expect_error("{% set ns = namespace(s='xx') %}{% for i in range(64) %}"
	             "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
	             NULL, "out of memory");
	/* What real templates do stays well inside. */
	expect("{% for i in range(200) %}{% for j in range(100) %}{% endfor %}{% endfor %}ok", NULL,
	       "ok");
}

static void test_globals_and_errors(void **state)
{
	(void)state;
	expect("{{ range(3)|join }}{{ range(1, 3)|join }}{{ namespace(a=1).a }}", NULL, "012121");
	expect_error("{{ raise_exception('nope: ' ~ 1) }}", NULL, "Jinja Exception: nope: 1");
	expect_error("{% if %}", NULL, "parser");
	expect_error("{% frobnicate %}", NULL, "unknown statement");
	expect_error("{% if true %}no end", NULL, "missing");
	expect_error("{{ 'unterminated }}", NULL, "lexer");
	expect_error("{{ 1 2 }}", NULL, "expected }}");
	expect_error("{{ x() }}", "{\"x\": 1}", "not a function");
	expect_error("{% macro r(n) %}{{ r(n) }}{% endmacro %}{{ r(1) }}", NULL, "too deep");
	expect_error("{% call m() %}x{% endcall %}", NULL, "CallStatement");
	expect_error("{{ 'abc'.split('') }}", NULL, "empty separator");
}

static void dtoa_is(double v, const char *want)
{
	char buf[40];
	size_t n = dtoa_nlohmann(v, buf);
	assert_int_equal(n, strlen(buf));
	if (strcmp(buf, want))
		fail_msg("dtoa(%.17g): want %s, got %s", v, want, buf);
}

static void test_dtoa(void **state)
{
	(void)state;
	dtoa_is(2.0, "2.0");
	dtoa_is(0.1, "0.1");
	dtoa_is(0.1 + 0.2, "0.30000000000000004");
	dtoa_is(1e15, "1000000000000000.0");
	dtoa_is(1e16, "1e+16");
	dtoa_is(1e-4, "0.0001");
	dtoa_is(1e-5, "1e-05");
	dtoa_is(1.5e-7, "1.5e-07");
	dtoa_is(-0.0, "-0.0");
	dtoa_is(123456789.123, "123456789.123");
	dtoa_is(5e-324, "5e-324");
	dtoa_is(1.7976931348623157e308, "1.7976931348623157e+308");
}

/* rsplit()'s search, and the joined-header probe's (prompt/chat.c): the
 * last occurrence, found past NULs, none where the needle is longer. */
/* util/bytes' hex and SHA-256, which tokens, secrets, fingerprints and a
 * verdict's bits are written with (FIPS 180-2's "abc"). */
static void test_bytes_hex(void **state)
{
	(void)state;
	char out[65];
	const unsigned char raw[] = {0x00, 0xff, 0x1a, 0x90};
	bytes_hex(raw, sizeof raw, out);
	assert_string_equal(out, "00ff1a90");
	bytes_hex(raw, 0, out);
	assert_string_equal(out, "");
	bytes_sha256_hex("abc", 3, out);
	assert_string_equal(out,
	                    "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	bytes_sha256_hex("", 0, out);
	assert_string_equal(out,
	                    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

static void test_bytes_rfind(void **state)
{
	(void)state;
	static const char h[] = "ab\0abXab";
	size_t hl = sizeof h - 1;
	assert_ptr_equal(bytes_rfind(h, hl, "ab", 2), h + 6);
	assert_ptr_equal(bytes_rfind(h, hl, "\0a", 2), h + 2);
	assert_ptr_equal(bytes_rfind(h, hl, "b", 1), h + 7);
	assert_ptr_equal(bytes_rfind(h, hl, "", 0), h + hl);
	assert_ptr_equal(bytes_rfind(h, 2, "ab", 2), h);
	assert_null(bytes_rfind(h, 1, "ab", 2));
	assert_null(bytes_rfind(h, hl, "ba", 2));
	assert_null(bytes_rfind(h, 0, "a", 1));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_printing),
	    cmocka_unit_test(test_bytes_rfind),
	    cmocka_unit_test(test_bytes_hex),
	    cmocka_unit_test(test_whitespace),
	    cmocka_unit_test(test_loops),
	    cmocka_unit_test(test_macros),
	    cmocka_unit_test(test_filters),
	    cmocka_unit_test(test_json),
	    cmocka_unit_test(test_tests_and_operators),
	    cmocka_unit_test(test_objects_and_methods),
	    cmocka_unit_test(test_globals_and_errors),
	    cmocka_unit_test(test_dtoa),
	    cmocka_unit_test(test_limits),
	    cmocka_unit_test(test_server_quirks),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
