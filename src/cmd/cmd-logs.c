/* toki logs [NAME] [-f] [--llama]: a run's log, as `toki status` names it:
 * toki serve's (requests, routes, errors) or llama-server's. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <dirent.h>
#include <time.h>

#include "cmd/cmd.h"
#include "launch/agents.h"
#include "model/run.h"
#include "util/paths.h"

static void usage(FILE *out)
{
	fprintf(out,
	        "usage: toki logs [NAME] [-f] [--llama]\n"
	        "\n"
	        "Prints a run's log: toki serve's (each request's route and cache numbers,\n"
	        "errors and why), or with --llama the log of the llama-server it runs. NAME\n"
	        "is the run (toki status lists them); without it, the active run, else the\n"
	        "only one, else the only run directory there is (a run that stopped or\n"
	        "failed to start keeps its log).\n"
	        "\n"
	        "  -f, --follow   keep printing what is added, as tail -f does (Ctrl-C stops)\n"
	        "  --llama        llama-server's log instead of toki serve's\n");
}

/* The only run directory with a serve.log, for when nothing runs: 0 with its
 * name, else -1 with a message that lists them. */
static int only_run_dir(char *name, size_t n, char *err, size_t errlen)
{
	char base[4096];
	DIR *d = paths_state_sub(base, sizeof base, "run") == 0 ? opendir(base) : NULL;
	int found = 0;
	size_t len = (size_t)snprintf(err, errlen, "no run is running; name one of:");
	struct dirent *de;
	while (d && (de = readdir(d))) {
		char log[4400];
		struct stat st;
		if (!paths_is_safe_name(de->d_name) || strlen(de->d_name) >= n ||
		    run_file_path(de->d_name, "serve.log", log, sizeof log) != 0 ||
		    stat(log, &st) != 0)
			continue;
		if (!found++)
			memcpy(name, de->d_name, strlen(de->d_name) + 1);
		if (len < errlen)
			len += (size_t)snprintf(err + len, errlen - len, " %s", de->d_name);
	}
	if (d)
		closedir(d);
	if (found == 1)
		return 0;
	if (!found)
		snprintf(err, errlen,
		         "no run has a log yet; start one with toki model use NAME or toki up "
		         "--model FILE");
	return -1;
}

/* Copies what f holds from where it is to its end; 0, or -1 on a write
 * error (the reader went away). */
static int copy_rest(FILE *f)
{
	char buf[16384];
	size_t got;
	while ((got = fread(buf, 1, sizeof buf, f)) > 0)
		if (fwrite(buf, 1, got, stdout) != got)
			return -1;
	clearerr(f);
	return fflush(stdout) == 0 ? 0 : -1;
}

int cmd_logs(int argc, char **argv)
{
	const char *want = NULL;
	int follow = 0, llama = 0;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			usage(stdout);
			return 0;
		} else if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--follow")) {
			follow = 1;
		} else if (!strcmp(argv[i], "--llama")) {
			llama = 1;
		} else if (argv[i][0] != '-' && !want) {
			want = argv[i];
		} else {
			usage(stderr);
			return 2;
		}
	}
	char name[200], endpoint[512], err[2048];
	if (want) {
		if (!paths_is_safe_name(want)) {
			fprintf(stderr, "toki logs: '%s' cannot be a run's name\n", want);
			return 2;
		}
		snprintf(name, sizeof name, "%s", want);
	} else if (agents_resolve_run(NULL, endpoint, sizeof endpoint, name, sizeof name, err,
	                              sizeof err) != 0 &&
	           only_run_dir(name, sizeof name, err, sizeof err) != 0) {
		fprintf(stderr, "toki logs: %s\n", err);
		return 1;
	}
	char path[4400];
	if (run_file_path(name, llama ? "llama-server.log" : "serve.log", path, sizeof path) != 0) {
		fprintf(stderr, "toki logs: '%s' cannot be a run's name\n", name);
		return 2;
	}
	FILE *f = fopen(path, "r");
	if (!f) {
		fprintf(stderr, "toki logs: %s: %s (toki status lists the runs)\n", path,
		        strerror(errno));
		return 1;
	}
	int rc = copy_rest(f) == 0 ? 0 : 1;
	/* Following: new lines as they are written; a log that shrank (a new
	 * start of the run truncated or replaced it) is read again from its
	 * beginning. */
	while (follow && rc == 0) {
		struct timespec ts = {0, 200 * 1000 * 1000};
		nanosleep(&ts, NULL);
		struct stat now, cur;
		long pos = ftell(f);
		if (stat(path, &now) == 0 &&
		    (fstat(fileno(f), &cur) != 0 || now.st_ino != cur.st_ino ||
		     (long)now.st_size < pos)) {
			FILE *g = fopen(path, "r");
			if (g) {
				fclose(f);
				f = g;
			}
		}
		rc = copy_rest(f) == 0 ? 0 : 1;
	}
	fclose(f);
	return rc;
}
