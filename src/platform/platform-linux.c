/* Linux: /proc. */
#include <dirent.h>
#include <sched.h>
#include <signal.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "platform/os.h"

const char *plat_os_name(void)
{
	return "linux";
}

int plat_self_exe(char *out, size_t n)
{
	if (n < 2) {
		errno = ENAMETOOLONG;
		return -1;
	}
	ssize_t l = readlink("/proc/self/exe", out, n - 1);
	if (l <= 0)
		return -1;
	if ((size_t)l >= n - 1) {
		errno = ENAMETOOLONG;
		return -1;
	}
	out[l] = '\0';
	return 0;
}

/* Reads a small /proc file whole. */
static int read_small(const char *path, char *buf, size_t n)
{
	FILE *f = fopen(path, "re");
	if (!f)
		return -1;
	size_t len = fread(buf, 1, n - 1, f);
	int bad = ferror(f);
	fclose(f);
	if (bad) {
		errno = EIO;
		return -1;
	}
	buf[len] = '\0';
	return 0;
}

int plat_boot_id(char *out, size_t n)
{
	FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
	if (!f)
		return -1;
	int ok = fgets(out, (int)n, f) != NULL;
	fclose(f);
	if (!ok)
		return -1;
	out[strcspn(out, "\n")] = '\0';
	return *out ? 0 : -1;
}

int plat_mem_read(struct plat_mem *m)
{
	char buf[16384];
	if (read_small("/proc/meminfo", buf, sizeof buf) != 0)
		return -1;
	return plat_parse_meminfo(buf, m);
}

int plat_is_apple_silicon(void)
{
	return 0;
}

int plat_os_gpu_default(struct plat_gpus *g)
{
	g->n = 0;
	return -1;
}

long plat_rss_kib(pid_t pid)
{
	char path[64], buf[4096];
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	if (read_small(path, buf, sizeof buf) != 0)
		return -1;
	return plat_parse_proc_status_rss(buf);
}

int plat_cpus(void)
{
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
		return CPU_COUNT(&set);
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (int)n : 1;
}

int plat_os_ephemeral_ports(int *lo, int *hi)
{
	char buf[64];
	if (read_small("/proc/sys/net/ipv4/ip_local_port_range", buf, sizeof buf) != 0)
		return -1;
	return sscanf(buf, "%d %d", lo, hi) == 2 ? 0 : -1;
}

int plat_os_zombie(pid_t pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	char state;
	long ppid, pgrp, session;
	return read_small(path, buf, sizeof buf) == 0 &&
	       plat_parse_proc_stat(buf, &state, &ppid, &pgrp, &session) == 0 &&
	       (state == 'Z' || state == 'X');
}

int plat_session_signal(pid_t sid, int sig)
{
	DIR *d = opendir("/proc");
	if (!d)
		return 0;
	int alive = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		char *end;
		long pid = strtol(de->d_name, &end, 10);
		if (*end || pid <= 0 || pid == (long)getpid())
			continue;
		char path[64], buf[1024];
		snprintf(path, sizeof path, "/proc/%ld/stat", pid);
		if (read_small(path, buf, sizeof buf) != 0)
			continue;
		char state;
		long ppid, pgrp, session;
		if (plat_parse_proc_stat(buf, &state, &ppid, &pgrp, &session) != 0)
			continue;
		if (session != (long)sid || state == 'Z' || state == 'X')
			continue;
		alive++;
		if (sig)
			kill((pid_t)pid, sig);
	}
	closedir(d);
	return alive;
}
