#include <stdio.h>

#include "cmd/cmd.h"

int cmd_version(int argc, char **argv)
{
	printf("toki %s\n", TOKI_VERSION);
	return 0;
}
