/* FreeBSD: sysctl (kern.proc, hw.physmem, vm.stats). Not built here;
 * docs/platforms.md says what was checked where. */
#include <sys/types.h>
#include <sys/sysctl.h>
#include <sys/user.h>

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "platform/os.h"

const char *plat_os_name(void)
{
	return "freebsd";
}

int plat_self_exe(char *out, size_t n)
{
	int mib[4] = {CTL_KERN, KERN_PROC, KERN_PROC_PATHNAME, -1};
	size_t len = n;
	if (sysctl(mib, 4, out, &len, NULL, 0) != 0)
		return -1;
	return 0;
}

int plat_mem_read(struct plat_mem *m)
{
	uint64_t total, page, fr, inactive, cache = 0;
	if (plat_sysctl_u64("hw.physmem", &total) != 0 ||
	    plat_sysctl_u64("hw.pagesize", &page) != 0)
		return -1;
	m->total = total;
	m->available = total;
	if (plat_sysctl_u64("vm.stats.vm.v_free_count", &fr) == 0 &&
	    plat_sysctl_u64("vm.stats.vm.v_inactive_count", &inactive) == 0) {
		(void)plat_sysctl_u64("vm.stats.vm.v_cache_count", &cache); /* gone in 12+ */
		uint64_t avail = (fr + inactive + cache) * page;
		m->available = avail < total ? avail : total;
	}
	return 0;
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
	int mib[4] = {CTL_KERN, KERN_PROC, KERN_PROC_PID, (int)pid};
	struct kinfo_proc kp;
	size_t len = sizeof kp;
	if (sysctl(mib, 4, &kp, &len, NULL, 0) != 0 || len != sizeof kp)
		return -1;
	return (long)kp.ki_rssize * (getpagesize() / 1024);
}

int plat_cpus(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n > 0 ? (int)n : 1;
}

int plat_os_zombie(pid_t pid)
{
	int mib[4] = {CTL_KERN, KERN_PROC, KERN_PROC_PID, (int)pid};
	struct kinfo_proc kp;
	size_t len = sizeof kp;
	return sysctl(mib, 4, &kp, &len, NULL, 0) == 0 && len == sizeof kp && kp.ki_stat == SZOMB;
}

int plat_session_signal(pid_t sid, int sig)
{
	int mib[3] = {CTL_KERN, KERN_PROC, KERN_PROC_PROC};
	size_t len = 0;
	if (sysctl(mib, 3, NULL, &len, NULL, 0) != 0)
		return 0;
	len += len / 8; /* processes started meanwhile */
	struct kinfo_proc *kp = malloc(len);
	if (!kp)
		return 0;
	if (sysctl(mib, 3, kp, &len, NULL, 0) != 0) {
		free(kp);
		return 0;
	}
	int alive = 0;
	for (size_t i = 0; i < len / sizeof *kp; i++) {
		if (kp[i].ki_sid != sid || kp[i].ki_pid == getpid() || kp[i].ki_stat == SZOMB)
			continue;
		alive++;
		if (sig)
			kill(kp[i].ki_pid, sig);
	}
	free(kp);
	return alive;
}
