/* toki tokenize: the token ids of a text (or of a chat request's prompt) as
 * the llama-server serving a GGUF file would give them, with toki's own
 * tokenizer and chat-template engine, no server needed. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cmd/cmd.h"
#include "model/gguf.h"
#include "tokenizer/vocab.h"

static const char usage[] =
	"usage: toki tokenize --model FILE [--no-add-special] [--no-parse-special]\n"
	"                     [--pieces] [--lines] [TEXT]\n"
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
	"                      one JSON array per line (or {\"error\": ...})\n";

struct opts {
	int add_special, parse_special, pieces;
};

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
	json_t *out = rc == 0 ? tokens_json(v, &t, o->pieces)
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

int cmd_tokenize(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"model", required_argument, NULL, 'm'},
		{"no-add-special", no_argument, NULL, 'a'},
		{"no-parse-special", no_argument, NULL, 'p'},
		{"pieces", no_argument, NULL, 'P'},
		{"lines", no_argument, NULL, 'l'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	struct opts o = {1, 1, 0};
	const char *model = NULL;
	int lines = 0, c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "m:h", longopts, NULL)) != -1) {
		switch (c) {
		case 'm': model = optarg; break;
		case 'a': o.add_special = 0; break;
		case 'p': o.parse_special = 0; break;
		case 'P': o.pieces = 1; break;
		case 'l': lines = 1; break;
		case 'h': fputs(usage, stdout); return 0;
		default: fputs(usage, stderr); return 2;
		}
	}
	if (!model || (lines && optind < argc) || optind + 1 < argc) {
		fputs(usage, stderr);
		return 2;
	}
	struct gguf_error gerr;
	struct gguf *g = gguf_open(model, &gerr);
	if (!g) {
		fprintf(stderr, "toki tokenize: %s: %s\n", model, gerr.text);
		return 1;
	}
	char err[256];
	struct vocab *v = vocab_from_gguf(g, err, sizeof err);
	gguf_close(g);
	if (!v) {
		fprintf(stderr, "toki tokenize: %s: %s\n", model, err);
		return 1;
	}
	int rc = 0;
	if (optind < argc) {
		rc = print_one(v, argv[optind], strlen(argv[optind]), &o) ? 1 : 0;
	} else if (!lines) {
		size_t len;
		char *text = read_all(stdin, &len);
		rc = text ? (print_one(v, text, len, &o) ? 1 : 0) : 1;
		free(text);
	} else {
		char *line = NULL;
		size_t cap = 0;
		ssize_t n;
		while ((n = getline(&line, &cap, stdin)) > 0) {
			json_error_t jerr;
			json_t *s = json_loadb(line, (size_t)n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
			if (!json_is_string(s)) {
				puts("{\"error\":\"not a JSON string\"}");
				rc = 1;
			} else {
				print_one(v, json_string_value(s), json_string_length(s), &o);
			}
			json_decref(s);
			fflush(stdout);
		}
		free(line);
	}
	vocab_free(v);
	return rc;
}
