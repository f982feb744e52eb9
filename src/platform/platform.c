/* The common part of the layer: what is the same on every OS but needs the
 * OS-specific functions (GPU memory from the tools that know it). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "platform/os.h"

/* Loading CUDA or ROCm to list the devices takes seconds; a wedged driver
 * can hang a probe for minutes, and a start must not hang with it. */
#define LIST_DEVICES_TIMEOUT_MS 30000
#define NVIDIA_SMI_TIMEOUT_MS 10000

static int timeout_from_env(const char *name, int dflt)
{
	const char *t = getenv(name);
	return t && atoi(t) > 0 ? atoi(t) : dflt;
}

/* Leaves out software devices unless they are wanted. */
static void keep_devices(struct plat_gpus *g, int include_software)
{
	int k = 0;
	for (int i = 0; i < g->n; i++)
		if (include_software || !plat_gpu_is_software(&g->dev[i]))
			g->dev[k++] = g->dev[i];
	g->n = k;
}

int plat_gpu_read(const char *llama_server, char *const env_extra[], int include_software,
                  struct plat_gpus *g)
{
	char *out = malloc(65536);
	if (!out)
		return -1;
	memset(g, 0, sizeof *g);
	/* llama-server's own list first: it names what its backend (CUDA,
	 * ROCm, Vulkan, Metal, SYCL) will use, with the memory that backend
	 * sees; nvidia-smi knows only NVIDIA's and nothing of the build. */
	if (llama_server && *llama_server) {
		char *const argv[] = {(char *)llama_server, "--list-devices", NULL};
		struct plat_cmd c = {
		    .argv = argv,
		    .env_extra = env_extra,
		    .timeout_ms =
		        timeout_from_env("TOKI_LIST_DEVICES_TIMEOUT_MS", LIST_DEVICES_TIMEOUT_MS),
		    .merge_stderr = 1,
		};
		if (plat_run(&c, out, 65536, NULL, NULL) == 0 &&
		    plat_parse_list_devices(out, g) > 0) {
			keep_devices(g, include_software);
			if (g->n > 0) {
				free(out);
				return 0;
			}
		}
	}
	char *const smi[] = {"nvidia-smi", "--query-gpu=name,memory.total,memory.used",
	                     "--format=csv,noheader,nounits", NULL};
	struct plat_cmd c = {
	    .argv = smi,
	    .timeout_ms = timeout_from_env("TOKI_NVIDIA_SMI_TIMEOUT_MS", NVIDIA_SMI_TIMEOUT_MS),
	};
	/* A line a GPU: more than a few KiB is not its answer, and a cut-off
	 * line could parse as a wrong number. */
	int overflow = 0;
	if (plat_run(&c, out, 8192, &overflow, NULL) == 0 && !overflow &&
	    plat_parse_nvidia_smi(out, g) > 0) {
		free(out);
		return 0;
	}
	free(out);
	memset(g, 0, sizeof *g);
	return plat_os_gpu_default(g);
}

/* The port of 127.0.0.1 a listening socket can take now (0: any), or -1. */
static int bind_port(int port)
{
	int fd = plat_socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0)
		return -1;
	struct sockaddr_in a = {.sin_family = AF_INET,
	                        .sin_port = htons((uint16_t)port),
	                        .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof a;
	int got = -1;
	if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
	    getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		got = ntohs(a.sin_port);
	close(fd);
	return got;
}

/* How many ports below the ephemeral range are tried, from a random one. */
#define FREE_PORT_WINDOW 10000
#define FREE_PORT_TRIES 200

int plat_free_port(void)
{
	int lo = 0, hi = 0;
	if (plat_os_ephemeral_ports(&lo, &hi) != 0 || lo <= 0 || hi < lo)
		lo = 32768; /* Linux's default, below the BSDs' 49152 */
	int bottom = lo - FREE_PORT_WINDOW;
	if (bottom < 10000)
		return bind_port(0); /* a range that starts low: nothing below it */
	unsigned r = 0;
	(void)plat_random(&r, sizeof r);
	for (int i = 0; i < FREE_PORT_TRIES; i++) {
		int port = bottom + (int)((r + (unsigned)i) % FREE_PORT_WINDOW);
		if (bind_port(port) == port)
			return port;
	}
	return bind_port(0);
}
