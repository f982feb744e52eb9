#include "model/llama_args.h"

#include <string.h>

int llama_arg_is(const char *arg, const char *name)
{
	if (strncmp(arg, "--", 2) != 0)
		return !strcmp(arg, name);
	/* A long option: an underscore stands for a dash (llama.cpp's arg.cpp
	 * replaces them before it looks the option up). */
	for (; *arg && *name; arg++, name++)
		if (*arg != *name && !(*arg == '_' && *name == '-'))
			return 0;
	return !*arg && !*name;
}
