/* toki: the command-line tool. A small table dispatches to one file per
 * command (src/cmd/cmd-*.c), as git and tmux do. */
#include <stdio.h>
#include <string.h>

#include "cmd/cmd.h"

static const struct cmd_entry commands[] = {
	{"serve", cmd_serve, "run the cache-routing daemon in front of llama-server"},
	{"model", cmd_model, "install a llama-server, pull, use, list and remove models"},
	{"up", cmd_up, "start llama-server and toki serve for a GGUF file"},
	{"down", cmd_down, "stop what toki model use / toki up started"},
	{"status", cmd_status, "what runs, ports, context, memory, cache hit rate, logs"},
	{"logs", cmd_logs, "a run's log (toki serve's or llama-server's); -f follows it"},
	{"tui", cmd_tui, "chat with the running model in the terminal: raw, cached, compare"},
	{"diff", cmd_diff, "run a prompt raw, then cached: tokens, TTFT, speed-up, identical?"},
	{"launch", cmd_launch, "start a coding agent pinned to the local model"},
	{"service", cmd_service, "run toki at login: a systemd user unit or a launchd agent"},
	{"web", cmd_web, "a browser chat UI: raw vs cached turns, live numbers, a chart"},
	{"gguf", cmd_gguf, "inspect GGUF files, or write random-weight test models"},
	{"tokenize", cmd_tokenize, "token ids of a text as llama-server gives them, without a server"},
	{"version", cmd_version, "print the version"},
};

static void usage(FILE *out)
{
	fprintf(out, "usage: toki <command> [options]\n\ncommands:\n");
	for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
		fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
	fprintf(out, "\n'toki <command> --help' describes each command.\n");
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	const char *name = argv[1];
	if (!strcmp(name, "-h") || !strcmp(name, "--help") || !strcmp(name, "help")) {
		usage(stdout);
		return 0;
	}
	if (!strcmp(name, "--version"))
		name = "version";
	for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
		if (!strcmp(commands[i].name, name))
			return commands[i].run(argc - 1, argv + 1);
	fprintf(stderr, "toki: unknown command '%s'\n\n", name);
	usage(stderr);
	return 2;
}
