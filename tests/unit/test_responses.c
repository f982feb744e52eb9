/* Unit tests for the Responses -> chat completions conversion
 * (src/api/responses.c). The expectations are llama-server build 11669's own
 * conversion: every request shape here was also sent to the real server's
 * /v1/responses and gave the same prompt tokens as /v1/chat/completions with
 * this output, and every error case gave the same 400 message. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api/responses.h"

/* Test JSON is written with ' for "; none of it needs a literal apostrophe. */
static json_t *J(const char *text)
{
	char *s = strdup(text);
	assert_non_null(s);
	for (char *p = s; *p; p++)
		if (*p == '\'')
			*p = '"';
	json_error_t e;
	json_t *v = json_loads(s, JSON_DECODE_ANY | JSON_ALLOW_NUL, &e);
	if (!v)
		fprintf(stderr, "bad test JSON: %s: %s\n", e.text, s);
	free(s);
	assert_non_null(v);
	return v;
}

static void expect_json(json_t *got, const char *want_text)
{
	json_t *want = J(want_text);
	if (!got || !json_equal(got, want)) {
		char *g = got ? json_dumps(got, JSON_COMPACT) : NULL;
		char *w = json_dumps(want, JSON_COMPACT);
		fprintf(stderr, "got:  %s\nwant: %s\n", g ? g : "(null)", w);
		free(g);
		free(w);
	}
	assert_non_null(got);
	assert_true(json_equal(got, want));
	json_decref(want);
	json_decref(got);
}

static json_t *convert_ok(const char *req_text)
{
	json_t *req = J(req_text);
	char err[256] = "";
	json_t *chat = responses_to_chat(req, err, sizeof err);
	if (!chat)
		fprintf(stderr, "unexpected error: %s\n", err);
	assert_non_null(chat);
	json_decref(req);
	return chat;
}

static void test_string_input(void **state)
{
	expect_json(convert_ok("{'model':'gpt','input':'Hi','stream':true,'store':false}"),
	            "{'model':'gpt','stream':true,'store':false,"
	            "'messages':[{'role':'user','content':'Hi'}]}");
}

static void test_instructions(void **state)
{
	/* Always a "system" message; a non-string (even null) becomes "". */
	expect_json(convert_ok("{'instructions':'Be brief','input':'Hi'}"),
	            "{'messages':[{'role':'system','content':'Be brief'},"
	            "{'role':'user','content':'Hi'}]}");
	expect_json(convert_ok("{'instructions':null,'input':'Hi'}"),
	            "{'messages':[{'role':'system','content':''},{'role':'user','content':'Hi'}]}");
	expect_json(convert_ok("{'instructions':5,'input':'Hi'}"),
	            "{'messages':[{'role':'system','content':''},{'role':'user','content':'Hi'}]}");
	/* A NUL is text, kept whole (before, the instructions ended at it). */
	expect_json(convert_ok("{'instructions':'a\\u0000b','input':'\\u0000'}"),
	            "{'messages':[{'role':'system','content':'a\\u0000b'},"
	            "{'role':'user','content':'\\u0000'}]}");
}

static void test_codex_conversation(void **state)
{
	expect_json(
	    convert_ok(
	        "{'model':'m','instructions':'You are Codex','tool_choice':'auto',"
	        "'parallel_tool_calls':false,'store':false,'stream':true,"
	        "'include':['reasoning.encrypted_content'],'prompt_cache_key':'k',"
	        "'reasoning':{'effort':'high','summary':'auto'},'max_output_tokens':100,"
	        "'tools':[{'type':'function','name':'shell','description':'Run',"
	        "'parameters':{'type':'object'},'strict':false},"
	        "{'type':'function','name':'apply_patch','parameters':{'type':'object'}},"
	        "{'type':'web_search'},{'type':'local_shell'},5],"
	        "'input':["
	        "{'type':'message','role':'developer','id':'d1','content':"
	        "[{'type':'input_text','text':'<permissions>'}]},"
	        "{'type':'message','role':'user','content':[{'type':'input_text',"
	        "'text':'<env>'},{'type':'input_text','text':'List files'}]},"
	        "{'type':'reasoning','summary':[{'type':'summary_text','text':'sum'}],"
	        "'content':[{'type':'reasoning_text','text':'think 1'}],"
	        "'encrypted_content':null},"
	        "{'type':'message','role':'assistant','status':'completed','content':"
	        "[{'type':'output_text','text':'Running','annotations':[]}]},"
	        "{'type':'function_call','name':'shell','arguments':'{\\'cmd\\':[\\'ls\\']}',"
	        "'call_id':'call_1'},"
	        "{'type':'function_call_output','call_id':'call_1','output':'a\\nb'},"
	        "{'type':'reasoning','summary':[],'content':[{'type':'reasoning_text',"
	        "'text':'think 2'}]},"
	        "{'type':'function_call','name':'shell','arguments':'{}','call_id':'call_2'},"
	        "{'type':'function_call_output','call_id':'call_2','output':"
	        "[{'type':'input_text','text':'x'},{'type':'input_text','text':'y'}]},"
	        "{'type':'message','role':'assistant','content':[{'type':'output_text',"
	        "'text':'Done'}]},"
	        "{'type':'message','role':'user','content':'thanks'}]}"),
	    "{'model':'m','tool_choice':'auto','parallel_tool_calls':false,'store':false,"
	    "'stream':true,'include':['reasoning.encrypted_content'],'prompt_cache_key':'k',"
	    "'reasoning_effort':'high','max_tokens':100,"
	    "'tools':[{'type':'function','function':{'name':'shell','description':'Run',"
	    "'parameters':{'type':'object'},'strict':false}},"
	    "{'type':'function','function':{'name':'apply_patch',"
	    "'parameters':{'type':'object'},'strict':true}}],"
	    "'messages':["
	    "{'role':'system','content':'You are Codex'},"
	    /* Input messages keep their other keys (id) and their role. */
	    "{'role':'developer','id':'d1','content':[{'text':'<permissions>','type':'text'}]},"
	    "{'role':'user','content':[{'text':'<env>','type':'text'},"
	    "{'text':'List files','type':'text'}]},"
	    /* A reasoning item opens an assistant message the next items join. */
	    "{'role':'assistant','content':[{'text':'Running','type':'text'}],"
	    "'reasoning_content':'think 1','tool_calls':[{'function':{"
	    "'arguments':'{\\'cmd\\':[\\'ls\\']}','name':'shell'},'id':'call_1',"
	    "'type':'function'}]},"
	    "{'content':'a\\nb','role':'tool','tool_call_id':'call_1'},"
	    "{'role':'assistant','content':[],'reasoning_content':'think 2',"
	    "'tool_calls':[{'function':{'arguments':'{}','name':'shell'},'id':'call_2',"
	    "'type':'function'}]},"
	    "{'content':[{'type':'text','text':'x'},{'type':'text','text':'y'}],"
	    "'role':'tool','tool_call_id':'call_2'},"
	    "{'role':'assistant','content':[{'text':'Done','type':'text'}]},"
	    "{'role':'user','content':[{'text':'thanks','type':'text'}]}]}");
}

static void test_roles_and_merging(void **state)
{
	/* system/developer items stay where they are with their role; an
	 * assistant message after an assistant message merges into it; a
	 * reasoning item after one overwrites its reasoning (first part only). */
	expect_json(
	    convert_ok("{'input':[{'role':'system','content':[{'type':'input_text','text':'s'}]},"
	               "{'role':'user','content':'u'},"
	               "{'role':'developer','content':'d','status':'x'},"
	               "{'type':'message','role':'assistant','content':[{'type':'output_text',"
	               "'text':'a1'}]},"
	               "{'type':'message','role':'assistant','content':'a2'},"
	               "{'type':'message','role':'assistant','content':[{'type':'refusal',"
	               "'refusal':'no'}]},"
	               "{'type':'reasoning','summary':[],'content':[{'text':'r1'},{'text':'r2'}]},"
	               "{'type':'function_call','name':'f','arguments':'{}','call_id':'c'}]}"),
	    "{'messages':[{'role':'system','content':[{'text':'s','type':'text'}]},"
	    "{'role':'user','content':[{'text':'u','type':'text'}]},"
	    "{'role':'developer','content':[{'text':'d','type':'text'}]},"
	    "{'role':'assistant','content':[{'text':'a1','type':'text'},"
	    "{'text':'a2','type':'text'},{'refusal':'no','type':'refusal'}],"
	    "'reasoning_content':'r1','tool_calls':[{'function':{'arguments':'{}',"
	    "'name':'f'},'id':'c','type':'function'}]}]}");
	/* A function call with nothing before it is its own assistant message,
	 * without a content key. */
	expect_json(convert_ok("{'input':[{'type':'function_call','name':'f','arguments':'{}',"
	                       "'call_id':'c'},{'type':'function_call_output','call_id':'c',"
	                       "'output':'o'},{'role':'user','content':'u'}]}"),
	            "{'messages':[{'role':'assistant','tool_calls':[{'function':{'arguments':'{}',"
	            "'name':'f'},'id':'c','type':'function'}]},"
	            "{'content':'o','role':'tool','tool_call_id':'c'},"
	            "{'role':'user','content':[{'text':'u','type':'text'}]}]}");
}

static void test_images(void **state)
{
	expect_json(
	    convert_ok("{'input':[{'role':'user','content':[{'type':'input_image',"
	               "'image_url':'data:image/png;base64,AA','detail':'auto'},"
	               "{'type':'input_text','text':'what'}]},"
	               "{'type':'function_call','name':'f','arguments':'{}','call_id':'c'},"
	               "{'type':'function_call_output','call_id':'c','output':[{'type':"
	               "'input_image','image_url':'data:image/gif;base64,R0'},"
	               "{'type':'input_text','text':'t'}]}]}"),
	    "{'messages':[{'role':'user','content':[{'image_url':{'url':"
	    "'data:image/png;base64,AA'},'type':'image_url'},{'text':'what','type':'text'}]},"
	    "{'role':'assistant','tool_calls':[{'function':{'arguments':'{}','name':'f'},"
	    "'id':'c','type':'function'}]},"
	    "{'content':[{'type':'image_url','image_url':{'url':'data:image/gif;base64,R0'}},"
	    "{'type':'text','text':'t'}],'role':'tool','tool_call_id':'c'}]}");
}

static void test_tools_all_skipped(void **state)
{
	/* Only non-function tools: no tools key at all. */
	expect_json(convert_ok("{'input':'x','tools':[{'type':'web_search'}]}"),
	            "{'messages':[{'role':'user','content':'x'}]}");
	expect_json(convert_ok("{'input':'x','tools':[]}"),
	            "{'messages':[{'role':'user','content':'x'}]}");
	/* A reasoning object without effort just goes. */
	expect_json(convert_ok("{'input':'x','reasoning':{'summary':'auto'},'reasoning_x':1}"),
	            "{'messages':[{'role':'user','content':'x'}],'reasoning_x':1}");
}

/* llama-server's own messages, verbatim. */
static void test_errors(void **state)
{
	static const char *cases[][2] = {
	    {"[]", "request body must be a JSON object"},
	    {"{'model':'m'}", "'input' is required"},
	    {"{'input':'x','previous_response_id':'resp_1'}",
	     "llama.cpp does not support 'previous_response_id'."},
	    {"{'input':5}", "'input' must be a string or array of objects"},
	    {"{'input':{'role':'user','content':'x'}}",
	     "'input' must be a string or array of objects"},
	    {"{'input':['hello']}", "Cannot determine type of 'item'"},
	    {"{'input':[{'type':'weird'}]}", "Cannot determine type of 'item'"},
	    /* An assistant message without type "message" is not recognised. */
	    {"{'input':[{'role':'assistant','content':'a'}]}", "Cannot determine type of 'item'"},
	    {"{'input':[{'role':'user','content':[{'type':'input_text'}]}]}",
	     "'Input text' requires 'text'"},
	    {"{'input':[{'role':'user','content':[{'type':'input_image'}]}]}",
	     "'image_url' is required"},
	    {"{'input':[{'role':'user','content':[{'type':'input_file','file_id':'f'}]}]}",
	     "'input_file' is not supported by llamacpp at this moment"},
	    {"{'input':[{'role':'user','content':[{'type':'text','text':'x'}]}]}",
	     "'type' must be one of 'input_text', 'input_image', or 'input_file'"},
	    {"{'input':[{'role':'user','content':[5]}]}",
	     "'type' must be one of 'input_text', 'input_image', or 'input_file'"},
	    {"{'input':[{'type':'message','role':'assistant','content':[{'type':'output_text'}]}]}",
	     "'Output text' requires 'text'"},
	    {"{'input':[{'type':'message','role':'assistant','content':[{'type':'refusal'}]}]}",
	     "'Refusal' requires 'refusal'"},
	    {"{'input':[{'type':'message','role':'assistant','content':[{'type':'x'}]}]}",
	     "'type' must be one of 'output_text' or 'refusal'"},
	    {"{'input':[{'type':'function_call_output','call_id':'c','output':[{'text':'x'}]}]}",
	     "Output of tool call missing 'type' field"},
	    {"{'input':[{'type':'function_call_output','call_id':'c','output':[5]}]}",
	     "Output of tool call missing 'type' field"},
	    {"{'input':[{'type':'function_call_output','call_id':'c','output':"
	     "[{'type':'output_text','text':'x'}]}]}",
	     "Output of tool call should be 'Input text' or 'Input image'"},
	    {"{'input':[{'type':'function_call_output','call_id':'c','output':"
	     "[{'type':'input_image'}]}]}",
	     "'image_url' is required"},
	    {"{'input':[{'type':'reasoning','summary':[],'encrypted_content':'x'}]}",
	     "item['content'] is not an array"},
	    {"{'input':[{'type':'reasoning','summary':[],'content':[]}]}",
	     "item['content'] is empty"},
	    {"{'input':[{'type':'reasoning','summary':[],'content':[{'text':5}]}]}",
	     "item['content']['text'] is not a string"},
	    {"{'input':[{'type':'function_call','name':'f','arguments':{},'call_id':'c'}]}",
	     "Cannot determine type of 'item'"},
	    {"{'input':'x','tools':{'type':'function'}}", "'tools' must be an array of objects"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		json_t *req = J(cases[i][0]);
		char err[256] = "";
		json_t *chat = responses_to_chat(req, err, sizeof err);
		if (chat || strcmp(err, cases[i][1]))
			fprintf(stderr, "case %zu %s: err '%s', want '%s'\n", i, cases[i][0], err,
			        cases[i][1]);
		assert_null(chat);
		assert_string_equal(err, cases[i][1]);
		json_decref(req);
	}
}

/* Like llama-server, a non-string previous_response_id or text is let through
 * here (llama-server's chat parser then rejects the text). */
static void test_lenient_like_llama_server(void **state)
{
	expect_json(convert_ok("{'input':'x','previous_response_id':5}"),
	            "{'previous_response_id':5,'messages':[{'role':'user','content':'x'}]}");
	expect_json(convert_ok("{'input':'x','previous_response_id':''}"),
	            "{'previous_response_id':'','messages':[{'role':'user','content':'x'}]}");
	expect_json(convert_ok("{'input':[{'role':'user','content':[{'type':'input_text',"
	                       "'text':5}]}]}"),
	            "{'messages':[{'role':'user','content':[{'text':5,'type':'text'}]}]}");
}

static int replace_nth(json_t *v, int *n, json_t *repl)
{
	if (json_is_object(v)) {
		const char *k;
		json_t *c;
		json_object_foreach(v, k, c)
		{
			if ((*n)-- == 0) {
				json_object_set(v, k, repl);
				return 1;
			}
			if (replace_nth(c, n, repl))
				return 1;
		}
	} else if (json_is_array(v)) {
		size_t i;
		json_t *c;
		json_array_foreach(v, i, c)
		{
			if ((*n)-- == 0) {
				json_array_set(v, i, repl);
				return 1;
			}
			if (replace_nth(c, n, repl))
				return 1;
		}
	}
	return 0;
}

/* Every node of a full request swapped for every JSON type: a result or an
 * error, never a crash (nor, under ASan, a leak). */
static void test_wrong_types_everywhere(void **state)
{
	json_t *base = J(
	    "{'model':'m','instructions':'i','previous_response_id':null,'max_output_tokens':5,"
	    "'reasoning':{'effort':'low'},'tools':[{'type':'function','name':'f','parameters':{}}],"
	    "'input':[{'type':'message','role':'user','content':[{'type':'input_text','text':'u'},"
	    "{'type':'input_image','image_url':'x'}]},{'role':'developer','content':'d'},"
	    "{'type':'reasoning','summary':[],'content':[{'type':'reasoning_text','text':'r'}]},"
	    "{'type':'message','role':'assistant','content':[{'type':'output_text','text':'a'},"
	    "{'type':'refusal','refusal':'n'}]},{'type':'function_call','name':'f',"
	    "'arguments':'{}','call_id':'c'},{'type':'function_call_output','call_id':'c',"
	    "'output':[{'type':'input_text','text':'o'},{'type':'input_image','image_url':'y'}]},"
	    "{'type':'function_call_output','call_id':'c','output':'s'}]}");
	json_t *repls[] = {json_null(),  json_integer(7), json_string("s"),
	                   json_array(), json_object(),   json_false()};
	int total = 0;
	for (int target = 0;; target++) {
		int any = 0;
		for (size_t r = 0; r < sizeof repls / sizeof repls[0]; r++) {
			json_t *req = json_deep_copy(base);
			int n = target;
			if (!replace_nth(req, &n, repls[r])) {
				json_decref(req);
				continue;
			}
			any = 1;
			char err[256] = "";
			json_t *chat = responses_to_chat(req, err, sizeof err);
			assert_true(chat != NULL || err[0] != '\0');
			json_decref(chat);
			json_decref(req);
			total++;
		}
		if (!any)
			break;
	}
	assert_true(total > 100);
	for (size_t r = 0; r < sizeof repls / sizeof repls[0]; r++)
		json_decref(repls[r]);
	json_decref(base);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_string_input),
	    cmocka_unit_test(test_instructions),
	    cmocka_unit_test(test_codex_conversation),
	    cmocka_unit_test(test_roles_and_merging),
	    cmocka_unit_test(test_images),
	    cmocka_unit_test(test_tools_all_skipped),
	    cmocka_unit_test(test_errors),
	    cmocka_unit_test(test_lenient_like_llama_server),
	    cmocka_unit_test(test_wrong_types_everywhere),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
