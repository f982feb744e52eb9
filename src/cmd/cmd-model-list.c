/* Placeholder until this command lands (issue: model lifecycle). */
#include <stdio.h>

#include "cmd/cmd.h"

int cmd_model_list(int argc, char **argv)
{
	fprintf(stderr, "toki: '%s' is not built yet\n", argv[0]);
	return 1;
}
