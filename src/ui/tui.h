/* `toki tui`: a full-screen terminal chat (ncursesw) against a toki daemon,
 * streaming the answer as it arrives, in three modes: raw (cache_prompt off:
 * llama-server evaluates the whole conversation every turn), cached (through
 * toki's router) and compare (raw, then cached, side by side, with time to
 * first token, evaluated tokens and the speed-up).
 *
 * The conversation is multi-turn: every turn resends the whole history, which
 * is where the cache pays. The HTTP stream runs on a worker thread (ui/client);
 * the terminal thread polls the keyboard and a wake-up pipe, so typing,
 * scrolling and resizing never wait for the network. */
#ifndef TOKI_UI_TUI_H
#define TOKI_UI_TUI_H

enum tui_mode {
	TUI_MODE_RAW,
	TUI_MODE_CACHED,
	TUI_MODE_COMPARE,
};

struct tui_opts {
	const char *url;    /* --url, or NULL: the running model, else 127.0.0.1:8787 */
	const char *system; /* a system message, or NULL */
	long max_tokens;    /* per answer; <= 0: the server's default */
	double temperature; /* < 0: the server's default */
	enum tui_mode mode; /* the mode to start in */
};

/* Runs until the user quits. 0, or 1 with a message on stderr when the
 * terminal cannot be used (not a terminal, too old a terminfo). */
int tui_run(const struct tui_opts *o);

#endif
