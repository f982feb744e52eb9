/* toki service install | remove | status: runs toki at login, through the
 * OS's own service manager (a systemd user unit, a launchd agent). The
 * service runs `toki up --foreground`: the endpoint for every registry
 * model (src/pool/), or with --model one GGUF file or registered model in
 * its own run (`toki up --model FILE|NAME --foreground`). What it starts is what those commands
 * start by hand, and toki status, toki logs and toki down see it as any other run. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "model/launch.h"
#include "model/registry.h"
#include "model/run.h"
#include "platform/platform.h"
#include "util/paths.h"

extern char **environ;

static void usage(FILE *out)
{
	fprintf(out,
	        "usage: toki service install [--print] [--manager systemd|launchd] [--model "
	        "FILE|NAME]\n"
	        "                            [toki up options]\n"
	        "       toki service remove\n"
	        "       toki service status\n"
	        "\n"
	        "Runs toki at login through the OS's service manager: a systemd user unit\n"
	        "(~/.config/systemd/user/tokirecur.service) on Linux, a launchd agent\n"
	        "(~/Library/LaunchAgents/com.tokirecur.toki.plist) on macOS. It runs\n"
	        "`toki up --foreground`, the endpoint for every registry model; with --model,\n"
	        "`toki up --foreground --model FILE|NAME`: one GGUF file or registered model\n"
	        "in its own run, with the options given (--ctx,\n"
	        "--slots, --port, --reuse, --max-output, --llama-server, --name). It logs to\n"
	        "$TOKI_STATE_DIR/service.log, is restarted after a crash, and\n"
	        "stays stopped after toki down. PATH and the TOKI_* variables set now are\n"
	        "written into it. On Linux, `loginctl enable-linger` starts it at boot rather\n"
	        "than at login.\n"
	        "\n"
	        "  --print           print the unit (or plist) instead of installing it\n"
	        "  --manager M       systemd or launchd (default: this OS's)\n");
}

/* The variables the service needs from the installing shell: PATH (to
 * find llama-server and the agents) and toki's own. */
static int service_env(char **env, int max)
{
	int n = 0;
	for (char **e = environ; *e && n < max; e++)
		if (!strncmp(*e, "PATH=", 5) || !strncmp(*e, "TOKI_", 5) ||
		    !strncmp(*e, "XDG_CONFIG_HOME=", 16) || !strncmp(*e, "XDG_STATE_HOME=", 15) ||
		    !strncmp(*e, "XDG_CACHE_HOME=", 15) || !strncmp(*e, "HOME=", 5))
			env[n++] = *e;
	env[n] = NULL;
	return n;
}

static int absolute(const char *path, char *out, size_t n)
{
	if (path[0] == '/')
		return snprintf(out, n, "%s", path) < (int)n ? 0 : -1;
	char cwd[4096];
	if (!getcwd(cwd, sizeof cwd))
		return -1;
	return snprintf(out, n, "%s/%s", cwd, path) < (int)n ? 0 : -1;
}

static int install(int argc, char **argv)
{
	int print = 0;
	const char *manager_name = NULL;
	struct launch_opts o = {0};
	const struct cmd_opt opts[] = {
	    {"print", CMD_OPT_FLAG, {.i = &print}, NULL},
	    {"manager", CMD_OPT_STR, {.s = &manager_name}, NULL},
	    {"model", CMD_OPT_STR, {.s = &o.model_path}, NULL},
	    {"name", CMD_OPT_STR, {.s = &o.name}, NULL},
	    {"ctx", CMD_OPT_LONG, {.l = &o.ctx}, NULL},
	    {"slots", CMD_OPT_INT, {.i = &o.slots}, NULL},
	    {"max-output", CMD_OPT_LONG, {.l = &o.max_output}, NULL},
	    {"port", CMD_OPT_INT, {.i = &o.port}, NULL},
	    {"reuse", CMD_OPT_STR, {.s = &o.mode}, NULL},
	    {"llama-server", CMD_OPT_STR, {.s = &o.binary}, NULL},
	    {NULL, 0, {0}, NULL},
	};
	int r = cmd_parse_options(argc, argv, opts, usage);
	if (r >= 0)
		return r;
	if (optind < argc || o.ctx < 0 || o.slots < 0 || o.port < 0) {
		usage(stderr);
		return 2;
	}
	enum plat_service_kind kind = plat_service_default();
	if (manager_name && !strcmp(manager_name, "systemd"))
		kind = PLAT_SERVICE_SYSTEMD;
	else if (manager_name && !strcmp(manager_name, "launchd"))
		kind = PLAT_SERVICE_LAUNCHD;
	else if (manager_name) {
		fprintf(stderr, "toki service: --manager takes systemd or launchd, not '%s'\n",
		        manager_name);
		return 2;
	}

	/* What it runs: without --model the endpoint for the registry (toki
	 * up), else a file or a registered model through toki up --model. */
	char self[4096], model[4096] = "", binary[4096] = "";
	if (plat_self_exe(self, sizeof self) != 0) {
		fprintf(stderr, "toki service: cannot find the toki binary: %s\n", strerror(errno));
		return 1;
	}
	struct registry reg = {0};
	char rerr[512];
	int have_reg = registry_load(&reg, rerr, sizeof rerr) == 0;
	struct stat st;
	int endpoint = !o.model_path;
	int is_file = o.model_path && stat(o.model_path, &st) == 0 && S_ISREG(st.st_mode);
	const char *reg_name = NULL;
	if (endpoint) {
		/* The endpoint takes each model's settings from the registry. */
		if (o.ctx || o.slots || o.name || o.max_output || o.binary) {
			fprintf(stderr,
			        "toki service: --ctx, --slots, --name, --max-output and "
			        "--llama-server are one model's: pass --model FILE|NAME, or "
			        "set them in the registry for the endpoint\n");
			registry_free(&reg);
			return 2;
		}
		if (!have_reg || reg.n == 0) {
			fprintf(stderr, "toki service: %s\n",
			        have_reg
			            ? "the registry has no models for the endpoint to serve: add "
			              "one with toki model pull, or pass --model FILE"
			            : rerr);
			registry_free(&reg);
			return 1;
		}
	} else if (!is_file) {
		reg_name = o.model_path;
		if (!have_reg || !registry_find(&reg, reg_name)) {
			fprintf(stderr,
			        "toki service: '%s' is neither a file nor a registered model (toki "
			        "model list)\n",
			        o.model_path);
			registry_free(&reg);
			return 1;
		}
	} else if (absolute(o.model_path, model, sizeof model) != 0) {
		fprintf(stderr, "toki service: the path %s is too long\n", o.model_path);
		registry_free(&reg);
		return 1;
	}
	if (o.binary && absolute(o.binary, binary, sizeof binary) != 0) {
		registry_free(&reg);
		return 1;
	}
	char *args[40];
	int a = 0;
	char num[5][32];
	args[a++] = self;
	if (endpoint) {
		args[a++] = "up";
	} else {
		/* A file, or a registered model's name: toki up --model takes both. */
		args[a++] = "up";
		args[a++] = "--model";
		args[a++] = is_file ? model : (char *)reg_name;
		if (o.name) {
			args[a++] = "--name";
			args[a++] = (char *)o.name;
		}
	}
	args[a++] = "--foreground";
	if (o.ctx > 0) {
		snprintf(num[0], sizeof num[0], "%ld", o.ctx);
		args[a++] = "--ctx";
		args[a++] = num[0];
	}
	if (o.slots > 0) {
		snprintf(num[1], sizeof num[1], "%d", o.slots);
		args[a++] = "--slots";
		args[a++] = num[1];
	}
	if (o.port > 0) {
		snprintf(num[2], sizeof num[2], "%d", o.port);
		args[a++] = "--port";
		args[a++] = num[2];
	}
	if (o.mode) {
		args[a++] = "--reuse";
		args[a++] = (char *)o.mode;
	}
	if (!endpoint && o.max_output > 0) {
		snprintf(num[3], sizeof num[3], "%ld", o.max_output);
		args[a++] = "--max-output";
		args[a++] = num[3];
	}
	if (!endpoint && *binary) {
		args[a++] = "--llama-server";
		args[a++] = binary;
	}
	args[a] = NULL;

	char log[4096], home[2048];
	if (paths_state_sub(log, sizeof log, "service.log") != 0 ||
	    plat_home_dir(home, sizeof home) != 0) {
		fprintf(stderr, "toki service: the state folder's path is too long\n");
		registry_free(&reg);
		return 1;
	}
	char *env[64];
	service_env(env, 63);
	struct plat_service svc = {.argv = args, .env = env, .log_path = log, .workdir = home};
	char *text = plat_service_render(kind, &svc);
	registry_free(&reg);
	if (!text) {
		fprintf(stderr, "toki service: out of memory\n");
		return 1;
	}
	if (print) {
		fputs(text, stdout);
		free(text);
		return 0;
	}
	char path[4096], dir[4096];
	if (plat_service_path(kind, path, sizeof path) != 0) {
		fprintf(stderr, "toki service: cannot place the %s file: %s\n",
		        plat_service_kind_name(kind), strerror(errno));
		free(text);
		return 1;
	}
	snprintf(dir, sizeof dir, "%s", path);
	*strrchr(dir, '/') = '\0';
	char state[4096];
	int ok = paths_state_dir(state, sizeof state) == 0 && paths_mkdir_p(state, 0700) == 0 &&
	         paths_mkdir_p(dir, 0755) == 0 &&
	         plat_replace_file(path, text, strlen(text), 0644) == 0;
	free(text);
	if (!ok) {
		fprintf(stderr, "toki service: cannot write %s: %s\n", path, strerror(errno));
		return 1;
	}
	printf("wrote %s\n", path);
	char err[2200];
	if (plat_service_enable(kind, path, err, sizeof err) != 0) {
		fprintf(stderr,
		        "toki service: %s\nThe file stays; start it once the %s user manager runs "
		        "(%s), or remove it with toki service remove.\n",
		        err, plat_service_kind_name(kind),
		        kind == PLAT_SERVICE_LAUNCHD ? "launchctl bootstrap gui/$(id -u) PLIST"
		                                     : "systemctl --user enable --now tokirecur");
		return 1;
	}
	printf("started: toki runs now and at every login (toki status shows it; toki service "
	       "status, the manager's view; log %s)\n",
	       log);
	return 0;
}

static int remove_service(int argc, char **argv)
{
	if (argc > 1) {
		usage(stderr);
		return 2;
	}
	enum plat_service_kind kind = plat_service_default();
	char path[4096], err[2200];
	if (plat_service_path(kind, path, sizeof path) != 0) {
		fprintf(stderr, "toki service: %s\n", strerror(errno));
		return 1;
	}
	struct stat st;
	if (stat(path, &st) != 0) {
		fprintf(stderr, "toki service: not installed (no %s)\n", path);
		return 1;
	}
	int r = 0;
	if (plat_service_disable(kind, err, sizeof err) != 0) {
		/* The file goes all the same: a manager that is not running has
		 * nothing loaded to stop. */
		fprintf(stderr, "toki service: %s (removing the file all the same)\n", err);
		r = 1;
	}
	if (unlink(path) != 0) {
		fprintf(stderr, "toki service: cannot remove %s: %s\n", path, strerror(errno));
		return 1;
	}
	printf("removed %s\n", path);
	return r;
}

static int status(int argc, char **argv)
{
	if (argc > 1) {
		usage(stderr);
		return 2;
	}
	enum plat_service_kind kind = plat_service_default();
	char path[4096], state[256];
	if (plat_service_path(kind, path, sizeof path) != 0) {
		fprintf(stderr, "toki service: %s\n", strerror(errno));
		return 1;
	}
	FILE *f = fopen(path, "r");
	if (!f) {
		printf("not installed (no %s)\n", path);
		return 1;
	}
	char line[8192], runs[8192] = "";
	while (fgets(line, sizeof line, f))
		if (!strncmp(line, "ExecStart=", 10))
			snprintf(runs, sizeof runs, "%s", line + 10);
	fclose(f);
	runs[strcspn(runs, "\n")] = '\0';
	plat_service_state(kind, state, sizeof state);
	printf("installed: %s (%s)\n", path, plat_service_kind_name(kind));
	if (*runs)
		printf("runs:      %s\n", runs);
	printf("state:     %s\n", state);
	struct run_info *ri = NULL;
	int n = 0;
	run_list(&ri, &n);
	for (int i = 0; i < n; i++) {
		char url[300];
		run_info_url(&ri[i], url, sizeof url);
		printf("run:       %s at %s (pid %d)\n", ri[i].name, url, (int)ri[i].pid);
	}
	free(ri);
	return 0;
}

int cmd_service(int argc, char **argv)
{
	if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
		usage(argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	if (!strcmp(argv[1], "install"))
		return install(argc - 1, argv + 1);
	if (!strcmp(argv[1], "remove"))
		return remove_service(argc - 1, argv + 1);
	if (!strcmp(argv[1], "status"))
		return status(argc - 1, argv + 1);
	fprintf(stderr, "toki service: unknown subcommand '%s'\n", argv[1]);
	usage(stderr);
	return 2;
}
