/* macOS (Apple silicon and Intel): sysctl, vm_stat, libproc. Built and
 * tested only on a Mac (.github/workflows/macos.yml); docs/platforms.md
 * says what was checked where. */
#include <errno.h>
#include <libproc.h>
#include <limits.h>
#include <mach-o/dyld.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/proc_info.h>
#include <sys/sysctl.h>
#include <unistd.h>

#include "platform/os.h"

#ifndef SZOMB
#define SZOMB 5 /* <sys/proc.h>: a zombie */
#endif

const char *plat_os_name(void)
{
	return "macos";
}

int plat_self_exe(char *out, size_t n)
{
	char buf[PATH_MAX];
	uint32_t size = sizeof buf;
	if (_NSGetExecutablePath(buf, &size) != 0) {
		errno = ENAMETOOLONG;
		return -1;
	}
	/* It may be a path through a symbolic link (Homebrew's bin/). */
	char real[PATH_MAX];
	if (!realpath(buf, real))
		return -1;
	if ((size_t)snprintf(out, n, "%s", real) >= n) {
		errno = ENAMETOOLONG;
		return -1;
	}
	return 0;
}

int plat_mem_read(struct plat_mem *m)
{
	uint64_t total;
	if (plat_sysctl_u64("hw.memsize", &total) != 0)
		return -1;
	m->total = total;
	m->available = total;
	/* vm_stat's counts, as Activity Monitor reads them; without it the
	 * total stands in (a start then sizes a little generously, as an
	 * explicit TOKI_MEMORY_MB would). */
	char out[8192];
	char *const argv[] = {"/usr/bin/vm_stat", NULL};
	struct plat_cmd c = {.argv = argv, .timeout_ms = 5000};
	if (plat_run(&c, out, sizeof out, NULL, NULL) == 0)
		(void)plat_parse_vm_stat(out, m);
	return 0;
}

int plat_is_apple_silicon(void)
{
	uint64_t arm64 = 0;
	return plat_sysctl_u64("hw.optional.arm64", &arm64) == 0 && arm64 == 1;
}

int plat_os_gpu_default(struct plat_gpus *g)
{
	if (!plat_is_apple_silicon())
		return -1;
	struct plat_mem m;
	if (plat_mem_read(&m) != 0)
		return -1;
	uint64_t wired = 0;
	(void)plat_sysctl_u64("iogpu.wired_limit_mb", &wired);
	struct plat_gpu_device *d = &g->dev[0];
	memset(g, 0, sizeof *g);
	snprintf(d->name, sizeof d->name, "Metal");
	size_t len = sizeof d->desc;
	if (sysctlbyname("machdep.cpu.brand_string", d->desc, &len, NULL, 0) != 0)
		snprintf(d->desc, sizeof d->desc, "Apple silicon");
	d->total = plat_metal_working_set(m.total, wired);
	/* Unified memory: what the GPU can take is also what the rest of the
	 * machine leaves free. */
	d->free = m.available < d->total ? m.available : d->total;
	g->n = 1;
	snprintf(g->source, sizeof g->source, "metal default");
	return 0;
}

long plat_rss_kib(pid_t pid)
{
	struct proc_taskinfo ti;
	if (proc_pidinfo(pid, PROC_PIDTASKINFO, 0, &ti, sizeof ti) != (int)sizeof ti)
		return -1;
	return (long)(ti.pti_resident_size / 1024);
}

int plat_cpus(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (int)n : 1;
}

int plat_os_zombie(pid_t pid)
{
	struct proc_bsdinfo bi;
	return proc_pidinfo(pid, PROC_PIDTBSDINFO, 0, &bi, sizeof bi) == (int)sizeof bi &&
	       bi.pbi_status == SZOMB;
}

int plat_session_signal(pid_t sid, int sig)
{
	int cap = proc_listallpids(NULL, 0);
	if (cap <= 0)
		return 0;
	cap += 64; /* processes started meanwhile */
	pid_t *pids = calloc((size_t)cap, sizeof *pids);
	if (!pids)
		return 0;
	int n = proc_listallpids(pids, cap * (int)sizeof *pids);
	int alive = 0;
	for (int i = 0; i < n; i++) {
		pid_t pid = pids[i];
		if (pid <= 0 || pid == getpid() || getsid(pid) != sid)
			continue;
		struct proc_bsdinfo bi;
		if (proc_pidinfo(pid, PROC_PIDTBSDINFO, 0, &bi, sizeof bi) == (int)sizeof bi &&
		    bi.pbi_status == SZOMB)
			continue;
		alive++;
		if (sig)
			kill(pid, sig);
	}
	free(pids);
	return alive;
}
