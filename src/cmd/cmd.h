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
int cmd_gguf(int argc, char **argv);
int cmd_version(int argc, char **argv);

#endif
