/* How much context a model can have on this machine, and where the chosen
 * context is recorded.
 *
 * The sizing rule (memsize_fit_context):
 *   memory  = available RAM (CPU), or free VRAM when the model runs on a GPU
 *             (llama-server -ngl 99: weights and KV cache both in VRAM; on
 *             Apple silicon always: Metal's working set of unified memory)
 *   margin  = max(1.5 GiB, 10% of that memory's total), kept free for the OS,
 *             other programs, llama.cpp's compute buffers and the CUDA context;
 *             these do not depend much on the context, so a fixed reserve is
 *             simpler and safer than modelling them
 *   weights = the GGUF's tensor data bytes
 *   kv      = bytes one token takes in the KV cache (all layers, K and V) for
 *             the cache type: f16 2 bytes an element, q8_0 34 bytes per 32,
 *             q4_0 18 bytes per 32 (llama-server's --cache-type-k/-v)
 *   ctx     = (memory - margin - weights) / (kv * n_slots), rounded down to a
 *             multiple of 256, at most the training context (also rounded
 *             down to 256), at least 512
 * ctx is per slot: llama-server splits -c evenly between its -np slots, so it
 * must be started with -c ctx * n_slots. If not even 512 tokens a slot fit,
 * nothing is chosen (0) and the report says by how much it missed.
 *
 * The KV estimate assumes every layer caches every token. Models with
 * sliding-window layers (Gemma 2/3) cache less in llama.cpp, so for them this
 * is an upper bound: the context chosen is safe, not the largest possible.
 *
 * The chosen context of a running model is kept in one place,
 * $state/run/<name>/ctx (a decimal number and a newline), written by whoever
 * starts the model and read by everything that needs it. */
#ifndef TOKI_MODEL_MEMSIZE_H
#define TOKI_MODEL_MEMSIZE_H

#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"

#define MEMSIZE_MIN_CTX 512
#define MEMSIZE_CTX_STEP 256
#define MEMSIZE_MARGIN_MIN (UINT64_C(3) << 29) /* 1.5 GiB */
#define MEMSIZE_MARGIN_PERCENT 10

/* The machine, in bytes. Filled by memsize_read_machine/_gpu, or by hand in
 * tests to simulate another machine. */
struct mem_budget {
	uint64_t total;     /* RAM: MemTotal */
	uint64_t available; /* RAM: MemAvailable (0: use total) */
	int gpu;            /* 1: size against VRAM instead of RAM */
	uint64_t vram_total;
	uint64_t vram_free;
	char gpu_source[32]; /* who said: "llama-server --list-devices", "nvidia-smi", ... */
};

/* The numbers behind a memsize_fit_context() answer, so a refusal can be
 * explained with them. */
struct memsize_report {
	int fits;              /* 1: at least MEMSIZE_MIN_CTX tokens a slot fit */
	int gpu;               /* sized against VRAM */
	char kv_type[16];      /* "q8_0", or "q8_0/f16" where K and V differ */
	uint64_t memory;       /* what was sized against: available RAM or free VRAM */
	uint64_t total;        /* the total of that memory */
	uint64_t margin;       /* kept free (see above) */
	uint64_t weights;      /* tensor data bytes */
	uint64_t kv_per_token; /* one token of one slot */
	int n_slots;
	long ctx_memory;        /* largest per-slot context memory allows, a multiple of 256
	                           (may be under 512; 0 when the weights alone do not fit) */
	long ctx_train;         /* the training context, 0 when the file does not say */
	long ctx;               /* the answer: chosen per-slot context, 0 when none fits */
	const char *limited_by; /* "memory", "training context" or "minimum" */
	uint64_t kv_bytes;      /* KV cache at ctx, all slots */
	uint64_t used;          /* weights + kv_bytes */
};

/* RAM from the platform layer (Linux's MemAvailable, macOS's vm_stat,
 * FreeBSD's vm.stats); gpu and VRAM set to 0. 0, or -1 (errno set). */
int memsize_read_machine(struct mem_budget *b);
/* VRAM from the platform layer (plat_gpu_read): the devices llama_server
 * lists with `--list-devices` (CUDA, ROCm, Vulkan, Metal, SYCL alike; NULL:
 * not asked), else nvidia-smi, else Metal's default working set on Apple
 * silicon. Sums all GPUs, since llama.cpp splits layers across them, and
 * sets b->gpu = 1. -1 (b untouched) when none is found. Software devices
 * (llvmpipe) do not count. */
int memsize_read_gpu(struct mem_budget *b, const char *llama_server, char *const env_extra[]);

/* The ggml type number of a KV cache type name as llama-server takes it
 * (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, iq4_nl; any case), or -1. */
int memsize_kv_type(const char *name);

/* The largest per-slot context that fits (see the rule above). kv_type is
 * the K and V caches' type ("q8_0"), or each ("q8_0/f16": -ctk alone leaves
 * V at f16); NULL means f16; n_slots >= 1. Returns the context (>= 512), 0 when not even 512
 * tokens a slot fit, or -1 on bad arguments (unknown kv_type, n_slots < 1, a
 * model without layer or head counts). out (may be NULL) is filled whenever
 * the return is not -1. */
long memsize_fit_context(const struct gguf_model_info *mi, const struct mem_budget *b,
                         const char *kv_type, int n_slots, struct memsize_report *out);

/* The training context the model has under llama-server's own arguments
 * (args, as passed to it), from the one its file states (ctx_train; 0 when
 * it states none):
 *   --override-kv KEY=int:N, KEY ending in .context_length (several
 *     overrides may share one argument, comma-separated): the model's
 *     context is N;
 *   --rope-scale S, or --rope-freq-scale F (S = 1/F), with S > 1: RoPE
 *     stretched S times covers S times the original context, which is
 *     --yarn-orig-ctx N when given (YaRN's original context), else the
 *     model's; --rope-scaling alone does not stretch.
 * The last occurrence of a flag wins, as in llama-server. why (may be NULL)
 * gets the arguments that changed it ("" when none did). Returns the
 * context (0 when neither the file nor the arguments give one). */
long memsize_ctx_train_from_args(long ctx_train, char *const *args, int n, char *why,
                                 size_t whylen);

/* One sentence explaining a report against an asked-for context (asked <= 0:
 * none asked), e.g. "asked for 65536 tokens, but only 23040 fit: weights
 * 2.3 GiB + KV 144 KiB/token in 7.0 GiB available with 1.5 GiB kept free".
 * Returns what snprintf returns. */
int memsize_explain(const struct memsize_report *r, long asked, char *buf, size_t n);

/* "2.3 GiB", "144 KiB", "512 B": binary units, one decimal below 100. */
void memsize_human(uint64_t bytes, char *buf, size_t n);

/* $state/run/<name>/ctx: written atomically (tmp, fsync, rename), creating
 * the directory. 0, or -1 with errno set (EINVAL for a bad name or ctx). */
int memsize_write_ctx(const char *model_name, long ctx);
/* The context recorded for that model, or -1: no file (errno ENOENT), or not
 * a positive number (EINVAL). */
long memsize_read_ctx(const char *model_name);

#endif
