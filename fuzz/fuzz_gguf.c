/* GGUF files (src/model/gguf.c): `toki gguf info`, context sizing and
 * `toki serve --model` read headers of files from anywhere. Opens the bytes,
 * reads the model facts and walks every accessor. A header whose tensors
 * point past its end is retried with zero padding, so that a metadata-only
 * seed (the stories260K header truncated) still reaches the tensor paths. */
#include <stdint.h>
#include <string.h>

#include "fuzz_common.h"
#include "model/gguf.h"

static void walk(const struct gguf *g)
{
	struct gguf_model_info mi;
	memset(&mi, 0xAA, sizeof mi);
	bool ok = gguf_model_info_read(g, &mi);
	if (ok) {
		FUZZ_CHECK(memchr(mi.architecture, '\0', sizeof mi.architecture));
		FUZZ_CHECK(memchr(mi.name, '\0', sizeof mi.name));
		FUZZ_CHECK(memchr(mi.tokenizer_model, '\0', sizeof mi.tokenizer_model));
		(void)gguf_kv_bytes_per_token(&mi, 2.0);
		(void)gguf_kv_bytes_per_token(&mi, 0.5);
		(void)gguf_kv_bytes_per_token_type(&mi, GGML_TYPE_F16, GGML_TYPE_F16);
		(void)gguf_kv_bytes_per_token_type(&mi, GGML_TYPE_Q8_0, 2 /* q4_0 */);
		(void)gguf_kv_bytes_per_token_type(&mi, 12345, 0);
		(void)gguf_file_type_name(mi.file_type);
	}
	FUZZ_CHECK(gguf_data_offset(g) <= gguf_file_size(g) || gguf_n_tensors(g) == 0);
	(void)gguf_version(g);
	(void)gguf_alignment(g);
	size_t n = gguf_n_kv(g);
	for (size_t i = 0; i < n; i++) {
		const struct gguf_kv *kv = gguf_kv_at(g, i);
		FUZZ_CHECK(kv && kv->key);
		FUZZ_CHECK(gguf_find_key(g, kv->key) == kv);
		(void)gguf_type_name(kv->type);
		int64_t i64;
		uint64_t u64;
		(void)gguf_kv_to_i64(kv, &i64);
		(void)gguf_kv_to_u64(kv, &u64);
		uint32_t u32;
		int32_t i32;
		float f;
		double d;
		bool b;
		(void)gguf_get_u32(g, kv->key, &u32);
		(void)gguf_get_i32(g, kv->key, &i32);
		(void)gguf_get_u64(g, kv->key, &u64);
		(void)gguf_get_i64(g, kv->key, &i64);
		(void)gguf_get_f32(g, kv->key, &f);
		(void)gguf_get_f64(g, kv->key, &d);
		(void)gguf_get_bool(g, kv->key, &b);
		const char *s = gguf_get_string(g, kv->key);
		if (s)
			(void)strlen(s);
		uint64_t an = gguf_kv_arr_n(kv);
		/* The first and last few elements, and one past the end. */
		for (uint64_t k = 0; k < an && k < 4; k++) {
			(void)gguf_kv_arr_i64(kv, k, &i64);
			(void)gguf_kv_arr_u64(kv, k, &u64);
			(void)gguf_kv_arr_f64(kv, k, &d);
			const struct gguf_str *gs = gguf_kv_arr_str(kv, k);
			if (gs && gs->len)
				(void)((volatile const char *)gs->data)[gs->len - 1];
		}
		if (an) {
			(void)gguf_kv_arr_i64(kv, an - 1, &i64);
			const struct gguf_str *gs = gguf_kv_arr_str(kv, an - 1);
			if (gs && gs->len)
				(void)((volatile const char *)gs->data)[gs->len - 1];
		}
		FUZZ_CHECK(!gguf_kv_arr_i64(kv, an, &i64));
		FUZZ_CHECK(gguf_kv_arr_str(kv, an) == NULL);
	}
	FUZZ_CHECK(gguf_find_key(g, "no.such.key.in.any.file") == NULL);
	size_t nt = gguf_n_tensors(g);
	for (size_t i = 0; i < nt; i++) {
		const struct gguf_tensor_info *t = gguf_tensor_at(g, i);
		FUZZ_CHECK(t && t->name);
		FUZZ_CHECK(t->n_dims <= GGUF_MAX_DIMS);
		FUZZ_CHECK(gguf_find_tensor(g, t->name) == t);
		(void)gguf_tensor_type_name(t->type);
		uint32_t bs, ts;
		(void)gguf_tensor_type_size(t->type, &bs, &ts);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct gguf_error err;
	struct gguf *g = gguf_open_memory(data, size, &err);
	if (g) {
		walk(g);
		gguf_close(g);
		return 0;
	}
	FUZZ_CHECK(err.text[0] != '\0');
	FUZZ_CHECK(memchr(err.text, '\0', sizeof err.text));
	if (size <= 65536 && strstr(err.text, "past the end")) {
		size_t padded = 2u << 20;
		uint8_t *buf = calloc(1, padded);
		if (!buf)
			return 0;
		memcpy(buf, data, size);
		g = gguf_open_memory(buf, padded, &err);
		free(buf); /* the result holds no pointer into it */
		if (g) {
			walk(g);
			gguf_close(g);
		}
	}
	return 0;
}
