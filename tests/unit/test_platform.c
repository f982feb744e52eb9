/* The platform layer (src/platform/): every parser on outputs recorded from
 * real machines (Linux /proc, macOS sysctl and vm_stat, llama-server
 * --list-devices from CUDA, ROCm, Metal and Vulkan builds, nvidia-smi), the
 * compat functions against glibc's own where there is one, the process
 * functions on real children, and the rule that nothing outside the layer
 * uses a Linux- or glibc-only interface. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#ifdef __linux__
#include <sched.h>
#endif
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "platform/platform.h"
#include "tmpdir.h"

#define MiB (UINT64_C(1) << 20)
#define KiB UINT64_C(1024)

static int setup(void **state)
{
	return tmpdir_make("toki-platform");
}

static int teardown(void **state)
{
	tmpdir_remove();
	return 0;
}

/* --- Linux /proc ------------------------------------------------------------ */

static void test_meminfo(void **state)
{
	struct plat_mem m;
	/* An 8 GB machine's /proc/meminfo, abridged. */
	const char *m8 = "MemTotal:        8039596 kB\n"
	                 "MemFree:          512000 kB\n"
	                 "MemAvailable:    6291456 kB\n"
	                 "Buffers:          100000 kB\n"
	                 "Cached:          4000000 kB\n";
	assert_int_equal(plat_parse_meminfo(m8, &m), 0);
	assert_int_equal(m.total, UINT64_C(8039596) * KiB);
	assert_int_equal(m.available, UINT64_C(6291456) * KiB);
	/* Without MemAvailable (kernels before 3.14): MemFree + Buffers + Cached. */
	const char *old = "MemTotal:       16384000 kB\nMemFree:  1000 kB\nBuffers: 200 kB\n"
	                  "Cached:  30 kB\nSwapCached: 5 kB\n";
	assert_int_equal(plat_parse_meminfo(old, &m), 0);
	assert_int_equal(m.available, 1230u * KiB);
	/* Available is never more than total. */
	assert_int_equal(plat_parse_meminfo("MemTotal: 100 kB\nMemAvailable: 200 kB\n", &m), 0);
	assert_int_equal(m.available, 100u * KiB);
	/* Broken: no MemTotal, zero, garbage, no MemFree either, overflow. */
	const char *bad[] = {"",
	                     "MemFree: 5 kB\n",
	                     "MemTotal: 0 kB\nMemAvailable: 0 kB\n",
	                     "MemTotal: lots\n",
	                     "MemTotal: 100 kB\n",
	                     "MemTotal: 99999999999999999999 kB\n",
	                     "MemTotal: 18014398509481984 kB\n",
	                     "MemTotalX: 5 kB\n"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		if (plat_parse_meminfo(bad[i], &m) != -1)
			fail_msg("accepted '%s'", bad[i]);
}

static void test_proc_status_and_stat(void **state)
{
	/* /proc/PID/status of a llama-server, abridged. */
	const char *status = "Name:\tllama-server\nUmask:\t0022\nState:\tS (sleeping)\n"
	                     "VmPeak:\t 2391232 kB\nVmRSS:\t  812344 kB\nRssAnon:\t  40960 kB\n";
	assert_int_equal(plat_parse_proc_status_rss(status), 812344);
	assert_int_equal(plat_parse_proc_status_rss("Name:\tkthreadd\nState:\tS\n"), -1);
	assert_int_equal(plat_parse_proc_status_rss("VmRSSX:\t5 kB\n"), -1);

	char state_c;
	long ppid, pgrp, sid;
	/* A comm with spaces and parentheses: parsed from the last ')'. */
	const char *stat = "4242 (toki (serve) x) S 1 4242 4240 0 -1 4194560 1234 0 0 0";
	assert_int_equal(plat_parse_proc_stat(stat, &state_c, &ppid, &pgrp, &sid), 0);
	assert_int_equal(state_c, 'S');
	assert_int_equal(ppid, 1);
	assert_int_equal(pgrp, 4242);
	assert_int_equal(sid, 4240);
	assert_int_equal(plat_parse_proc_stat("77 (x) Z 5 77 77 0", &state_c, &ppid, &pgrp, &sid),
	                 0);
	assert_int_equal(state_c, 'Z');
	assert_int_equal(plat_parse_proc_stat("4242 toki S 1 2 3", &state_c, &ppid, &pgrp, &sid),
	                 -1);
	assert_int_equal(plat_parse_proc_stat("4242 (toki) S 1", &state_c, &ppid, &pgrp, &sid), -1);
}

/* --- macOS sysctl and vm_stat -------------------------------------------------- */

static void test_sysctl(void **state)
{
	uint64_t v = 0;
	/* `sysctl hw.memsize` on a 16 GB M2 MacBook Air, and `sysctl -n`. */
	assert_int_equal(plat_parse_sysctl_u64("hw.memsize: 17179869184\n", "hw.memsize", &v), 0);
	assert_int_equal(v, UINT64_C(17179869184));
	assert_int_equal(plat_parse_sysctl_u64("68719476736\n", "hw.memsize", &v), 0);
	assert_int_equal(v, UINT64_C(68719476736));
	/* FreeBSD's sysctl prints the same shape; "=" on some others. */
	assert_int_equal(plat_parse_sysctl_u64("hw.physmem = 34359738368", "hw.physmem", &v), 0);
	assert_int_equal(v, UINT64_C(34359738368));
	/* iogpu.wired_limit_mb unset reads 0. */
	assert_int_equal(
	    plat_parse_sysctl_u64("iogpu.wired_limit_mb: 0\n", "iogpu.wired_limit_mb", &v), 0);
	assert_int_equal(v, 0);
	const char *bad[] = {"",
	                     "hw.memsize:",
	                     "hw.memsize: lots",
	                     "hw.memsize: 12 GB",
	                     "sysctl: unknown oid 'hw.memsize'",
	                     "hw.pagesize: 16384 16384"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		if (plat_parse_sysctl_u64(bad[i], "hw.memsize", &v) != -1)
			fail_msg("accepted '%s'", bad[i]);
}

static void test_vm_stat(void **state)
{
	/* `vm_stat` on an M1 Pro with 32 GB (16 KiB pages), as macOS 14 prints it. */
	const char *out = "Mach Virtual Memory Statistics: (page size of 16384 bytes)\n"
	                  "Pages free:                                6000.\n"
	                  "Pages active:                            700000.\n"
	                  "Pages inactive:                          690000.\n"
	                  "Pages speculative:                         4000.\n"
	                  "Pages throttled:                              0.\n"
	                  "Pages wired down:                        200000.\n"
	                  "Pages purgeable:                          30000.\n"
	                  "\"Translation faults\":                 123456789.\n"
	                  "Pages copy-on-write:                    4567890.\n"
	                  "Pages stored in compressor:              400000.\n"
	                  "Pages occupied by compressor:            150000.\n";
	struct plat_mem m = {.total = UINT64_C(32) << 30};
	assert_int_equal(plat_parse_vm_stat(out, &m), 0);
	assert_int_equal(m.available, (UINT64_C(6000) + 690000 + 30000 + 4000) * 16384);
	assert_int_equal(m.total, UINT64_C(32) << 30); /* left alone */
	/* An Intel Mac's 4 KiB pages, no purgeable line. */
	const char *intel = "Mach Virtual Memory Statistics: (page size of 4096 bytes)\n"
	                    "Pages free:                               10.\n"
	                    "Pages inactive:                           20.\n";
	m.total = 0;
	assert_int_equal(plat_parse_vm_stat(intel, &m), 0);
	assert_int_equal(m.available, 30 * 4096);
	/* Never more than the total, when it is known. */
	m.total = 4096;
	assert_int_equal(plat_parse_vm_stat(intel, &m), 0);
	assert_int_equal(m.available, 4096);
	const char *bad[] = {
	    "", "Pages free: 10.\nPages inactive: 20.\n",
	    "Mach Virtual Memory Statistics: (page size of 4096 bytes)\nPages free: 1.\n",
	    "Mach Virtual Memory Statistics: (page size of x bytes)\nPages free: "
	    "1.\nPages inactive: 1.\n"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		if (plat_parse_vm_stat(bad[i], &m) != -1)
			fail_msg("accepted '%s'", bad[i]);
}

static void test_metal_working_set(void **state)
{
	/* Apple's recommendedMaxWorkingSetSize: about 2/3 of RAM up to 36 GiB,
	 * 3/4 above; a user's iogpu.wired_limit_mb wins. */
	assert_int_equal(plat_metal_working_set(UINT64_C(16) << 30, 0),
	                 (UINT64_C(16) << 30) / 3 * 2);
	assert_int_equal(plat_metal_working_set(UINT64_C(36) << 30, 0), UINT64_C(24) << 30);
	assert_int_equal(plat_metal_working_set(UINT64_C(64) << 30, 0), UINT64_C(48) << 30);
	assert_int_equal(plat_metal_working_set(UINT64_C(128) << 30, 0), UINT64_C(96) << 30);
	assert_int_equal(plat_metal_working_set(UINT64_C(64) << 30, 57344), UINT64_C(56) << 30);
}

/* --- llama-server --list-devices and nvidia-smi ----------------------------------- */

static void test_list_devices(void **state)
{
	struct plat_gpus g;
	/* A CUDA build on two GPUs, with the backend's own log before the list
	 * (both on the same pipe: stderr is merged). */
	const char *cuda = "ggml_cuda_init: GGML_CUDA_FORCE_MMQ:    no\n"
	                   "ggml_cuda_init: found 2 CUDA devices:\n"
	                   "  Device 0: NVIDIA GeForce RTX 4090, compute capability 8.9, VMM: yes\n"
	                   "  Device 1: NVIDIA GeForce RTX 3090, compute capability 8.6, VMM: yes\n"
	                   "load_backend: loaded CUDA backend from /opt/llama/libggml-cuda.so\n"
	                   "Available devices:\n"
	                   "  CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23517 MiB free)\n"
	                   "  CUDA1: NVIDIA GeForce RTX 3090 (24135 MiB, 23850 MiB free)\n";
	assert_int_equal(plat_parse_list_devices(cuda, &g), 2);
	assert_string_equal(g.dev[0].name, "CUDA0");
	assert_string_equal(g.dev[0].desc, "NVIDIA GeForce RTX 4090");
	assert_int_equal(g.dev[0].total, 24080 * MiB);
	assert_int_equal(g.dev[0].free, 23517 * MiB);
	assert_string_equal(g.dev[1].name, "CUDA1");
	assert_int_equal(g.dev[1].free, 23850 * MiB);
	assert_string_equal(g.source, "llama-server --list-devices");
	assert_false(plat_gpu_is_software(&g.dev[0]));

	/* Metal on an M3 Max with 64 GB: its total is the working set. */
	const char *metal = "ggml_metal_init: found device: Apple M3 Max\n"
	                    "Available devices:\n"
	                    "  Metal: Apple M3 Max (49152 MiB, 49151 MiB free)\n"
	                    "  BLAS: Accelerate (0 MiB, 0 MiB free)\n";
	assert_int_equal(plat_parse_list_devices(metal, &g), 2);
	assert_string_equal(g.dev[0].name, "Metal");
	assert_string_equal(g.dev[0].desc, "Apple M3 Max");
	assert_int_equal(g.dev[0].total, 49152 * MiB);

	/* Vulkan on Mesa's lavapipe (this machine's test server): the
	 * description has parentheses of its own, and it is software. */
	const char *lvp =
	    "Available devices:\n"
	    "  Vulkan0: llvmpipe (LLVM 22.1.8, 256 bits) (24105 MiB, 23767 MiB free)\n";
	assert_int_equal(plat_parse_list_devices(lvp, &g), 1);
	assert_string_equal(g.dev[0].desc, "llvmpipe (LLVM 22.1.8, 256 bits)");
	assert_int_equal(g.dev[0].total, 24105 * MiB);
	assert_true(plat_gpu_is_software(&g.dev[0]));

	/* ROCm, and a line after the list that is not part of it. */
	const char *rocm = "Available devices:\n"
	                   "  ROCm0: AMD Radeon RX 7900 XTX (24560 MiB, 24462 MiB free)\n"
	                   "main: exiting\n";
	assert_int_equal(plat_parse_list_devices(rocm, &g), 1);
	assert_string_equal(g.dev[0].name, "ROCm0");

	/* The CPU build: no device. */
	assert_int_equal(plat_parse_list_devices("Available devices:\n  (none)\n", &g), 0);
	assert_int_equal(g.n, 0);
	/* Not that listing at all (an old build that does not know the flag). */
	assert_int_equal(plat_parse_list_devices("error: invalid argument: --list-devices\n", &g),
	                 -1);
	assert_int_equal(plat_parse_list_devices("", &g), -1);
}

static void test_nvidia_smi(void **state)
{
	struct plat_gpus g;
	assert_int_equal(plat_parse_nvidia_smi("NVIDIA H200, 143771, 1234\n", &g), 1);
	assert_string_equal(g.dev[0].desc, "NVIDIA H200");
	assert_int_equal(g.dev[0].total, 143771 * MiB);
	assert_int_equal(g.dev[0].free, (143771 - 1234) * MiB);
	assert_string_equal(g.source, "nvidia-smi");
	/* Two GPUs; CRLF and spacing are tolerated; a name with commas. */
	assert_int_equal(plat_parse_nvidia_smi("A, B, 24576, 1000\r\n  X,  8192 ,0\n\n", &g), 2);
	assert_string_equal(g.dev[0].desc, "A, B");
	assert_int_equal(g.dev[1].total, 8192 * MiB);
	assert_int_equal(g.dev[1].free, 8192 * MiB);
	/* Without the name column. */
	assert_int_equal(plat_parse_nvidia_smi("81559, 1234\n", &g), 1);
	assert_string_equal(g.dev[0].desc, "");
	/* Used above total (it happens mid-allocation) means none free. */
	assert_int_equal(plat_parse_nvidia_smi("X, 100, 200\n", &g), 1);
	assert_int_equal(g.dev[0].free, 0);
	const char *bad[] = {"",
	                     "\n",
	                     "X, [N/A], [N/A]\n",
	                     "No devices were found\n",
	                     "8192\n",
	                     "X, 8192, \n",
	                     "X, 8192, 10 MiB\n",
	                     "X, 8192, 10\nY, [N/A], 1\n",
	                     "X, 0, 0\n",
	                     "X, 99999999999999999999, 1\n"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		if (plat_parse_nvidia_smi(bad[i], &g) != -1)
			fail_msg("accepted '%s'", bad[i]);
}

/* --- compat ---------------------------------------------------------------------- */

static int sign(int x)
{
	return (x > 0) - (x < 0);
}

static void test_strverscmp(void **state)
{
	/* glibc's documented order. */
	const char *order[] = {"000", "00", "01", "010", "09", "0", "1", "9", "10"};
	size_t n = sizeof order / sizeof order[0];
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < n; j++)
			if (sign(plat_strverscmp(order[i], order[j])) != sign((int)i - (int)j))
				fail_msg("%s vs %s", order[i], order[j]);
	/* llama.cpp's names. */
	const char *names[] = {"b99",       "b100",      "b4500",     "b4500", "cuda-12.4",
	                       "cuda-12.8", "cuda-13.0", "cuda-13.4", "12.10", "12.9",
	                       "x",         "x1",        "",          "a0b",   "a00b"};
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		for (size_t j = 0; j < sizeof names / sizeof names[0]; j++) {
			int got = sign(plat_strverscmp(names[i], names[j]));
#ifdef __GLIBC__
			/* The same answers as glibc's own, where there is one. */
			int want = sign(strverscmp(names[i], names[j]));
			if (got != want)
				fail_msg("%s vs %s: %d, glibc %d", names[i], names[j], got, want);
#endif
			assert_int_equal(got, -sign(plat_strverscmp(names[j], names[i])));
		}
	assert_true(plat_strverscmp("b100", "b99") > 0);
	assert_true(plat_strverscmp("cuda-13.4", "cuda-12.8") > 0);
	assert_true(plat_strverscmp("12.10", "12.9") > 0);
	assert_int_equal(plat_strverscmp("b4500", "b4500"), 0);
}

struct item {
	int key, seq;
};

static int by_key(const void *a, const void *b, void *arg)
{
	int *calls = arg;
	(*calls)++;
	const struct item *x = a, *y = b;
	return (x->key > y->key) - (x->key < y->key);
}

static void test_qsort_r(void **state)
{
	struct item v[200];
	unsigned seed = 7;
	for (int i = 0; i < 200; i++) {
		seed = seed * 1103515245u + 12345u;
		v[i].key = (int)((seed >> 16) % 13);
		v[i].seq = i;
	}
	int calls = 0;
	assert_int_equal(plat_qsort_r(v, 200, sizeof v[0], by_key, &calls), 0);
	assert_true(calls > 0); /* the context reaches the comparison */
	for (int i = 1; i < 200; i++) {
		assert_true(v[i - 1].key <= v[i].key);
		if (v[i - 1].key == v[i].key) /* stable */
			assert_true(v[i - 1].seq < v[i].seq);
	}
	assert_int_equal(plat_qsort_r(v, 0, sizeof v[0], by_key, &calls), 0);
	assert_int_equal(plat_qsort_r(v, 1, sizeof v[0], by_key, &calls), 0);
}

static void test_fds_and_files(void **state)
{
	int p[2];
	assert_int_equal(plat_pipe(p, 0), 0);
	assert_true(fcntl(p[0], F_GETFD) & FD_CLOEXEC);
	assert_true(fcntl(p[1], F_GETFD) & FD_CLOEXEC);
	assert_false(fcntl(p[0], F_GETFL) & O_NONBLOCK);
	close(p[0]);
	close(p[1]);
	assert_int_equal(plat_pipe(p, 1), 0);
	assert_true(fcntl(p[0], F_GETFL) & O_NONBLOCK);
	assert_true(fcntl(p[1], F_GETFL) & O_NONBLOCK);
	close(p[0]);
	close(p[1]);
	int s = plat_socket(AF_INET, SOCK_STREAM, 0);
	assert_true(s >= 0);
	assert_true(fcntl(s, F_GETFD) & FD_CLOEXEC);
	close(s);

	/* Atomic replacement: the new content whole, no temporary left. */
	char path[600];
	snprintf(path, sizeof path, "%s/ctx", tmpdir);
	assert_int_equal(plat_replace_file(path, "1\n", 2, 0600), 0);
	assert_int_equal(plat_replace_file(path, "23040\n", 6, 0600), 0);
	char buf[32] = {0};
	FILE *f = fopen(path, "r");
	assert_non_null(f);
	assert_int_equal(fread(buf, 1, sizeof buf - 1, f), 6);
	fclose(f);
	assert_string_equal(buf, "23040\n");
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	DIR *d = opendir(tmpdir);
	struct dirent *e;
	int files = 0;
	while ((e = readdir(d)))
		files += e->d_name[0] != '.';
	closedir(d);
	assert_int_equal(files, 1);
	/* A folder that does not exist: an error, nothing written. */
	char nowhere[700];
	snprintf(nowhere, sizeof nowhere, "%s/no/such/file", tmpdir);
	assert_int_equal(plat_replace_file(nowhere, "x", 1, 0600), -1);
	assert_int_equal(errno, ENOENT);

	/* Locks: a second descriptor cannot take an exclusive one. */
	int a = open(path, O_RDWR), b = open(path, O_RDWR);
	assert_int_equal(plat_lock(a, 1, 0), 0);
	assert_int_equal(plat_lock(b, 1, 0), -1);
	assert_true(errno == EWOULDBLOCK || errno == EAGAIN);
	close(a);
	assert_int_equal(plat_lock(b, 1, 0), 0);
	close(b);

	unsigned char r1[32] = {0}, r2[32] = {0};
	assert_int_equal(plat_random(r1, sizeof r1), 0);
	assert_int_equal(plat_random(r2, sizeof r2), 0);
	assert_memory_not_equal(r1, r2, sizeof r1);

	char home[512];
	char *saved = getenv("HOME") ? strdup(getenv("HOME")) : NULL;
	setenv("HOME", "/somewhere/else", 1);
	assert_int_equal(plat_home_dir(home, sizeof home), 0);
	assert_string_equal(home, "/somewhere/else");
	/* Without HOME (a service manager may start toki so): the password
	 * database. */
	unsetenv("HOME");
	assert_int_equal(plat_home_dir(home, sizeof home), 0);
	assert_true(home[0] == '/');
	if (saved) {
		setenv("HOME", saved, 1);
		free(saved);
	}
	assert_int_equal(plat_home_dir(home, 2), -1); /* does not fit */
}

/* --- the machine and processes ----------------------------------------------------- */

static void test_machine(void **state)
{
	char exe[4096];
	assert_int_equal(plat_self_exe(exe, sizeof exe), 0);
	assert_true(exe[0] == '/');
	const char *base = strrchr(exe, '/') + 1;
	assert_string_equal(base, "test_platform");
	assert_int_equal(plat_self_exe(exe, 4), -1); /* does not fit */

	/* This boot's name: the same when asked again, never empty. */
	char boot[128], again[128];
	assert_int_equal(plat_boot_id(boot, sizeof boot), 0);
	assert_true(strlen(boot) >= 8);
	assert_int_equal(plat_boot_id(again, sizeof again), 0);
	assert_string_equal(boot, again);

	struct plat_mem m;
	assert_int_equal(plat_mem_read(&m), 0);
	assert_true(m.total > 64 * MiB);
	assert_true(m.available > 0 && m.available <= m.total);

	long rss = plat_rss_kib(getpid());
	assert_true(rss > 100 && rss < 10 * 1024 * 1024);
	assert_int_equal(plat_rss_kib(0x7ffffff0), -1);
#ifdef __linux__
	assert_string_equal(plat_os_name(), "linux");
	assert_int_equal(plat_is_apple_silicon(), 0);
#endif

	/* The CPUs: at least one, no more than are online; on Linux the
	 * affinity mask's (taskset, a cgroup's cpuset). */
	int cpus = plat_cpus();
	assert_true(cpus >= 1 && cpus <= sysconf(_SC_NPROCESSORS_ONLN));
#ifdef __linux__
	cpu_set_t all, one;
	assert_int_equal(sched_getaffinity(0, sizeof all, &all), 0);
	CPU_ZERO(&one);
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &all)) {
			CPU_SET(c, &one);
			break;
		}
	assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
	assert_int_equal(plat_cpus(), 1);
	assert_int_equal(sched_setaffinity(0, sizeof all, &all), 0);
	assert_int_equal(plat_cpus(), cpus);
#endif
}

/* A port for llama-server: free, and below the OS's ephemeral range, where
 * no connection's local port can take it before the server binds it. */
static void test_free_port(void **state)
{
	int lo = 32768;
#ifdef __linux__
	FILE *f = fopen("/proc/sys/net/ipv4/ip_local_port_range", "r");
	assert_non_null(f);
	assert_int_equal(fscanf(f, "%d", &lo), 1);
	fclose(f);
#endif
	for (int i = 0; i < 20; i++) {
		int port = plat_free_port();
		assert_true(port >= lo - 10000 && port < lo);
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		struct sockaddr_in a = {.sin_family = AF_INET,
		                        .sin_port = htons((uint16_t)port),
		                        .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
		assert_int_equal(listen(fd, 1), 0);
		/* Taken now: the next pick is another port. */
		assert_int_not_equal(plat_free_port(), port);
		close(fd);
	}
}

static void test_run(void **state)
{
	char out[256];
	int over = -1, late = -1;
	char *const echo[] = {"sh", "-c", "echo hello; echo err >&2; exit 3", NULL};
	struct plat_cmd c = {.argv = echo, .timeout_ms = 10000};
	assert_int_equal(plat_run(&c, out, sizeof out, &over, &late), 3);
	assert_string_equal(out, "hello\n"); /* stderr to /dev/null */
	assert_int_equal(over, 0);
	assert_int_equal(late, 0);
	c.merge_stderr = 1;
	assert_int_equal(plat_run(&c, out, sizeof out, NULL, NULL), 3);
	assert_non_null(strstr(out, "hello\n"));
	assert_non_null(strstr(out, "err\n"));

	/* The environment given reaches it. */
	char env1[] = "TOKI_PLAT_TEST=42";
	char *env[] = {env1, NULL};
	char *const show[] = {"sh", "-c", "printf %s \"$TOKI_PLAT_TEST\"", NULL};
	struct plat_cmd e = {.argv = show, .env_extra = env};
	assert_int_equal(plat_run(&e, out, sizeof out, NULL, NULL), 0);
	assert_string_equal(out, "42");
	assert_null(getenv("TOKI_PLAT_TEST")); /* not ours */

	/* More output than fits: drained, cut, and said. */
	char small[8];
	char *const lots[] = {"sh", "-c",
	                      "i=0; while [ $i -lt 2000 ]; do echo 0123456789; "
	                      "i=$((i+1)); done",
	                      NULL};
	struct plat_cmd l = {.argv = lots};
	assert_int_equal(plat_run(&l, small, sizeof small, &over, NULL), 0);
	assert_int_equal(over, 1);
	assert_int_equal(strlen(small), sizeof small - 1);
	/* Output discarded. */
	assert_int_equal(plat_run(&l, NULL, 0, &over, NULL), 0);
	assert_int_equal(over, 0);

	/* A hung command is killed at the deadline with its whole group (a
	 * grandchild holding the pipe would otherwise keep it open). */
	char *const hang[] = {"sh", "-c", "sleep 30 & sleep 30", NULL};
	struct plat_cmd h = {.argv = hang, .timeout_ms = 300};
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	assert_int_equal(plat_run(&h, out, sizeof out, NULL, &late), -1);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	assert_int_equal(late, 1);
	assert_true(t1.tv_sec - t0.tv_sec < 10);

	/* Not found: 127, as a shell says. */
	char *const none[] = {"toki-no-such-program", NULL};
	struct plat_cmd x = {.argv = none};
	assert_int_equal(plat_run(&x, out, sizeof out, NULL, NULL), 127);
	/* Killed by a signal. */
	char *const sig[] = {"sh", "-c", "kill -9 $$", NULL};
	struct plat_cmd k = {.argv = sig};
	assert_int_equal(plat_run(&k, out, sizeof out, NULL, &late), -1);
	assert_int_equal(late, 0);
}

static void test_spawn_stop(void **state)
{
	char err[256];
	/* A child that ignores SIGTERM is killed after the timeout. It says
	 * when its trap is set, and the test waits for that line. */
	int p[2];
	assert_int_equal(plat_pipe(p, 0), 0);
	char *const stubborn[] = {"sh", "-c", "trap '' TERM; echo ready; while :; do sleep 1; done",
	                          NULL};
	struct plat_spawn s = {
	    .argv = stubborn, .fd_in = -1, .fd_out = p[1], .fd_err = -1, .detach = PLAT_NEW_GROUP};
	pid_t pid = plat_spawn(&s, err, sizeof err);
	close(p[1]);
	assert_true(pid > 0);
	assert_int_equal(getpgid(pid), pid);
	char line[16] = {0};
	assert_int_equal(read(p[0], line, 6), 6);
	assert_string_equal(line, "ready\n");
	close(p[0]);
	assert_true(plat_alive(pid));
	int status;
	assert_int_equal(plat_wait(pid, 0, &status), 0); /* still running */
	assert_int_equal(plat_stop(pid, 1, 500), 1);
	assert_false(plat_alive(pid));

	/* One that stops on SIGTERM: reaped, so no zombie is left. */
	char *const meek[] = {"sleep", "30", NULL};
	s.argv = meek;
	s.fd_out = -1;
	pid = plat_spawn(&s, err, sizeof err);
	assert_true(pid > 0);
	assert_int_equal(plat_stop(pid, 0, 5000), 0);
	assert_int_equal(kill(pid, 0), -1);
	assert_int_equal(errno, ESRCH);
	assert_int_equal(plat_stop(pid, 0, 100), 0); /* already gone */

	/* Exit status through plat_wait; a zombie child is not alive. */
	char *const quick[] = {"sh", "-c", "exit 5", NULL};
	s.argv = quick;
	pid = plat_spawn(&s, err, sizeof err);
	assert_int_equal(plat_wait(pid, 10000, &status), 1);
	assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 5);
	pid = plat_spawn(&s, err, sizeof err);
	/* Wait for it to exit without reaping it (waitid WNOWAIT), then
	 * plat_alive must reap and say no. */
	siginfo_t si;
	assert_int_equal(waitid(P_PID, (id_t)pid, &si, WEXITED | WNOWAIT), 0);
	assert_int_equal(kill(pid, 0), 0); /* a zombie answers kill */
	assert_false(plat_alive(pid));
	assert_int_equal(kill(pid, 0), -1);

	/* A zombie that is not ours (its parent, here a child of ours that
	 * never reaps, may be a service manager or a shell) has exited all the
	 * same: not alive, though kill(pid, 0) still finds it. */
	int zp[2];
	assert_int_equal(plat_pipe(zp, 0), 0);
	pid_t holder = fork();
	assert_true(holder >= 0);
	if (holder == 0) {
		pid_t z = fork();
		if (z == 0)
			_exit(0);
		if (write(zp[1], &z, sizeof z) != (ssize_t)sizeof z)
			_exit(1);
		for (;;)
			pause(); /* never reaps z */
	}
	close(zp[1]);
	pid_t zombie = 0;
	assert_int_equal(read(zp[0], &zombie, sizeof zombie), (ssize_t)sizeof zombie);
	close(zp[0]);
	assert_true(zombie > 0);
	int gone = 0;
	for (int i = 0; i < 500 && !gone; i++) { /* until it has exited */
		gone = !plat_alive(zombie);
		if (!gone) {
			struct timespec ts = {0, 10 * 1000 * 1000};
			nanosleep(&ts, NULL);
		}
	}
	assert_true(gone);
	assert_int_equal(kill(zombie, 0), 0); /* still there, unreaped */
	assert_true(plat_alive(holder));
	kill(holder, SIGKILL);
	assert_int_equal(plat_wait(holder, 10000, &status), 1);

	/* A new session: plat_session_signal finds its members (the shell
	 * and its background child) and stops them. */
	char *const sess[] = {"sh", "-c", "sleep 30 & wait", NULL};
	s.argv = sess;
	s.detach = PLAT_NEW_SESSION;
	pid = plat_spawn(&s, err, sizeof err);
	assert_true(pid > 0);
	int found = 0;
	for (int i = 0; i < 500 && found < 2; i++) { /* until the shell has forked */
		found = plat_session_signal(pid, 0);
		if (found < 2) {
			struct timespec ts = {0, 10 * 1000 * 1000};
			nanosleep(&ts, NULL);
		}
	}
	assert_int_equal(found, 2);
	assert_int_equal(getsid(pid), pid);
	assert_int_equal(plat_session_signal(pid, SIGKILL), 2);
	assert_int_equal(plat_wait(pid, 10000, &status), 1);
	for (int i = 0; i < 500 && plat_session_signal(pid, 0); i++) {
		struct timespec ts = {0, 10 * 1000 * 1000};
		nanosleep(&ts, NULL);
	}
	assert_int_equal(plat_session_signal(pid, 0), 0);

	/* Nothing to run. */
	struct plat_spawn empty = {.fd_in = -1, .fd_out = -1, .fd_err = -1};
	assert_int_equal(plat_spawn(&empty, err, sizeof err), -1);
}

/* --- the rule: nothing outside src/platform/ uses a Linux- or glibc-only interface */

static const char *const forbidden[] = {"/proc",
                                        "pipe2",
                                        "strverscmp",
                                        "qsort_r",
                                        "getrandom",
                                        "SOCK_CLOEXEC",
                                        "SOCK_NONBLOCK",
                                        "prctl",
                                        "epoll",
                                        "sysinfo",
                                        "<linux/",
                                        "accept4",
                                        "memfd_create",
                                        "O_TMPFILE",
                                        "execvpe",
                                        "strchrnul",
                                        "mempcpy",
                                        "memrchr",
                                        "secure_getenv",
                                        "get_nprocs",
                                        "sched_getaffinity",
                                        "program_invocation_name",
                                        "MSG_NOSIGNAL",
                                        "sys/random.h",
                                        "sys/sysinfo.h",
                                        "sys/prctl.h",
                                        "sys/epoll.h",
                                        "__GLIBC__",
                                        "CLOCK_BOOTTIME",
                                        "signalfd",
                                        "timerfd",
                                        "inotify_init",
                                        "copy_file_range",
                                        "getauxval",
                                        "malloc_usable_size"};

/* The text without its comments, so that a comment may name what it avoids. */
static char *strip_comments(const char *s)
{
	size_t n = strlen(s);
	char *o = malloc(n + 1);
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		if (s[i] == '/' && s[i + 1] == '*') {
			const char *e = strstr(s + i + 2, "*/");
			i = e ? (size_t)(e - s) + 1 : n;
			o[k++] = ' ';
		} else if (s[i] == '/' && s[i + 1] == '/' && (i == 0 || s[i - 1] != ':')) {
			while (i < n && s[i] != '\n')
				i++;
			o[k++] = '\n';
		} else {
			o[k++] = s[i];
		}
	}
	o[k] = '\0';
	return o;
}

static int ident(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '_';
}

static void scan_file(const char *path, int *bad)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *text = malloc((size_t)n + 1);
	size_t got = fread(text, 1, (size_t)n, f);
	fclose(f);
	text[got] = '\0';
	char *code = strip_comments(text);
	free(text);
	for (size_t i = 0; i < sizeof forbidden / sizeof forbidden[0]; i++) {
		const char *w = forbidden[i];
		size_t wl = strlen(w);
		for (const char *p = strstr(code, w); p; p = strstr(p + 1, w)) {
			/* A whole word: plat_strverscmp is fine. */
			if ((ident(w[0]) && p > code && ident(p[-1])) ||
			    (ident(w[wl - 1]) && ident(p[wl])))
				continue;
			int line = 1;
			for (const char *q = code; q < p; q++)
				line += *q == '\n';
			print_message("%s:%d uses %s outside src/platform/\n", path, line, w);
			(*bad)++;
			break;
		}
	}
	free(code);
}

static void scan_dir(const char *dir, int *bad, int *files)
{
	DIR *d = opendir(dir);
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char p[4096];
		snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
		struct stat st;
		if (stat(p, &st) != 0)
			continue;
		if (S_ISDIR(st.st_mode)) {
			if (strcmp(e->d_name, "platform") != 0)
				scan_dir(p, bad, files);
			continue;
		}
		size_t l = strlen(e->d_name);
		if (l > 2 &&
		    (!strcmp(e->d_name + l - 2, ".c") || !strcmp(e->d_name + l - 2, ".h"))) {
			(*files)++;
			scan_file(p, bad);
		}
	}
	closedir(d);
}

static void test_no_linux_only_interfaces(void **state)
{
	char src[4096];
	snprintf(src, sizeof src, "%s/src", TOKI_SOURCE_DIR);
	int bad = 0, files = 0;
	scan_dir(src, &bad, &files);
	assert_true(files > 100); /* the tree was found */
	assert_int_equal(bad, 0);
	/* The scan itself finds a use, and passes over a comment's mention. */
	char probe[600];
	snprintf(probe, sizeof probe, "%s/probe.c", tmpdir);
	FILE *f = fopen(probe, "w");
	fputs("/* not pipe2 */\nint x = plat_strverscmp(a, b);\n// getrandom\n", f);
	fclose(f);
	scan_file(probe, &bad);
	assert_int_equal(bad, 0);
	f = fopen(probe, "w");
	fputs("static int f(void) { return pipe2(p, 0); }\n", f);
	fclose(f);
	scan_file(probe, &bad);
	assert_int_equal(bad, 1);
	unlink(probe);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_meminfo),
	    cmocka_unit_test(test_proc_status_and_stat),
	    cmocka_unit_test(test_sysctl),
	    cmocka_unit_test(test_vm_stat),
	    cmocka_unit_test(test_metal_working_set),
	    cmocka_unit_test(test_list_devices),
	    cmocka_unit_test(test_nvidia_smi),
	    cmocka_unit_test(test_strverscmp),
	    cmocka_unit_test(test_qsort_r),
	    cmocka_unit_test_setup_teardown(test_fds_and_files, setup, teardown),
	    cmocka_unit_test(test_machine),
	    cmocka_unit_test(test_free_port),
	    cmocka_unit_test(test_run),
	    cmocka_unit_test(test_spawn_stop),
	    cmocka_unit_test_setup_teardown(test_no_linux_only_interfaces, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
