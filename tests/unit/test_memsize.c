/* Memory sizing: the context chosen for real model shapes on simulated 8 GiB
 * and 16 GiB machines (and an 8 GiB GPU), every number worked out by hand
 * below; the floor, the training-context cap, refusals and their
 * explanations; VRAM from a fake llama-server --list-devices and a fake
 * nvidia-smi on PATH (their parsing is test_platform.c's); and the recorded
 * context file.
 *
 * The models, from their published config.json and GGUF listings:
 *   Qwen3-4B (Qwen/Qwen3-4B): num_hidden_layers 36, num_attention_heads 32,
 *     num_key_value_heads 8, head_dim 128, hidden_size 2560,
 *     max_position_embeddings 40960. Q4_K_M GGUF 2.50 GB
 *     (bartowski/Qwen_Qwen3-4B-GGUF): weights taken as 2,500,000,000 B.
 *   gemma-2-9b (google/gemma-2-9b-it): num_hidden_layers 42,
 *     num_attention_heads 16, num_key_value_heads 8, head_dim 256,
 *     hidden_size 3584, max_position_embeddings 8192. Q4_K_M GGUF 5.76 GB
 *     (bartowski/gemma-2-9b-it-GGUF): 5,760,000,000 B.
 *   GLM-4-9B (THUDM/glm-4-9b-chat): num_layers 40, num_attention_heads 32,
 *     multi_query_group_num 2 (KV heads), kv_channels 128, hidden_size 4096,
 *     seq_length 131072. Q4_K_M GGUF 6.31 GB (bartowski): 6,310,000,000 B.
 *
 * KV bytes per token, f16 (2 B an element), layers x KV heads x (K + V) x 2:
 *   Qwen3-4B   36 x 8 x (128 + 128) x 2 = 147,456 B = 144 KiB
 *   gemma-2-9b 42 x 8 x (256 + 256) x 2 = 344,064 B = 336 KiB
 *   GLM-4-9B   40 x 2 x (128 + 128) x 2 =  40,960 B =  40 KiB
 * q8_0 is 34 B per 32 elements, q4_0 18 B per 32; one layer's K row is
 * KV heads x head dim elements:
 *   Qwen3-4B   q8_0: 8 x 128 = 1024 el = 32 blocks x 34 = 1,088 B; x 2 (K, V) x 36 = 78,336 B
 *              q4_0: 32 blocks x 18 = 576 B; x 2 x 36 = 41,472 B
 *   gemma-2-9b q8_0: 8 x 256 = 2048 el = 64 blocks x 34 = 2,176 B; x 2 x 42 = 182,784 B
 *
 * Machines:
 *   8 GiB:  total 8,589,934,592, available 7 GiB = 7,516,192,768
 *           margin = max(1.5 GiB = 1,610,612,736, 10% = 858,993,459) = 1,610,612,736
 *   16 GiB: total 17,179,869,184, available 14 GiB = 15,032,385,536
 *           margin = max(1,610,612,736, 10% = 1,717,986,918) = 1,717,986,918
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/memsize.h"

#define GiB (UINT64_C(1) << 30)
#define MiB (UINT64_C(1) << 20)

/* --- Helpers ------------------------------------------------------------- */

static char tmpdir[256];

static int rm_entry(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
	return remove(p);
}

static int setup(void **state)
{
	const char *base = getenv("TMPDIR");
	snprintf(tmpdir, sizeof tmpdir, "%s/toki-mem-XXXXXX", base && *base ? base : "/tmp");
	if (!mkdtemp(tmpdir))
		return -1;
	char st[512];
	snprintf(st, sizeof st, "%s/state", tmpdir);
	setenv("TOKI_STATE_DIR", st, 1);
	return 0;
}

static int teardown(void **state)
{
	nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	return 0;
}

static void write_file(const char *path, const char *text, mode_t mode)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(text, 1, strlen(text), f), strlen(text));
	assert_int_equal(fclose(f), 0);
	assert_int_equal(chmod(path, mode), 0);
}

static struct gguf_model_info shape(const char *arch, uint64_t layers, uint64_t heads,
                                    uint64_t kv_heads, uint64_t head_dim, uint64_t ctx,
                                    uint64_t weights)
{
	struct gguf_model_info mi;
	memset(&mi, 0, sizeof mi);
	snprintf(mi.architecture, sizeof mi.architecture, "%s", arch);
	mi.n_layers = layers;
	mi.n_head = heads;
	mi.n_head_kv = kv_heads;
	mi.n_head_kv_sum = layers * kv_heads;
	mi.key_length = head_dim;
	mi.value_length = head_dim;
	mi.n_embd = heads * head_dim;
	mi.context_length = ctx;
	mi.tensor_data_bytes = weights;
	mi.file_type = -1;
	return mi;
}

static struct gguf_model_info qwen3_4b(void)
{
	return shape("qwen3", 36, 32, 8, 128, 40960, 2500000000u);
}

static struct gguf_model_info gemma2_9b(void)
{
	return shape("gemma2", 42, 16, 8, 256, 8192, 5760000000u);
}

static struct gguf_model_info glm4_9b(void)
{
	return shape("chatglm", 40, 32, 2, 128, 131072, 6310000000u);
}

static const struct mem_budget machine_8g = {.total = 8 * GiB, .available = 7 * GiB};
static const struct mem_budget machine_16g = {.total = 16 * GiB, .available = 14 * GiB};

/* --- Sizing real shapes -------------------------------------------------------- */

static void test_kv_per_token(void **state)
{
	struct gguf_model_info q = qwen3_4b(), g = gemma2_9b(), z = glm4_9b();
	struct memsize_report r;
	assert_true(memsize_fit_context(&q, &machine_16g, "f16", 1, &r) > 0);
	assert_int_equal(r.kv_per_token, 147456);
	assert_int_equal(r.kv_per_token, gguf_kv_bytes_per_token(&q, 2.0));
	assert_true(memsize_fit_context(&q, &machine_16g, "q8_0", 1, &r) > 0);
	assert_int_equal(r.kv_per_token, 78336);
	assert_true(memsize_fit_context(&q, &machine_16g, "Q4_0", 1, &r) > 0);
	assert_int_equal(r.kv_per_token, 41472);
	assert_string_equal(r.kv_type, "q4_0");
	/* -ctk alone leaves V at f16 in llama-server: each its own type. */
	assert_true(memsize_fit_context(&q, &machine_16g, "q8_0/f16", 1, &r) > 0);
	assert_int_equal(r.kv_per_token, 78336 / 2 + 147456 / 2);
	assert_string_equal(r.kv_type, "q8_0/f16");
	assert_true(memsize_fit_context(&q, &machine_16g, "f16/F16", 1, &r) > 0);
	assert_int_equal(r.kv_per_token, 147456);
	assert_string_equal(r.kv_type, "f16");
	assert_int_equal(memsize_fit_context(&q, &machine_16g, "q8_0/q7", 1, &r), -1);
	assert_int_equal(memsize_fit_context(&q, &machine_16g, "q8_0/f16/f32/bf16", 1, &r), -1);
	assert_true(memsize_fit_context(&g, &machine_16g, NULL, 1, &r) > 0);
	assert_int_equal(r.kv_per_token, 344064);
	assert_string_equal(r.kv_type, "f16"); /* NULL means f16 */
	assert_true(memsize_fit_context(&g, &machine_16g, "q8_0", 1, &r) > 0);
	assert_int_equal(r.kv_per_token, 182784);
	assert_true(memsize_fit_context(&z, &machine_16g, "f16", 1, &r) > 0);
	assert_int_equal(r.kv_per_token, 40960);
}

static void test_qwen3_4b_8g(void **state)
{
	struct gguf_model_info mi = qwen3_4b();
	struct memsize_report r;
	/* KV budget = 7,516,192,768 - 1,610,612,736 - 2,500,000,000 = 3,405,580,032
	 * f16: 3,405,580,032 / 147,456 = 23,095.7 -> 23,095 -> 90 x 256 = 23,040,
	 * under the training 40,960: memory decides. */
	assert_int_equal(memsize_fit_context(&mi, &machine_8g, "f16", 1, &r), 23040);
	assert_int_equal(r.fits, 1);
	assert_int_equal(r.gpu, 0);
	assert_int_equal(r.memory, 7516192768u);
	assert_int_equal(r.total, 8589934592u);
	assert_int_equal(r.margin, 1610612736u);
	assert_int_equal(r.weights, 2500000000u);
	assert_int_equal(r.ctx_memory, 23040);
	assert_int_equal(r.ctx_train, 40960);
	assert_int_equal(r.ctx, 23040);
	assert_string_equal(r.limited_by, "memory");
	/* 23,040 x 147,456 = 3,397,386,240; + weights = 5,897,386,240 */
	assert_int_equal(r.kv_bytes, 3397386240u);
	assert_int_equal(r.used, 5897386240u);
	assert_true(r.used + r.margin <= r.memory);
	/* One step more would not fit: 23,296 x 147,456 = 3,435,134,976 > budget. */
	assert_true((uint64_t)(23040 + 256) * 147456 > 3405580032u);

	/* q8_0: 3,405,580,032 / 78,336 = 43,474.3 -> 169 x 256 = 43,264, above
	 * the training context: 40,960. */
	assert_int_equal(memsize_fit_context(&mi, &machine_8g, "q8_0", 1, &r), 40960);
	assert_int_equal(r.ctx_memory, 43264);
	assert_string_equal(r.limited_by, "training context");
	assert_int_equal(r.kv_bytes, 40960u * 78336u);
	/* q4_0: / 41,472 = 82,117.6 -> 81,920 -> capped at 40,960. */
	assert_int_equal(memsize_fit_context(&mi, &machine_8g, "q4_0", 1, &r), 40960);
	assert_int_equal(r.ctx_memory, 81920);

	/* Four slots share the budget: / (4 x 147,456 = 589,824) = 5,773.9
	 * -> 22 x 256 = 5,632 a slot (llama-server -c 22,528). */
	assert_int_equal(memsize_fit_context(&mi, &machine_8g, "f16", 4, &r), 5632);
	assert_int_equal(r.n_slots, 4);
	assert_int_equal(r.kv_bytes, 5632u * 4u * 147456u);
}

static void test_qwen3_4b_16g(void **state)
{
	struct gguf_model_info mi = qwen3_4b();
	struct memsize_report r;
	/* 15,032,385,536 - 1,717,986,918 - 2,500,000,000 = 10,814,398,618;
	 * / 147,456 = 73,339.7 -> 286 x 256 = 73,216 -> capped at 40,960. */
	assert_int_equal(memsize_fit_context(&mi, &machine_16g, "f16", 1, &r), 40960);
	assert_int_equal(r.margin, 1717986918u);
	assert_int_equal(r.ctx_memory, 73216);
	assert_string_equal(r.limited_by, "training context");
	/* 40,960 x 147,456 = 6,039,797,760; + 2.5e9 = 8,539,797,760 */
	assert_int_equal(r.used, 8539797760u);
}

static void test_gemma2_9b(void **state)
{
	struct gguf_model_info mi = gemma2_9b();
	struct memsize_report r;
	/* 8 GiB: 7,516,192,768 - 1,610,612,736 - 5,760,000,000 = 145,580,032;
	 * f16: / 344,064 = 423.1 -> 256 after rounding: under the 512 minimum,
	 * so nothing is chosen. */
	assert_int_equal(memsize_fit_context(&mi, &machine_8g, "f16", 1, &r), 0);
	assert_int_equal(r.fits, 0);
	assert_int_equal(r.ctx_memory, 256);
	assert_int_equal(r.ctx, 0);
	assert_int_equal(r.kv_bytes, 0);
	/* q8_0 rescues it: 145,580,032 / 182,784 = 796.4 -> 768. */
	assert_int_equal(memsize_fit_context(&mi, &machine_8g, "q8_0", 1, &r), 768);
	assert_int_equal(r.fits, 1);
	assert_string_equal(r.limited_by, "memory");
	/* 16 GiB: 15,032,385,536 - 1,717,986,918 - 5,760,000,000 = 7,554,398,618;
	 * / 344,064 = 21,956.4 -> 85 x 256 = 21,760 -> the training 8,192 caps. */
	assert_int_equal(memsize_fit_context(&mi, &machine_16g, "f16", 1, &r), 8192);
	assert_int_equal(r.ctx_memory, 21760);
	assert_string_equal(r.limited_by, "training context");
}

static void test_glm4_9b(void **state)
{
	struct gguf_model_info mi = glm4_9b();
	struct memsize_report r;
	/* 16 GiB: 15,032,385,536 - 1,717,986,918 - 6,310,000,000 = 7,004,398,618;
	 * / 40,960 = 171,005.8 -> 667 x 256 = 170,752 -> capped at 131,072. */
	assert_int_equal(memsize_fit_context(&mi, &machine_16g, "f16", 1, &r), 131072);
	assert_int_equal(r.ctx_memory, 170752);
	/* Four slots: / 163,840 = 42,751.4 -> 166 x 256 = 42,496 a slot. */
	assert_int_equal(memsize_fit_context(&mi, &machine_16g, "f16", 4, &r), 42496);
	assert_string_equal(r.limited_by, "memory");
	/* 8 GiB: 7,516,192,768 - 1,610,612,736 = 5,905,580,032 < 6,310,000,000:
	 * the weights alone do not fit. */
	assert_int_equal(memsize_fit_context(&mi, &machine_8g, "q4_0", 1, &r), 0);
	assert_int_equal(r.ctx_memory, 0);
	assert_int_equal(r.fits, 0);
}

/* On a GPU the budget is free VRAM, whatever the RAM. */
static void test_gpu(void **state)
{
	struct gguf_model_info mi = qwen3_4b();
	struct memsize_report r;
	/* An 8 GiB card with 512 MiB in use: free 7,680 MiB = 8,053,063,680;
	 * margin max(1.5 GiB, 858,993,459) = 1,610,612,736;
	 * 8,053,063,680 - 1,610,612,736 - 2,500,000,000 = 3,942,450,944;
	 * / 147,456 = 26,736.3 -> 104 x 256 = 26,624. */
	struct mem_budget b = {.total = 1 * GiB,
	                       .available = 1 * GiB,
	                       .gpu = 1,
	                       .vram_total = 8 * GiB,
	                       .vram_free = 7680 * MiB};
	assert_int_equal(memsize_fit_context(&mi, &b, "f16", 1, &r), 26624);
	assert_int_equal(r.gpu, 1);
	assert_int_equal(r.memory, 8053063680u);
	assert_int_equal(r.total, 8589934592u);
	/* An 80 GiB card keeps 10% = 8 GiB free, more than 1.5 GiB. */
	struct mem_budget big = {.gpu = 1, .vram_total = 80 * GiB, .vram_free = 80 * GiB};
	assert_int_equal(memsize_fit_context(&mi, &big, "f16", 1, &r), 40960);
	assert_int_equal(r.margin, 8 * GiB);
}

/* --- Edges --------------------------------------------------------------------- */

static void test_floor_and_caps(void **state)
{
	struct gguf_model_info mi = qwen3_4b();
	struct memsize_report r;
	/* Exactly 600 tokens of room (margin + weights + 600 x 147,456 =
	 * 1,610,612,736 + 2,500,000,000 + 88,473,600 = 4,199,086,336):
	 * 600 -> 512, the floor itself. */
	struct mem_budget b = {.total = 8 * GiB, .available = 4199086336u};
	assert_int_equal(memsize_fit_context(&mi, &b, "f16", 1, &r), 512);
	assert_string_equal(r.limited_by, "memory");
	/* 511 tokens of room round to 256: none. */
	b.available = 1610612736u + 2500000000u + 511u * 147456u;
	assert_int_equal(memsize_fit_context(&mi, &b, "f16", 1, &r), 0);
	/* Exactly 512 tokens of room: fits, to the byte. */
	b.available = 1610612736u + 2500000000u + 512u * 147456u;
	assert_int_equal(memsize_fit_context(&mi, &b, "f16", 1, &r), 512);
	assert_int_equal(r.used + r.margin, r.memory);

	/* A toy model trained on 128 tokens still gets the 512 minimum. */
	struct gguf_model_info toy = shape("llama", 5, 8, 4, 8, 128, 1000000);
	assert_int_equal(memsize_fit_context(&toy, &machine_8g, "f16", 1, &r), 512);
	assert_string_equal(r.limited_by, "minimum");
	/* A training context off the 256 grid is rounded down: 4000 -> 3840. */
	toy.context_length = 4000;
	assert_int_equal(memsize_fit_context(&toy, &machine_8g, "f16", 1, &r), 3840);
	assert_string_equal(r.limited_by, "training context");
	/* No training context in the file: memory alone decides, up to the
	 * 2^30 ceiling (5 x 4 x 16 x 2 = 640 B a token). */
	toy.context_length = 0;
	assert_int_equal(memsize_fit_context(&toy, &machine_16g, "f16", 1, &r),
	                 (long)((14 * GiB - 1717986918u - 1000000u) / 640 / 256 * 256));
	struct mem_budget huge = {.total = UINT64_MAX, .available = UINT64_MAX};
	assert_int_equal(memsize_fit_context(&toy, &huge, "f16", 1, &r), 1L << 30);
	/* available 0 (unknown) falls back to total. */
	struct mem_budget tot_only = {.total = 16 * GiB};
	assert_int_equal(memsize_fit_context(&mi, &tot_only, "f16", 1, &r), 40960);
}

static void test_bad_arguments(void **state)
{
	struct gguf_model_info mi = qwen3_4b();
	struct memsize_report r;
	memset(&r, 0x5a, sizeof r);
	assert_int_equal(memsize_fit_context(NULL, &machine_8g, "f16", 1, &r), -1);
	assert_int_equal(memsize_fit_context(&mi, NULL, "f16", 1, &r), -1);
	assert_int_equal(memsize_fit_context(&mi, &machine_8g, "q3_k", 1, &r), -1);
	assert_int_equal(memsize_fit_context(&mi, &machine_8g, "", 1, &r), -1);
	assert_int_equal(memsize_fit_context(&mi, &machine_8g, "f16", 0, &r), -1);
	assert_int_equal(memsize_fit_context(&mi, &machine_8g, "f16", -3, &r), -1);
	struct gguf_model_info empty;
	memset(&empty, 0, sizeof empty);
	assert_int_equal(memsize_fit_context(&empty, &machine_8g, "f16", 1, &r), -1);
	/* The report is untouched on -1 and may be NULL otherwise. */
	assert_int_equal(r.n_slots, 0x5a5a5a5a);
	assert_int_equal(memsize_fit_context(&mi, &machine_8g, "f16", 1, NULL), 23040);
	/* Absurd slot counts saturate instead of wrapping around. */
	assert_int_equal(memsize_fit_context(&mi, &machine_8g, "f16", 0x7fffffff, &r), 0);

	assert_int_equal(memsize_kv_type("f16"), 1);
	assert_int_equal(memsize_kv_type("F32"), 0);
	assert_int_equal(memsize_kv_type("bf16"), 30);
	assert_int_equal(memsize_kv_type("q8_0"), 8);
	assert_int_equal(memsize_kv_type("q4_0"), 2);
	assert_int_equal(memsize_kv_type("q4_1"), 3);
	assert_int_equal(memsize_kv_type("q5_0"), 6);
	assert_int_equal(memsize_kv_type("q5_1"), 7);
	assert_int_equal(memsize_kv_type("iq4_nl"), 20);
	assert_int_equal(memsize_kv_type("q4_K"), -1);
	assert_int_equal(memsize_kv_type(NULL), -1);
	/* Every accepted name is the ggml type of that name. */
	const char *names[] = {"f32",  "f16",  "bf16", "q8_0",  "q4_0",
	                       "q4_1", "q5_0", "q5_1", "iq4_nl"};
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
		const char *g = gguf_tensor_type_name((uint32_t)memsize_kv_type(names[i]));
		assert_non_null(g);
		assert_string_equal(g, names[i]);
		assert_true(memsize_fit_context(&mi, &machine_16g, names[i], 1, &r) > 0);
	}
}

static void test_explain(void **state)
{
	char buf[512];
	struct memsize_report r;
	struct gguf_model_info q = qwen3_4b(), g = gemma2_9b(), z = glm4_9b();

	assert_int_equal(memsize_fit_context(&q, &machine_8g, "f16", 1, &r), 23040);
	memsize_explain(&r, 65536, buf, sizeof buf);
	assert_string_equal(buf, "asked for 65536 tokens, but only 23040 fit: weights 2.3 GiB + "
	                         "KV f16 144 KiB/token in 7.0 GiB available with 1.5 GiB kept "
	                         "free");
	/* 16,384 x 147,456 + 2.5e9 = 4,915,919,104 B = 4.6 GiB */
	memsize_explain(&r, 16384, buf, sizeof buf);
	assert_string_equal(buf, "16384 tokens fit (at most 23040, limit: memory): weights 2.3 GiB "
	                         "+ KV f16 144 KiB/token = 4.6 GiB of 7.0 GiB available with 1.5 "
	                         "GiB kept free");
	/* None asked: the chosen context, 5,897,386,240 B = 5.5 GiB. */
	memsize_explain(&r, 0, buf, sizeof buf);
	assert_non_null(strstr(buf, "23040 tokens fit (at most 23040, limit: memory)"));
	assert_non_null(strstr(buf, "= 5.5 GiB of"));

	assert_int_equal(memsize_fit_context(&q, &machine_16g, "f16", 1, &r), 40960);
	memsize_explain(&r, 65536, buf, sizeof buf);
	assert_string_equal(buf, "asked for 65536 tokens, but the model was trained on 40960: "
	                         "using 40960");

	assert_int_equal(memsize_fit_context(&g, &machine_8g, "f16", 1, &r), 0);
	memsize_explain(&r, 8192, buf, sizeof buf);
	assert_string_equal(buf, "only 256 tokens fit, under the minimum of 512: weights 5.4 GiB + "
	                         "KV f16 336 KiB/token in 7.0 GiB available with 1.5 GiB kept "
	                         "free");

	assert_int_equal(memsize_fit_context(&z, &machine_8g, "f16", 1, &r), 0);
	memsize_explain(&r, 0, buf, sizeof buf);
	assert_string_equal(buf, "the model does not fit: weights 5.9 GiB + 1.5 GiB kept free is "
	                         "more than the 7.0 GiB available");

	assert_int_equal(memsize_fit_context(&z, &machine_16g, "f16", 4, &r), 42496);
	memsize_explain(&r, 65536, buf, sizeof buf);
	assert_non_null(strstr(buf, "KV f16 40.0 KiB/token x 4 slots in 14.0 GiB available"));

	struct mem_budget b = {.gpu = 1, .vram_total = 8 * GiB, .vram_free = 7680 * MiB};
	assert_int_equal(memsize_fit_context(&q, &b, "f16", 1, &r), 26624);
	memsize_explain(&r, 32768, buf, sizeof buf);
	assert_non_null(strstr(buf, "in 7.5 GiB of free VRAM"));

	/* A small buffer truncates, NUL-terminated. */
	int n = memsize_explain(&r, 32768, buf, 10);
	assert_true(n > 10);
	assert_int_equal(strlen(buf), 9);
}

static void test_human(void **state)
{
	char b[32];
	memsize_human(0, b, sizeof b);
	assert_string_equal(b, "0 B");
	memsize_human(1023, b, sizeof b);
	assert_string_equal(b, "1023 B");
	memsize_human(1024, b, sizeof b);
	assert_string_equal(b, "1.0 KiB");
	memsize_human(147456, b, sizeof b);
	assert_string_equal(b, "144 KiB");
	memsize_human(3 * GiB / 2, b, sizeof b);
	assert_string_equal(b, "1.5 GiB");
	memsize_human(2500000000u, b, sizeof b);
	assert_string_equal(b, "2.3 GiB");
	memsize_human(UINT64_MAX, b, sizeof b);
	assert_string_equal(b, "16.0 EiB");
}

/* --- Reading the machine -------------------------------------------------------- */

static void test_read_machine(void **state)
{
	/* The parsing is tests/unit/test_platform.c's; here, this machine
	 * gives something sensible. */
	struct mem_budget b;
	assert_int_equal(memsize_read_machine(&b), 0);
	assert_true(b.total > 64 * MiB);
	assert_true(b.available > 0 && b.available <= b.total);
	assert_int_equal(b.gpu, 0);
}

/* A fake nvidia-smi first on PATH, before the usual directories. */
static void fake_smi(const char *script, const char *path)
{
	char dir[512], p[600], body[1024], newpath[4096];
	snprintf(dir, sizeof dir, "%s/bin", tmpdir);
	mkdir(dir, 0755);
	snprintf(p, sizeof p, "%s/nvidia-smi", dir);
	snprintf(body, sizeof body, "#!/bin/sh\n%s\n", script);
	write_file(p, body, 0755);
	snprintf(newpath, sizeof newpath, "%s:%s", dir, path);
	setenv("PATH", newpath, 1);
}

static void test_nvidia_smi_run(void **state)
{
	char *saved = strdup(getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
	struct mem_budget b = machine_8g;
	/* It must be asked exactly this. */
	fake_smi("[ \"$1\" = --query-gpu=name,memory.total,memory.used ] || exit 3\n"
	         "[ \"$2\" = --format=csv,noheader,nounits ] || exit 4\n"
	         "echo 'NVIDIA GeForce RTX 4060, 8192, 512'; echo noise >&2",
	         saved);
	assert_int_equal(memsize_read_gpu(&b, NULL, NULL), 0);
	assert_string_equal(b.gpu_source, "nvidia-smi");
	assert_int_equal(b.gpu, 1);
	assert_int_equal(b.vram_total, 8 * GiB);
	assert_int_equal(b.vram_free, 7680 * MiB);
	assert_int_equal(b.total, 8 * GiB); /* RAM untouched */

	struct mem_budget c = machine_8g;
	fake_smi("echo '8192, 512'; exit 9", saved); /* fails: not trusted */
	assert_int_equal(memsize_read_gpu(&c, NULL, NULL), -1);
	assert_int_equal(c.gpu, 0);
	fake_smi("echo 'No devices were found'", saved);
	assert_int_equal(memsize_read_gpu(&c, NULL, NULL), -1);
	/* Far more output than it should print: drained, then refused. */
	fake_smi("i=0; while [ $i -lt 3000 ]; do echo '8192, 512'; i=$((i+1)); done", saved);
	assert_int_equal(memsize_read_gpu(&c, NULL, NULL), -1);
	/* A hung nvidia-smi is killed at the deadline. */
	setenv("TOKI_NVIDIA_SMI_TIMEOUT_MS", "300", 1);
	fake_smi("exec sleep 30", saved);
	assert_int_equal(memsize_read_gpu(&c, NULL, NULL), -1);
	unsetenv("TOKI_NVIDIA_SMI_TIMEOUT_MS");
	/* No nvidia-smi at all. */
	char empty[512];
	snprintf(empty, sizeof empty, "%s/nothing", tmpdir);
	setenv("PATH", empty, 1);
	assert_int_equal(memsize_read_gpu(&c, NULL, NULL), -1);
	assert_int_equal(c.gpu, 0);
	setenv("PATH", saved, 1);
	free(saved);
}

/* llama-server's own device list comes before nvidia-smi: it names what its
 * backend (CUDA, ROCm, Vulkan, Metal) will use. */
static void test_list_devices_run(void **state)
{
	char *saved = strdup(getenv("PATH") ? getenv("PATH") : "/usr/bin:/bin");
	/* An nvidia-smi that would say otherwise: it must not be asked. */
	fake_smi("echo 'NVIDIA X, 1000, 0'", saved);
	char server[600];
	snprintf(server, sizeof server, "%s/llama-server", tmpdir);
	/* The backends log on stderr before the list; the environment given
	 * reaches it (HSA_OVERRIDE_GFX_VERSION for ROCm). */
	write_file(server,
	           "#!/bin/sh\n[ \"$1\" = --list-devices ] || exit 3\n"
	           "[ \"$TOKI_TEST_ENV\" = yes ] || exit 4\n"
	           "echo 'ggml_cuda_init: found 2 CUDA devices:' >&2\n"
	           "echo 'Available devices:'\n"
	           "echo '  CUDA0: NVIDIA H100 80GB HBM3 (81559 MiB, 80000 MiB free)'\n"
	           "echo '  CUDA1: NVIDIA H100 80GB HBM3 (81559 MiB, 1000 MiB free)'\n",
	           0755);
	char env1[] = "TOKI_TEST_ENV=yes";
	char *env[] = {env1, NULL};
	struct mem_budget b = machine_8g;
	assert_int_equal(memsize_read_gpu(&b, server, env), 0);
	assert_int_equal(b.gpu, 1);
	assert_int_equal(b.vram_total, 2 * 81559 * MiB);
	assert_int_equal(b.vram_free, 81000 * MiB);
	assert_string_equal(b.gpu_source, "llama-server --list-devices");
	/* Without the environment it fails, and nvidia-smi answers. */
	b = machine_8g;
	assert_int_equal(memsize_read_gpu(&b, server, NULL), 0);
	assert_int_equal(b.vram_total, 1000 * MiB);
	assert_string_equal(b.gpu_source, "nvidia-smi");
	/* A software Vulkan device (lavapipe) is no GPU; with no nvidia-smi
	 * either there is none. */
	write_file(
	    server,
	    "#!/bin/sh\necho 'Available devices:'\n"
	    "echo '  Vulkan0: llvmpipe (LLVM 19.1.7, 256 bits) (24105 MiB, 23767 MiB free)'\n",
	    0755);
	char empty[512];
	snprintf(empty, sizeof empty, "%s/nothing", tmpdir);
	setenv("PATH", empty, 1);
	b = machine_8g;
	assert_int_equal(memsize_read_gpu(&b, server, NULL), -1);
	assert_int_equal(b.gpu, 0);
	setenv("PATH", saved, 1);
	free(saved);
}

/* --- The recorded context ----------------------------------------------------------- */

static void test_ctx_file(void **state)
{
	errno = 0;
	assert_int_equal(memsize_read_ctx("qwen3-4b"), -1);
	assert_int_equal(errno, ENOENT);
	assert_int_equal(memsize_write_ctx("qwen3-4b", 23040), 0);
	assert_int_equal(memsize_read_ctx("qwen3-4b"), 23040);
	assert_int_equal(memsize_write_ctx("qwen3-4b", 40960), 0);
	assert_int_equal(memsize_read_ctx("qwen3-4b"), 40960);
	char p[512];
	snprintf(p, sizeof p, "%s/state/run/qwen3-4b/ctx", tmpdir);
	FILE *f = fopen(p, "r");
	assert_non_null(f);
	char buf[32] = "";
	assert_non_null(fgets(buf, sizeof buf, f));
	fclose(f);
	assert_string_equal(buf, "40960\n");
	/* Only the file itself is left: no temporaries. */
	char cmd[700];
	snprintf(cmd, sizeof cmd, "test \"$(ls -A '%s/state/run/qwen3-4b')\" = ctx", tmpdir);
	assert_int_equal(system(cmd), 0);

	/* Bad values and names. */
	errno = 0;
	assert_int_equal(memsize_write_ctx("qwen3-4b", 0), -1);
	assert_int_equal(errno, EINVAL);
	assert_int_equal(memsize_write_ctx("qwen3-4b", -5), -1);
	assert_int_equal(memsize_write_ctx("qwen3-4b", (1L << 30) + 1), -1);
	const char *bad[] = {"../x", "a/b", "", ".", "..", NULL};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		errno = 0;
		assert_int_equal(memsize_write_ctx(bad[i], 1024), -1);
		assert_int_equal(errno, EINVAL);
		assert_int_equal(memsize_read_ctx(bad[i]), -1);
	}
	/* A file that does not hold a positive number. */
	const char *junk[] = {
	    "", "abc\n", "-5\n", "0\n", "12x\n", "99999999999999999999\n", "2000000000\n"};
	for (size_t i = 0; i < sizeof junk / sizeof junk[0]; i++) {
		write_file(p, junk[i], 0644);
		errno = 0;
		assert_int_equal(memsize_read_ctx("qwen3-4b"), -1);
		assert_int_equal(errno, EINVAL);
	}
	write_file(p, "  8192 \r\n", 0644);
	assert_int_equal(memsize_read_ctx("qwen3-4b"), -1); /* must start with the digits */
	write_file(p, "8192 \r\n", 0644);
	assert_int_equal(memsize_read_ctx("qwen3-4b"), 8192);

	/* The run directory cannot be made: a file is where it should go. */
	snprintf(p, sizeof p, "%s/state/run/blocked", tmpdir);
	write_file(p, "x", 0644);
	assert_int_equal(memsize_write_ctx("blocked", 1024), -1);
	/* The rename target is a non-empty directory. */
	snprintf(p, sizeof p, "%s/state/run/dir/ctx/x", tmpdir);
	snprintf(cmd, sizeof cmd, "mkdir -p '%s'", p);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(memsize_write_ctx("dir", 1024), -1);
	snprintf(cmd, sizeof cmd, "test \"$(ls -A '%s/state/run/dir')\" = ctx", tmpdir);
	assert_int_equal(system(cmd), 0); /* the temporary was removed */
	/* A state path that does not fit. */
	char longp[5000];
	memset(longp, 'a', sizeof longp - 1);
	longp[0] = '/';
	longp[sizeof longp - 1] = '\0';
	setenv("TOKI_STATE_DIR", longp, 1);
	errno = 0;
	assert_int_equal(memsize_write_ctx("x", 1024), -1);
	assert_int_equal(errno, ENAMETOOLONG);
	assert_int_equal(memsize_read_ctx("x"), -1);
}

/* llama-server arguments that give a model another context than its file
 * states (issue 13, item 12): a registry entry with ctx 8192 and
 * --override-kv llama.context_length=int:65536 on a model trained on 2048
 * was refused. */
static void test_ctx_train_from_args(void **state)
{
	(void)state;
	char why[200];
	char *none[] = {"-ngl", "99", "-fa", "on"};
	assert_int_equal(memsize_ctx_train_from_args(2048, none, 4, why, sizeof why), 2048);
	assert_string_equal(why, "");
	assert_int_equal(memsize_ctx_train_from_args(2048, NULL, 0, NULL, 0), 2048);

	char *ov[] = {"--override-kv", "llama.context_length=int:65536"};
	assert_int_equal(memsize_ctx_train_from_args(2048, ov, 2, why, sizeof why), 65536);
	assert_string_equal(why, "--override-kv llama.context_length=int:65536");
	/* Any architecture; several overrides in one argument; a shorter one. */
	char *ov2[] = {"--override-kv", "qwen3.expert_count=int:8,qwen3.context_length=int:1024"};
	assert_int_equal(memsize_ctx_train_from_args(40960, ov2, 2, why, sizeof why), 1024);
	/* Other keys, other types, no number: not the context. */
	char *ov3[] = {"--override-kv", "llama.context_length=float:9.0",
	               "--override-kv", "llama.block_count=int:99",
	               "--override-kv", "llama.context_length=int:"};
	assert_int_equal(memsize_ctx_train_from_args(2048, ov3, 6, why, sizeof why), 2048);
	assert_string_equal(why, "");

	/* RoPE scaling: linear scale, frequency scale, YaRN's original context. */
	char *rs[] = {"--rope-scaling", "linear", "--rope-scale", "4"};
	assert_int_equal(memsize_ctx_train_from_args(2048, rs, 4, why, sizeof why), 8192);
	assert_string_equal(why, "--rope-scale 4");
	char *fs[] = {"--rope-freq-scale", "0.25"};
	assert_int_equal(memsize_ctx_train_from_args(4096, fs, 2, why, sizeof why), 16384);
	/* Written with underscores, as llama-server reads them too. */
	char *fs_[] = {"--rope_freq_scale", "0.25"};
	assert_int_equal(memsize_ctx_train_from_args(4096, fs_, 2, why, sizeof why), 16384);
	char *yarn[] = {"--rope-scaling", "yarn", "--rope-scale", "4", "--yarn-orig-ctx", "32768"};
	assert_int_equal(memsize_ctx_train_from_args(32768, yarn, 6, why, sizeof why), 131072);
	assert_string_equal(why, "--rope-scale 4 --yarn-orig-ctx 32768");
	/* --rope-scaling without a scale, or a scale of 1 or less, stretches
	 * nothing; a stretch of a shorter original context adds nothing. */
	char *noscale[] = {"--rope-scaling", "yarn", "--yarn-orig-ctx", "32768"};
	assert_int_equal(memsize_ctx_train_from_args(2048, noscale, 4, why, sizeof why), 2048);
	char *shrink[] = {"--rope-scale", "0.5"};
	assert_int_equal(memsize_ctx_train_from_args(2048, shrink, 2, why, sizeof why), 2048);
	char *short_orig[] = {"--rope-scale", "2", "--yarn-orig-ctx", "512"};
	assert_int_equal(memsize_ctx_train_from_args(4096, short_orig, 4, why, sizeof why), 4096);
	assert_string_equal(why, "");
	/* Both: the override is the original context the scale stretches. */
	char *both[] = {"--override-kv", "llama.context_length=int:4096", "--rope-scale", "2"};
	assert_int_equal(memsize_ctx_train_from_args(2048, both, 4, why, sizeof why), 8192);
	assert_string_equal(why, "--override-kv llama.context_length=int:4096 --rope-scale 2");
	/* A file that states no context: only the arguments give one. */
	assert_int_equal(memsize_ctx_train_from_args(0, rs, 4, why, sizeof why), 0);
	assert_int_equal(memsize_ctx_train_from_args(0, ov, 2, why, sizeof why), 65536);
	/* A flag without its value, a value that is not a number. */
	char *dangling[] = {"--rope-scale", "x", "--override-kv"};
	assert_int_equal(memsize_ctx_train_from_args(2048, dangling, 3, why, sizeof why), 2048);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_kv_per_token),
	    cmocka_unit_test(test_qwen3_4b_8g),
	    cmocka_unit_test(test_qwen3_4b_16g),
	    cmocka_unit_test(test_gemma2_9b),
	    cmocka_unit_test(test_glm4_9b),
	    cmocka_unit_test(test_gpu),
	    cmocka_unit_test(test_floor_and_caps),
	    cmocka_unit_test(test_bad_arguments),
	    cmocka_unit_test(test_explain),
	    cmocka_unit_test(test_human),
	    cmocka_unit_test(test_read_machine),
	    cmocka_unit_test_setup_teardown(test_nvidia_smi_run, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_list_devices_run, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_ctx_file, setup, teardown),
	    cmocka_unit_test(test_ctx_train_from_args),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
