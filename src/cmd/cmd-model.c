/* toki model: a second-level table, one file per subcommand. */
#include <stdio.h>
#include <string.h>

#include "cmd/cmd.h"

static const struct cmd_entry model_commands[] = {
	{"install-llama", cmd_model_install_llama, "fetch a llama.cpp release built for this machine"},
	{"pull", cmd_model_pull, "download a GGUF from the Hugging Face hub"},
	{"use", cmd_model_use, "start a registered model with toki serve in front"},
	{"list", cmd_model_list, "list registered models"},
	{"remove", cmd_model_remove, "remove a model from the registry (--purge: its files too)"},
};

static void usage(FILE *out)
{
	fprintf(out, "usage: toki model <command> [options]\n\ncommands:\n");
	for (size_t i = 0; i < sizeof model_commands / sizeof model_commands[0]; i++)
		fprintf(out, "  %-14s %s\n", model_commands[i].name, model_commands[i].summary);
}

int cmd_model(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		usage(stdout);
		return 0;
	}
	for (size_t i = 0; i < sizeof model_commands / sizeof model_commands[0]; i++)
		if (!strcmp(model_commands[i].name, argv[1]))
			return model_commands[i].run(argc - 1, argv + 1);
	fprintf(stderr, "toki model: unknown command '%s'\n\n", argv[1]);
	usage(stderr);
	return 2;
}

int cmd_option_value(const char *cmd, int argc, char **argv, int *i, const char *opt,
		     const char **value)
{
	size_t n = strlen(opt);
	if (strncmp(argv[*i], opt, n) != 0)
		return 0;
	if (argv[*i][n] == '=') {
		*value = argv[*i] + n + 1;
		return 1;
	}
	if (argv[*i][n] != '\0')
		return 0;
	if (*i + 1 >= argc) {
		fprintf(stderr, "%s: %s needs a value\n", cmd, opt);
		return -1;
	}
	*value = argv[++*i];
	return 1;
}
