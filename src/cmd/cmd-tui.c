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

int cmd_tui(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"url", required_argument, NULL, 'u'},
	    {"mode", required_argument, NULL, 'M'},
	    {"system", required_argument, NULL, 's'},
	    {"system-file", required_argument, NULL, 'S'},
	    {"max-tokens", required_argument, NULL, 'n'},
	    {"temperature", required_argument, NULL, 't'},
	    {"help", no_argument, NULL, 'h'},
	    {0},
	};
	struct tui_opts o = {.max_tokens = 512, .temperature = 0, .mode = TUI_MODE_CACHED};
	const char *system_file = NULL;
	optind = 1;
	int c;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'u':
			o.url = optarg;
			break;
		case 's':
			o.system = optarg;
			break;
		case 'S':
			system_file = optarg;
			break;
		case 'n':
			o.max_tokens = atol(optarg);
			break;
		case 't':
			o.temperature = atof(optarg);
			break;
		case 'M':
			if (!strcmp(optarg, "raw")) {
				o.mode = TUI_MODE_RAW;
			} else if (!strcmp(optarg, "cached")) {
				o.mode = TUI_MODE_CACHED;
			} else if (!strcmp(optarg, "compare")) {
				o.mode = TUI_MODE_COMPARE;
			} else {
				fprintf(stderr, "toki tui: --mode is raw, cached or compare\n");
				return 2;
			}
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
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
