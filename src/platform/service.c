/* The service manager of each OS: a systemd user unit on Linux (and
 * FreeBSD desktops that run it), a launchd agent on macOS. What toki
 * service writes, where, and the manager's commands to start and stop it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "platform/platform.h"

#define LAUNCHD_LABEL "com.tokirecur.toki"
#define SYSTEMD_UNIT "tokirecur.service"

/* A growing string; NULL once an allocation failed. */
struct text {
	char *s;
	size_t len, cap;
};

static void put(struct text *t, const char *s)
{
	if (!t->s && t->cap)
		return;
	size_t l = strlen(s);
	if (t->len + l + 1 > t->cap) {
		size_t cap = t->cap ? t->cap : 1024;
		while (t->len + l + 1 > cap)
			cap *= 2;
		char *n = realloc(t->s, cap);
		if (!n) {
			free(t->s);
			t->s = NULL;
			t->cap = 1; /* failed: further puts do nothing */
			return;
		}
		t->s = n;
		t->cap = cap;
	}
	memcpy(t->s + t->len, s, l + 1);
	t->len += l;
}

static void putc_(struct text *t, char c)
{
	char b[2] = {c, 0};
	put(t, b);
}

/* systemd's quoting for ExecStart and Environment: a word in double quotes,
 * with \ and " escaped, % doubled (specifiers) and $ doubled (variables). */
static void put_systemd_word(struct text *t, const char *w)
{
	putc_(t, '"');
	for (const char *p = w; *p; p++) {
		if (*p == '\\' || *p == '"')
			putc_(t, '\\');
		else if (*p == '%' || *p == '$')
			putc_(t, *p);
		if (*p == '\n')
			put(t, "\\n");
		else
			putc_(t, *p);
	}
	putc_(t, '"');
}

/* A path setting (WorkingDirectory=, StandardOutput=append:) takes no
 * quotes; only specifiers are expanded, so % is doubled. */
static void put_systemd_path(struct text *t, const char *path)
{
	for (const char *p = path; *p; p++) {
		if (*p == '%')
			putc_(t, '%');
		putc_(t, *p);
	}
}

static void put_xml(struct text *t, const char *s)
{
	for (const char *p = s; *p; p++) {
		switch (*p) {
		case '&':
			put(t, "&amp;");
			break;
		case '<':
			put(t, "&lt;");
			break;
		case '>':
			put(t, "&gt;");
			break;
		case '"':
			put(t, "&quot;");
			break;
		default:
			putc_(t, *p);
		}
	}
}

static void put_xml_string(struct text *t, const char *indent, const char *s)
{
	put(t, indent);
	put(t, "<string>");
	put_xml(t, s);
	put(t, "</string>\n");
}

static char *render_systemd(const struct plat_service *s)
{
	struct text t = {0};
	put(&t, "# Written by toki service install: runs toki at login.\n"
	        "# toki service remove stops and deletes it; toki down stops the run (a\n"
	        "# clean exit, which is not restarted).\n"
	        "[Unit]\n"
	        "Description=Toki Recur: KV-cache reuse in front of llama-server\n"
	        "After=network.target\n"
	        "\n"
	        "[Service]\n"
	        "Type=simple\n"
	        "ExecStart=");
	for (int i = 0; s->argv[i]; i++) {
		if (i)
			putc_(&t, ' ');
		put_systemd_word(&t, s->argv[i]);
	}
	putc_(&t, '\n');
	for (int i = 0; s->env && s->env[i]; i++) {
		put(&t, "Environment=");
		put_systemd_word(&t, s->env[i]);
		putc_(&t, '\n');
	}
	if (s->workdir) {
		put(&t, "WorkingDirectory=");
		put_systemd_path(&t, s->workdir);
		putc_(&t, '\n');
	}
	put(&t, "StandardOutput=append:");
	put_systemd_path(&t, s->log_path);
	put(&t, "\nStandardError=append:");
	put_systemd_path(&t, s->log_path);
	put(&t, "\n"
	        "# A crash (a non-zero exit or a signal) is restarted; toki down's stop\n"
	        "# is an exit 0, which is not.\n"
	        "Restart=on-failure\n"
	        "RestartSec=5\n"
	        "# toki serve stops its llama-server on SIGTERM; what is left after the\n"
	        "# timeout is killed.\n"
	        "KillMode=mixed\n"
	        "TimeoutStopSec=30\n"
	        "\n"
	        "[Install]\n"
	        "WantedBy=default.target\n");
	return t.s;
}

static char *render_launchd(const struct plat_service *s)
{
	struct text t = {0};
	put(&t, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
	        "<!DOCTYPE plist PUBLIC \"-//Apple//DTD PLIST 1.0//EN\" "
	        "\"http://www.apple.com/DTDs/PropertyList-1.0.dtd\">\n"
	        "<!-- Written by toki service install: runs toki at login. toki service\n"
	        "     remove stops and deletes it; toki down stops the run (a clean exit,\n"
	        "     which is not restarted). -->\n"
	        "<plist version=\"1.0\">\n"
	        "<dict>\n"
	        "\t<key>Label</key>\n"
	        "\t<string>" LAUNCHD_LABEL "</string>\n"
	        "\t<key>ProgramArguments</key>\n"
	        "\t<array>\n");
	for (int i = 0; s->argv[i]; i++)
		put_xml_string(&t, "\t\t", s->argv[i]);
	put(&t, "\t</array>\n");
	if (s->env && s->env[0]) {
		put(&t, "\t<key>EnvironmentVariables</key>\n\t<dict>\n");
		for (int i = 0; s->env[i]; i++) {
			const char *eq = strchr(s->env[i], '=');
			if (!eq)
				continue;
			char key[256];
			snprintf(key, sizeof key, "%.*s", (int)(eq - s->env[i]), s->env[i]);
			put(&t, "\t\t<key>");
			put_xml(&t, key);
			put(&t, "</key>\n");
			put_xml_string(&t, "\t\t", eq + 1);
		}
		put(&t, "\t</dict>\n");
	}
	if (s->workdir) {
		put(&t, "\t<key>WorkingDirectory</key>\n");
		put_xml_string(&t, "\t", s->workdir);
	}
	put(&t, "\t<key>StandardOutPath</key>\n");
	put_xml_string(&t, "\t", s->log_path);
	put(&t, "\t<key>StandardErrorPath</key>\n");
	put_xml_string(&t, "\t", s->log_path);
	put(&t, "\t<key>RunAtLoad</key>\n"
	        "\t<true/>\n"
	        "\t<!-- Restarted after a crash; toki down's stop is an exit 0, which is\n"
	        "\t     not. -->\n"
	        "\t<key>KeepAlive</key>\n"
	        "\t<dict>\n"
	        "\t\t<key>SuccessfulExit</key>\n"
	        "\t\t<false/>\n"
	        "\t</dict>\n"
	        "\t<key>ThrottleInterval</key>\n"
	        "\t<integer>5</integer>\n"
	        "</dict>\n"
	        "</plist>\n");
	return t.s;
}

enum plat_service_kind plat_service_default(void)
{
	return strcmp(plat_os_name(), "macos") == 0 ? PLAT_SERVICE_LAUNCHD : PLAT_SERVICE_SYSTEMD;
}

const char *plat_service_kind_name(enum plat_service_kind k)
{
	return k == PLAT_SERVICE_LAUNCHD ? "launchd" : "systemd";
}

char *plat_service_render(enum plat_service_kind k, const struct plat_service *s)
{
	if (!s->argv || !s->argv[0] || !s->log_path) {
		errno = EINVAL;
		return NULL;
	}
	return k == PLAT_SERVICE_LAUNCHD ? render_launchd(s) : render_systemd(s);
}

int plat_service_path(enum plat_service_kind k, char *out, size_t n)
{
	char home[2048];
	if (plat_home_dir(home, sizeof home) != 0)
		return -1;
	int w;
	if (k == PLAT_SERVICE_LAUNCHD) {
		w = snprintf(out, n, "%s/Library/LaunchAgents/" LAUNCHD_LABEL ".plist", home);
	} else {
		const char *x = getenv("XDG_CONFIG_HOME");
		w = x && *x ? snprintf(out, n, "%s/systemd/user/" SYSTEMD_UNIT, x)
		            : snprintf(out, n, "%s/.config/systemd/user/" SYSTEMD_UNIT, home);
	}
	if (w < 0 || (size_t)w >= n) {
		errno = ENAMETOOLONG;
		return -1;
	}
	return 0;
}

/* Runs the manager's command; its output (both streams) in out. */
static int manager(char *const argv[], char *out, size_t n)
{
	struct plat_cmd c = {.argv = argv, .timeout_ms = 30000, .merge_stderr = 1};
	int st = plat_run(&c, out, n, NULL, NULL);
	out[strcspn(out, "\n")] = '\0'; /* the first line says why */
	return st;
}

int plat_service_enable(enum plat_service_kind k, const char *path, char *err, size_t errlen)
{
	char out[2048];
	if (k == PLAT_SERVICE_LAUNCHD) {
		char domain[64], target[128];
		snprintf(domain, sizeof domain, "gui/%d", (int)getuid());
		snprintf(target, sizeof target, "%s/" LAUNCHD_LABEL, domain);
		/* A loaded older version is replaced. */
		char *const out_argv[] = {"launchctl", "bootout", target, NULL};
		(void)manager(out_argv, out, sizeof out);
		char *const in_argv[] = {"launchctl", "bootstrap", domain, (char *)path, NULL};
		if (manager(in_argv, out, sizeof out) != 0) {
			snprintf(err, errlen, "launchctl bootstrap %s %s failed: %s", domain, path,
			         *out ? out : "no launchctl");
			return -1;
		}
		return 0;
	}
	char *const reload[] = {"systemctl", "--user", "daemon-reload", NULL};
	if (manager(reload, out, sizeof out) != 0) {
		snprintf(err, errlen, "systemctl --user daemon-reload failed: %s",
		         *out ? out : "no systemctl");
		return -1;
	}
	char *const enable[] = {"systemctl", "--user", "enable", "--now", SYSTEMD_UNIT, NULL};
	if (manager(enable, out, sizeof out) != 0) {
		snprintf(err, errlen, "systemctl --user enable --now " SYSTEMD_UNIT " failed: %s",
		         out);
		return -1;
	}
	return 0;
}

int plat_service_disable(enum plat_service_kind k, char *err, size_t errlen)
{
	char out[2048];
	if (k == PLAT_SERVICE_LAUNCHD) {
		char target[128];
		snprintf(target, sizeof target, "gui/%d/" LAUNCHD_LABEL, (int)getuid());
		char *const argv[] = {"launchctl", "bootout", target, NULL};
		if (manager(argv, out, sizeof out) != 0) {
			snprintf(err, errlen, "launchctl bootout %s failed: %s", target,
			         *out ? out : "no launchctl");
			return -1;
		}
		return 0;
	}
	char *const disable[] = {"systemctl", "--user", "disable", "--now", SYSTEMD_UNIT, NULL};
	if (manager(disable, out, sizeof out) != 0) {
		snprintf(err, errlen, "systemctl --user disable --now " SYSTEMD_UNIT " failed: %s",
		         *out ? out : "no systemctl");
		return -1;
	}
	char *const reload[] = {"systemctl", "--user", "daemon-reload", NULL};
	(void)manager(reload, out, sizeof out);
	return 0;
}

int plat_service_state(enum plat_service_kind k, char *out, size_t n)
{
	char buf[16384];
	if (k == PLAT_SERVICE_LAUNCHD) {
		char target[128];
		snprintf(target, sizeof target, "gui/%d/" LAUNCHD_LABEL, (int)getuid());
		char *const argv[] = {"launchctl", "print", target, NULL};
		struct plat_cmd c = {.argv = argv, .timeout_ms = 30000, .merge_stderr = 1};
		if (plat_run(&c, buf, sizeof buf, NULL, NULL) != 0) {
			snprintf(out, n, "not loaded");
			return -1;
		}
		/* "\tstate = running" */
		const char *st = strstr(buf, "state = ");
		if (!st) {
			snprintf(out, n, "loaded");
			return 0;
		}
		st += 8;
		snprintf(out, n, "%.*s", (int)strcspn(st, "\n"), st);
		return 0;
	}
	char *const argv[] = {"systemctl", "--user", "is-active", SYSTEMD_UNIT, NULL};
	/* is-active exits non-zero for inactive and failed units too: the word
	 * it prints is the answer. */
	struct plat_cmd c = {.argv = argv, .timeout_ms = 30000, .merge_stderr = 1};
	int st = plat_run(&c, buf, sizeof buf, NULL, NULL);
	buf[strcspn(buf, "\n")] = '\0';
	if (st < 0 || st == 127 || !*buf) {
		snprintf(out, n, "unknown (no systemd user manager)");
		return -1;
	}
	snprintf(out, n, "%s", buf);
	return 0;
}
