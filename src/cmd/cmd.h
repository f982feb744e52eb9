/* The command layer: one file per subcommand (cmd-<name>.c), dispatched from
 * the table in main.c. Commands parse their own arguments and call into the
 * library modules; they hold no logic of their own beyond that. */
#ifndef TOKI_CMD_H
#define TOKI_CMD_H

#include <stdio.h>

struct cmd_entry {
	const char *name;
	int (*run)(int argc, char **argv); /* argv[0] is the command name */
	const char *summary;
};

int cmd_serve(int argc, char **argv);
int cmd_model(int argc, char **argv);
int cmd_up(int argc, char **argv);
int cmd_down(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_logs(int argc, char **argv);
int cmd_tui(int argc, char **argv);
int cmd_diff(int argc, char **argv);
int cmd_web(int argc, char **argv);
int cmd_launch(int argc, char **argv);
int cmd_service(int argc, char **argv);

/* The value of "--opt VALUE" or "--opt=VALUE" at argv[*i], for commands that
 * parse their arguments by hand: 1 (and *i advanced past it), 0 when
 * argv[*i] is another option, -1 (after saying so, as cmd) when the value is
 * missing. */
int cmd_option_value(const char *cmd, int argc, char **argv, int *i, const char *opt,
                     const char **value);

/* One option of a command's table for cmd_parse_options: its long name
 * (--name), what it takes, and where the value goes; the table ends with a
 * NULL name. -h/--help is added to every table. */
enum cmd_opt_kind {
	CMD_OPT_STR,    /* to.s = the value */
	CMD_OPT_INT,    /* to.i = atoi(value) */
	CMD_OPT_LONG,   /* to.l = atol(value) */
	CMD_OPT_DOUBLE, /* to.d = atof(value) */
	CMD_OPT_FLAG,   /* takes no value; to.i = 1 */
	CMD_OPT_FN,     /* fn(value, to.ctx): 0, or the exit status to end with */
};
struct cmd_opt {
	const char *name;
	enum cmd_opt_kind kind;
	union {
		const char **s;
		int *i;
		long *l;
		double *d;
		void *ctx;
	} to;
	int (*fn)(const char *value, void *ctx);
};

/* getopt_long over argv with opts. -1 once every option is taken (optind is
 * then at the first operand); 0 after --help (usage to stdout); 2 after an
 * unknown option or a missing value (getopt says which; usage to stderr);
 * else what an fn returned. */
int cmd_parse_options(int argc, char **argv, const struct cmd_opt *opts, void (*usage)(FILE *));

/* The options toki up and toki model use share, into o: --ctx, --slots,
 * --port, --reuse, --wait, and with up also --model, --name, --max-output,
 * --llama-server. Returns as cmd_parse_options. */
struct launch_opts;
int cmd_launch_options(int argc, char **argv, int up, struct launch_opts *o, void (*usage)(FILE *));
/* Starts the endpoint for the registry (toki up without --model) with o's
 * --port, --reuse, --foreground, --max-body-mb, --client-timeout and --wait,
 * and says where it is: 0 (also when it already runs), or 1 after saying
 * why not. */
int cmd_up_endpoint(const struct launch_opts *o);

/* `toki model <sub>`: one file each (cmd-model-<sub>.c). */
int cmd_model_install_llama(int argc, char **argv);
int cmd_model_pull(int argc, char **argv);
int cmd_model_use(int argc, char **argv);
int cmd_model_list(int argc, char **argv);
int cmd_model_remove(int argc, char **argv);
int cmd_gguf(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_version(int argc, char **argv);

#endif
