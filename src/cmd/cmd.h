/* The command layer: one file per subcommand (cmd-<name>.c), dispatched from
 * the table in main.c. Commands parse their own arguments and call into the
 * library modules; they hold no logic of their own beyond that. */
#ifndef TOKI_CMD_H
#define TOKI_CMD_H

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

/* The value of "--opt VALUE" or "--opt=VALUE" at argv[*i], for commands that
 * parse their arguments by hand: 1 (and *i advanced past it), 0 when
 * argv[*i] is another option, -1 (after saying so, as cmd) when the value is
 * missing. */
int cmd_option_value(const char *cmd, int argc, char **argv, int *i, const char *opt,
		     const char **value);

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
