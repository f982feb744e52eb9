/* GGUF reader and random-model writer: known facts of a real model, a
 * write/read round trip, determinism, and hostile input (truncations, absurd
 * counts, malformed fields, random mutations) that must fail cleanly. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "tmpdir.h"
#include "model/gguf.h"
#include "gguf_craft.h"

/* --- Helpers ------------------------------------------------------------- */

static int setup_tmpdir(void **state)
{
	(void)state;
	return tmpdir_make("toki-gguf");
}

static int teardown_tmpdir(void **state)
{
	(void)state;
	tmpdir_remove();
	return 0;
}

static void tmp_path(char *out, size_t len, const char *name)
{
	snprintf(out, len, "%s/%s", tmpdir, name);
}

/* The test model: $TOKI_TEST_MODEL, else <source>/../shared/models/, where
 * <source> is $TOKI_SOURCE_DIR or, as ctest does not set it for unit tests,
 * the repository this file was compiled from (CMake passes absolute paths). */
static void stories_path(char *out, size_t len)
{
	const char *m = getenv("TOKI_TEST_MODEL");
	if (m && *m) {
		snprintf(out, len, "%s", m);
		return;
	}
	const char *src = getenv("TOKI_SOURCE_DIR");
	if (src && *src) {
		snprintf(out, len, "%s/../shared/models/stories260K.gguf", src);
		return;
	}
	const char *file = __FILE__;
	const char *tail = strstr(file, "/tests/unit/test_gguf.c");
	if (tail)
		snprintf(out, len, "%.*s/../shared/models/stories260K.gguf", (int)(tail - file),
		         file);
	else
		snprintf(out, len, "../shared/models/stories260K.gguf");
}

static uint8_t *read_all(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	assert_non_null(f);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	assert_true(n >= 0);
	fseek(f, 0, SEEK_SET);
	uint8_t *buf = malloc((size_t)n + 1);
	assert_non_null(buf);
	assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
	fclose(f);
	*len = (size_t)n;
	return buf;
}

static void write_all(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(data, 1, len, f), len);
	assert_int_equal(fclose(f), 0);
}

static void small_params(struct gguf_gen_params *p)
{
	gguf_gen_params_default(p);
	p->n_embd = 128;
	p->n_layers = 2;
	p->n_head = 4;
	p->n_head_kv = 2;
	p->n_ff = 256;
	p->context_length = 4096;
	p->seed = 7;
	p->name = "tiny";
}

static void write_small_model(const char *name, uint32_t wtype, uint64_t seed, char *path,
                              size_t pathlen)
{
	struct gguf_gen_params p;
	small_params(&p);
	p.weight_type = wtype;
	p.seed = seed;
	tmp_path(path, pathlen, name);
	char err[256] = "";
	int rc = gguf_write_random_llama(&p, path, err, sizeof err);
	if (rc != 0)
		fail_msg("write failed: %s", err);
}

/* Parses from memory and also, for a few cases, through a file: the two
 * readers share the parser but not the I/O. Returns the error text. */
static void expect_fail(const struct buf *b, const char *needle)
{
	struct gguf_error err;
	struct gguf *g = gguf_open_memory(b->p, b->len, &err);
	if (g) {
		gguf_close(g);
		fail_msg("parse succeeded, expected an error containing '%s'", needle);
	}
	assert_true(err.text[0] != '\0');
	if (needle && !strstr(err.text, needle))
		fail_msg("error '%s' does not contain '%s'", err.text, needle);

	char path[512];
	tmp_path(path, sizeof path, "crafted.gguf");
	write_all(path, b->p, b->len);
	g = gguf_open(path, &err);
	if (g) {
		gguf_close(g);
		fail_msg("file parse succeeded, expected '%s'", needle);
	}
	if (needle && !strstr(err.text, needle))
		fail_msg("file error '%s' does not contain '%s'", err.text, needle);
}

/* --- A real model -------------------------------------------------------- */

static void test_stories260k(void **state)
{
	char path[1024];
	stories_path(path, sizeof path);
	if (access(path, R_OK) != 0) {
		print_message("skipping: %s not found (set TOKI_TEST_MODEL)\n", path);
		skip();
	}
	struct gguf_error err;
	struct gguf *g = gguf_open(path, &err);
	if (!g)
		fail_msg("%s: %s", path, err.text);
	assert_int_equal(gguf_version(g), 3);
	assert_int_equal(gguf_file_size(g), 1185376);
	assert_int_equal(gguf_alignment(g), 32);
	assert_int_equal(gguf_n_tensors(g), 48);

	struct gguf_model_info mi;
	assert_true(gguf_model_info_read(g, &mi));
	assert_string_equal(mi.architecture, "llama");
	assert_int_equal(mi.n_layers, 5);
	assert_int_equal(mi.n_embd, 64);
	assert_int_equal(mi.n_head, 8);
	assert_int_equal(mi.n_head_kv, 4);
	assert_int_equal(mi.n_head_kv_sum, 20);
	assert_false(mi.n_head_kv_per_layer);
	assert_int_equal(mi.n_ff, 172);
	assert_int_equal(mi.key_length, 8);
	assert_int_equal(mi.value_length, 8);
	assert_int_equal(mi.context_length, 2048);
	assert_int_equal(mi.n_vocab, 512);
	assert_string_equal(mi.tokenizer_model, "llama");
	assert_false(mi.has_chat_template);
	assert_int_equal(mi.file_size, 1185376);
	assert_int_equal(mi.file_type, -1);
	assert_int_equal(mi.main_tensor_type, GGML_TYPE_F32);
	/* f32: 4 bytes per parameter, all of it tensor data. */
	assert_int_equal(mi.tensor_data_bytes, mi.n_params * 4);
	assert_true(mi.tensor_data_bytes <= mi.file_size - gguf_data_offset(g));

	/* 5 layers × 4 KV heads × (8 + 8) × 2 bytes. */
	assert_int_equal(gguf_kv_bytes_per_token(&mi, 2.0), 640);
	assert_int_equal(gguf_kv_bytes_per_token_type(&mi, GGML_TYPE_F16, GGML_TYPE_F16), 640);
	/* q8_0: 160 elements each for K and V = 5 blocks of 34 bytes. */
	assert_int_equal(gguf_kv_bytes_per_token_type(&mi, GGML_TYPE_Q8_0, GGML_TYPE_Q8_0), 340);

	const struct gguf_tensor_info *te = gguf_find_tensor(g, "token_embd.weight");
	assert_non_null(te);
	assert_int_equal(te->n_dims, 2);
	assert_int_equal(te->ne[0], 64);
	assert_int_equal(te->ne[1], 512);
	assert_int_equal(te->type, GGML_TYPE_F32);
	const struct gguf_kv *toks = gguf_find_key(g, "tokenizer.ggml.tokens");
	assert_non_null(toks);
	assert_int_equal(toks->arr_type, GGUF_TYPE_STRING);
	assert_string_equal(gguf_kv_arr_str(toks, 0)->data, "<unk>");
	assert_string_equal(gguf_kv_arr_str(toks, 1)->data, "<s>");
	assert_null(gguf_kv_arr_str(toks, 512));
	uint32_t bos;
	assert_true(gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &bos));
	assert_int_equal(bos, 1);
	float eps;
	assert_true(gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps));
	assert_true(eps > 0.9e-5f && eps < 1.1e-5f);
	assert_null(gguf_find_key(g, "no.such.key"));
	assert_null(gguf_get_string(g, "llama.block_count")); /* not a string */
	gguf_close(g);
}

/* --- Round trip ---------------------------------------------------------- */

static void check_tensor(const struct gguf *g, const char *name, uint64_t ne0, uint64_t ne1,
                         uint32_t type)
{
	const struct gguf_tensor_info *t = gguf_find_tensor(g, name);
	if (!t)
		fail_msg("tensor %s missing", name);
	assert_int_equal(t->n_dims, ne1 ? 2 : 1);
	assert_int_equal(t->ne[0], ne0);
	assert_int_equal(t->ne[1], ne1 ? ne1 : 1);
	assert_int_equal(t->type, type);
	assert_int_equal(t->offset % 32, 0);
}

static void roundtrip(uint32_t wtype)
{
	char path[512];
	write_small_model(wtype == GGML_TYPE_F16 ? "rt16.gguf" : "rt32.gguf", wtype, 7, path,
	                  sizeof path);
	char tmp[600];
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	assert_int_equal(access(tmp, F_OK), -1); /* renamed away */

	struct gguf_error err;
	struct gguf *g = gguf_open(path, &err);
	if (!g)
		fail_msg("%s", err.text);
	struct stat st;
	assert_int_equal(stat(path, &st), 0);

	struct gguf_model_info mi;
	assert_true(gguf_model_info_read(g, &mi));
	assert_string_equal(mi.architecture, "llama");
	assert_string_equal(mi.name, "tiny");
	assert_int_equal(mi.version, 3);
	assert_int_equal(mi.n_layers, 2);
	assert_int_equal(mi.n_embd, 128);
	assert_int_equal(mi.n_head, 4);
	assert_int_equal(mi.n_head_kv, 2);
	assert_int_equal(mi.n_head_kv_sum, 4);
	assert_int_equal(mi.n_ff, 256);
	assert_int_equal(mi.key_length, 32);
	assert_int_equal(mi.value_length, 32);
	assert_int_equal(mi.context_length, 4096);
	assert_int_equal(mi.n_vocab, gguf_gen_vocab_size());
	assert_true(mi.n_vocab > 512 && mi.n_vocab < 4096);
	assert_string_equal(mi.tokenizer_model, "llama");
	assert_true(mi.has_chat_template);
	assert_int_equal(mi.file_size, (uint64_t)st.st_size);
	assert_int_equal(mi.n_tensors, 3 + 9 * 2);
	assert_int_equal(mi.alignment, 32);
	assert_int_equal(mi.file_type, wtype == GGML_TYPE_F16 ? 1 : 0);
	assert_int_equal(mi.main_tensor_type, wtype);

	struct gguf_gen_params p;
	small_params(&p);
	assert_int_equal(mi.n_params, gguf_gen_param_count(&p));
	/* Norms (f32) plus matrices at the weight type's size. */
	uint64_t norms = 128 + 2 * 2 * 128;
	uint64_t esz = wtype == GGML_TYPE_F16 ? 2 : 4;
	assert_int_equal(mi.tensor_data_bytes, norms * 4 + (mi.n_params - norms) * esz);
	/* The file is metadata, padding and the data, nothing more. */
	uint64_t data_end = 0;
	for (size_t i = 0; i < gguf_n_tensors(g); i++) {
		const struct gguf_tensor_info *t = gguf_tensor_at(g, i);
		uint64_t end = t->offset + t->nbytes;
		if (end > data_end)
			data_end = end;
	}
	assert_int_equal(gguf_data_offset(g) % 32, 0);
	assert_int_equal(gguf_data_offset(g) + (data_end + 31) / 32 * 32, (uint64_t)st.st_size);
	/* 2 layers × 2 KV heads × (32 + 32) × 2 bytes. */
	assert_int_equal(gguf_kv_bytes_per_token(&mi, 2.0), 512);

	uint32_t v = 0;
	assert_true(gguf_get_u32(g, "llama.rope.dimension_count", &v));
	assert_int_equal(v, 32);
	assert_true(gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &v));
	assert_int_equal(v, GGUF_GEN_TOKEN_BOS);
	assert_true(gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &v));
	assert_int_equal(v, GGUF_GEN_TOKEN_EOS);
	assert_true(gguf_get_u32(g, "tokenizer.ggml.eot_token_id", &v));
	assert_int_equal(v, GGUF_GEN_TOKEN_IM_END);
	assert_true(gguf_get_u32(g, "tokenizer.ggml.unknown_token_id", &v));
	assert_int_equal(v, GGUF_GEN_TOKEN_UNK);
	bool bv = false;
	assert_true(gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &bv));
	assert_true(bv);
	assert_true(gguf_get_bool(g, "tokenizer.ggml.add_eos_token", &bv));
	assert_false(bv);
	float f = 0;
	assert_true(gguf_get_f32(g, "llama.rope.freq_base", &f));
	assert_true(f == 10000.0f);
	const char *tmpl = gguf_get_string(g, "tokenizer.chat_template");
	assert_non_null(tmpl);
	assert_non_null(strstr(tmpl, "<|im_start|>"));
	assert_non_null(strstr(tmpl, "add_generation_prompt"));

	const struct gguf_kv *toks = gguf_find_key(g, "tokenizer.ggml.tokens");
	const struct gguf_kv *types = gguf_find_key(g, "tokenizer.ggml.token_type");
	const struct gguf_kv *scores = gguf_find_key(g, "tokenizer.ggml.scores");
	assert_non_null(toks);
	assert_non_null(types);
	assert_non_null(scores);
	assert_int_equal(gguf_kv_arr_n(types), mi.n_vocab);
	assert_int_equal(gguf_kv_arr_n(scores), mi.n_vocab);
	assert_int_equal(scores->arr_type, GGUF_TYPE_FLOAT32);
	assert_int_equal(types->arr_type, GGUF_TYPE_INT32);
	static const struct {
		uint32_t id;
		const char *text;
		int64_t type;
	} expect[] = {
	    {0, "<unk>", 2},
	    {1, "<s>", 3},
	    {2, "</s>", 3},
	    {3, "<|im_start|>", 3},
	    {4, "<|im_end|>", 3},
	    {GGUF_GEN_TOKEN_BYTE0, "<0x00>", 6},
	    {GGUF_GEN_TOKEN_BYTE0 + 0x0a, "<0x0A>", 6},
	    {GGUF_GEN_TOKEN_BYTE0 + 255, "<0xFF>", 6},
	    {GGUF_GEN_TOKEN_BYTE0 + 256, "\xe2\x96\x81", 1},
	};
	for (size_t i = 0; i < sizeof expect / sizeof expect[0]; i++) {
		const struct gguf_str *s = gguf_kv_arr_str(toks, expect[i].id);
		assert_non_null(s);
		assert_string_equal(s->data, expect[i].text);
		int64_t t;
		assert_true(gguf_kv_arr_i64(types, expect[i].id, &t));
		assert_int_equal(t, expect[i].type);
	}
	/* Common words are single pieces, and all pieces are unique. */
	bool have_the = false;
	for (uint64_t i = 0; i < gguf_kv_arr_n(toks); i++) {
		const struct gguf_str *s = gguf_kv_arr_str(toks, i);
		assert_non_null(s);
		assert_true(s->len > 0);
		have_the |= !strcmp(s->data, "\xe2\x96\x81the");
	}
	assert_true(have_the);

	uint64_t q_dim = 128, kv_dim = 2 * 32;
	check_tensor(g, "token_embd.weight", 128, mi.n_vocab, wtype);
	check_tensor(g, "output.weight", 128, mi.n_vocab, wtype);
	check_tensor(g, "output_norm.weight", 128, 0, GGML_TYPE_F32);
	for (int l = 0; l < 2; l++) {
		char n[64];
#define CHECK(suffix, a, b, t)                                                                     \
	do {                                                                                       \
		snprintf(n, sizeof n, "blk.%d." suffix ".weight", l);                              \
		check_tensor(g, n, (a), (b), (t));                                                 \
	} while (0)
		CHECK("attn_norm", 128, 0, GGML_TYPE_F32);
		CHECK("attn_q", 128, q_dim, wtype);
		CHECK("attn_k", 128, kv_dim, wtype);
		CHECK("attn_v", 128, kv_dim, wtype);
		CHECK("attn_output", q_dim, 128, wtype);
		CHECK("ffn_norm", 128, 0, GGML_TYPE_F32);
		CHECK("ffn_gate", 128, 256, wtype);
		CHECK("ffn_up", 128, 256, wtype);
		CHECK("ffn_down", 256, 128, wtype);
#undef CHECK
	}

	/* Look at the data: norms are exactly 1.0, weights small and not all
	 * equal. */
	size_t flen;
	uint8_t *file = read_all(path, &flen);
	const struct gguf_tensor_info *on = gguf_find_tensor(g, "output_norm.weight");
	for (uint64_t i = 0; i < on->ne[0]; i++) {
		float x;
		memcpy(&x, file + gguf_data_offset(g) + on->offset + 4 * i, 4);
		assert_true(x == 1.0f);
	}
	const struct gguf_tensor_info *wq = gguf_find_tensor(g, "blk.1.attn_q.weight");
	const uint8_t *d = file + gguf_data_offset(g) + wq->offset;
	unsigned distinct_signs = 0;
	double sumsq = 0;
	for (uint64_t i = 0; i < wq->n_elements; i++) {
		double x;
		if (wtype == GGML_TYPE_F32) {
			float fx;
			memcpy(&fx, d + 4 * i, 4);
			x = fx;
		} else {
			/* Decode f16 by hand: sign, 5-bit exponent, 10-bit mantissa. */
			uint16_t h = (uint16_t)(d[2 * i] | d[2 * i + 1] << 8);
			int e = (h >> 10) & 0x1f, m = h & 0x3ff;
			x = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
			if (h & 0x8000)
				x = -x;
		}
		assert_true(x >= -0.03125 && x <= 0.03125);
		distinct_signs |= x < 0 ? 1 : 2;
		sumsq += x * x;
	}
	assert_int_equal(distinct_signs, 3);
	double sd = sqrt(sumsq / (double)wq->n_elements);
	assert_true(sd > 0.015 && sd < 0.021); /* uniform ±2^-5: 0.018 */
	free(file);
	gguf_close(g);
}

static void test_roundtrip_f16(void **state)
{
	roundtrip(GGML_TYPE_F16);
}

static void test_roundtrip_f32(void **state)
{
	roundtrip(GGML_TYPE_F32);
}

/* --- Determinism --------------------------------------------------------- */

static void sha256_file(const char *path, char hex[65])
{
	size_t len;
	uint8_t *d = read_all(path, &len);
	unsigned char md[32];
	unsigned int mdlen = 0;
	assert_int_equal(EVP_Digest(d, len, md, &mdlen, EVP_sha256(), NULL), 1);
	for (unsigned i = 0; i < 32; i++)
		snprintf(hex + 2 * i, 3, "%02x", md[i]);
	free(d);
}

static void test_determinism(void **state)
{
	char a[512], b[512], c[512];
	write_small_model("det_a.gguf", GGML_TYPE_F16, 42, a, sizeof a);
	write_small_model("det_b.gguf", GGML_TYPE_F16, 42, b, sizeof b);
	write_small_model("det_c.gguf", GGML_TYPE_F16, 43, c, sizeof c);
	size_t la, lb, lc;
	uint8_t *da = read_all(a, &la), *db = read_all(b, &lb), *dc = read_all(c, &lc);
	assert_int_equal(la, lb);
	assert_memory_equal(da, db, la);
	assert_int_equal(la, lc);
	assert_memory_not_equal(da, dc, la);
	free(da);
	free(db);
	free(dc);

	/* Same bytes on every machine: a pinned hash. Weights are exact
	 * multiples of 2^-28 converted to f16 with integer code, so nothing
	 * depends on the host's float environment. An intended change to the
	 * generator (vocabulary, metadata, weights) must update this hash. */
	char hex[65];
	sha256_file(a, hex);
	print_message("small model (seed 42) sha256 %s\n", hex);
	assert_string_equal(hex,
	                    "dacfdd18cd62513cd3f69cfba80d1c597a6ebd66a7597fc697ee397c505ad760");
}

/* --- Parameters ---------------------------------------------------------- */

static void test_params(void **state)
{
	uint64_t n = 0;
	assert_true(gguf_parse_param_count("24M", &n));
	assert_int_equal(n, 24000000);
	assert_true(gguf_parse_param_count("1.5B", &n));
	assert_int_equal(n, 1500000000);
	assert_true(gguf_parse_param_count("500k", &n));
	assert_int_equal(n, 500000);
	assert_true(gguf_parse_param_count("123456", &n));
	assert_int_equal(n, 123456);
	assert_false(gguf_parse_param_count("", &n));
	assert_false(gguf_parse_param_count("24X", &n));
	assert_false(gguf_parse_param_count("24MM", &n));
	assert_false(gguf_parse_param_count("-5M", &n));
	assert_false(gguf_parse_param_count("nan", &n));
	assert_false(gguf_parse_param_count("1e30", &n));

	static const uint64_t sizes[] = {1000000, 24000000, 100000000, 1000000000, 7000000000};
	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		struct gguf_gen_params p;
		gguf_gen_params_default(&p);
		char err[256];
		assert_true(gguf_gen_params_for_size(&p, sizes[i], err, sizeof err));
		double got = (double)gguf_gen_param_count(&p);
		assert_true(got > 0.85 * (double)sizes[i] && got < 1.15 * (double)sizes[i]);
		assert_int_equal(p.n_embd % 64, 0);
		assert_int_equal(p.n_embd / p.n_head, 64);
		assert_int_equal(p.n_head % p.n_head_kv, 0);
		assert_int_equal(p.n_ff % 64, 0);
	}
	struct gguf_gen_params p;
	gguf_gen_params_default(&p);
	assert_int_equal(p.context_length, 32768);
	assert_int_equal(p.weight_type, GGML_TYPE_F16);
	assert_int_equal(p.n_embd, 512);
	assert_int_equal(p.n_layers, 8);
	char err[256];
	assert_false(gguf_gen_params_for_size(&p, 1000, err, sizeof err));
	assert_non_null(strstr(err, "too small"));
	assert_non_null(strstr(err, "built-in vocabulary"));
	/* With another model's vocabulary the smallest count is that
	 * vocabulary's, and the message says so (it once named the built-in
	 * one with the other's count). */
	struct gguf_gen_vocab big = {.n = 151669};
	gguf_gen_params_default(&p);
	p.vocab = &big;
	assert_false(gguf_gen_params_for_size(&p, 1000000, err, sizeof err));
	assert_non_null(strstr(err, "too small"));
	assert_null(strstr(err, "built-in"));
	assert_non_null(strstr(err, "this vocabulary (151669 tokens)"));
	struct gguf_gen_params smallest;
	gguf_gen_params_default(&smallest);
	smallest.vocab = &big;
	smallest.n_embd = 64;
	smallest.n_head = smallest.n_head_kv = 1;
	smallest.n_ff = 192;
	smallest.n_layers = 1;
	char want[64];
	snprintf(want, sizeof want, "has %llu",
	         (unsigned long long)gguf_gen_param_count(&smallest));
	assert_non_null(strstr(err, want));
	gguf_gen_params_default(&p);

	/* Invalid shapes are refused before anything is written. */
	char path[512];
	tmp_path(path, sizeof path, "bad.gguf");
	small_params(&p);
	p.n_head = 3; /* 128 % 3 != 0 */
	assert_int_equal(gguf_write_random_llama(&p, path, err, sizeof err), -1);
	assert_non_null(strstr(err, "multiple"));
	small_params(&p);
	p.n_head_kv = 3;
	assert_int_equal(gguf_write_random_llama(&p, path, err, sizeof err), -1);
	small_params(&p);
	p.weight_type = GGML_TYPE_Q8_0;
	assert_int_equal(gguf_write_random_llama(&p, path, err, sizeof err), -1);
	small_params(&p);
	p.n_layers = 0;
	assert_int_equal(gguf_write_random_llama(&p, path, err, sizeof err), -1);
	assert_int_equal(access(path, F_OK), -1);
	small_params(&p);
	assert_int_equal(gguf_write_random_llama(&p, "/nonexistent-dir/x.gguf", err, sizeof err),
	                 -1);
	assert_non_null(strstr(err, "cannot create"));
}

/* --- All value types ----------------------------------------------------- */

static void test_value_types(void **state)
{
	struct buf b = {0};
	b_header(&b, 0, 17);
	b_str(&b, "u8");
	b_u32(&b, GGUF_TYPE_UINT8);
	b_u8(&b, 200);
	b_str(&b, "i8");
	b_u32(&b, GGUF_TYPE_INT8);
	b_u8(&b, (uint8_t)-5);
	b_str(&b, "u16");
	b_u32(&b, GGUF_TYPE_UINT16);
	b_u8(&b, 0x34);
	b_u8(&b, 0x12);
	b_str(&b, "i16");
	b_u32(&b, GGUF_TYPE_INT16);
	b_u8(&b, 0xfe);
	b_u8(&b, 0xff);
	b_str(&b, "u32");
	b_u32(&b, GGUF_TYPE_UINT32);
	b_u32(&b, 4000000000u);
	b_str(&b, "i32");
	b_u32(&b, GGUF_TYPE_INT32);
	b_u32(&b, (uint32_t)-70000);
	b_str(&b, "f32");
	b_u32(&b, GGUF_TYPE_FLOAT32);
	b_u32(&b, 0x3fc00000u); /* 1.5 */
	b_str(&b, "bool");
	b_u32(&b, GGUF_TYPE_BOOL);
	b_u8(&b, 1);
	b_str(&b, "str");
	b_u32(&b, GGUF_TYPE_STRING);
	b_str(&b, "hello");
	b_str(&b, "u64");
	b_u32(&b, GGUF_TYPE_UINT64);
	b_u64(&b, UINT64_MAX);
	b_str(&b, "i64");
	b_u32(&b, GGUF_TYPE_INT64);
	b_u64(&b, (uint64_t)INT64_MIN);
	b_str(&b, "f64");
	b_u32(&b, GGUF_TYPE_FLOAT64);
	b_u64(&b, 0xc004000000000000ull); /* -2.5 */
	b_str(&b, "arr_i32");
	b_u32(&b, GGUF_TYPE_ARRAY);
	b_u32(&b, GGUF_TYPE_INT32);
	b_u64(&b, 3);
	b_u32(&b, 8);
	b_u32(&b, (uint32_t)-1);
	b_u32(&b, 4);
	b_str(&b, "arr_str");
	b_u32(&b, GGUF_TYPE_ARRAY);
	b_u32(&b, GGUF_TYPE_STRING);
	b_u64(&b, 2);
	b_str(&b, "a");
	b_str(&b, "");
	b_str(&b, "arr_empty");
	b_u32(&b, GGUF_TYPE_ARRAY);
	b_u32(&b, GGUF_TYPE_FLOAT64);
	b_u64(&b, 0);
	b_str(&b, "arr_bool");
	b_u32(&b, GGUF_TYPE_ARRAY);
	b_u32(&b, GGUF_TYPE_BOOL);
	b_u64(&b, 2);
	b_u8(&b, 0);
	b_u8(&b, 7);
	b_str(&b, "arr_f32");
	b_u32(&b, GGUF_TYPE_ARRAY);
	b_u32(&b, GGUF_TYPE_FLOAT32);
	b_u64(&b, 1);
	b_u32(&b, 0x3fc00000u);

	struct gguf_error err;
	struct gguf *g = gguf_open_memory(b.p, b.len, &err);
	if (!g)
		fail_msg("%s", err.text);
	assert_int_equal(gguf_n_kv(g), 17);
	assert_string_equal(gguf_kv_at(g, 0)->key, "u8");
	assert_null(gguf_kv_at(g, 17));
	uint32_t u32;
	int32_t i32;
	uint64_t u64;
	int64_t i64;
	float f;
	double d;
	bool bo;
	assert_true(gguf_get_u32(g, "u8", &u32));
	assert_int_equal(u32, 200);
	assert_true(gguf_get_i32(g, "i8", &i32));
	assert_int_equal(i32, -5);
	assert_false(gguf_get_u32(g, "i8", &u32)); /* negative */
	assert_true(gguf_get_u32(g, "u16", &u32));
	assert_int_equal(u32, 0x1234);
	assert_true(gguf_get_i64(g, "i16", &i64));
	assert_int_equal(i64, -2);
	assert_true(gguf_get_u32(g, "u32", &u32));
	assert_int_equal(u32, 4000000000u);
	assert_false(gguf_get_i32(g, "u32", &i32)); /* does not fit */
	assert_true(gguf_get_i32(g, "i32", &i32));
	assert_int_equal(i32, -70000);
	assert_true(gguf_get_f32(g, "f32", &f));
	assert_true(f == 1.5f);
	assert_true(gguf_get_f64(g, "i32", &d)); /* ints convert to floats */
	assert_true(d == -70000.0);
	assert_true(gguf_get_bool(g, "bool", &bo));
	assert_true(bo);
	assert_false(gguf_get_u32(g, "bool", &u32)); /* bools are not numbers */
	assert_string_equal(gguf_get_string(g, "str"), "hello");
	assert_int_equal(gguf_find_key(g, "str")->val.str.len, 5);
	assert_true(gguf_get_u64(g, "u64", &u64));
	assert_true(u64 == UINT64_MAX);
	assert_false(gguf_get_i64(g, "u64", &i64));
	assert_false(gguf_get_u32(g, "u64", &u32));
	assert_true(gguf_get_i64(g, "i64", &i64));
	assert_true(i64 == INT64_MIN);
	assert_false(gguf_get_u64(g, "i64", &u64));
	assert_true(gguf_get_f64(g, "f64", &d));
	assert_true(d == -2.5);
	assert_false(gguf_get_f64(g, "str", &d));

	const struct gguf_kv *a = gguf_find_key(g, "arr_i32");
	assert_int_equal(gguf_kv_arr_n(a), 3);
	assert_true(gguf_kv_arr_i64(a, 1, &i64));
	assert_int_equal(i64, -1);
	assert_false(gguf_kv_arr_u64(a, 1, &u64));
	assert_true(gguf_kv_arr_u64(a, 2, &u64));
	assert_int_equal(u64, 4);
	assert_false(gguf_kv_arr_i64(a, 3, &i64)); /* out of range */
	assert_null(gguf_kv_arr_str(a, 0));
	assert_false(gguf_get_u32(g, "arr_i32", &u32));
	const struct gguf_kv *s = gguf_find_key(g, "arr_str");
	assert_string_equal(gguf_kv_arr_str(s, 0)->data, "a");
	assert_int_equal(gguf_kv_arr_str(s, 1)->len, 0);
	assert_false(gguf_kv_arr_i64(s, 0, &i64));
	assert_int_equal(gguf_kv_arr_n(gguf_find_key(g, "arr_empty")), 0);
	const struct gguf_kv *ab = gguf_find_key(g, "arr_bool");
	assert_true(gguf_kv_arr_u64(ab, 1, &u64));
	assert_int_equal(u64, 1); /* any non-zero byte is true */
	assert_true(gguf_kv_arr_f64(gguf_find_key(g, "arr_f32"), 0, &d));
	assert_true(d == 1.5);
	assert_int_equal(gguf_kv_arr_n(gguf_find_key(g, "u8")), 0);

	/* No architecture: info still fills what it can and says so. */
	struct gguf_model_info mi;
	assert_false(gguf_model_info_read(g, &mi));
	assert_string_equal(mi.architecture, "");
	assert_int_equal(mi.n_params, 0);
	gguf_close(g);
	free(b.p);
}

/* Per-layer head counts (arrays) take the max, and the KV cache sums them. */
static void test_per_layer_heads(void **state)
{
	struct buf b = {0};
	b_header(&b, 0, 6);
	b_str(&b, "general.architecture");
	b_u32(&b, GGUF_TYPE_STRING);
	b_str(&b, "hybrid");
	b_str(&b, "hybrid.block_count");
	b_u32(&b, GGUF_TYPE_UINT32);
	b_u32(&b, 4);
	b_str(&b, "hybrid.embedding_length");
	b_u32(&b, GGUF_TYPE_UINT64);
	b_u64(&b, 256);
	b_str(&b, "hybrid.attention.head_count");
	b_u32(&b, GGUF_TYPE_INT32);
	b_u32(&b, 4);
	b_str(&b, "hybrid.attention.head_count_kv");
	b_u32(&b, GGUF_TYPE_ARRAY);
	b_u32(&b, GGUF_TYPE_UINT32);
	b_u64(&b, 4);
	b_u32(&b, 2);
	b_u32(&b, 0);
	b_u32(&b, 4);
	b_u32(&b, 0);
	b_str(&b, "hybrid.attention.value_length");
	b_u32(&b, GGUF_TYPE_UINT32);
	b_u32(&b, 32);
	struct gguf_error err;
	struct gguf *g = gguf_open_memory(b.p, b.len, &err);
	if (!g)
		fail_msg("%s", err.text);
	struct gguf_model_info mi;
	assert_true(gguf_model_info_read(g, &mi));
	assert_int_equal(mi.n_head, 4);
	assert_int_equal(mi.n_head_kv, 4);
	assert_true(mi.n_head_kv_per_layer);
	assert_int_equal(mi.n_head_kv_sum, 6);
	assert_int_equal(mi.key_length, 64); /* default: 256 / 4 */
	assert_int_equal(mi.value_length, 32);
	/* 6 head-layers × (64 + 32) × 2 bytes. */
	assert_int_equal(gguf_kv_bytes_per_token(&mi, 2.0), 6 * 96 * 2);
	/* A 0.5-byte element rounds up. */
	mi.n_head_kv_sum = 1;
	mi.key_length = 1;
	mi.value_length = 0;
	assert_int_equal(gguf_kv_bytes_per_token(&mi, 0.5), 1);
	/* Absurd numbers saturate instead of wrapping. */
	mi.n_head_kv_sum = UINT64_MAX / 2;
	mi.key_length = 1000;
	assert_true(gguf_kv_bytes_per_token(&mi, 2.0) == UINT64_MAX);
	assert_true(gguf_kv_bytes_per_token_type(&mi, GGML_TYPE_F16, GGML_TYPE_F16) == UINT64_MAX);
	assert_int_equal(gguf_kv_bytes_per_token_type(&mi, 4, GGML_TYPE_F16), 0); /* removed type */
	gguf_close(g);
	free(b.p);
}

/* --- Hostile input ------------------------------------------------------- */

static void test_open_errors(void **state)
{
	struct gguf_error err;
	assert_null(gguf_open("/nonexistent/model.gguf", &err));
	assert_non_null(strstr(err.text, "cannot open"));
	assert_null(gguf_open(tmpdir, &err));
	assert_non_null(strstr(err.text, "regular file"));
	assert_null(gguf_open("/nonexistent/model.gguf", NULL)); /* err is optional */

	char path[512];
	tmp_path(path, sizeof path, "empty.gguf");
	write_all(path, "", 0);
	assert_null(gguf_open(path, &err));
	assert_non_null(strstr(err.text, "not a GGUF"));
	assert_null(gguf_open_memory(NULL, 0, &err));

	struct buf b = {0};
	b_put(&b, "GGML", 4);
	b_u32(&b, 3);
	b_u64(&b, 0);
	b_u64(&b, 0);
	expect_fail(&b, "bad magic");
	b.len = 0;
	b_put(&b, "GGUF", 4);
	b_u32(&b, 1);
	b_u64(&b, 0);
	b_u64(&b, 0);
	expect_fail(&b, "version 1");
	b.len = 4;
	b_u32(&b, 0x03000000u);
	b_u64(&b, 0);
	b_u64(&b, 0);
	expect_fail(&b, "big-endian");
	b.len = 4;
	b_u32(&b, 4);
	b_u64(&b, 0);
	b_u64(&b, 0);
	expect_fail(&b, "version 4");

	/* The smallest valid file: a header with nothing in it. */
	b.len = 0;
	b_header(&b, 0, 0);
	struct gguf *g = gguf_open_memory(b.p, b.len, &err);
	assert_non_null(g);
	assert_int_equal(gguf_n_kv(g), 0);
	assert_null(gguf_find_key(g, "x"));
	assert_null(gguf_find_tensor(g, "x"));
	gguf_close(g);
	gguf_close(NULL);
	free(b.p);
}

static void test_absurd_counts(void **state)
{
	struct buf b = {0};
	b_header(&b, 0, 1ull << 60);
	expect_fail(&b, "metadata count");

	b.len = 0;
	b_header(&b, 1ull << 60, 0);
	expect_fail(&b, "tensor count");

	b.len = 0;
	b_header(&b, 0, UINT64_MAX);
	expect_fail(&b, "metadata count");

	/* A key whose length is larger than the file. */
	b.len = 0;
	b_header(&b, 0, 1);
	b_u64(&b, 1ull << 40);
	b_put(&b, "abcdefgh", 8);
	expect_fail(&b, "exceeds");

	/* A string value longer than the file. */
	b.len = 0;
	b_header(&b, 0, 1);
	b_str(&b, "k");
	b_u32(&b, GGUF_TYPE_STRING);
	b_u64(&b, UINT64_MAX);
	expect_fail(&b, "exceeds");

	/* Arrays of 2^62 elements, numbers and strings. */
	static const uint32_t types[] = {GGUF_TYPE_UINT8, GGUF_TYPE_FLOAT64, GGUF_TYPE_STRING,
	                                 GGUF_TYPE_BOOL};
	for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
		b.len = 0;
		b_header(&b, 0, 1);
		b_str(&b, "arr");
		b_u32(&b, GGUF_TYPE_ARRAY);
		b_u32(&b, types[i]);
		b_u64(&b, 1ull << 62);
		b_u64(&b, 0);
		expect_fail(&b, "cannot fit");
	}
	/* A string array whose count fits but whose strings claim too much. */
	b.len = 0;
	b_header(&b, 0, 1);
	b_str(&b, "arr");
	b_u32(&b, GGUF_TYPE_ARRAY);
	b_u32(&b, GGUF_TYPE_STRING);
	b_u64(&b, 2);
	b_u64(&b, 1ull << 50);
	b_u64(&b, 0);
	expect_fail(&b, "exceeds");

	/* Tensor dims whose product overflows. */
	b.len = 0;
	b_header(&b, 1, 0);
	b_str(&b, "t");
	b_u32(&b, 4);
	b_u64(&b, 1ull << 32);
	b_u64(&b, 1ull << 32);
	b_u64(&b, 1);
	b_u64(&b, 1);
	b_u32(&b, GGML_TYPE_F32);
	b_u64(&b, 0);
	expect_fail(&b, "overflows");

	b.len = 0;
	b_header(&b, 1, 0);
	b_str(&b, "t");
	b_u32(&b, 1);
	b_u64(&b, UINT64_MAX);
	b_u32(&b, GGML_TYPE_F32);
	b_u64(&b, 0);
	expect_fail(&b, "overflows");

	/* A tensor whose data is far past the end of the file. */
	b.len = 0;
	b_header(&b, 1, 0);
	b_str(&b, "t");
	b_u32(&b, 2);
	b_u64(&b, 1ull << 20);
	b_u64(&b, 1ull << 20);
	b_u32(&b, GGML_TYPE_F16);
	b_u64(&b, 0);
	expect_fail(&b, "past the end");

	b.len = 0;
	b_header(&b, 1, 0);
	b_str(&b, "t");
	b_u32(&b, 1);
	b_u64(&b, 32);
	b_u32(&b, GGML_TYPE_F32);
	b_u64(&b, UINT64_MAX - 31); /* aligned, and offset + size wraps */
	while (b.len % 32)
		b_u8(&b, 0);
	for (int i = 0; i < 128; i++)
		b_u8(&b, 0);
	expect_fail(&b, "past the end");
	free(b.p);
}

static void test_malformed_fields(void **state)
{
	struct buf b = {0};

	b_header(&b, 0, 1);
	b_str(&b, "k");
	b_u32(&b, 13); /* no such type */
	b_u32(&b, 0);
	expect_fail(&b, "unknown value type");

	b.len = 0;
	b_header(&b, 0, 1);
	b_str(&b, "k");
	b_u32(&b, GGUF_TYPE_ARRAY);
	b_u32(&b, GGUF_TYPE_ARRAY);
	b_u64(&b, 1);
	b_u32(&b, GGUF_TYPE_UINT8);
	b_u64(&b, 0);
	expect_fail(&b, "nested");

	b.len = 0;
	b_header(&b, 0, 1);
	b_str(&b, "k");
	b_u32(&b, GGUF_TYPE_ARRAY);
	b_u32(&b, 99);
	b_u64(&b, 0);
	expect_fail(&b, "unknown array element type");

	b.len = 0;
	b_header(&b, 0, 2);
	b_str(&b, "dup");
	b_u32(&b, GGUF_TYPE_UINT8);
	b_u8(&b, 1);
	b_str(&b, "dup");
	b_u32(&b, GGUF_TYPE_UINT8);
	b_u8(&b, 2);
	expect_fail(&b, "duplicate metadata key");

	b.len = 0;
	b_header(&b, 0, 1);
	b_u64(&b, 3);
	b_put(&b, "a\0b", 3);
	b_u32(&b, GGUF_TYPE_UINT8);
	b_u8(&b, 1);
	expect_fail(&b, "NUL");

	/* Escape sequences in names do not reach the error text. */
	b.len = 0;
	b_header(&b, 0, 1);
	b_str(&b, "\x1b[31mred");
	b_u32(&b, 77);
	b_u32(&b, 0);
	expect_fail(&b, "?[31mred");

	static const uint64_t bad_alignments[] = {0, 3, 48, 1ull << 33};
	for (size_t i = 0; i < sizeof bad_alignments / sizeof bad_alignments[0]; i++) {
		b.len = 0;
		b_header(&b, 0, 1);
		b_str(&b, "general.alignment");
		b_u32(&b, GGUF_TYPE_UINT64);
		b_u64(&b, bad_alignments[i]);
		expect_fail(&b, "alignment");
	}
	b.len = 0;
	b_header(&b, 0, 1);
	b_str(&b, "general.alignment");
	b_u32(&b, GGUF_TYPE_STRING);
	b_str(&b, "32");
	expect_fail(&b, "alignment");

	b.len = 0;
	b_header(&b, 1, 0);
	b_str(&b, "t");
	b_u32(&b, 5);
	for (int i = 0; i < 64; i++)
		b_u8(&b, 0);
	expect_fail(&b, "dimensions");

	/* Offset not a multiple of the (custom) alignment. */
	b.len = 0;
	b_header(&b, 1, 1);
	b_str(&b, "general.alignment");
	b_u32(&b, GGUF_TYPE_UINT32);
	b_u32(&b, 64);
	b_str(&b, "t");
	b_u32(&b, 1);
	b_u64(&b, 4);
	b_u32(&b, GGML_TYPE_F32);
	b_u64(&b, 32);
	expect_fail(&b, "multiple of the alignment 64");

	/* A quantised row that is not a whole number of blocks. */
	b.len = 0;
	b_header(&b, 1, 0);
	b_str(&b, "t");
	b_u32(&b, 1);
	b_u64(&b, 33);
	b_u32(&b, GGML_TYPE_Q8_0);
	b_u64(&b, 0);
	expect_fail(&b, "block size");

	b.len = 0;
	b_header(&b, 2, 0);
	for (int i = 0; i < 2; i++) {
		b_str(&b, "same");
		b_u32(&b, 1);
		b_u64(&b, 8);
		b_u32(&b, GGML_TYPE_F32);
		b_u64(&b, 32 * (uint64_t)i);
	}
	while (b.len % 32)
		b_u8(&b, 0);
	for (int i = 0; i < 64; i++)
		b_u8(&b, 0);
	expect_fail(&b, "duplicate tensor");

	/* An unknown tensor type is kept (size unknown), not an error. */
	b.len = 0;
	b_header(&b, 1, 0);
	b_str(&b, "future");
	b_u32(&b, 2);
	b_u64(&b, 64);
	b_u64(&b, 2);
	b_u32(&b, 1000);
	b_u64(&b, 0);
	while (b.len % 32)
		b_u8(&b, 0);
	struct gguf_error err;
	struct gguf *g = gguf_open_memory(b.p, b.len, &err);
	if (!g)
		fail_msg("%s", err.text);
	const struct gguf_tensor_info *t = gguf_tensor_at(g, 0);
	assert_false(t->type_known);
	assert_int_equal(t->nbytes, 0);
	assert_int_equal(t->n_elements, 128);
	assert_null(gguf_tensor_type_name(1000));
	assert_null(gguf_tensor_at(g, 1));
	gguf_close(g);
	free(b.p);
}

static void test_truncation(void **state)
{
	char path[512];
	write_small_model("trunc_src.gguf", GGML_TYPE_F16, 3, path, sizeof path);
	size_t len;
	uint8_t *d = read_all(path, &len);
	struct gguf_error err;
	struct gguf *full = gguf_open_memory(d, len, &err);
	if (!full)
		fail_msg("%s", err.text);
	uint64_t data_off = gguf_data_offset(full);
	uint64_t data_end = 0;
	for (size_t i = 0; i < gguf_n_tensors(full); i++) {
		const struct gguf_tensor_info *t = gguf_tensor_at(full, i);
		if (t->offset + t->nbytes > data_end)
			data_end = t->offset + t->nbytes;
	}
	gguf_close(full);

	/* Every cut inside the metadata, and a spread of cuts inside the
	 * data, must fail with a message. Past the last tensor's data only
	 * padding is missing, which loads. */
	for (uint64_t cut = 0; cut < data_off + data_end;
	     cut = cut < data_off + 64 ? cut + 1 : cut + 997) {
		struct gguf *g = gguf_open_memory(d, cut, &err);
		if (g) {
			gguf_close(g);
			fail_msg("a file cut at %llu of %zu parsed", (unsigned long long)cut, len);
		}
		assert_true(err.text[0] != '\0');
	}
	struct gguf *g = gguf_open_memory(d, data_off + data_end, &err);
	assert_non_null(g);
	gguf_close(g);

	/* A few through real files, exercising the buffered file reader. */
	static const double fractions[] = {0.0001, 0.001, 0.01, 0.5, 0.999};
	char cut_path[512];
	tmp_path(cut_path, sizeof cut_path, "cut.gguf");
	for (size_t i = 0; i < sizeof fractions / sizeof fractions[0]; i++) {
		size_t cut = (size_t)((double)len * fractions[i]);
		write_all(cut_path, d, cut);
		g = gguf_open(cut_path, &err);
		if (g) {
			gguf_close(g);
			fail_msg("file cut at %zu parsed", cut);
		}
		assert_non_null(strstr(err.text, "truncated"));
	}
	free(d);
}

/* Random mutations of a real header: any outcome but a crash, a hang or a
 * leak (run under ASan with -DTOKI_SANITIZE=ON) is fine, and a failure must
 * say why. */
static void test_mutations(void **state)
{
	char path[512];
	write_small_model("mut_src.gguf", GGML_TYPE_F16, 5, path, sizeof path);
	size_t len;
	uint8_t *d = read_all(path, &len);
	struct gguf_error err;
	struct gguf *g0 = gguf_open_memory(d, len, &err);
	assert_non_null(g0);
	size_t meta = (size_t)gguf_data_offset(g0);
	gguf_close(g0);

	uint8_t *m = malloc(len);
	assert_non_null(m);
	uint64_t s = 12345;
	int ok = 0, failed = 0;
	for (int iter = 0; iter < 3000; iter++) {
		memcpy(m, d, len);
		int flips = 1 + iter % 4;
		for (int k = 0; k < flips; k++) {
			s = s * 6364136223846793005ull + 1442695040888963407ull;
			size_t at = (size_t)((s >> 33) % meta);
			uint8_t v = (uint8_t)(s >> 13);
			/* Half the time set a whole byte of a length to 0xff. */
			m[at] = iter % 2 ? v : 0xff;
		}
		struct gguf *g = gguf_open_memory(m, len, &err);
		if (g) {
			struct gguf_model_info mi;
			gguf_model_info_read(g, &mi);
			(void)gguf_kv_bytes_per_token(&mi, 2.0);
			gguf_close(g);
			ok++;
		} else {
			assert_true(err.text[0] != '\0');
			failed++;
		}
	}
	print_message("mutations: %d parsed, %d rejected\n", ok, failed);
	assert_true(failed > 0);
	free(m);
	free(d);
}

/* The other architectures: their keys, their tensor counts, and a parameter
 * count that is what the file holds. */
static void test_archs(void **state)
{
	(void)state;
	static const struct {
		enum gguf_gen_arch arch;
		const char *name;
		size_t tensors; /* for 4 layers */
	} cases[] = {
	    /* 3 Gated DeltaNet layers of 14 tensors, one attention layer of 11 */
	    {GGUF_GEN_ARCH_QWEN35, "qwen35", 2 + 1 + 3 * 14 + 11},
	    {GGUF_GEN_ARCH_GEMMA3, "gemma3", 2 + 4 * 13}, /* tied output */
	    {GGUF_GEN_ARCH_GPT_OSS, "gpt-oss", 3 + 4 * 19},
	    /* qwen35's with 8 feed-forward tensors (router, 3 expert stacks,
	       shared gate and shared expert) in place of 3 */
	    {GGUF_GEN_ARCH_QWEN35MOE, "qwen35moe", 2 + 1 + 3 * 19 + 16},
	};
	for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
		struct gguf_gen_params p;
		small_params(&p);
		p.n_layers = 4;
		p.arch = cases[c].arch;
		p.sliding_window = 32;
		enum gguf_gen_arch parsed;
		assert_true(gguf_gen_arch_parse(cases[c].name, &parsed));
		assert_int_equal(parsed, cases[c].arch);
		assert_string_equal(gguf_gen_arch_name(cases[c].arch), cases[c].name);
		char path[512], err[256] = "";
		tmp_path(path, sizeof path, cases[c].name);
		if (gguf_write_random_llama(&p, path, err, sizeof err) != 0)
			fail_msg("%s: %s", cases[c].name, err);
		struct gguf_error gerr;
		struct gguf *g = gguf_open(path, &gerr);
		if (!g)
			fail_msg("%s", gerr.text);
		struct gguf_model_info mi;
		assert_true(gguf_model_info_read(g, &mi));
		assert_string_equal(mi.architecture, cases[c].name);
		assert_int_equal(mi.n_layers, 4);
		assert_int_equal(mi.n_embd, 128);
		assert_int_equal(mi.n_tensors, cases[c].tensors);
		assert_int_equal(mi.n_params, gguf_gen_param_count(&p));
		char key[96];
		uint32_t v = 0;
		snprintf(key, sizeof key, "%s.attention.key_length", cases[c].name);
		assert_true(gguf_get_u32(g, key, &v));
		assert_int_equal(v, 32);
		snprintf(key, sizeof key, "%s.attention.sliding_window", cases[c].name);
		int hybrid = cases[c].arch == GGUF_GEN_ARCH_QWEN35 ||
		             cases[c].arch == GGUF_GEN_ARCH_QWEN35MOE;
		assert_int_equal(gguf_get_u32(g, key, &v), !hybrid);
		snprintf(key, sizeof key, "%s.expert_shared_feed_forward_length", cases[c].name);
		assert_int_equal(gguf_get_u32(g, key, &v),
		                 cases[c].arch == GGUF_GEN_ARCH_QWEN35MOE);
		gguf_close(g);
	}
	enum gguf_gen_arch a;
	assert_false(gguf_gen_arch_parse("mamba", &a));
	struct gguf_gen_params p;
	small_params(&p);
	p.arch = GGUF_GEN_ARCH_GEMMA3;
	p.sliding_window = 0;
	char err[256] = "";
	assert_false(gguf_gen_params_check(&p, err, sizeof err));
	assert_non_null(strstr(err, "sliding window"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_stories260k),     cmocka_unit_test(test_roundtrip_f16),
	    cmocka_unit_test(test_roundtrip_f32),   cmocka_unit_test(test_determinism),
	    cmocka_unit_test(test_params),          cmocka_unit_test(test_value_types),
	    cmocka_unit_test(test_per_layer_heads), cmocka_unit_test(test_open_errors),
	    cmocka_unit_test(test_absurd_counts),   cmocka_unit_test(test_malformed_fields),
	    cmocka_unit_test(test_truncation),      cmocka_unit_test(test_mutations),
	    cmocka_unit_test(test_archs),
	};
	return cmocka_run_group_tests(tests, setup_tmpdir, teardown_tmpdir);
}
