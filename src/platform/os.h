/* What each platform-<os>.c gives the common code of the layer, beside the
 * public functions of platform.h. Not for use outside src/platform/. */
#ifndef TOKI_PLATFORM_OS_H
#define TOKI_PLATFORM_OS_H

#include "platform/platform.h"

/* The GPU memory the OS itself can state when no llama-server or
 * nvidia-smi says anything: Metal's working set on Apple silicon. 0 with
 * g->n = 1, or -1 where the OS has nothing to say. */
int plat_os_gpu_default(struct plat_gpus *g);

/* 1 when pid is a zombie: exited, but not yet reaped by its parent (which
 * may be a service manager or a shell, not us), else 0. */
int plat_os_zombie(pid_t pid);

/* The ports the OS gives connect() and bind() to port 0 (Linux's
 * ip_local_port_range, the BSDs' net.inet.ip.portrange): 0, or -1 where it
 * cannot say. */
int plat_os_ephemeral_ports(int *lo, int *hi);

#if defined(__APPLE__) || defined(__FreeBSD__)
/* sysctlbyname(3) of a number, whether the key is 32 or 64 bits wide. */
int plat_sysctl_u64(const char *name, uint64_t *v);
#endif

#endif
