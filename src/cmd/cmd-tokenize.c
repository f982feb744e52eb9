/* toki tokenize: the token ids of a text (or of a chat request's prompt) as
 * the llama-server serving a GGUF file would give them, with toki's own
 * tokenizer and chat-template engine, no server needed. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "cmd/cmd.h"
#include "model/gguf.h"
#include "prompt/prompt.h"
#include "router/sched.h"
#include "tokenizer/vocab.h"
#include "util/json_body.h"

static const char usage[] =
    "usage: toki tokenize --model FILE [--no-add-special] [--no-parse-special]\n"
    "                     [--pieces] [--lines] [TEXT]\n"
    "       toki tokenize --model FILE --chat [--props PROPS.json] [--thinking on|off]\n"
    "                     [--schedule [--ubatch N]] [--lines] [REQUEST]\n"
    "\n"
    "Prints the token ids of TEXT (or of standard input) as the llama-server\n"
    "serving FILE gives them on /tokenize with add_special and parse_special,\n"
    "using toki's own tokenizer (the one toki serve routes with).\n"
    "\n"
    "  --model FILE        the GGUF whose vocabulary to use\n"
    "  --no-add-special    no BOS/EOS the vocabulary would add\n"
    "  --no-parse-special  special-token text stays text\n"
    "  --pieces            print [id, \"text\"] pairs instead of ids\n"
    "  --lines             standard input holds one JSON string per line; print\n"
    "                      one JSON array per line (or {\"error\": ...})\n"
    "  --chat              the input is a chat completions request (JSON): print\n"
    "                      {\"prompt\": ..., \"tokens\": [...]} as llama-server would\n"
    "                      template and tokenize it, or {\"declined\": why} for what\n"
    "                      toki leaves to the server\n"
    "  --props FILE        the server's /props answer: its chat template, template\n"
    "                      capabilities and BOS/EOS text (default: the model's own\n"
    "                      template, a plain template's capabilities)\n"
    "  --schedule          with --chat: also print \"chunks\", the token positions\n"
    "                      where exact mode's schedule starts a chunk (message starts,\n"
    "                      small chunks merged; the last is the generation prompt,\n"
    "                      \"header\": true, or it is empty, \"header\": \"empty\";\n"
    "                      \"joins\": true where its last token is a step of its own,\n"
    "                      the template writing an answer right after it)\n"
    "                      and \"steps\", where each of a cold evaluation's requests\n"
    "                      ends (chunk ends, tail splits, long chunks in parts, an\n"
    "                      earlier answer's tokens in forced runs of up to 64)\n"
    "  --ubatch N          the server's -ub, for \"steps\" (default 512)\n"
    "  --thinking on|off   the enable_thinking the server passes its template when\n"
    "                      the request does not say (default on; llama-server turns\n"
    "                      it off for templates it finds no reasoning in)\n";

struct opts {
	int add_special, parse_special, pieces, schedule, ubatch;
};

/* What exact mode sends for a prompt of n tokens on chunk starts b[0..nb)
 * that reuses nothing: the ends of its requests, the last one n. */
static json_t *steps_json(const size_t *b, size_t nb, size_t n, int ub)
{
	struct plan p;
	if (plan_build(&p, b, nb, n, 0, 0, 0, 0, sched_max_step(ub), ub) != 0)
		return NULL;
	json_t *a = json_array();
	size_t done = 0;
	for (size_t i = 0; i < p.n; i++) {
		size_t k = plan_forced_run(&p, i, done);
		if (k)
			i += k - 1; /* one request (serve/exec.c, forced_body) */
		done = p.steps[i].upto;
		json_array_append_new(a, json_integer((json_int_t)done));
	}
	plan_free(&p);
	return a;
}

static json_t *tokens_json(const struct vocab *v, const struct token_list *t, int pieces)
{
	json_t *a = json_array();
	for (size_t i = 0; i < t->n; i++) {
		if (!pieces) {
			json_array_append_new(a, json_integer(t->v[i]));
			continue;
		}
		size_t len;
		const char *text = vocab_token_text(v, t->v[i], &len);
		json_t *s = json_stringn(text, len);
		json_array_append_new(a, json_pack("[i, o]", t->v[i], s ? s : json_null()));
	}
	return a;
}

/* One line of output for one text: its tokens, or why there are none. */
static int print_one(const struct vocab *v, const char *text, size_t len, const struct opts *o)
{
	struct token_list t = {0};
	int rc = vocab_tokenize(v, text, len, o->add_special, o->parse_special, &t);
	json_t *out =
	    rc == 0 ? tokens_json(v, &t, o->pieces)
	            : json_pack("{s:s}", "error",
	                        rc == -2 ? "the server would refuse this text" : "out of memory");
	char *s = json_dumps(out, JSON_COMPACT);
	if (s)
		puts(s);
	free(s);
	json_decref(out);
	token_list_free(&t);
	return rc;
}

static char *read_all(FILE *f, size_t *len)
{
	size_t cap = 65536, n = 0;
	char *buf = malloc(cap);
	while (buf) {
		size_t got = fread(buf + n, 1, cap - n, f);
		n += got;
		if (n < cap)
			break;
		char *b = realloc(buf, cap * 2);
		if (!b) {
			free(buf);
			return NULL;
		}
		buf = b;
		cap *= 2;
	}
	*len = n;
	return buf;
}

/* One chat request: its prompt and tokens, as one line of JSON. */
static int print_chat(struct prompt_engine *pe, const char *text, size_t len, const struct opts *o)
{
	json_error_t jerr;
	json_t *req = json_loadb(text, len, JSON_BODY_FLAGS, &jerr);
	json_t *out;
	int rc = 0;
	if (!json_is_object(req)) {
		out = json_pack("{s:s}", "error", "the request is not a JSON object");
		rc = 1;
	} else {
		char why[512], *prompt = NULL;
		size_t plen = 0;
		struct token_list t = {0};
		struct prompt_starts st = {0};
		enum chat_result r =
		    prompt_engine_chat_starts(pe, req, time(NULL), &prompt, &plen, &t,
		                              o->schedule ? &st : NULL, why, sizeof why);
		if (r == CHAT_OK) {
			json_t *p = json_stringn(prompt, plen);
			out = json_pack("{s:o, s:o}", "prompt",
			                p ? p : json_string("(not valid UTF-8)"), "tokens",
			                tokens_json(prompt_engine_vocab(pe), &t, o->pieces));
			if (o->schedule) {
				st.n = sched_chunks(st.pos, st.kind, st.n);
				json_t *a = json_array();
				for (size_t i = 0; i < st.n; i++)
					json_array_append_new(a,
					                      json_integer((json_int_t)st.pos[i]));
				json_object_set_new(out, "chunks", a);
				json_object_set_new(out, "header",
				                    st.header == CHAT_HEADER_EMPTY
				                        ? json_string("empty")
				                        : json_boolean(st.header));
				json_object_set_new(out, "joins", json_boolean(st.joins));
				json_t *steps = steps_json(st.pos, st.n, t.n, o->ubatch);
				if (!steps) {
					json_decref(out);
					out = json_pack("{s:s}", "error", "out of memory");
					rc = 1;
				} else {
					json_object_set_new(out, "steps", steps);
				}
			}
			free(st.pos);
			free(st.kind);
		} else {
			out = json_pack("{s:s}", r == CHAT_DECLINED ? "declined" : "error", why);
			rc = r == CHAT_DECLINED ? 0 : 1;
		}
		free(prompt);
		token_list_free(&t);
	}
	json_decref(req);
	char *s = out ? json_dumps(out, JSON_COMPACT) : NULL;
	if (s)
		puts(s);
	free(s);
	json_decref(out);
	return rc;
}

static struct prompt_engine *engine_for(const char *model, const char *props_file, int thinking)
{
	json_t *props = NULL;
	if (props_file) {
		json_error_t jerr;
		props = json_load_file(props_file, 0, &jerr);
		if (!json_is_object(props)) {
			fprintf(stderr, "toki tokenize: %s: %s\n", props_file, jerr.text);
			json_decref(props);
			return NULL;
		}
	}
	struct prompt_engine_config cfg = {
	    .model_path = model,
	    .chat_template = json_string_value(json_object_get(props, "chat_template")),
	    .tool_use_template =
	        json_string_value(json_object_get(props, "chat_template_tool_use")),
	    .caps = json_object_get(props, "chat_template_caps"),
	    .bos_token = json_string_value(json_object_get(props, "bos_token")),
	    .eos_token = json_string_value(json_object_get(props, "eos_token")),
	    .enable_thinking = thinking,
	};
	char err[512];
	struct prompt_engine *pe = prompt_engine_new(&cfg, err, sizeof err);
	json_decref(props);
	if (!pe)
		fprintf(stderr, "toki tokenize: %s: %s\n", model, err);
	else if (!prompt_engine_has_chat(pe))
		fprintf(stderr, "toki tokenize: %s: no chat template toki renders\n", model);
	return pe;
}

int cmd_tokenize(int argc, char **argv)
{
	static const struct option longopts[] = {
	    {"model", required_argument, NULL, 'm'},
	    {"no-add-special", no_argument, NULL, 'a'},
	    {"no-parse-special", no_argument, NULL, 'p'},
	    {"pieces", no_argument, NULL, 'P'},
	    {"lines", no_argument, NULL, 'l'},
	    {"chat", no_argument, NULL, 'c'},
	    {"props", required_argument, NULL, 'r'},
	    {"thinking", required_argument, NULL, 't'},
	    {"schedule", no_argument, NULL, 'S'},
	    {"ubatch", required_argument, NULL, 'u'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct opts o = {1, 1, 0, 0, 512};
	const char *model = NULL, *props = NULL;
	int lines = 0, chat = 0, thinking = 1, c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "m:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'm':
			model = optarg;
			break;
		case 'a':
			o.add_special = 0;
			break;
		case 'p':
			o.parse_special = 0;
			break;
		case 'P':
			o.pieces = 1;
			break;
		case 'S':
			o.schedule = 1;
			break;
		case 'u':
			o.ubatch = atoi(optarg);
			if (o.ubatch <= 0) {
				fputs(usage, stderr);
				return 2;
			}
			break;
		case 'l':
			lines = 1;
			break;
		case 'c':
			chat = 1;
			break;
		case 'r':
			props = optarg;
			break;
		case 't':
			if (strcmp(optarg, "on") && strcmp(optarg, "off")) {
				fputs(usage, stderr);
				return 2;
			}
			thinking = !strcmp(optarg, "on");
			break;
		case 'h':
			fputs(usage, stdout);
			return 0;
		default:
			fputs(usage, stderr);
			return 2;
		}
	}
	if (!model || (lines && optind < argc) || optind + 1 < argc || (props && !chat)) {
		fputs(usage, stderr);
		return 2;
	}
	struct vocab *v = NULL;
	struct prompt_engine *pe = NULL;
	if (chat) {
		pe = engine_for(model, props, thinking);
		if (!pe)
			return 1;
	} else {
		struct gguf_error gerr;
		struct gguf *g = gguf_open(model, &gerr);
		if (!g) {
			fprintf(stderr, "toki tokenize: %s: %s\n", model, gerr.text);
			return 1;
		}
		char err[256];
		v = vocab_from_gguf(g, err, sizeof err);
		gguf_close(g);
		if (!v) {
			fprintf(stderr, "toki tokenize: %s: %s\n", model, err);
			return 1;
		}
	}
	int rc = 0;
	if (optind < argc || !lines) {
		size_t len = 0;
		char *text = optind < argc ? strdup(argv[optind]) : read_all(stdin, &len);
		if (text && optind < argc)
			len = strlen(text);
		if (!text)
			rc = 1;
		else
			rc = (chat ? print_chat(pe, text, len, &o) : print_one(v, text, len, &o))
			         ? 1
			         : 0;
		free(text);
	} else {
		char *line = NULL;
		size_t cap = 0;
		ssize_t n;
		while ((n = getline(&line, &cap, stdin)) > 0) {
			if (chat) {
				print_chat(pe, line, (size_t)n, &o);
			} else {
				json_error_t jerr;
				json_t *s = json_loadb(line, (size_t)n,
				                       JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
				if (!json_is_string(s)) {
					puts("{\"error\":\"not a JSON string\"}");
					rc = 1;
				} else {
					print_one(v, json_string_value(s), json_string_length(s),
					          &o);
				}
				json_decref(s);
			}
			fflush(stdout);
		}
		free(line);
	}
	vocab_free(v);
	prompt_engine_free(pe);
	return rc;
}
