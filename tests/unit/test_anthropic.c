/* Unit tests for the Anthropic Messages <-> chat completions translation
 * (src/api/anthropic.c). The expected conversions are what llama-server build
 * 11669's own /v1/messages conversion produced: each request shape here was
 * also checked against the real server (same prompt tokens through
 * /v1/messages and through /v1/chat/completions with this output). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "api/anthropic.h"

/* Test JSON is written with ' for " to stay readable; none of it needs a
 * literal apostrophe. */
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

static char *Q(const char *text)
{
	char *s = strdup(text);
	assert_non_null(s);
	for (char *p = s; *p; p++)
		if (*p == '\'')
			*p = '"';
	return s;
}

/* got must equal want (order-insensitive JSON equality); frees got. */
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
	json_t *chat = anthropic_to_chat(req, err, sizeof err);
	if (!chat)
		fprintf(stderr, "unexpected error: %s\n", err);
	assert_non_null(chat);
	json_decref(req);
	return chat;
}

/* ------------------------------------------------------------ requests */

static void test_simple_string(void **state)
{
	expect_json(convert_ok("{'model':'claude','max_tokens':64,"
	                       "'messages':[{'role':'user','content':'Hi there'}]}"),
	            "{'model':'claude','messages':[{'role':'user','content':'Hi there'}],"
	            "'max_tokens':64}");
}

static void test_max_tokens_default(void **state)
{
	/* llama-server fills in 4096 instead of rejecting. */
	expect_json(convert_ok("{'messages':[{'role':'user','content':'x'}]}"),
	            "{'messages':[{'role':'user','content':'x'}],'max_tokens':4096}");
}

static void test_system_string_billing(void **state)
{
	expect_json(convert_ok("{'system':'x-anthropic-billing-header: cc_version=2.1.101.e51; "
	                       "cc_entrypoint=cli; cch=a5145;You are Claude Code.',"
	                       "'messages':[{'role':'user','content':'Hi'}]}"),
	            "{'messages':[{'role':'system','content':'x-anthropic-billing-header: "
	            "cc_version=2.1.101.e51; cc_entrypoint=cli; cch=fffff;You are Claude Code.'},"
	            "{'role':'user','content':'Hi'}],'max_tokens':4096}");
}

static void test_system_blocks(void **state)
{
	/* Text blocks are joined with no separator, each masked on its own;
	 * other block types are skipped. */
	expect_json(convert_ok("{'system':[{'type':'text','text':'x-anthropic-billing-header: "
	                       "cch=12345;'},{'type':'image','source':{}},"
	                       "{'type':'text','text':'A','cache_control':{'type':'ephemeral'}},"
	                       "{'type':'text','text':'x-anthropic-billing-header: cch=12345;'}],"
	                       "'messages':[{'role':'user','content':'Hi'}]}"),
	            "{'messages':[{'role':'system','content':'x-anthropic-billing-header: "
	            "cch=fffff;Ax-anthropic-billing-header: cch=fffff;'},"
	            "{'role':'user','content':'Hi'}],'max_tokens':4096}");
}

static void test_system_billing_not_masked(void **state)
{
	/* Left alone: no ';' right after five stamp characters, and a header
	 * that does not start its block. */
	expect_json(convert_ok("{'system':[{'type':'text','text':'x-anthropic-billing-header: "
	                       "cch=a51;'},{'type':'text','text':' x-anthropic-billing-header: "
	                       "cch=12345;'}],'messages':[{'role':'user','content':'Hi'}]}"),
	            "{'messages':[{'role':'system','content':'x-anthropic-billing-header: "
	            "cch=a51; x-anthropic-billing-header: cch=12345;'},"
	            "{'role':'user','content':'Hi'}],'max_tokens':4096}");
	/* The stamp at the very end with no ';' after it is left alone; with
	 * the ';' as the last character it is masked. */
	expect_json(convert_ok("{'system':'x-anthropic-billing-header: cch=12345',"
	                       "'messages':[{'role':'user','content':'Hi'}]}"),
	            "{'messages':[{'role':'system','content':'x-anthropic-billing-header: "
	            "cch=12345'},{'role':'user','content':'Hi'}],'max_tokens':4096}");
	expect_json(convert_ok("{'system':'x-anthropic-billing-header: cch=12345;',"
	                       "'messages':[{'role':'user','content':'Hi'}]}"),
	            "{'messages':[{'role':'system','content':'x-anthropic-billing-header: "
	            "cch=fffff;'},{'role':'user','content':'Hi'}],'max_tokens':4096}");
}

static void test_system_empty(void **state)
{
	/* An empty array still makes an (empty) system message; null none. */
	expect_json(convert_ok("{'system':[],'messages':[{'role':'user','content':'Hi'}]}"),
	            "{'messages':[{'role':'system','content':''},{'role':'user','content':'Hi'}],"
	            "'max_tokens':4096}");
	expect_json(convert_ok("{'system':null,'messages':[{'role':'user','content':'Hi'}]}"),
	            "{'messages':[{'role':'user','content':'Hi'}],'max_tokens':4096}");
	/* Claude Code puts a system message after the first user message. */
	expect_json(convert_ok("{'messages':[{'role':'user','content':'Hi'},"
	                       "{'role':'system','content':'env'}]}"),
	            "{'messages':[{'role':'user','content':'Hi'},{'role':'system','content':'env'}],"
	            "'max_tokens':4096}");
}

static void test_agent_conversation(void **state)
{
	expect_json(
	    convert_ok(
	        "{'max_tokens':5,'messages':["
	        "{'role':'user','content':[{'type':'text','text':'List files',"
	        "'cache_control':{'type':'ephemeral'}}]},"
	        "{'role':'assistant','content':[{'type':'thinking','thinking':'I should ',"
	        "'signature':'sig'},{'type':'thinking','thinking':'run ls.'},"
	        "{'type':'redacted_thinking','data':'xx'},{'type':'text','text':'Running ls.'},"
	        "{'type':'tool_use','id':'toolu_1','name':'Bash','input':{'command':'ls',"
	        "'timeout':0.1}}]},"
	        "{'role':'user','content':[{'type':'tool_result','tool_use_id':'toolu_1',"
	        "'content':'a.txt'},{'type':'text','text':'Now count them.'}]},"
	        "{'role':'assistant','content':[{'type':'tool_use','id':'toolu_2','name':'Bash',"
	        "'input':{'command':'wc'}},{'type':'tool_use','id':'toolu_3','name':'NoArgs'}]},"
	        "{'role':'user','content':[{'type':'tool_result','tool_use_id':'toolu_2',"
	        "'content':[{'type':'text','text':'2'},{'type':'text','text':'\\n'},"
	        "{'type':'document','source':{}}],'is_error':true},"
	        "{'type':'tool_result','tool_use_id':'toolu_3'}]}]}"),
	    "{'messages':["
	    "{'role':'user','content':[{'type':'text','text':'List files'}]},"
	    "{'role':'assistant','content':[{'type':'text','text':'Running ls.'}],"
	    "'tool_calls':[{'id':'toolu_1','type':'function','function':{'name':'Bash',"
	    "'arguments':'{\\'command\\':\\'ls\\',\\'timeout\\':0.1}'}}],"
	    "'reasoning_content':'I should run ls.'},"
	    /* The text of a tool-result message comes first, its results after. */
	    "{'role':'user','content':[{'type':'text','text':'Now count them.'}]},"
	    "{'role':'tool','tool_call_id':'toolu_1','content':'a.txt'},"
	    "{'role':'assistant','content':'','tool_calls':["
	    "{'id':'toolu_2','type':'function','function':{'name':'Bash',"
	    "'arguments':'{\\'command\\':\\'wc\\'}'}},"
	    "{'id':'toolu_3','type':'function','function':{'name':'NoArgs','arguments':'{}'}}]},"
	    "{'role':'tool','tool_call_id':'toolu_2','content':'2\\n'},"
	    "{'role':'tool','tool_call_id':'toolu_3','content':''}],'max_tokens':5}");
}

static void test_images(void **state)
{
	expect_json(
	    convert_ok("{'messages':[{'role':'user','content':["
	               "{'type':'image','source':{'type':'base64','media_type':'image/png',"
	               "'data':'iVBOR'}},"
	               "{'type':'image','source':{'type':'base64','data':'/9j/'}},"
	               "{'type':'image','source':{'type':'url','url':'https://x/y.png'}},"
	               "{'type':'image','source':{'type':'file','file_id':'f1'}},"
	               "{'type':'text','text':'What is this?'}]},"
	               "{'role':'assistant','content':[{'type':'tool_use','id':'t','name':'shot',"
	               "'input':{}}]},"
	               "{'role':'user','content':[{'type':'tool_result','tool_use_id':'t',"
	               "'content':[{'type':'text','text':'screen:'},{'type':'image','source':"
	               "{'type':'base64','media_type':'image/gif','data':'R0lG'}}]}]}]}"),
	    "{'messages':[{'role':'user','content':["
	    "{'type':'image_url','image_url':{'url':'data:image/png;base64,iVBOR'}},"
	    "{'type':'image_url','image_url':{'url':'data:image/jpeg;base64,/9j/'}},"
	    "{'type':'image_url','image_url':{'url':'https://x/y.png'}},"
	    "{'type':'text','text':'What is this?'}]},"
	    "{'role':'assistant','content':'','tool_calls':[{'id':'t','type':'function',"
	    "'function':{'name':'shot','arguments':'{}'}}]},"
	    /* An image keeps a tool result as a list of parts. */
	    "{'role':'tool','tool_call_id':'t','content':[{'type':'text','text':'screen:'},"
	    "{'type':'image_url','image_url':{'url':'data:image/gif;base64,R0lG'}}]}],"
	    "'max_tokens':4096}");
}

static void test_dropped_and_skipped(void **state)
{
	/* A message left with nothing (only unknown blocks) disappears, and so
	 * does an assistant message without content. */
	expect_json(
	    convert_ok("{'messages':[{'role':'user','content':'Q'},"
	               "{'role':'assistant'},"
	               "{'role':'assistant','content':[{'type':'redacted_thinking','data':'x'}]},"
	               "{'role':'user','content':[{'type':'document','source':{}}]},"
	               "{'role':'assistant','content':[]},"
	               "{'role':'assistant','content':[{'type':'thinking','thinking':'t'}]},"
	               "{'role':'user','content':'R'}]}"),
	    "{'messages':[{'role':'user','content':'Q'},"
	    "{'role':'assistant','content':'','reasoning_content':'t'},"
	    "{'role':'user','content':'R'}],'max_tokens':4096}");
}

static void test_tools_and_params(void **state)
{
	expect_json(
	    convert_ok("{'tools':[{'name':'Bash','description':'Run','input_schema':"
	               "{'type':'object','properties':{'c':{'type':'string'}}},"
	               "'cache_control':{'type':'ephemeral'}},"
	               "{'name':'NoDesc'},{'type':'web_search_20250305','name':'web_search',"
	               "'max_uses':5}],'tool_choice':{'type':'tool','name':'Bash'},"
	               "'stop_sequences':['\\n\\nHuman:'],'temperature':0.5,'top_p':0.9,'top_k':40,"
	               "'stream':true,'max_tokens':100,'metadata':{'user_id':'u-1'},"
	               "'thinking':{'type':'enabled','budget_tokens':2048},"
	               "'chat_template_kwargs':{'enable_thinking':false},"
	               "'service_tier':'auto','container':'c',"
	               "'messages':[{'role':'user','content':'Hi'}]}"),
	    "{'messages':[{'role':'user','content':'Hi'}],"
	    "'tools':[{'type':'function','function':{'name':'Bash','description':'Run',"
	    "'parameters':{'type':'object','properties':{'c':{'type':'string'}}}}},"
	    "{'type':'function','function':{'name':'NoDesc','description':'','parameters':{}}},"
	    "{'type':'function','function':{'name':'web_search','description':'',"
	    "'parameters':{}}}],"
	    "'tool_choice':'required','stop':['\\n\\nHuman:'],'max_tokens':100,"
	    "'temperature':0.5,'top_p':0.9,'top_k':40,'stream':true,"
	    "'chat_template_kwargs':{'enable_thinking':false},"
	    "'thinking_budget_tokens':2048,'__metadata_user_id':'u-1'}");
}

static void test_tool_choice_kinds(void **state)
{
	const char *kinds[][2] = {
	    {"auto", "auto"}, {"any", "required"}, {"tool", "required"}, {"none", "none"}};
	for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
		char req[256], want[256];
		snprintf(req, sizeof req,
		         "{'tool_choice':{'type':'%s'},'messages':[{'role':'user','content':'x'}]}",
		         kinds[i][0]);
		snprintf(want, sizeof want,
		         "{'messages':[{'role':'user','content':'x'}],'tool_choice':'%s',"
		         "'max_tokens':4096}",
		         kinds[i][1]);
		expect_json(convert_ok(req), want);
	}
}

static void test_thinking_defaults(void **state)
{
	expect_json(convert_ok("{'thinking':{'type':'enabled'},'metadata':{'user_id':''},"
	                       "'messages':[{'role':'user','content':'x'}]}"),
	            "{'messages':[{'role':'user','content':'x'}],'max_tokens':4096,"
	            "'thinking_budget_tokens':10000}");
	expect_json(convert_ok("{'thinking':{'type':'disabled'},"
	                       "'messages':[{'role':'user','content':'x'}]}"),
	            "{'messages':[{'role':'user','content':'x'}],'max_tokens':4096}");
}

static void test_count_tokens(void **state)
{
	json_t *req = J("{'system':'s','stream':true,'max_tokens':'ignored',"
	                "'messages':[{'role':'user','content':'x'}]}");
	char err[256] = "";
	json_t *chat = anthropic_count_tokens_request_to_chat(req, err, sizeof err);
	expect_json(chat, "{'messages':[{'role':'system','content':'s'},"
	                  "{'role':'user','content':'x'}]}");
	json_decref(req);
}

static void test_tool_input_serialisation(void **state)
{
	/* The arguments text is what llama-server's nlohmann dump writes:
	 * checked against the real server, token for token. */
	json_t *v = J("{'s':'\\u0001\\u001f\\t\\'q\\\\/\\u007f\\u00e9','i':-42,'z':0,'big':"
	              "9007199254740993,'f':[1.5,100.0,1e15,1e16,123456789012345680000.0,-0.0,"
	              "3.14159,2.5e-7,0.001,1e-4,0.0001234,1e-5,5e-324,1.7976931348623157e308,"
	              "0.30000000000000004,0.6666666666666666,1e21,12345.678,-1e-10,0.1],"
	              "'n':null,'t':true,'o':{},'a':[],'nul':'a\\u0000b'}");
	char *s = anthropic_dump_json(v);
	char *want = Q("{'s':'\\u0001\\u001f\\t\\'q\\\\/\x7f\xc3\xa9','i':-42,'z':0,"
	               "'big':9007199254740993,'f':[1.5,100.0,1e+15,1e+16,"
	               "1.2345678901234568e+20,-0.0,3.14159,2.5e-07,0.001,0.0001,0.0001234,1e-05,"
	               "5e-324,1.7976931348623157e+308,0.30000000000000004,0.6666666666666666,"
	               "1e+21,12345.678,-1e-10,0.1],'n':null,'t':true,'o':{},'a':[],"
	               "'nul':'a\\u0000b'}");
	assert_non_null(s);
	assert_string_equal(s, want);
	free(s);
	free(want);
	json_decref(v);
}

/* Each (request, error fragment): NULL with a message, never a crash. */
static void test_malformed(void **state)
{
	static const char *cases[][2] = {
	    {"[]", "JSON object"},
	    {"{}", "'messages' is required"},
	    {"{'messages':{}}", "messages: must be an array"},
	    {"{'messages':['x']}", "messages[0]: must be an object"},
	    {"{'messages':[{'content':'x'}]}", "messages[0].role"},
	    {"{'messages':[{'role':'robot','content':'x'}]}", "messages[0].role"},
	    {"{'messages':[{'role':5,'content':'x'}]}", "messages[0].role"},
	    {"{'messages':[{'role':'user'}]}", "'content' is required"},
	    {"{'messages':[{'role':'user','content':5}]}", "messages[0].content"},
	    {"{'messages':[{'role':'user','content':null}]}", "messages[0].content"},
	    {"{'messages':[{'role':'user','content':[5]}]}", "content[0]: must be an object"},
	    {"{'messages':[{'role':'user','content':[{'text':'x'}]}]}", "content[0].type"},
	    {"{'messages':[{'role':'user','content':[{'type':1}]}]}", "content[0].type"},
	    {"{'messages':[{'role':'user','content':[{'type':'text'}]}]}", "content[0].text"},
	    {"{'messages':[{'role':'user','content':[{'type':'text','text':[]}]}]}",
	     "content[0].text"},
	    {"{'messages':[{'role':'assistant','content':[{'type':'thinking','thinking':1}]}]}",
	     "content[0].thinking"},
	    {"{'messages':[{'role':'user','content':[{'type':'image','source':'x'}]}]}",
	     "content[0].source"},
	    {"{'messages':[{'role':'user','content':[{'type':'image','source':{'type':3}}]}]}",
	     "source.type"},
	    {"{'messages':[{'role':'user','content':[{'type':'image','source':{'type':'base64',"
	     "'data':{}}}]}]}",
	     "source.data"},
	    {"{'messages':[{'role':'user','content':[{'type':'image','source':{'type':'base64',"
	     "'media_type':1}}]}]}",
	     "source.media_type"},
	    {"{'messages':[{'role':'user','content':[{'type':'image','source':{'type':'url',"
	     "'url':1}}]}]}",
	     "source.url"},
	    {"{'messages':[{'role':'assistant','content':[{'type':'tool_use','id':1}]}]}",
	     "content[0].id"},
	    {"{'messages':[{'role':'assistant','content':[{'type':'tool_use','name':[]}]}]}",
	     "content[0].name"},
	    {"{'messages':[{'role':'user','content':[{'type':'tool_result','tool_use_id':{}}]}]}",
	     "tool_use_id"},
	    {"{'messages':[{'role':'user','content':[{'type':'tool_result','content':7}]}]}",
	     "content[0].content"},
	    {"{'messages':[{'role':'user','content':[{'type':'tool_result','content':[1]}]}]}",
	     "content[0].content[0]"},
	    {"{'messages':[{'role':'user','content':[{'type':'tool_result','content':"
	     "[{'type':'text','text':1}]}]}]}",
	     "content[0].content[0].text"},
	    {"{'messages':[{'role':'user','content':[{'type':'tool_result','content':"
	     "[{'type':'image','source':[]}]}]}]}",
	     "content[0].content[0].source"},
	    {"{'system':5,'messages':[]}", "system"},
	    {"{'system':[1],'messages':[]}", "system[0]"},
	    {"{'system':[{'type':'text','text':1}],'messages':[]}", "system[0].text"},
	    {"{'system':[{'type':[]}],'messages':[]}", "system[0].type"},
	    {"{'tools':{},'messages':[]}", "tools"},
	    {"{'tools':[1],'messages':[]}", "tools[0]"},
	    {"{'tools':[{'name':1}],'messages':[]}", "tools[0].name"},
	    {"{'tools':[{'name':'a','description':2}],'messages':[]}", "tools[0].description"},
	    {"{'tools':[{'name':'a','input_schema':'x'}],'messages':[]}", "input_schema"},
	    {"{'tool_choice':'auto','messages':[]}", "tool_choice"},
	    {"{'tool_choice':{'type':'sometimes'},'messages':[]}", "tool_choice.type"},
	    {"{'tool_choice':{'type':1},'messages':[]}", "tool_choice.type"},
	    {"{'stop_sequences':'x','messages':[]}", "stop_sequences"},
	    {"{'stop_sequences':[1],'messages':[]}", "stop_sequences[0]"},
	    {"{'max_tokens':'5','messages':[]}", "max_tokens"},
	    {"{'max_tokens':-1,'messages':[]}", "max_tokens"},
	    {"{'max_tokens':1.5,'messages':[]}", "max_tokens"},
	    {"{'temperature':'hot','messages':[]}", "temperature"},
	    {"{'top_p':[],'messages':[]}", "top_p"},
	    {"{'top_k':1.5,'messages':[]}", "top_k"},
	    {"{'stream':'yes','messages':[]}", "stream"},
	    {"{'chat_template_kwargs':[],'messages':[]}", "chat_template_kwargs"},
	    {"{'thinking':'on','messages':[]}", "thinking"},
	    {"{'thinking':{'type':'enabled','budget_tokens':'big'},'messages':[]}",
	     "thinking.budget_tokens"},
	    {"{'metadata':'m','messages':[]}", "metadata"},
	    {"{'metadata':{'user_id':5},'messages':[]}", "metadata.user_id"},
	    {"{'model':5,'messages':[]}", "model"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		json_t *req = J(cases[i][0]);
		char err[256] = "";
		json_t *chat = anthropic_to_chat(req, err, sizeof err);
		if (chat || !strstr(err, cases[i][1]))
			fprintf(stderr, "case %zu %s: err '%s', want '%s'\n", i, cases[i][0], err,
			        cases[i][1]);
		assert_null(chat);
		assert_non_null(strstr(err, cases[i][1]));
		json_decref(req);
	}
}

/* Replaces the target-th node (pre-order, root excluded) of v by repl. */
static int replace_nth(json_t *v, int *n, json_t *repl)
{
	if (json_is_object(v)) {
		const char *k;
		json_t *c;
		void *tmp;
		json_object_foreach_safe(v, tmp, k, c)
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

static const char *full_request =
    "{'model':'m','max_tokens':9,'temperature':0.1,'top_p':1,'top_k':3,'stream':false,"
    "'stop_sequences':['s'],'metadata':{'user_id':'u'},'thinking':{'type':'enabled',"
    "'budget_tokens':1024},'chat_template_kwargs':{'a':1},"
    "'system':[{'type':'text','text':'sys'}],'tools':[{'name':'t','description':'d',"
    "'input_schema':{'type':'object'}}],'tool_choice':{'type':'tool','name':'t'},"
    "'messages':[{'role':'user','content':[{'type':'text','text':'q'},"
    "{'type':'image','source':{'type':'base64','media_type':'image/png','data':'AA'}}]},"
    "{'role':'assistant','content':[{'type':'thinking','thinking':'th'},"
    "{'type':'text','text':'a'},{'type':'tool_use','id':'i','name':'t','input':{'x':[1]}}]},"
    "{'role':'user','content':[{'type':'tool_result','tool_use_id':'i','content':"
    "[{'type':'text','text':'r'},{'type':'image','source':{'type':'url','url':'u'}}]}]}]}";

/* Every node of a full request swapped for every JSON type: a result or an
 * error, never a crash or a leak (run under ASan to see the latter). */
static void test_wrong_types_everywhere(void **state)
{
	json_t *base = J(full_request);
	json_t *repls[] = {json_null(),  json_integer(7), json_real(2.5), json_string("s"),
	                   json_array(), json_object(),   json_true()};
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
			json_t *chat = anthropic_to_chat(req, err, sizeof err);
			assert_true(chat != NULL || err[0] != '\0');
			json_decref(chat);
			chat = anthropic_count_tokens_request_to_chat(req, err, sizeof err);
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

/* ----------------------------------------------------------- responses */

static void test_from_chat_text(void **state)
{
	json_t *resp =
	    J("{'id':'chatcmpl-abc123','object':'chat.completion','model':'x.gguf',"
	      "'choices':[{'index':0,'finish_reason':'stop','message':{'role':'assistant',"
	      "'content':'Hello!'}}],'usage':{'completion_tokens':3,'prompt_tokens':50,"
	      "'total_tokens':53},'timings':{'cache_n':40,'prompt_n':10,'predicted_n':3}}");
	expect_json(
	    anthropic_from_chat(resp, "claude-x", 1000, 24),
	    "{'id':'msg_abc123','type':'message','role':'assistant','content':"
	    "[{'type':'text','text':'Hello!'}],'model':'claude-x','stop_reason':'end_turn',"
	    "'stop_sequence':null,'usage':{'input_tokens':24,'cache_read_input_tokens':1000,"
	    "'output_tokens':3}}");
	/* Negative numbers: llama-server's own timings. */
	expect_json(anthropic_from_chat(resp, "claude-x", -1, -1),
	            "{'id':'msg_abc123','type':'message','role':'assistant','content':"
	            "[{'type':'text','text':'Hello!'}],'model':'claude-x','stop_reason':'end_turn',"
	            "'stop_sequence':null,'usage':{'input_tokens':10,'cache_read_input_tokens':40,"
	            "'output_tokens':3}}");
	json_decref(resp);
}

static void test_from_chat_thinking_and_tools(void **state)
{
	json_t *resp =
	    J("{'id':'chatcmpl-9','choices':[{'finish_reason':'tool_calls','message':{"
	      "'role':'assistant','reasoning_content':'Let me look.','content':'Checking.',"
	      "'tool_calls':[{'type':'function','id':'AbC','function':{'name':'Bash',"
	      "'arguments':'{\\'command\\':\\'ls\\'}'}},{'type':'function','id':'d2','function':"
	      "{'name':'Read','arguments':'not json'}},{'type':'function','id':'n','function':"
	      "{'name':'Read','arguments':'{\\'f\\':\\'a\\\\u0000\\'}'}}]}}],"
	      "'usage':{'completion_tokens':20,'prompt_tokens':100,"
	      "'prompt_tokens_details':{'cached_tokens':64}}}");
	expect_json(anthropic_from_chat(resp, "m", -1, -1),
	            "{'id':'msg_9','type':'message','role':'assistant','content':["
	            "{'type':'thinking','thinking':'Let me look.','signature':''},"
	            "{'type':'text','text':'Checking.'},"
	            "{'type':'tool_use','id':'AbC','name':'Bash','input':{'command':'ls'}},"
	            "{'type':'tool_use','id':'d2','name':'Read','input':{}},"
	            "{'type':'tool_use','id':'n','name':'Read','input':{'f':'a\\u0000'}}],"
	            "'model':'m','stop_reason':'tool_use','stop_sequence':null,"
	            "'usage':{'input_tokens':36,'cache_read_input_tokens':64,'output_tokens':20}}");
	json_decref(resp);
}

static void test_from_chat_stop_reasons(void **state)
{
	json_t *r = J("{'choices':[{'finish_reason':'length','message':{'content':''}}]}");
	json_t *m = anthropic_from_chat(r, NULL, 0, 0);
	assert_non_null(m);
	assert_string_equal(json_string_value(json_object_get(m, "stop_reason")), "max_tokens");
	assert_int_equal(json_array_size(json_object_get(m, "content")), 0);
	/* No chat id: a random message id. */
	assert_true(!strncmp(json_string_value(json_object_get(m, "id")), "msg_", 4));
	assert_true(strlen(json_string_value(json_object_get(m, "id"))) > 10);
	json_decref(m);
	json_decref(r);

	/* A stop word, when the backend names it (verbose mode), is a
	 * stop_sequence stop. */
	r = J("{'choices':[{'finish_reason':'stop','message':{'content':'x'}}],"
	      "'__verbose':{'stopping_word':'END'}}");
	m = anthropic_from_chat(r, "m", 0, 0);
	assert_string_equal(json_string_value(json_object_get(m, "stop_reason")), "stop_sequence");
	assert_string_equal(json_string_value(json_object_get(m, "stop_sequence")), "END");
	json_decref(m);
	json_decref(r);
}

static void test_from_chat_malformed(void **state)
{
	static const char *bad[] = {
	    "null",
	    "[]",
	    "{}",
	    "{'choices':{}}",
	    "{'choices':[]}",
	    "{'choices':[5]}",
	    "{'choices':[{'message':'x'}]}",
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		json_t *r = J(bad[i]);
		assert_null(anthropic_from_chat(r, "m", 0, 0));
		json_decref(r);
	}
	/* Odd but present messages translate without crashing. */
	static const char *odd[] = {
	    "{'id':5,'choices':[{'finish_reason':7,'message':{'content':5,'tool_calls':5,"
	    "'reasoning_content':[]}}],'usage':'u','timings':[]}",
	    "{'choices':[{'message':{'content':[{'type':'text','text':'a'},5,{'text':'b'}],"
	    "'tool_calls':[5,{'function':5},{'id':[],'function':{'name':5,'arguments':5}},"
	    "{'function':{'arguments':{'k':1}}}]}}]}",
	};
	for (size_t i = 0; i < sizeof odd / sizeof odd[0]; i++) {
		json_t *r = J(odd[i]);
		json_t *m = anthropic_from_chat(r, "m", -1, -1);
		assert_non_null(m);
		json_decref(m);
		json_decref(r);
	}
}

/* ----------------------------------------------------------- streaming */

/* Feeds chunks (test JSON, ' for ") and returns everything written. */
static char *run_stream(struct anthropic_stream *s, const char *const *chunks, size_t n,
                        const char *cache)
{
	struct strbuf out;
	strbuf_init(&out);
	for (size_t i = 0; i < n; i++) {
		json_t *c = J(chunks[i]);
		assert_int_equal(anthropic_stream_feed(s, c, &out), 0);
		json_decref(c);
	}
	json_t *cb = cache ? J(cache) : NULL;
	assert_int_equal(anthropic_stream_finish(s, cb, &out), 0);
	json_decref(cb);
	assert_true(anthropic_stream_done(s));
	char *r = strdup(out.p ? out.p : "");
	strbuf_free(&out);
	return r;
}

static void expect_stream(char *got, const char *want_q)
{
	char *want = Q(want_q);
	if (strcmp(got, want))
		fprintf(stderr, "got:\n%s\nwant:\n%s\n", got, want);
	assert_string_equal(got, want);
	free(want);
	free(got);
}

#define CHUNK(delta)                                                                               \
	"{'id':'chatcmpl-s1','object':'chat.completion.chunk','choices':[{"                        \
	"'finish_reason':null,'index':0,'delta':" delta "}]}"

static void test_stream_text(void **state)
{
	const char *chunks[] = {
	    CHUNK("{'role':'assistant','content':null}"),
	    CHUNK("{'content':'Hel'}"),
	    CHUNK("{'content':''}"),
	    CHUNK("{'content':'lo'}"),
	    "{'id':'chatcmpl-s1','choices':[{'finish_reason':'stop','index':0,'delta':{}}],"
	    "'timings':{'cache_n':42,'prompt_n':7,'predicted_n':2}}",
	};
	struct anthropic_stream *s = anthropic_stream_new("claude-x", 5, 44);
	char *got = run_stream(s, chunks, 5, "{'route':'hit','slot':0}");
	expect_stream(
	    got, "event: message_start\ndata: {'type':'message_start','message':{'id':'msg_s1',"
	         "'type':'message','role':'assistant','content':[],'model':'claude-x',"
	         "'stop_reason':null,'stop_sequence':null,'usage':{'input_tokens':5,"
	         "'cache_read_input_tokens':44,'output_tokens':0}}}\n\n"
	         "event: content_block_start\ndata: {'type':'content_block_start','index':0,"
	         "'content_block':{'type':'text','text':''}}\n\n"
	         "event: content_block_delta\ndata: {'type':'content_block_delta','index':0,"
	         "'delta':{'type':'text_delta','text':'Hel'}}\n\n"
	         "event: content_block_delta\ndata: {'type':'content_block_delta','index':0,"
	         "'delta':{'type':'text_delta','text':'lo'}}\n\n"
	         "event: content_block_stop\ndata: {'type':'content_block_stop','index':0}\n\n"
	         "event: message_delta\ndata: {'type':'message_delta','delta':{'stop_reason':"
	         "'end_turn','stop_sequence':null},'usage':{'input_tokens':7,"
	         "'cache_read_input_tokens':42,'output_tokens':2}}\n\n"
	         "event: message_stop\ndata: {'type':'message_stop','cache':{'route':'hit',"
	         "'slot':0}}\n\n");
	anthropic_stream_free(s);
}

static void test_stream_text_and_tools(void **state)
{
	/* llama-server's shape: the first delta of a call has its id and name,
	 * later ones only argument text. */
	const char *chunks[] = {
	    CHUNK("{'role':'assistant','content':null}"),
	    CHUNK("{'content':'Running.'}"),
	    CHUNK("{'tool_calls':[{'index':0,'id':'c1','type':'function','function':"
	          "{'name':'Bash','arguments':'{\\'com'}}]}"),
	    CHUNK("{'tool_calls':[{'index':0,'function':{'arguments':'mand\\': \\'ls\\'}'}}]}"),
	    CHUNK("{'tool_calls':[{'index':1,'id':'c2','type':'function','function':"
	          "{'name':'Read'}}]}"),
	    CHUNK("{'tool_calls':[{'index':1,'function':{'arguments':'{}'}}]}"),
	    "{'id':'chatcmpl-s1','choices':[{'finish_reason':'tool_calls','index':0,"
	    "'delta':{}}],'timings':{'cache_n':0,'prompt_n':30,'predicted_n':25}}",
	};
	struct anthropic_stream *s = anthropic_stream_new("m", 30, 0);
	char *got = run_stream(s, chunks, 7, NULL);
	expect_stream(
	    got, "event: message_start\ndata: {'type':'message_start','message':{'id':'msg_s1',"
	         "'type':'message','role':'assistant','content':[],'model':'m','stop_reason':null,"
	         "'stop_sequence':null,'usage':{'input_tokens':30,'cache_read_input_tokens':0,"
	         "'output_tokens':0}}}\n\n"
	         "event: content_block_start\ndata: {'type':'content_block_start','index':0,"
	         "'content_block':{'type':'text','text':''}}\n\n"
	         "event: content_block_delta\ndata: {'type':'content_block_delta','index':0,"
	         "'delta':{'type':'text_delta','text':'Running.'}}\n\n"
	         "event: content_block_stop\ndata: {'type':'content_block_stop','index':0}\n\n"
	         "event: content_block_start\ndata: {'type':'content_block_start','index':1,"
	         "'content_block':{'type':'tool_use','id':'c1','name':'Bash','input':{}}}\n\n"
	         "event: content_block_delta\ndata: {'type':'content_block_delta','index':1,"
	         "'delta':{'type':'input_json_delta','partial_json':'{\\'com'}}\n\n"
	         "event: content_block_delta\ndata: {'type':'content_block_delta','index':1,"
	         "'delta':{'type':'input_json_delta','partial_json':'mand\\': \\'ls\\'}'}}\n\n"
	         "event: content_block_stop\ndata: {'type':'content_block_stop','index':1}\n\n"
	         "event: content_block_start\ndata: {'type':'content_block_start','index':2,"
	         "'content_block':{'type':'tool_use','id':'c2','name':'Read','input':{}}}\n\n"
	         "event: content_block_delta\ndata: {'type':'content_block_delta','index':2,"
	         "'delta':{'type':'input_json_delta','partial_json':'{}'}}\n\n"
	         "event: content_block_stop\ndata: {'type':'content_block_stop','index':2}\n\n"
	         "event: message_delta\ndata: {'type':'message_delta','delta':{'stop_reason':"
	         "'tool_use','stop_sequence':null},'usage':{'input_tokens':30,"
	         "'cache_read_input_tokens':0,'output_tokens':25}}\n\n"
	         "event: message_stop\ndata: {'type':'message_stop'}\n\n");
	anthropic_stream_free(s);
}

static void test_stream_reasoning_then_text(void **state)
{
	const char *chunks[] = {
	    CHUNK("{'role':'assistant','content':null}"),
	    CHUNK("{'reasoning_content':'Let me'}"),
	    CHUNK("{'reasoning_content':' think.'}"),
	    CHUNK("{'content':'\\nHi'}"),
	    "{'id':'chatcmpl-s1','choices':[{'finish_reason':'length','index':0,'delta':{}}],"
	    "'timings':{'cache_n':10,'prompt_n':1,'predicted_n':4}}",
	};
	struct anthropic_stream *s = anthropic_stream_new("m", 1, 10);
	char *got = run_stream(s, chunks, 5, NULL);
	expect_stream(
	    got, "event: message_start\ndata: {'type':'message_start','message':{'id':'msg_s1',"
	         "'type':'message','role':'assistant','content':[],'model':'m','stop_reason':null,"
	         "'stop_sequence':null,'usage':{'input_tokens':1,'cache_read_input_tokens':10,"
	         "'output_tokens':0}}}\n\n"
	         "event: content_block_start\ndata: {'type':'content_block_start','index':0,"
	         "'content_block':{'type':'thinking','thinking':''}}\n\n"
	         "event: content_block_delta\ndata: {'type':'content_block_delta','index':0,"
	         "'delta':{'type':'thinking_delta','thinking':'Let me'}}\n\n"
	         "event: content_block_delta\ndata: {'type':'content_block_delta','index':0,"
	         "'delta':{'type':'thinking_delta','thinking':' think.'}}\n\n"
	         "event: content_block_delta\ndata: {'type':'content_block_delta','index':0,"
	         "'delta':{'type':'signature_delta','signature':''}}\n\n"
	         "event: content_block_stop\ndata: {'type':'content_block_stop','index':0}\n\n"
	         "event: content_block_start\ndata: {'type':'content_block_start','index':1,"
	         "'content_block':{'type':'text','text':''}}\n\n"
	         "event: content_block_delta\ndata: {'type':'content_block_delta','index':1,"
	         "'delta':{'type':'text_delta','text':'\\nHi'}}\n\n"
	         "event: content_block_stop\ndata: {'type':'content_block_stop','index':1}\n\n"
	         "event: message_delta\ndata: {'type':'message_delta','delta':{'stop_reason':"
	         "'max_tokens','stop_sequence':null},'usage':{'input_tokens':1,"
	         "'cache_read_input_tokens':10,'output_tokens':4}}\n\n"
	         "event: message_stop\ndata: {'type':'message_stop'}\n\n");
	anthropic_stream_free(s);
}

static void test_stream_usage_after_finish(void **state)
{
	/* With include_usage llama-server puts its timings on a last chunk
	 * without choices: message_delta waits for it. */
	const char *chunks[] = {
	    CHUNK("{'content':'x'}"),
	    "{'id':'chatcmpl-s1','choices':[{'finish_reason':'stop','index':0,'delta':{}}]}",
	    "{'id':'chatcmpl-s1','choices':[],'usage':{'completion_tokens':1,"
	    "'prompt_tokens':9},'timings':{'cache_n':8,'prompt_n':1,'predicted_n':1}}",
	    CHUNK("{'content':'ignored after the end'}"),
	};
	struct anthropic_stream *s = anthropic_stream_new("m", 1, 8);
	char *got = run_stream(s, chunks, 4, NULL);
	const char *tail =
	    "event: content_block_stop\ndata: {\"type\":\"content_block_stop\","
	    "\"index\":0}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\","
	    "\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},"
	    "\"usage\":{\"input_tokens\":1,\"cache_read_input_tokens\":8,"
	    "\"output_tokens\":1}}\n\nevent: message_stop\ndata: "
	    "{\"type\":\"message_stop\"}\n\n";
	assert_non_null(strstr(got, tail));
	assert_null(strstr(got, "ignored"));
	free(got);
	anthropic_stream_free(s);
}

static void test_stream_cut_short(void **state)
{
	/* The backend stops without a finish chunk: finish still closes the
	 * block and ends the message, counting deltas for output_tokens. */
	struct anthropic_stream *s = anthropic_stream_new("m", 3, 0);
	struct strbuf out;
	strbuf_init(&out);
	assert_int_equal(anthropic_stream_start(s, &out), 0);
	assert_int_equal(anthropic_stream_start(s, &out), 0); /* only once */
	json_t *c = J(CHUNK("{'reasoning_content':'hm'}"));
	assert_int_equal(anthropic_stream_feed(s, c, &out), 0);
	json_decref(c);
	assert_int_equal(anthropic_stream_finish(s, NULL, &out), 0);
	assert_int_equal(anthropic_stream_finish(s, NULL, &out), 0); /* no-op */
	const char *p = out.p;
	int starts = 0;
	while ((p = strstr(p, "event: message_start")))
		starts++, p++;
	assert_int_equal(starts, 1);
	/* The id was made before any chunk came: random, not the chunk's. */
	assert_null(strstr(out.p, "msg_s1"));
	assert_non_null(strstr(out.p, "\"id\":\"msg_"));
	assert_non_null(strstr(out.p, "{\"type\":\"signature_delta\",\"signature\":\"\"}"));
	assert_non_null(strstr(out.p, "\"stop_reason\":\"end_turn\",\"stop_sequence\":null},"
	                              "\"usage\":{\"output_tokens\":1}}"));
	assert_non_null(
	    strstr(out.p, "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));
	strbuf_free(&out);
	anthropic_stream_free(s);
}

static void test_stream_error(void **state)
{
	const char *chunks[] = {
	    CHUNK("{'content':'par'}"),
	    "{'error':{'code':500,'message':'slot died','type':'server_error'}}",
	    CHUNK("{'content':'more'}"),
	};
	struct anthropic_stream *s = anthropic_stream_new("m", 0, 0);
	char *got = run_stream(s, chunks, 3, NULL);
	const char *want_end = "event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":"
	                       "\"api_error\",\"message\":\"slot died\"}}\n\n";
	size_t gl = strlen(got), wl = strlen(want_end);
	assert_true(gl > wl);
	assert_string_equal(got + gl - wl, want_end);
	assert_null(strstr(got, "message_stop"));
	assert_null(strstr(got, "more"));
	free(got);
	anthropic_stream_free(s);

	/* Context overflow is the client's problem: invalid_request_error. */
	s = anthropic_stream_new("m", 0, 0);
	struct strbuf out;
	strbuf_init(&out);
	json_t *c = J("{'error':{'message':'too long','type':'exceed_context_size_error'}}");
	assert_int_equal(anthropic_stream_feed(s, c, &out), 0);
	json_decref(c);
	assert_non_null(strstr(out.p, "\"type\":\"invalid_request_error\""));
	assert_int_equal(anthropic_stream_error(s, "api_error", "again", &out), 0);
	assert_null(strstr(out.p, "again"));
	strbuf_free(&out);
	anthropic_stream_free(s);
}

static void test_stream_malformed_chunks(void **state)
{
	const char *chunks[] = {
	    "5",
	    "'text'",
	    "[]",
	    "{}",
	    "{'choices':5}",
	    "{'choices':[5]}",
	    "{'choices':[{'delta':'x'}]}",
	    "{'choices':[{'delta':{'content':5,'reasoning_content':[],'tool_calls':{}}}]}",
	    "{'choices':[{'delta':{'tool_calls':[5,{'index':'a'},{'index':0,'id':5,"
	    "'function':5},{'index':0,'function':{'arguments':7}}]}}]}",
	    "{'choices':[{'delta':{'tool_calls':[{'function':{'name':'n','arguments':'{'}}]}}]}",
	    "{'choices':[{'finish_reason':5}],'timings':'t','usage':[]}",
	    "{'error':5}",
	};
	struct anthropic_stream *s = anthropic_stream_new(NULL, -5, -5);
	char *got = run_stream(s, chunks, sizeof chunks / sizeof chunks[0], NULL);
	/* Whatever came out is whole events. */
	size_t n = strlen(got);
	assert_true(n > 0);
	assert_string_equal(got + n - 2, "\n\n");
	free(got);
	anthropic_stream_free(s);
	anthropic_stream_free(NULL);
}

static void test_ping_and_strbuf(void **state)
{
	assert_string_equal(anthropic_ping_event(), "event: ping\ndata: {\"type\": \"ping\"}\n\n");
	struct strbuf b = {0};
	assert_int_equal(strbuf_appends(&b, "ab"), 0);
	assert_int_equal(strbuf_append(&b, "cdef", 2), 0);
	assert_string_equal(b.p, "abcd");
	assert_int_equal(b.len, 4);
	strbuf_reset(&b);
	assert_int_equal(b.len, 0);
	assert_string_equal(b.p, "");
	for (int i = 0; i < 1000; i++)
		assert_int_equal(strbuf_appends(&b, "0123456789"), 0);
	assert_int_equal(b.len, 10000);
	assert_int_equal(b.p[10000], '\0');
	strbuf_free(&b);
	assert_null(b.p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_simple_string),
	    cmocka_unit_test(test_max_tokens_default),
	    cmocka_unit_test(test_system_string_billing),
	    cmocka_unit_test(test_system_blocks),
	    cmocka_unit_test(test_system_billing_not_masked),
	    cmocka_unit_test(test_system_empty),
	    cmocka_unit_test(test_agent_conversation),
	    cmocka_unit_test(test_images),
	    cmocka_unit_test(test_dropped_and_skipped),
	    cmocka_unit_test(test_tools_and_params),
	    cmocka_unit_test(test_tool_choice_kinds),
	    cmocka_unit_test(test_thinking_defaults),
	    cmocka_unit_test(test_count_tokens),
	    cmocka_unit_test(test_tool_input_serialisation),
	    cmocka_unit_test(test_malformed),
	    cmocka_unit_test(test_wrong_types_everywhere),
	    cmocka_unit_test(test_from_chat_text),
	    cmocka_unit_test(test_from_chat_thinking_and_tools),
	    cmocka_unit_test(test_from_chat_stop_reasons),
	    cmocka_unit_test(test_from_chat_malformed),
	    cmocka_unit_test(test_stream_text),
	    cmocka_unit_test(test_stream_text_and_tools),
	    cmocka_unit_test(test_stream_reasoning_then_text),
	    cmocka_unit_test(test_stream_usage_after_finish),
	    cmocka_unit_test(test_stream_cut_short),
	    cmocka_unit_test(test_stream_error),
	    cmocka_unit_test(test_stream_malformed_chunks),
	    cmocka_unit_test(test_ping_and_strbuf),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
