/* toki down [NAME...]: stops runs started by toki model use / toki up. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cmd.h"
#include "model/run.h"

int cmd_down(int argc, char **argv)
{
	if (argc > 1 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
		printf("usage: toki down [NAME...]\n\nStops the named runs (default: every run),\n"
		       "each toki serve with the llama-server it started.\n");
		return 0;
	}
	char err[512];
	int rc = 0;
	if (argc > 1) {
		for (int i = 1; i < argc; i++) {
			/* The endpoint waits for its models' saves (up to 30 s). */
			int t = strcmp(argv[i], "endpoint") ? 15 : 60;
			if (run_stop(argv[i], t, err, sizeof err) != 0) {
				fprintf(stderr, "toki down: %s\n", err);
				rc = 1;
			} else {
				printf("stopped %s\n", argv[i]);
			}
		}
		return rc;
	}
	/* The endpoint first: it stops the models it started (each saving its
	 * slots), which are then no longer running. */
	int stopped = 0;
	struct run_info ep;
	if (run_get("endpoint", &ep) == 0) {
		if (run_stop("endpoint", 60, err, sizeof err) != 0) {
			fprintf(stderr, "toki down: %s\n", err);
			rc = 1;
		} else {
			printf("stopped endpoint\n");
			stopped = 1;
		}
	}
	struct run_info *runs;
	int n;
	run_list(&runs, &n);
	if (n == 0 && !stopped)
		printf("nothing is running\n");
	for (int i = 0; i < n; i++) {
		if (run_stop(runs[i].name, 15, err, sizeof err) != 0) {
			fprintf(stderr, "toki down: %s\n", err);
			rc = 1;
		} else {
			printf("stopped %s\n", runs[i].name);
		}
	}
	free(runs);
	return rc;
}
