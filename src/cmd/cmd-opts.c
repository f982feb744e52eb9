/* The getopt_long loop every command that takes options ran on its own: one
 * table of options with where each value goes, so that a command lists its
 * options once and the --help and error handling are the same everywhere;
 * and the launch options toki up and toki model use share. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

#include "cmd/cmd.h"
#include "model/launch.h"

/* getopt_long's value for opts[i]: above every character, 'h' and '?'. */
#define OPT_VAL(i) (256 + (int)(i))
#define MAX_OPTS 32

int cmd_parse_options(int argc, char **argv, const struct cmd_opt *opts, void (*usage)(FILE *))
{
	struct option longs[MAX_OPTS + 2];
	size_t n = 0;
	for (; opts[n].name; n++) {
		if (n == MAX_OPTS) {
			fprintf(stderr, "toki: more than %d options in one table\n", MAX_OPTS);
			return 2;
		}
		int has = opts[n].kind == CMD_OPT_FLAG ? no_argument : required_argument;
		longs[n] = (struct option){opts[n].name, has, NULL, OPT_VAL(n)};
	}
	longs[n] = (struct option){"help", no_argument, NULL, 'h'};
	longs[n + 1] = (struct option){0};
	optind = 1;
	int c;
	while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
		if (c == 'h') {
			usage(stdout);
			return 0;
		}
		if (c < OPT_VAL(0) || c >= OPT_VAL(n)) {
			usage(stderr);
			return 2;
		}
		const struct cmd_opt *o = &opts[c - OPT_VAL(0)];
		switch (o->kind) {
		case CMD_OPT_STR:
			*o->to.s = optarg;
			break;
		case CMD_OPT_INT:
			*o->to.i = atoi(optarg);
			break;
		case CMD_OPT_LONG:
			*o->to.l = atol(optarg);
			break;
		case CMD_OPT_DOUBLE:
			*o->to.d = atof(optarg);
			break;
		case CMD_OPT_FLAG:
			*o->to.i = 1;
			break;
		case CMD_OPT_FN: {
			int r = o->fn(optarg, o->to.ctx);
			if (r)
				return r;
			break;
		}
		}
	}
	return -1;
}

int cmd_launch_options(int argc, char **argv, int up, struct launch_opts *o, void (*usage)(FILE *))
{
	/* In toki up's order; toki model use takes the ones not marked up-only,
	 * in the same order. */
	const struct {
		int up_only;
		struct cmd_opt opt;
	} all[] = {
	    {1, {"model", CMD_OPT_STR, {.s = &o->model_path}, NULL}},
	    {1, {"name", CMD_OPT_STR, {.s = &o->name}, NULL}},
	    {0, {"ctx", CMD_OPT_LONG, {.l = &o->ctx}, NULL}},
	    {0, {"slots", CMD_OPT_INT, {.i = &o->slots}, NULL}},
	    {1, {"max-output", CMD_OPT_LONG, {.l = &o->max_output}, NULL}},
	    {0, {"port", CMD_OPT_INT, {.i = &o->port}, NULL}},
	    {0, {"reuse", CMD_OPT_STR, {.s = &o->mode}, NULL}},
	    {1, {"llama-server", CMD_OPT_STR, {.s = &o->binary}, NULL}},
	    {0, {"wait", CMD_OPT_INT, {.i = &o->wait_s}, NULL}},
	    {0, {"foreground", CMD_OPT_FLAG, {.i = &o->foreground}, NULL}},
	    {0, {"max-body-mb", CMD_OPT_INT, {.i = &o->max_body_mb}, NULL}},
	    {0, {"client-timeout", CMD_OPT_INT, {.i = &o->client_timeout_s}, NULL}},
	};
	struct cmd_opt opts[sizeof all / sizeof all[0] + 1];
	size_t n = 0;
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		if (up || !all[i].up_only)
			opts[n++] = all[i].opt;
	opts[n] = (struct cmd_opt){0};
	return cmd_parse_options(argc, argv, opts, usage);
}
