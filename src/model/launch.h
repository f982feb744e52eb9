/* Starting a model in the background with toki serve in front: what
 * `toki model use` and `toki up` share. It picks the llama-server, sizes the
 * context to the machine (refusing an asked-for context that does not fit,
 * with the numbers), records that context as the single source of truth
 * ($TOKI_STATE_DIR/run/<name>/ctx) and starts the run. */
#ifndef TOKI_LAUNCH_H
#define TOKI_LAUNCH_H

#include <stddef.h>

struct launch_opts {
	const char *name;	/* the run's name */
	const char *model_path; /* the GGUF */
	const char *binary;	/* llama-server; NULL: find one */
	long ctx;		/* asked-for context per slot; 0: the largest that fits */
	int slots;		/* 0: 2 */
	long max_output;
	int port;		/* toki's; 0: 8787 */
	const char *host;
	const char *mode;
	char *const *llama_args;
	int n_llama_args;
	int wait_s; /* how long to wait for the model to load; 0: 600 */
	int foreground; /* become toki serve instead of starting it in the background */
};

/* Prints what it chose and the endpoint. 0, or -1 with err. */
int launch_model(const struct launch_opts *o, char *endpoint, size_t n, char *err, size_t errlen);
/* The llama-server to use when none is named: $TOKI_LLAMA_SERVER, an
 * installed llama.cpp build (toki model install-llama), llama-server on
 * PATH, or the one scripts/provision-llama-server.sh cached. gfx gets the
 * build's HSA_OVERRIDE_GFX_VERSION ("" if none). */
int launch_find_llama_server(char *path, size_t n, char *gfx, size_t gfxn);

#endif
