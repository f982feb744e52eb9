/* The platform layer: everything toki needs from the operating system that
 * differs between Linux, macOS and FreeBSD, behind one interface (as tmux's
 * osdep-*.c and compat/). Nothing outside src/platform/ uses a Linux- or
 * glibc-only interface (/proc, pipe2, SOCK_CLOEXEC, getrandom, strverscmp,
 * GNU qsort_r, prctl, epoll, sysinfo); tests/unit/test_platform.c checks it.
 *
 *   platform-linux.c    /proc (meminfo, PID/status, PID/stat), /proc/self/exe
 *   platform-darwin.c   _NSGetExecutablePath, sysctl hw.memsize, vm_stat,
 *                       proc_pidinfo, proc_listallpids; Metal's working set
 *   platform-freebsd.c  sysctl kern.proc, hw.physmem, vm.stats
 *   process.c           POSIX processes: spawn, stop, run-and-capture, the
 *                       child-exit watcher (the same on every Unix)
 *   parse.c             the pure parsers of what the OS and tools print,
 *                       compiled everywhere so their tests run on any host
 *   compat.c            strverscmp, qsort_r, cloexec pipes and sockets,
 *                       file locks, atomic replace, default folders
 *   service.c           systemd user units and launchd agents
 *
 * Every function returns 0 (or a documented value) on success and -1 with
 * errno set, or err filled, on failure. */
#ifndef TOKI_PLATFORM_H
#define TOKI_PLATFORM_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct event_base;

/* --- the machine ----------------------------------------------------------- */

/* "linux", "macos" or "freebsd" (what llama.cpp's release names say). */
const char *plat_os_name(void);

/* The running executable's absolute path. */
int plat_self_exe(char *out, size_t n);

/* A string that names this boot of the machine and changes at the next
 * (Linux's boot_id; the BSDs' and macOS's kern.boottime): what a verdict
 * about the drivers, kept across restarts of toki, is tied to. 0, or -1. */
int plat_boot_id(char *out, size_t n);

/* RAM in bytes: the total, and what a new program can take without
 * swapping (Linux's MemAvailable; macOS's free + inactive + purgeable +
 * speculative pages; FreeBSD's free + inactive + cache). */
struct plat_mem {
	uint64_t total;
	uint64_t available;
};
int plat_mem_read(struct plat_mem *m);

/* One accelerator llama-server sees, as `llama-server --list-devices`
 * prints it ("  CUDA0: NVIDIA H100 (81559 MiB, 80000 MiB free)"). On
 * Apple silicon Metal reports its recommended working set as the total,
 * which is what a model may use (about 65-75% of RAM). */
struct plat_gpu_device {
	char name[32];  /* CUDA0, ROCm0, Vulkan0, Metal, SYCL0, ... */
	char desc[128]; /* NVIDIA H100 80GB HBM3, Apple M3 Max, llvmpipe (...) */
	uint64_t total;
	uint64_t free;
};
#define PLAT_MAX_GPUS 16
struct plat_gpus {
	int n;
	struct plat_gpu_device dev[PLAT_MAX_GPUS];
	char source[32]; /* "llama-server --list-devices", "nvidia-smi", "metal default" */
};
/* The GPUs the llama-server binary (argv0, PATH searched; NULL: none) sees,
 * with env_extra ("NAME=value", may be NULL) in its environment; then
 * nvidia-smi; then, on Apple silicon, the default Metal working set of
 * RAM. CPU-only and software devices (llvmpipe, lavapipe) are left out
 * unless include_software. 0 with g->n >= 1, or -1 when none is found. */
int plat_gpu_read(const char *llama_server, char *const env_extra[], int include_software,
                  struct plat_gpus *g);
/* Whether a device is a software rasterizer (llvmpipe, lavapipe, SwiftShader). */
int plat_gpu_is_software(const struct plat_gpu_device *d);
/* Apple silicon: Metal's default working-set limit for that much RAM
 * (iogpu.wired_limit_mb when set, else 2/3 of RAM up to 36 GiB, 3/4 above). */
uint64_t plat_metal_working_set(uint64_t ram_total, uint64_t wired_limit_mb);
/* 1 on an Apple silicon Mac (Metal present), else 0. */
int plat_is_apple_silicon(void);

/* The logical CPUs this process may run on (Linux: its affinity mask, as
 * a cgroup or taskset leaves it; elsewhere: those online); at least 1. */
int plat_cpus(void);

/* A port on 127.0.0.1 for another process to listen on (llama-server's,
 * which toki picks and hands over): free now, and below the OS's ephemeral
 * range, so that no connection made meanwhile (each takes a local port from
 * that range) can hold it when that process binds it. A port bind(0) picked
 * could be taken so, and a closed connection's TIME_WAIT then keeps it
 * from the server for a minute. -1 when none is free. */
int plat_free_port(void);

/* A process's resident set in KiB, or -1. */
long plat_rss_kib(pid_t pid);

/* Sends sig (0: none) to every live process of session sid except the
 * caller; zombies are not counted. Returns how many there were. */
int plat_session_signal(pid_t sid, int sig);

/* --- the parsers (parse.c; pure, tested on recorded outputs) ----------------- */

int plat_parse_meminfo(const char *text, struct plat_mem *m);
/* /proc/PID/status: VmRSS in KiB, or -1. */
long plat_parse_proc_status_rss(const char *text);
/* /proc/PID/stat: state, ppid, pgrp, session (comm may hold anything). */
int plat_parse_proc_stat(const char *text, char *state, long *ppid, long *pgrp, long *session);
/* `sysctl hw.memsize` ("hw.memsize: 17179869184") or `sysctl -n` output. */
int plat_parse_sysctl_u64(const char *text, const char *key, uint64_t *v);
/* `vm_stat`: available = (free + inactive + purgeable + speculative) pages
 * times the page size its first line states; m->total is left alone. */
int plat_parse_vm_stat(const char *text, struct plat_mem *m);
/* `llama-server --list-devices`. Returns the number of devices (0 for
 * "(none)"), or -1 when the text is not that listing. */
int plat_parse_list_devices(const char *text, struct plat_gpus *g);
/* `nvidia-smi --query-gpu=name,memory.total,memory.used
 * --format=csv,noheader,nounits`. Returns the number of GPUs, or -1. */
int plat_parse_nvidia_smi(const char *text, struct plat_gpus *g);

/* --- processes (process.c) ----------------------------------------------- */

enum plat_detach {
	PLAT_SAME_GROUP = 0, /* the caller's process group */
	PLAT_NEW_GROUP,      /* a process group of its own: ^C reaches only us */
	PLAT_NEW_SESSION,    /* a session of its own: outlives the caller */
};

struct plat_spawn {
	char *const *argv;         /* argv[0] PATH-searched unless file is set or it has a '/' */
	const char *file;          /* the program to run, or NULL */
	char *const *env_extra;    /* "NAME=value" added to the environment, or NULL */
	int fd_in, fd_out, fd_err; /* -1: /dev/null */
	enum plat_detach detach;
};
/* Starts it; the child's exec failure is reported on its fd_err and as exit
 * status 127. Returns the pid, or -1 with err set. */
pid_t plat_spawn(const struct plat_spawn *s, char *err, size_t errlen);

/* Waits for a child up to timeout_ms (< 0: forever). 1 when it exited
 * (*status set), 0 when it still runs, -1 on error. */
int plat_wait(pid_t pid, int timeout_ms, int *status);
/* Whether pid names a live process (a zombie child is reaped first, so it
 * does not count). */
int plat_alive(pid_t pid);
/* Stops pid (its whole process group when group): SIGTERM, up to
 * timeout_ms, then SIGKILL. Reaps it when it is our child. 1 when it had
 * to be killed, 0 when it stopped on SIGTERM or was already gone. */
int plat_stop(pid_t pid, int group, int timeout_ms);

/* Runs a command to its end and captures its output: the one way toki runs
 * a probe (nvidia-smi, rocminfo, vulkaninfo, llama-server --list-devices,
 * --version). The command gets a process group of its own, killed whole
 * after timeout_ms (a wedged GPU driver can hang a probe for minutes). */
struct plat_cmd {
	char *const *argv;      /* argv[0] PATH-searched unless it has a '/' */
	char *const *env_extra; /* or NULL */
	int timeout_ms;         /* <= 0: 10 s */
	int merge_stderr;       /* 1: stderr into the capture; 0: /dev/null */
};
/* out (n bytes, NUL-terminated; NULL: output discarded) gets what it
 * printed; *overflow (may be NULL) is set when it printed more. Returns
 * its exit status, or -1 when it could not run, was killed by a signal or
 * timed out (*timed_out set, may be NULL). */
int plat_run(const struct plat_cmd *c, char *out, size_t n, int *overflow, int *timed_out);

/* The child-exit watcher: fn(pid, status, arg) for each child that exits,
 * from the event loop (SIGCHLD through libevent, then waitpid until none
 * is left). One a process. */
struct plat_child_watch;
struct plat_child_watch *plat_child_watch_new(struct event_base *base,
                                              void (*fn)(pid_t pid, int status, void *arg),
                                              void *arg);
void plat_child_watch_free(struct plat_child_watch *w);

/* --- files, descriptors, strings (compat.c) ------------------------------ */

/* A pipe whose ends are close-on-exec (and non-blocking with nonblock). */
int plat_pipe(int fds[2], int nonblock);
/* socket(2) with close-on-exec set. */
int plat_socket(int domain, int type, int protocol);
/* flock(2): exclusive or shared, waiting or not (EWOULDBLOCK). EINTR is
 * retried. */
int plat_lock(int fd, int exclusive, int wait);
/* Replaces path with data atomically: a temporary file beside it, fsync,
 * rename over, fsync of the folder. */
int plat_replace_file(const char *path, const void *data, size_t len, unsigned mode);
/* fsync(2) of a folder, or of the folder a path is in: what makes a rename
 * or a new file in it durable. Best effort (some filesystems refuse it). */
void plat_fsync_dir(const char *dir);
void plat_fsync_dir_of(const char *path);
/* Fills buf with n random bytes (OpenSSL's RAND_bytes). */
int plat_random(void *buf, size_t n);
/* The home folder ($HOME, else the password database). */
int plat_home_dir(char *out, size_t n);
/* Version-aware comparison, as glibc's strverscmp: "b100" > "b99". */
int plat_strverscmp(const char *a, const char *b);
/* qsort with a context argument, the same on every libc. Stable. */
int plat_qsort_r(void *base, size_t n, size_t size,
                 int (*cmp)(const void *a, const void *b, void *arg), void *arg);

/* --- the service manager (service.c) ------------------------------------- */

/* A systemd user unit (Linux) or a launchd agent (macOS) that runs toki at
 * login, restarts it after a crash, and leaves it stopped after a clean
 * exit (toki down). */
enum plat_service_kind {
	PLAT_SERVICE_SYSTEMD,
	PLAT_SERVICE_LAUNCHD,
};
struct plat_service {
	char *const *argv;    /* the command, its program an absolute path */
	char *const *env;     /* "NAME=value" it runs with, or NULL */
	const char *log_path; /* its stdout and stderr */
	const char *workdir;  /* or NULL */
};
/* This OS's manager. */
enum plat_service_kind plat_service_default(void);
const char *plat_service_kind_name(enum plat_service_kind k);
/* The unit's or the plist's text (owned by the caller), or NULL. */
char *plat_service_render(enum plat_service_kind k, const struct plat_service *s);
/* Where it goes: $XDG_CONFIG_HOME/systemd/user/tokirecur.service (else
 * ~/.config/...), or ~/Library/LaunchAgents/com.tokirecur.toki.plist. */
int plat_service_path(enum plat_service_kind k, char *out, size_t n);
/* Loads and starts the written file (systemctl --user daemon-reload and
 * enable --now; launchctl bootstrap gui/UID), or stops and unloads it.
 * 0, or -1 with err saying what the manager said. */
int plat_service_enable(enum plat_service_kind k, const char *path, char *err, size_t errlen);
int plat_service_disable(enum plat_service_kind k, char *err, size_t errlen);
/* The manager's word for its state: "active", "inactive", "failed",
 * "running", ...; -1 (out says why) when the manager cannot be asked. */
int plat_service_state(enum plat_service_kind k, char *out, size_t n);

#endif
