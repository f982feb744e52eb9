/* toki tui: a terminal chat against the daemon, in raw, cached or compare
 * mode (src/ui/tui.c). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cmd.h"
#include "ui/client.h"
#include "ui/tui.h"

static void usage(FILE *out)
{
	fprintf(out,
	        "usage: toki tui [--url URL] [--mode raw|cached|compare] [--system TEXT | "
	        "--system-file FILE]\n"
	        "                [--max-tokens N] [--temperature T]\n"
	        "\n"
	        "A full-screen chat with the running model. Every turn resends the whole\n"
	        "conversation; the modes show what the cache does with that:\n"
	        "  raw      cache_prompt off: the whole conversation is evaluated again, from an\n"
	        "           empty slot, on the schedule exact mode uses (toki's uncached run)\n"
	        "  cached   through toki's router (the default)\n"
	        "  compare  raw, then cached, side by side, with TTFT, evaluated tokens, speed-up\n"
	        "\n"
	        "Keys: F1/F2/F3 (or Alt+1/2/3, or Ctrl+1/2/3 where the terminal reports them)\n"
	        "switch the mode; Enter sends; Alt+Enter or Ctrl+J inserts a newline; Up/Down\n"
	        "recall earlier prompts; PgUp/PgDn (and the mouse wheel) scroll; Esc stops an\n"
	        "answer; F10, Ctrl+C or Ctrl+D quits.\n"
	        "\n"
	        "  --url URL          the daemon (default: the running model, else %s)\n"
	        "  --mode M           the mode to start in (default cached)\n"
	        "  --system TEXT      a system message at the start of the conversation\n"
	        "  --system-file F    the same, read from a file\n"
	        "  --max-tokens N     output tokens per answer (default 512)\n"
	        "  --temperature T    sampling temperature (default 0, so that raw and cached\n"
	        "                     answers can be compared byte for byte)\n",
	        CLIENT_DEFAULT_URL);
}

static char *read_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	size_t cap = 4096, len = 0;
	char *buf = malloc(cap);
	while (buf) {
		size_t n = fread(buf + len, 1, cap - len - 1, f);
		len += n;
		if (n == 0)
			break;
		if (cap - len - 1 == 0) {
			char *nb = realloc(buf, cap * 2);
			if (!nb) {
				free(buf);
				buf = NULL;
				break;
			}
			buf = nb;
			cap *= 2;
		}
	}
	int bad = ferror(f);
	fclose(f);
	if (!buf || bad) {
		free(buf);
		return NULL;
	}
	buf[len] = '\0';
	return buf;
}

/* --mode: checked where it is read, before the options after it. */
static int mode_opt(const char *value, void *ctx)
{
	enum tui_mode *mode = ctx;
	if (!strcmp(value, "raw")) {
		*mode = TUI_MODE_RAW;
	} else if (!strcmp(value, "cached")) {
		*mode = TUI_MODE_CACHED;
	} else if (!strcmp(value, "compare")) {
		*mode = TUI_MODE_COMPARE;
	} else {
		fprintf(stderr, "toki tui: --mode is raw, cached or compare\n");
		return 2;
	}
	return 0;
}

int cmd_tui(int argc, char **argv)
{
	struct tui_opts o = {.max_tokens = 512, .temperature = 0, .mode = TUI_MODE_CACHED};
	const char *system_file = NULL;
	const struct cmd_opt opts[] = {
	    {"url", CMD_OPT_STR, {.s = &o.url}, NULL},
	    {"mode", CMD_OPT_FN, {.ctx = &o.mode}, mode_opt},
	    {"system", CMD_OPT_STR, {.s = &o.system}, NULL},
	    {"system-file", CMD_OPT_STR, {.s = &system_file}, NULL},
	    {"max-tokens", CMD_OPT_LONG, {.l = &o.max_tokens}, NULL},
	    {"temperature", CMD_OPT_DOUBLE, {.d = &o.temperature}, NULL},
	    {0},
	};
	int r = cmd_parse_options(argc, argv, opts, usage);
	if (r >= 0)
		return r;
	if (optind != argc || (o.system && system_file)) {
		usage(stderr);
		return 2;
	}
	char *system = NULL;
	if (system_file) {
		system = read_file(system_file);
		if (!system) {
			fprintf(stderr, "toki tui: %s: %s\n", system_file,
			        strerror(errno ? errno : EIO));
			return 1;
		}
		o.system = system;
	}
	int rc = tui_run(&o);
	free(system);
	return rc;
}
