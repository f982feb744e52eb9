/* The parsers of what operating systems and tools print: /proc files,
 * sysctl, vm_stat, nvidia-smi, llama-server --list-devices. Pure functions
 * of text, compiled on every platform so that tests/unit/test_platform.c
 * checks each on recorded outputs wherever the suite runs. */
#include "platform/platform.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The number after "key:" at the start of a line, times 1024 when the
 * line says kB. */
static int meminfo_value(const char *text, const char *key, uint64_t *out)
{
	size_t kl = strlen(key);
	for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
		if (strncmp(p, key, kl) != 0 || p[kl] != ':')
			continue;
		const char *v = p + kl + 1;
		while (*v == ' ' || *v == '\t')
			v++;
		if (!isdigit((unsigned char)*v))
			return -1;
		char *end;
		errno = 0;
		unsigned long long n = strtoull(v, &end, 10);
		if (errno)
			return -1;
		while (*end == ' ')
			end++;
		if (!strncmp(end, "kB", 2)) {
			if (n > UINT64_MAX / 1024)
				return -1;
			n *= 1024;
		}
		*out = n;
		return 0;
	}
	return -1;
}

int plat_parse_meminfo(const char *text, struct plat_mem *m)
{
	uint64_t total = 0, avail = 0;
	if (meminfo_value(text, "MemTotal", &total) != 0 || total == 0) {
		errno = EINVAL;
		return -1;
	}
	if (meminfo_value(text, "MemAvailable", &avail) != 0) {
		/* Kernels before 3.14 have no MemAvailable: free memory plus the
		 * page cache is the usual stand-in (it overstates a little). */
		uint64_t fr = 0, bufs = 0, cached = 0;
		if (meminfo_value(text, "MemFree", &fr) != 0) {
			errno = EINVAL;
			return -1;
		}
		(void)meminfo_value(text, "Buffers", &bufs);
		(void)meminfo_value(text, "Cached", &cached);
		avail = fr + bufs + cached;
	}
	m->total = total;
	m->available = avail < total ? avail : total;
	return 0;
}

long plat_parse_proc_status_rss(const char *text)
{
	uint64_t v;
	if (meminfo_value(text, "VmRSS", &v) != 0)
		return -1;
	return (long)(v / 1024);
}

int plat_parse_proc_stat(const char *text, char *state, long *ppid, long *pgrp, long *session)
{
	/* pid (comm) state ppid pgrp session ...; comm may hold anything,
	 * spaces and parentheses included, so parse from its last ')'. */
	const char *rp = strrchr(text, ')');
	char st = 0;
	long pp = 0, pg = 0, se = 0;
	if (!rp || sscanf(rp + 1, " %c %ld %ld %ld", &st, &pp, &pg, &se) != 4) {
		errno = EINVAL;
		return -1;
	}
	*state = st;
	*ppid = pp;
	*pgrp = pg;
	*session = se;
	return 0;
}

int plat_parse_sysctl_u64(const char *text, const char *key, uint64_t *v)
{
	const char *p = text;
	while (*p == ' ' || *p == '\t' || *p == '\n')
		p++;
	/* "hw.memsize: 17179869184" (sysctl NAME), "hw.memsize = 1" (some
	 * BSDs) or "17179869184" (sysctl -n NAME). */
	size_t kl = key ? strlen(key) : 0;
	if (kl && !strncmp(p, key, kl)) {
		p += kl;
		while (*p == ' ' || *p == '\t')
			p++;
		if (*p != ':' && *p != '=') {
			errno = EINVAL;
			return -1;
		}
		p++;
		while (*p == ' ' || *p == '\t')
			p++;
	}
	if (!isdigit((unsigned char)*p)) {
		errno = EINVAL;
		return -1;
	}
	char *end;
	errno = 0;
	unsigned long long n = strtoull(p, &end, 10);
	if (errno)
		return -1;
	while (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n')
		end++;
	if (*end) {
		errno = EINVAL;
		return -1;
	}
	*v = n;
	return 0;
}

/* "Pages free:                               12345." */
static int vm_stat_pages(const char *text, const char *label, uint64_t *pages)
{
	size_t ll = strlen(label);
	for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
		if (strncmp(p, label, ll) != 0 || p[ll] != ':')
			continue;
		const char *v = p + ll + 1;
		while (*v == ' ' || *v == '\t')
			v++;
		if (!isdigit((unsigned char)*v))
			return -1;
		*pages = strtoull(v, NULL, 10);
		return 0;
	}
	return -1;
}

int plat_parse_vm_stat(const char *text, struct plat_mem *m)
{
	/* "Mach Virtual Memory Statistics: (page size of 16384 bytes)" */
	const char *ps = strstr(text, "page size of ");
	if (!ps) {
		errno = EINVAL;
		return -1;
	}
	uint64_t page = strtoull(ps + 13, NULL, 10);
	uint64_t fr, inactive, purgeable = 0, speculative = 0;
	if (!page || vm_stat_pages(text, "Pages free", &fr) != 0 ||
	    vm_stat_pages(text, "Pages inactive", &inactive) != 0) {
		errno = EINVAL;
		return -1;
	}
	/* Activity Monitor's "available": these are given back on demand. */
	(void)vm_stat_pages(text, "Pages purgeable", &purgeable);
	(void)vm_stat_pages(text, "Pages speculative", &speculative);
	m->available = (fr + inactive + purgeable + speculative) * page;
	if (m->total && m->available > m->total)
		m->available = m->total;
	return 0;
}

static void copy_field(char *dst, size_t n, const char *s, size_t len)
{
	if (len >= n)
		len = n - 1;
	memcpy(dst, s, len);
	dst[len] = '\0';
}

int plat_parse_list_devices(const char *text, struct plat_gpus *g)
{
	/* llama.cpp's common/arg.cpp prints
	 *   Available devices:
	 *     CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23517 MiB free)
	 *     Vulkan0: llvmpipe (LLVM 19.1.7, 256 bits) (24105 MiB, 23767 MiB free)
	 *   (or "  (none)"), after whatever the backends logged on loading. The
	 * description may hold parentheses, so the numbers are the last
	 * "(... MiB, ... MiB free)" of the line. */
	const char *start = strstr(text, "Available devices:");
	if (!start) {
		errno = EINVAL;
		return -1;
	}
	memset(g, 0, sizeof *g);
	const char *p = strchr(start, '\n');
	while (p && *p) {
		p++;
		const char *eol = strchr(p, '\n');
		size_t len = eol ? (size_t)(eol - p) : strlen(p);
		char line[512];
		copy_field(line, sizeof line, p, len);
		p = eol;
		char *s = line;
		if (*s != ' ' && *s != '\t')
			break; /* the list is indented; anything else ends it */
		while (*s == ' ' || *s == '\t')
			s++;
		char *colon = strstr(s, ": ");
		char *open = strrchr(s, '(');
		unsigned long long tot = 0, fr = 0;
		if (!colon || !open || open < colon ||
		    sscanf(open, "(%llu MiB, %llu MiB free)", &tot, &fr) != 2)
			continue; /* "(none)", or a line of another shape */
		if (g->n == PLAT_MAX_GPUS)
			break;
		struct plat_gpu_device *d = &g->dev[g->n++];
		copy_field(d->name, sizeof d->name, s, (size_t)(colon - s));
		char *desc = colon + 2;
		char *dend = open;
		while (dend > desc && dend[-1] == ' ')
			dend--;
		copy_field(d->desc, sizeof d->desc, desc, (size_t)(dend - desc));
		d->total = (uint64_t)tot << 20;
		d->free = (uint64_t)fr << 20;
	}
	snprintf(g->source, sizeof g->source, "llama-server --list-devices");
	return g->n;
}

int plat_parse_nvidia_smi(const char *text, struct plat_gpus *g)
{
	memset(g, 0, sizeof *g);
	for (const char *p = text; *p;) {
		while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
			p++;
		if (!*p)
			break;
		/* "NVIDIA H100 80GB HBM3, 81559, 1234": name, total and used
		 * MiB. Anything else ("[N/A]", "No devices were found") means
		 * the VRAM is not known. */
		const char *eol = strchr(p, '\n');
		size_t len = eol ? (size_t)(eol - p) : strlen(p);
		char line[512];
		copy_field(line, sizeof line, p, len);
		p += len;
		char *c2 = strrchr(line, ',');
		if (!c2)
			goto bad;
		*c2 = '\0';
		/* Without the name column ("81559, 1234") the line starts with
		 * the total. */
		char *c1 = strrchr(line, ',');
		const char *ts = c1 ? c1 + 1 : line, *us = c2 + 1, *name = c1 ? line : "";
		if (c1)
			*c1 = '\0';
		char *end;
		while (*ts == ' ')
			ts++;
		while (*us == ' ')
			us++;
		if (!isdigit((unsigned char)*ts) || !isdigit((unsigned char)*us))
			goto bad;
		errno = 0;
		unsigned long long t = strtoull(ts, &end, 10);
		if (*end && *end != ' ')
			goto bad;
		unsigned long long u = strtoull(us, &end, 10);
		while (*end == ' ' || *end == '\r')
			end++;
		if (errno || *end || t > (UINT64_MAX >> 21) || u > (UINT64_MAX >> 21) || !t)
			goto bad;
		if (g->n == PLAT_MAX_GPUS)
			break;
		struct plat_gpu_device *d = &g->dev[g->n];
		snprintf(d->name, sizeof d->name, "CUDA%d", g->n);
		copy_field(d->desc, sizeof d->desc, name, strlen(name));
		d->total = (uint64_t)t << 20;
		d->free = (uint64_t)(u < t ? t - u : 0) << 20;
		g->n++;
	}
	if (!g->n)
		goto bad;
	snprintf(g->source, sizeof g->source, "nvidia-smi");
	return g->n;
bad:
	g->n = 0;
	errno = EINVAL;
	return -1;
}

int plat_gpu_is_software(const struct plat_gpu_device *d)
{
	static const char *const soft[] = {"llvmpipe", "lavapipe", "SwiftShader", "softpipe"};
	for (size_t i = 0; i < sizeof soft / sizeof soft[0]; i++)
		if (strstr(d->desc, soft[i]))
			return 1;
	return 0;
}

uint64_t plat_metal_working_set(uint64_t ram_total, uint64_t wired_limit_mb)
{
	/* macOS lets the GPU wire iogpu.wired_limit_mb when a user set it;
	 * otherwise Metal's recommendedMaxWorkingSetSize, which Apple sets to
	 * about 2/3 of RAM on machines up to 36 GiB and 3/4 above. */
	if (wired_limit_mb)
		return wired_limit_mb << 20;
	if (ram_total <= (UINT64_C(36) << 30))
		return ram_total / 3 * 2;
	return ram_total / 4 * 3;
}
