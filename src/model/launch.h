/* Starting a model in the background with toki serve in front: what
 * `toki model use` and `toki up` share. It picks the llama-server, sizes the
 * context to the machine (refusing an asked-for context that does not fit,
 * with the numbers), records that context as the single source of truth
 * ($TOKI_STATE_DIR/run/<name>/ctx) and starts the run. */
#ifndef TOKI_LAUNCH_H
#define TOKI_LAUNCH_H

#include <stddef.h>
#include <stdint.h>

struct launch_opts {
	const char *name;       /* the run's name */
	const char *model_path; /* the GGUF */
	const char *binary;     /* llama-server; NULL: find one */
	long ctx;               /* asked-for context per slot; 0: the largest that fits */
	int slots;              /* 0: 2 */
	long max_output;
	int port; /* toki's; 0: 8787 */
	const char *host;
	const char *mode;
	char *const *llama_args;
	int n_llama_args;
	int wait_s;           /* how long to wait for the model to load; 0: 600 */
	int foreground;       /* become toki serve instead of starting it in the background */
	int max_body_mb;      /* toki serve --max-body-mb (0: its default) */
	int client_timeout_s; /* toki serve --client-timeout (0: its default) */
};

/* What a model needs to run here: its llama-server, its context and the
 * memory it takes at that context, sized as `toki model use` sizes it. */
struct launch_plan {
	char binary[4096];
	char gfx_env[64]; /* "HSA_OVERRIDE_GFX_VERSION=..." for its server, or "" */
	long ctx;         /* per slot */
	int slots;
	uint64_t used;      /* weights + KV at ctx, all slots */
	uint64_t capacity;  /* the memory sized against less the margin kept free */
	long ctx_train;     /* the training context, 0 when unknown */
	char ctx_args[200]; /* the llama-server arguments that changed it, or "" */
	char why[512];      /* the sizing in one sentence (memsize_explain) */
	int gpu;            /* sized against a GPU's memory: its layers run there, not on the CPU */
	int threads;        /* the CPU threads its server computes with; 0: llama.cpp's own
	                     * choice, a thread per core (launch_threads) */
};
/* Sizes o's model (o->port and o->foreground are not used). held_bytes: the
 * memory models toki runs hold now (the endpoint's), which the machine
 * reports as used but which stopping them frees: the model is sized as if
 * they were stopped (TOKI_MEMORY_MB, the memory as a whole, ignores it).
 * 0, or -1 with err (the refusal `toki model use` prints). */
int launch_plan(const struct launch_opts *o, uint64_t held_bytes, struct launch_plan *p, char *err,
                size_t errlen);
/* The CPU threads llama-server computes with, read from its arguments as
 * it reads them (a later option wins, the command line over its
 * environment: env_t is LLAMA_ARG_THREADS, env_tb LLAMA_ARG_THREADS_BATCH):
 * -t/--threads for generation, -tb/--threads-batch for the prompt (-t's
 * when not given or not positive), the larger. 0 where llama.cpp picks
 * (-t not given or not positive): a thread per core, as many as the
 * machine has to give. */
int launch_threads(char *const *args, int n, const char *env_t, const char *env_tb);
/* Whether llama-server puts layers on a GPU as its arguments ask: -ngl
 * (--gpu-layers, --n-gpu-layers; a later one winning) over env_ngl
 * (LLAMA_ARG_N_GPU_LAYERS): 1 for any value but "0" ("auto", "all", a
 * count), 0 for "0", -1 when neither asks (its own default then). */
int launch_offloads(char *const *args, int n, const char *env_ngl);
/* 1 when llama-server's --help text says it puts layers on a GPU unasked:
 * -ngl's default is "auto" (llama.cpp since late 2025: every layer that
 * fits, --fit adjusting what was not set), "all" or -1. Older builds say
 * nothing or 0: the CPU. */
int launch_help_offloads(const char *help);
/* Prints what it chose and the endpoint. 0, or -1 with err. */
int launch_model(const struct launch_opts *o, char *endpoint, size_t n, char *err, size_t errlen);
/* The llama-server to use when none is named: $TOKI_LLAMA_SERVER, an
 * installed llama.cpp build (toki model install-llama), llama-server on
 * PATH, or the one scripts/provision-llama-server.sh cached. gfx gets the
 * build's HSA_OVERRIDE_GFX_VERSION ("" if none). */
int launch_find_llama_server(char *path, size_t n, char *gfx, size_t gfxn);

#endif
