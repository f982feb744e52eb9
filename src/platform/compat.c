/* What libcs spell differently, or only glibc has: cloexec pipes and
 * sockets (pipe2 and SOCK_CLOEXEC are not on macOS), version comparison
 * (strverscmp is glibc's), qsort with a context (glibc and the BSDs put the
 * context in different places), random bytes (getrandom is Linux's), plus
 * the file operations every module wants done one way: locks and atomic
 * replacement. */
#include "platform/os.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/rand.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#if defined(__APPLE__) || defined(__FreeBSD__)
#include <sys/sysctl.h>
#include <sys/time.h>
#endif
#include <unistd.h>

/* Only where pipe2 or SOCK_CLOEXEC is missing (macOS). */
static inline int set_fd_flags(int fd, int nonblock)
{
	int fl = fcntl(fd, F_GETFD);
	if (fl < 0 || fcntl(fd, F_SETFD, fl | FD_CLOEXEC) < 0)
		return -1;
	if (nonblock) {
		fl = fcntl(fd, F_GETFL);
		if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
			return -1;
	}
	return 0;
}

int plat_pipe(int fds[2], int nonblock)
{
#if defined(__linux__) || defined(__FreeBSD__)
	/* Atomic: no window in which another thread's fork inherits the ends. */
	return pipe2(fds, O_CLOEXEC | (nonblock ? O_NONBLOCK : 0));
#else
	if (pipe(fds) != 0)
		return -1;
	if (set_fd_flags(fds[0], nonblock) != 0 || set_fd_flags(fds[1], nonblock) != 0) {
		int e = errno;
		close(fds[0]);
		close(fds[1]);
		errno = e;
		return -1;
	}
	return 0;
#endif
}

int plat_socket(int domain, int type, int protocol)
{
#ifdef SOCK_CLOEXEC
	return socket(domain, type | SOCK_CLOEXEC, protocol);
#else
	int fd = socket(domain, type, protocol);
	if (fd >= 0 && set_fd_flags(fd, 0) != 0) {
		int e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
#endif
}

int plat_lock(int fd, int exclusive, int wait)
{
	int op = (exclusive ? LOCK_EX : LOCK_SH) | (wait ? 0 : LOCK_NB);
	int r;
	while ((r = flock(fd, op)) != 0 && errno == EINTR)
		;
	return r;
}

int plat_replace_file(const char *path, const void *data, size_t len, unsigned mode)
{
	char tmp[4200];
	if ((size_t)snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid()) >= sizeof tmp) {
		errno = ENAMETOOLONG;
		return -1;
	}
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode);
	if (fd < 0)
		return -1;
	const char *p = data;
	size_t left = len;
	while (left) {
		ssize_t w = write(fd, p, left);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			goto fail;
		p += w;
		left -= (size_t)w;
	}
	if (fsync(fd) != 0)
		goto fail;
	if (close(fd) != 0) {
		fd = -1;
		goto fail;
	}
	fd = -1;
	if (rename(tmp, path) != 0)
		goto fail;
	/* The rename is durable once the folder is. */
	plat_fsync_dir_of(path);
	return 0;
fail:;
	int e = errno;
	if (fd >= 0)
		close(fd);
	unlink(tmp);
	errno = e;
	return -1;
}

void plat_fsync_dir(const char *dir)
{
	int fd = open(dir, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		(void)fsync(fd); /* best effort: some filesystems refuse it */
		close(fd);
	}
}

void plat_fsync_dir_of(const char *path)
{
	char dir[4200];
	const char *slash = strrchr(path, '/');
	if (!slash)
		snprintf(dir, sizeof dir, ".");
	else if (slash == path)
		snprintf(dir, sizeof dir, "/");
	else
		snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
	plat_fsync_dir(dir);
}

int plat_random(void *buf, size_t n)
{
	if (n > (size_t)0x7fffffff) {
		errno = EINVAL;
		return -1;
	}
	if (RAND_bytes(buf, (int)n) != 1) {
		errno = EIO;
		return -1;
	}
	return 0;
}

int plat_home_dir(char *out, size_t n)
{
	const char *h = getenv("HOME");
	if (!h || !*h) {
		struct passwd *pw = getpwuid(getuid());
		h = pw ? pw->pw_dir : NULL;
	}
	if (!h || !*h || (size_t)snprintf(out, n, "%s", h) >= n) {
		if (n)
			out[0] = '\0';
		errno = ENOENT;
		return -1;
	}
	return 0;
}

/* glibc's strverscmp: runs of digits compare as numbers, except that a run
 * with leading zeros is a fraction ("01" < "1", "009" < "01"). Only whole
 * numbers occur in llama.cpp's names (b4500, cuda-12.4), where it is plain
 * numeric order. */
int plat_strverscmp(const char *a, const char *b)
{
	const unsigned char *p = (const unsigned char *)a, *q = (const unsigned char *)b;
	for (;;) {
		if (isdigit(*p) && isdigit(*q)) {
			int pz = *p == '0', qz = *q == '0';
			if (pz || qz) {
				/* Fractional parts, compared digit by digit. Where one
				 * ends first: while only zeros were seen the longer is
				 * smaller ("000" < "00", "09" < "0"), after a nonzero
				 * digit it is larger ("01" < "010"). */
				if (pz != qz)
					return pz ? -1 : 1;
				int nonzero = 0;
				while (isdigit(*p) && isdigit(*q) && *p == *q) {
					nonzero |= *p != '0';
					p++;
					q++;
				}
				if (isdigit(*p) && isdigit(*q))
					return *p < *q ? -1 : 1;
				if (isdigit(*p) != isdigit(*q)) {
					int p_longer = isdigit(*p) != 0;
					return (p_longer == !nonzero) ? -1 : 1;
				}
				continue;
			}
			const unsigned char *ps = p, *qs = q;
			while (isdigit(*p))
				p++;
			while (isdigit(*q))
				q++;
			size_t lp = (size_t)(p - ps), lq = (size_t)(q - qs);
			if (lp != lq)
				return lp < lq ? -1 : 1;
			int c = memcmp(ps, qs, lp);
			if (c)
				return c < 0 ? -1 : 1;
			continue;
		}
		if (*p != *q)
			return *p < *q ? -1 : 1;
		if (!*p)
			return 0;
		p++;
		q++;
	}
}

/* A merge sort: stable, and the same order on every libc (glibc's qsort_r
 * is a merge sort too; the BSDs' are not stable). */
static void merge_sort(char *base, char *tmp, size_t n, size_t size,
                       int (*cmp)(const void *, const void *, void *), void *arg)
{
	if (n < 2)
		return;
	size_t h = n / 2;
	merge_sort(base, tmp, h, size, cmp, arg);
	merge_sort(base + h * size, tmp, n - h, size, cmp, arg);
	size_t i = 0, j = h, k = 0;
	while (i < h && j < n) {
		if (cmp(base + j * size, base + i * size, arg) < 0)
			memcpy(tmp + k++ * size, base + j++ * size, size);
		else
			memcpy(tmp + k++ * size, base + i++ * size, size);
	}
	while (i < h)
		memcpy(tmp + k++ * size, base + i++ * size, size);
	/* What is left of the right half is in place already. */
	memcpy(base, tmp, k * size);
}

int plat_qsort_r(void *base, size_t n, size_t size,
                 int (*cmp)(const void *a, const void *b, void *arg), void *arg)
{
	if (n < 2 || !size)
		return 0;
	if (n > SIZE_MAX / size) {
		errno = ENOMEM;
		return -1;
	}
	char *tmp = malloc(n * size);
	if (!tmp)
		return -1;
	merge_sort(base, tmp, n, size, cmp, arg);
	free(tmp);
	return 0;
}

#if defined(__APPLE__) || defined(__FreeBSD__)
int plat_sysctl_u64(const char *name, uint64_t *v)
{
	/* Some keys are 32 bits wide, some 64. */
	unsigned char buf[8] = {0};
	size_t len = sizeof buf;
	if (sysctlbyname(name, buf, &len, NULL, 0) != 0)
		return -1;
	if (len == 4) {
		uint32_t x;
		memcpy(&x, buf, 4);
		*v = x;
	} else if (len == 8) {
		memcpy(v, buf, 8);
	} else {
		errno = EINVAL;
		return -1;
	}
	return 0;
}

/* Both keep the ephemeral ports under net.inet.ip.portrange. */
int plat_os_ephemeral_ports(int *lo, int *hi)
{
	uint64_t first = 0, last = 0;
	if (plat_sysctl_u64("net.inet.ip.portrange.first", &first) != 0 ||
	    plat_sysctl_u64("net.inet.ip.portrange.last", &last) != 0)
		return -1;
	*lo = (int)first;
	*hi = (int)last;
	return 0;
}

/* Both keep the time of the boot under kern.boottime. */
int plat_boot_id(char *out, size_t n)
{
	struct timeval tv;
	size_t len = sizeof tv;
	if (sysctlbyname("kern.boottime", &tv, &len, NULL, 0) != 0 || len != sizeof tv)
		return -1;
	return (size_t)snprintf(out, n, "boottime:%lld.%06ld", (long long)tv.tv_sec,
	                        (long)tv.tv_usec) < n
	           ? 0
	           : -1;
}
#endif
