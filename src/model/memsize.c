#include "model/memsize.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "model/llama_args.h"
#include "platform/platform.h"
#include "util/paths.h"

/* Largest context ever chosen: far past any model, and small enough that
 * ctx * n_slots stays a sane llama-server -c. */
#define MEMSIZE_MAX_CTX (1L << 30)

/* --- Machine ---------------------------------------------------------------- */

int memsize_read_machine(struct mem_budget *b)
{
	struct plat_mem m;
	if (plat_mem_read(&m) != 0)
		return -1;
	memset(b, 0, sizeof *b);
	b->total = m.total;
	b->available = m.available;
	return 0;
}

int memsize_read_gpu(struct mem_budget *b, const char *llama_server, char *const env_extra[])
{
	struct plat_gpus g;
	if (plat_gpu_read(llama_server, env_extra, 0, &g) != 0 || g.n < 1)
		return -1;
	/* llama.cpp splits the layers across every GPU it sees. */
	uint64_t tot = 0, fr = 0;
	for (int i = 0; i < g.n; i++) {
		tot += g.dev[i].total;
		fr += g.dev[i].free;
	}
	if (!tot)
		return -1;
	b->gpu = 1;
	b->vram_total = tot;
	b->vram_free = fr < tot ? fr : tot;
	snprintf(b->gpu_source, sizeof b->gpu_source, "%s", g.source);
	return 0;
}

/* --- Sizing --------------------------------------------------------------------- */

static const struct {
	const char *name;
	int type;
} kv_types[] = {
    {"f32", 0},  {"f16", 1},  {"bf16", 30}, {"q8_0", 8},    {"q4_0", 2},
    {"q4_1", 3}, {"q5_0", 6}, {"q5_1", 7},  {"iq4_nl", 20},
};

int memsize_kv_type(const char *name)
{
	if (!name)
		return -1;
	for (size_t i = 0; i < sizeof kv_types / sizeof kv_types[0]; i++)
		if (!strcasecmp(kv_types[i].name, name))
			return kv_types[i].type;
	return -1;
}

static long round_step(uint64_t v)
{
	if (v > (uint64_t)MEMSIZE_MAX_CTX)
		v = (uint64_t)MEMSIZE_MAX_CTX;
	return (long)(v / MEMSIZE_CTX_STEP * MEMSIZE_CTX_STEP);
}

long memsize_fit_context(const struct gguf_model_info *mi, const struct mem_budget *b,
                         const char *kv_type, int n_slots, struct memsize_report *out)
{
	char k_name[16] = "f16";
	const char *v_name = k_name;
	if (kv_type) {
		if (strlen(kv_type) >= sizeof k_name)
			return -1;
		snprintf(k_name, sizeof k_name, "%s", kv_type);
		char *slash = strchr(k_name, '/');
		if (slash) {
			*slash = '\0';
			v_name = slash + 1;
		}
	}
	int type_k = memsize_kv_type(k_name), type_v = memsize_kv_type(v_name);
	if (!mi || !b || type_k < 0 || type_v < 0 || n_slots < 1)
		return -1;
	uint64_t kv = gguf_kv_bytes_per_token_type(mi, (uint32_t)type_k, (uint32_t)type_v);
	if (kv == 0 || kv == UINT64_MAX)
		return -1; /* no layers or heads: nothing to size */

	struct memsize_report r = {0};
	const char *kn = "", *vn = "";
	for (size_t i = 0; i < sizeof kv_types / sizeof kv_types[0]; i++) {
		if (kv_types[i].type == type_k)
			kn = kv_types[i].name;
		if (kv_types[i].type == type_v)
			vn = kv_types[i].name;
	}
	if (type_k == type_v)
		snprintf(r.kv_type, sizeof r.kv_type, "%s", kn);
	else
		snprintf(r.kv_type, sizeof r.kv_type, "%s/%s", kn, vn);
	r.gpu = b->gpu != 0;
	r.total = r.gpu ? b->vram_total : b->total;
	r.memory = r.gpu ? b->vram_free : (b->available ? b->available : b->total);
	/* floor(total * percent / 100) without overflowing on a huge total */
	r.margin =
	    r.total / 100 * MEMSIZE_MARGIN_PERCENT + r.total % 100 * MEMSIZE_MARGIN_PERCENT / 100;
	if (r.margin < MEMSIZE_MARGIN_MIN)
		r.margin = MEMSIZE_MARGIN_MIN;
	r.weights = mi->tensor_data_bytes;
	r.kv_per_token = kv;
	r.n_slots = n_slots;
	r.ctx_train = mi->context_length > (uint64_t)MEMSIZE_MAX_CTX ? MEMSIZE_MAX_CTX
	                                                             : (long)mi->context_length;

	/* Per-token cost of all slots; saturated, so a huge product fits nothing. */
	uint64_t per = kv > UINT64_MAX / (uint64_t)n_slots ? UINT64_MAX : kv * (uint64_t)n_slots;
	if (r.memory > r.margin && r.memory - r.margin > r.weights)
		r.ctx_memory = round_step((r.memory - r.margin - r.weights) / per);

	long ctx = r.ctx_memory;
	r.limited_by = "memory";
	if (r.ctx_train > 0) {
		long train = round_step((uint64_t)r.ctx_train);
		/* A training context under 512 (toy and test models) is raised to
		 * the minimum: llama.cpp runs them with a longer context without
		 * harm, and a shorter one leaves no room for a template and answer. */
		const char *why = train < MEMSIZE_MIN_CTX ? "minimum" : "training context";
		if (train < MEMSIZE_MIN_CTX)
			train = MEMSIZE_MIN_CTX;
		if (train < ctx) {
			ctx = train;
			r.limited_by = why;
		}
	}
	if (r.ctx_memory < MEMSIZE_MIN_CTX) {
		ctx = 0; /* not even the minimum fits */
		r.limited_by = "memory";
	}
	r.fits = ctx > 0;
	r.ctx = ctx;
	r.kv_bytes = (uint64_t)ctx * per; /* ctx <= ctx_memory: no overflow */
	r.used = r.weights + r.kv_bytes;
	if (out)
		*out = r;
	return ctx;
}

/* N from "KEY=int:N" when KEY ends in ".context_length"; -1 otherwise. One
 * --override-kv argument may hold several such items, comma-separated. */
static long override_context_length(const char *arg)
{
	static const char suffix[] = ".context_length=int:";
	long found = -1;
	const char *p = arg;
	while (p && *p) {
		const char *end = strchr(p, ',');
		size_t len = end ? (size_t)(end - p) : strlen(p);
		const char *at = memmem(p, len, suffix, sizeof suffix - 1);
		if (at) {
			const char *num = at + sizeof suffix - 1;
			char *stop;
			long v = strtol(num, &stop, 10);
			if (stop > num && stop == p + len && v > 0)
				found = v;
		}
		p = end ? end + 1 : NULL;
	}
	return found;
}

long memsize_ctx_train_from_args(long ctx_train, char *const *args, int n, char *why, size_t whylen)
{
	long ctx = ctx_train > 0 ? ctx_train : 0, yarn_orig = 0;
	double scale = 0;
	const char *override_arg = NULL, *scale_flag = NULL, *scale_arg = NULL, *yarn_arg = NULL;
	for (int i = 0; i + 1 < n; i++) {
		const char *flag = args[i], *val = args[i + 1];
		char *stop;
		if (llama_arg_is(flag, "--override-kv")) {
			long v = override_context_length(val);
			if (v > 0) {
				ctx = v;
				override_arg = val;
			}
		} else if (llama_arg_is(flag, "--rope-scale")) {
			double v = strtod(val, &stop);
			if (stop > val && !*stop && v > 0) {
				scale = v;
				scale_flag = flag;
				scale_arg = val;
			}
		} else if (llama_arg_is(flag, "--rope-freq-scale")) {
			double v = strtod(val, &stop);
			if (stop > val && !*stop && v > 0) {
				scale = 1.0 / v;
				scale_flag = flag;
				scale_arg = val;
			}
		} else if (llama_arg_is(flag, "--yarn-orig-ctx")) {
			long v = strtol(val, &stop, 10);
			if (stop > val && !*stop && v > 0) {
				yarn_orig = v;
				yarn_arg = val;
			}
		} else {
			continue;
		}
		i++; /* the value was this flag's */
	}
	if (why && whylen)
		why[0] = '\0';
	long base = yarn_orig > 0 ? yarn_orig : ctx;
	int stretched = scale > 1.0 && base > 0;
	if (stretched) {
		double v = (double)base * scale;
		long s = v >= (double)MEMSIZE_MAX_CTX ? MEMSIZE_MAX_CTX : (long)v;
		if (s > ctx)
			ctx = s;
		else
			stretched = 0; /* a stretch of a shorter original context adds nothing */
	}
	if (ctx > MEMSIZE_MAX_CTX)
		ctx = MEMSIZE_MAX_CTX;
	if (why && whylen && (override_arg || stretched)) {
		snprintf(why, whylen, "%s%s%s%s%s%s%s%s%s", override_arg ? "--override-kv " : "",
		         override_arg ? override_arg : "", override_arg && stretched ? " " : "",
		         stretched ? scale_flag : "", stretched ? " " : "",
		         stretched ? scale_arg : "",
		         stretched && yarn_arg ? " --yarn-orig-ctx " : "",
		         stretched && yarn_arg ? yarn_arg : "", "");
	}
	return ctx;
}

void memsize_human(uint64_t bytes, char *buf, size_t n)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
	if (bytes < 1024) {
		snprintf(buf, n, "%" PRIu64 " B", bytes);
		return;
	}
	double v = (double)bytes;
	int u = 0;
	while (v >= 1024 && u < 6) {
		v /= 1024;
		u++;
	}
	snprintf(buf, n, v < 99.95 ? "%.1f %s" : "%.0f %s", v, units[u]);
}

int memsize_explain(const struct memsize_report *r, long asked, char *buf, size_t n)
{
	char w[32], kv[32], mem[32], margin[32], used[32], slots[48] = "";
	memsize_human(r->weights, w, sizeof w);
	memsize_human(r->kv_per_token, kv, sizeof kv);
	memsize_human(r->memory, mem, sizeof mem);
	memsize_human(r->margin, margin, sizeof margin);
	if (r->n_slots > 1)
		snprintf(slots, sizeof slots, " x %d slots", r->n_slots);
	const char *where = r->gpu ? "of free VRAM" : "available";
	if (!r->fits && r->ctx_memory == 0)
		return snprintf(buf, n,
		                "the model does not fit: weights %s + %s kept free is more than "
		                "the %s %s",
		                w, margin, mem, where);
	if (!r->fits)
		return snprintf(buf, n,
		                "only %ld tokens fit, under the minimum of %d: weights %s + KV %s "
		                "%s/token%s in %s %s with %s kept free",
		                r->ctx_memory, MEMSIZE_MIN_CTX, w, r->kv_type, kv, slots, mem,
		                where, margin);
	if (asked > r->ctx) {
		if (!strcmp(r->limited_by, "memory"))
			return snprintf(
			    buf, n,
			    "asked for %ld tokens, but only %ld fit: weights %s + KV %s "
			    "%s/token%s in %s %s with %s kept free",
			    asked, r->ctx, w, r->kv_type, kv, slots, mem, where, margin);
		return snprintf(buf, n,
		                "asked for %ld tokens, but the model was trained on %ld: using "
		                "%ld",
		                asked, r->ctx_train, r->ctx);
	}
	long tokens = asked > 0 ? asked : r->ctx;
	memsize_human(r->weights + (uint64_t)tokens * r->kv_per_token * (uint64_t)r->n_slots, used,
	              sizeof used);
	return snprintf(buf, n,
	                "%ld tokens fit (at most %ld, limit: %s): weights %s + KV %s %s/token%s "
	                "= %s of %s %s with %s kept free",
	                tokens, r->ctx, r->limited_by, w, r->kv_type, kv, slots, used, mem, where,
	                margin);
}

/* --- The recorded context ------------------------------------------------------- */

static int ctx_path(const char *name, const char *leaf, char *out, size_t n)
{
	if (!name || !paths_is_safe_name(name)) {
		errno = EINVAL;
		return -1;
	}
	char sub[256];
	snprintf(sub, sizeof sub, "run/%s%s%s", name, leaf ? "/" : "", leaf ? leaf : "");
	if (paths_state_sub(out, n, sub) != 0) {
		errno = ENAMETOOLONG;
		return -1;
	}
	return 0;
}

int memsize_write_ctx(const char *model_name, long ctx)
{
	char dir[4096], path[4096];
	if (ctx <= 0 || ctx > MEMSIZE_MAX_CTX) {
		errno = EINVAL;
		return -1;
	}
	if (ctx_path(model_name, NULL, dir, sizeof dir) != 0 ||
	    ctx_path(model_name, "ctx", path, sizeof path) != 0)
		return -1;
	if (paths_mkdir_p(dir, 0700) != 0)
		return -1;
	char buf[32];
	int len = snprintf(buf, sizeof buf, "%ld\n", ctx);
	return plat_replace_file(path, buf, (size_t)len, 0644);
}

long memsize_read_ctx(const char *model_name)
{
	char path[4096];
	if (ctx_path(model_name, "ctx", path, sizeof path) != 0)
		return -1;
	FILE *f = fopen(path, "re");
	if (!f)
		return -1;
	char buf[64];
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = '\0';
	char *end;
	errno = 0;
	long v = buf[0] >= '0' && buf[0] <= '9' ? strtol(buf, &end, 10) : -1;
	if (v > 0 && !errno) {
		while (*end == ' ' || *end == '\t' || *end == '\r' || *end == '\n')
			end++;
		if (*end == '\0' && v <= MEMSIZE_MAX_CTX)
			return v;
	}
	errno = EINVAL;
	return -1;
}
