/* toki gguf: inspect GGUF files, or write random-weight llama test models. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cmd/cmd.h"
#include "model/gguf.h"

static const char gguf_usage[] =
    "usage: toki gguf info FILE [--json] [--kv] [--tensors]\n"
    "       toki gguf gen -o FILE [options]\n"
    "\n"
    "'toki gguf info --help' and 'toki gguf gen --help' describe each.\n";

static const char info_usage[] =
    "usage: toki gguf info FILE [--json] [--kv] [--tensors]\n"
    "\n"
    "Prints what a GGUF model is: architecture, shape, context, vocabulary,\n"
    "sizes, and the KV-cache bytes per token. Only metadata is read.\n"
    "\n"
    "  --json      print one JSON object instead of text\n"
    "  --kv        also list every metadata key (arrays summarised)\n"
    "  --tensors   also list every tensor (name, type, shape, offset)\n";

static const char gen_usage[] =
    "usage: toki gguf gen -o FILE [--params N | --embd N --layers N --heads N\n"
    "                     [--kv-heads N] [--ff N]] [--ctx N] [--seed N] [--type f16|f32]\n"
    "                     [--name NAME] [--tokenizer tokenizer.json [--pre NAME]\n"
    "                     [--tokenizer-config tokenizer_config.json]] [--chat-template FILE]\n"
    "                     [--arch llama|qwen35|qwen35moe|gemma3|gpt-oss\n"
    "                     [--sliding-window N]]\n"
    "\n"
    "Writes a model with random weights and a built-in byte-fallback vocabulary\n"
    "and ChatML template, which llama-server loads as is. The same seed gives\n"
    "the same bytes on every machine.\n"
    "\n"
    "  -o, --output FILE  where to write (via FILE.tmp and rename)\n"
    "  --arch A           llama (default); qwen35: Qwen 3.5's hybrid of Gated DeltaNet\n"
    "                     and gated attention (every 4th layer); gemma3: sliding-window\n"
    "                     attention in 5 layers of 6; gpt-oss: sliding window in every\n"
    "                     other layer, attention sinks, 4 experts (2 used); qwen35moe:\n"
    "                     qwen35 with 4 experts (2 used) and a shared expert\n"
    "  --sliding-window N gemma3, gpt-oss: the window in tokens (default 128)\n"
    "  --params N         pick a shape for about N parameters: 24M, 1.5B, ... (default 24M)\n"
    "  --embd N           embedding width (with --layers and --heads instead of --params)\n"
    "  --layers N         number of blocks\n"
    "  --heads N          attention heads (head size = embd / heads)\n"
    "  --kv-heads N       KV heads (default: heads)\n"
    "  --ff N             feed-forward width (default: 8/3 embd, rounded up to 64)\n"
    "  --ctx N            training context length (default 32768)\n"
    "  --seed N           weight seed (default 1)\n"
    "  --type T           weight type: f16 (default) or f32\n"
    "  --name NAME        general.name\n"
    "  --tokenizer FILE   a real model's Hugging Face tokenizer.json instead of the\n"
    "                     built-in vocabulary: byte-level BPE (Llama 3, Qwen, ...), or\n"
    "                     SentencePiece-style BPE with byte fallback (Llama 2, Mistral 7B,\n"
    "                     Gemma), written as llama.cpp writes it; others are refused\n"
    "  --pre NAME         a byte-level BPE tokenizer's llama.cpp pre-tokenizer\n"
    "                     (tokenizer.ggml.pre): llama-bpe, qwen2, gpt-2, ...\n"
    "  --tokenizer-config FILE  its tokenizer_config.json: BOS/EOS, add_bos, chat template\n"
    "  --chat-template FILE     the chat template to store (Jinja), instead of the\n"
    "                     config's or the built-in ChatML one\n";

/* Strings from a file go to a terminal or into JSON: make them valid UTF-8
 * without control characters (a hostile file could carry escape sequences).
 * Returns a malloc'd copy the caller frees, or NULL on out-of-memory. */
static char *clean_string(const char *s, size_t len, bool keep_newlines)
{
	char *out = malloc(len * 3 + 1); /* worst case: every byte becomes U+FFFD */
	if (!out)
		return NULL;
	size_t o = 0;
	for (size_t i = 0; i < len;) {
		unsigned char c = (unsigned char)s[i];
		size_t n = c < 0x80             ? 1
		           : (c & 0xe0) == 0xc0 ? 2
		           : (c & 0xf0) == 0xe0 ? 3
		           : (c & 0xf8) == 0xf0 ? 4
		                                : 0;
		bool ok = n > 0 && i + n <= len;
		for (size_t k = 1; ok && k < n; k++)
			ok = ((unsigned char)s[i + k] & 0xc0) == 0x80;
		/* Reject overlong encodings, surrogates and code points past U+10FFFF,
		 * which jansson would refuse. */
		if (ok && n == 2)
			ok = c >= 0xc2;
		if (ok && n == 3) {
			unsigned char c1 = (unsigned char)s[i + 1];
			ok = !(c == 0xe0 && c1 < 0xa0) && !(c == 0xed && c1 >= 0xa0);
		}
		if (ok && n == 4) {
			unsigned char c1 = (unsigned char)s[i + 1];
			ok = c <= 0xf4 && !(c == 0xf0 && c1 < 0x90) && !(c == 0xf4 && c1 >= 0x90);
		}
		if (!ok) {
			memcpy(out + o, "\xef\xbf\xbd", 3);
			o += 3;
			i++;
			continue;
		}
		if (n == 1 && (c < 0x20 || c == 0x7f) && !(keep_newlines && c == '\n'))
			out[o++] = '?';
		else {
			memcpy(out + o, s + i, n);
			o += n;
		}
		i += n;
	}
	out[o] = '\0';
	return out;
}

static void human_bytes(uint64_t b, char *buf, size_t len)
{
	static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	double v = (double)b;
	size_t u = 0;
	while (v >= 1024 && u + 1 < sizeof units / sizeof units[0]) {
		v /= 1024;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%" PRIu64 " B", b);
	else
		snprintf(buf, len, "%.1f %s", v, units[u]);
}

static void human_count(uint64_t n, char *buf, size_t len)
{
	if (n >= 1000000000ull)
		snprintf(buf, len, "%.2fB", (double)n / 1e9);
	else if (n >= 1000000ull)
		snprintf(buf, len, "%.2fM", (double)n / 1e6);
	else if (n >= 1000ull)
		snprintf(buf, len, "%.1fK", (double)n / 1e3);
	else
		snprintf(buf, len, "%" PRIu64, n);
}

/* A one-line rendering of a kv's value for --kv (text mode). */
static void print_kv_value(FILE *f, const struct gguf_kv *kv)
{
	char *c;
	switch (kv->type) {
	case GGUF_TYPE_STRING: {
		size_t shown = kv->val.str.len > 200 ? 200 : (size_t)kv->val.str.len;
		c = clean_string(kv->val.str.data, shown, false);
		fprintf(f, "\"%s\"%s", c ? c : "", shown < kv->val.str.len ? "..." : "");
		free(c);
		return;
	}
	case GGUF_TYPE_ARRAY: {
		fprintf(f, "[%s × %" PRIu64 "]", gguf_type_name(kv->arr_type), kv->arr_n);
		uint64_t shown = kv->arr_n < 8 ? kv->arr_n : 8;
		fprintf(f, " ");
		for (uint64_t i = 0; i < shown; i++) {
			const struct gguf_str *s = gguf_kv_arr_str(kv, i);
			int64_t iv;
			uint64_t uv;
			double dv;
			if (s) {
				c = clean_string(s->data, s->len > 40 ? 40 : (size_t)s->len, false);
				fprintf(f, "%s\"%s\"", i ? ", " : "", c ? c : "");
				free(c);
			} else if (gguf_kv_arr_i64(kv, i, &iv)) {
				fprintf(f, "%s%" PRId64, i ? ", " : "", iv);
			} else if (gguf_kv_arr_u64(kv, i, &uv)) {
				fprintf(f, "%s%" PRIu64, i ? ", " : "", uv);
			} else if (gguf_kv_arr_f64(kv, i, &dv)) {
				fprintf(f, "%s%g", i ? ", " : "", dv);
			}
		}
		if (shown < kv->arr_n)
			fprintf(f, ", ...");
		return;
	}
	case GGUF_TYPE_FLOAT32:
		fprintf(f, "%g", (double)kv->val.f32);
		return;
	case GGUF_TYPE_FLOAT64:
		fprintf(f, "%g", kv->val.f64);
		return;
	case GGUF_TYPE_BOOL:
		fprintf(f, "%s", kv->val.b ? "true" : "false");
		return;
	default: {
		int64_t iv;
		uint64_t uv;
		if (gguf_kv_to_i64(kv, &iv))
			fprintf(f, "%" PRId64, iv);
		else if (gguf_kv_to_u64(kv, &uv))
			fprintf(f, "%" PRIu64, uv);
		return;
	}
	}
}

/* jansson integers are signed 64-bit (json_int_t is long long); the rare
 * larger value becomes a real. */
static json_t *json_u64(uint64_t v)
{
	return v <= (uint64_t)INT64_MAX ? json_integer((json_int_t)v) : json_real((double)v);
}

static json_t *json_clean_string(const char *s, size_t len)
{
	char *c = clean_string(s, len, true);
	json_t *j = c ? json_string(c) : NULL;
	free(c);
	return j ? j : json_null();
}

static json_t *kv_to_json(const struct gguf_kv *kv)
{
	int64_t iv;
	uint64_t uv;
	switch (kv->type) {
	case GGUF_TYPE_STRING:
		return json_clean_string(kv->val.str.data, (size_t)kv->val.str.len);
	case GGUF_TYPE_BOOL:
		return json_boolean(kv->val.b);
	case GGUF_TYPE_FLOAT32:
		return json_real(kv->val.f32);
	case GGUF_TYPE_FLOAT64:
		return json_real(kv->val.f64);
	case GGUF_TYPE_ARRAY: {
		/* Summarised: vocabularies have hundreds of thousands of entries. */
		json_t *o = json_object();
		json_object_set_new(o, "array_type", json_string(gguf_type_name(kv->arr_type)));
		json_object_set_new(o, "n", json_u64(kv->arr_n));
		return o;
	}
	default:
		if (gguf_kv_to_i64(kv, &iv))
			return json_integer(iv);
		if (gguf_kv_to_u64(kv, &uv))
			return json_u64(uv);
		return json_null();
	}
}

static int info_json(const char *path, const struct gguf *g, const struct gguf_model_info *mi,
                     bool with_kv, bool with_tensors)
{
	json_t *o = json_object();
	if (!o)
		goto oom;
	json_object_set_new(o, "path", json_clean_string(path, strlen(path)));
	json_object_set_new(o, "gguf_version", json_integer(mi->version));
	json_object_set_new(o, "architecture",
	                    json_clean_string(mi->architecture, strlen(mi->architecture)));
	json_object_set_new(o, "name", json_clean_string(mi->name, strlen(mi->name)));
	json_object_set_new(o, "n_layers", json_u64(mi->n_layers));
	json_object_set_new(o, "n_embd", json_u64(mi->n_embd));
	json_object_set_new(o, "n_ff", json_u64(mi->n_ff));
	json_object_set_new(o, "n_head", json_u64(mi->n_head));
	json_object_set_new(o, "n_head_kv", json_u64(mi->n_head_kv));
	json_object_set_new(o, "n_head_kv_sum", json_u64(mi->n_head_kv_sum));
	json_object_set_new(o, "n_head_per_layer", json_boolean(mi->n_head_per_layer));
	json_object_set_new(o, "n_head_kv_per_layer", json_boolean(mi->n_head_kv_per_layer));
	json_object_set_new(o, "key_length", json_u64(mi->key_length));
	json_object_set_new(o, "value_length", json_u64(mi->value_length));
	json_object_set_new(o, "context_length", json_u64(mi->context_length));
	json_object_set_new(o, "n_vocab", json_u64(mi->n_vocab));
	json_object_set_new(o, "tokenizer_model",
	                    json_clean_string(mi->tokenizer_model, strlen(mi->tokenizer_model)));
	json_object_set_new(o, "has_chat_template", json_boolean(mi->has_chat_template));
	json_object_set_new(o, "file_size", json_u64(mi->file_size));
	json_object_set_new(o, "tensor_data_bytes", json_u64(mi->tensor_data_bytes));
	json_object_set_new(o, "n_params", json_u64(mi->n_params));
	json_object_set_new(o, "n_tensors", json_u64(mi->n_tensors));
	json_object_set_new(o, "n_kv", json_u64(mi->n_kv));
	json_object_set_new(o, "alignment", json_integer(mi->alignment));
	if (mi->file_type >= 0) {
		const char *ftn = gguf_file_type_name(mi->file_type);
		json_object_set_new(o, "file_type", json_integer(mi->file_type));
		json_object_set_new(o, "file_type_name", ftn ? json_string(ftn) : json_null());
	} else {
		json_object_set_new(o, "file_type", json_null());
		json_object_set_new(o, "file_type_name", json_null());
	}
	const char *mt = mi->main_tensor_type >= 0
	                     ? gguf_tensor_type_name((uint32_t)mi->main_tensor_type)
	                     : NULL;
	json_object_set_new(o, "main_tensor_type", mt ? json_string(mt) : json_null());
	json_object_set_new(o, "kv_bytes_per_token_f16", json_u64(gguf_kv_bytes_per_token(mi, 2)));
	json_object_set_new(
	    o, "kv_bytes_per_token_q8_0",
	    json_u64(gguf_kv_bytes_per_token_type(mi, GGML_TYPE_Q8_0, GGML_TYPE_Q8_0)));
	if (with_kv) {
		json_t *kvs = json_object();
		for (size_t i = 0; i < gguf_n_kv(g); i++) {
			const struct gguf_kv *kv = gguf_kv_at(g, i);
			char *k = clean_string(kv->key, strlen(kv->key), false);
			if (k)
				json_object_set_new(kvs, k, kv_to_json(kv));
			free(k);
		}
		json_object_set_new(o, "metadata", kvs);
	}
	if (with_tensors) {
		json_t *ts = json_array();
		for (size_t i = 0; i < gguf_n_tensors(g); i++) {
			const struct gguf_tensor_info *ti = gguf_tensor_at(g, i);
			json_t *t = json_object();
			json_t *ne = json_array();
			for (uint32_t d = 0; d < ti->n_dims; d++)
				json_array_append_new(ne, json_u64(ti->ne[d]));
			const char *tn = gguf_tensor_type_name(ti->type);
			json_object_set_new(t, "name",
			                    json_clean_string(ti->name, strlen(ti->name)));
			json_object_set_new(t, "type",
			                    tn ? json_string(tn) : json_integer(ti->type));
			json_object_set_new(t, "ne", ne);
			json_object_set_new(t, "offset", json_u64(ti->offset));
			json_object_set_new(t, "nbytes", json_u64(ti->nbytes));
			json_array_append_new(ts, t);
		}
		json_object_set_new(o, "tensors", ts);
	}
	char *s = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(o);
	if (!s)
		goto oom;
	printf("%s\n", s);
	free(s);
	return 0;
oom:
	fprintf(stderr, "toki gguf: out of memory\n");
	return 1;
}

static void info_text(const char *path, const struct gguf *g, const struct gguf_model_info *mi,
                      bool with_kv, bool with_tensors)
{
	char a[64], b[64];
	char *cpath = clean_string(path, strlen(path), false);
	char *arch = clean_string(mi->architecture, strlen(mi->architecture), false);
	char *name = clean_string(mi->name, strlen(mi->name), false);
	char *tok = clean_string(mi->tokenizer_model, strlen(mi->tokenizer_model), false);

	printf("file:              %s\n", cpath ? cpath : "");
	human_bytes(mi->file_size, a, sizeof a);
	printf("file size:         %" PRIu64 " bytes (%s)\n", mi->file_size, a);
	printf("gguf version:      %u (%" PRIu64 " metadata keys, %" PRIu64
	       " tensors, alignment %u)\n",
	       mi->version, mi->n_kv, mi->n_tensors, mi->alignment);
	printf("architecture:      %s\n", arch && *arch ? arch : "(none)");
	printf("name:              %s\n", name && *name ? name : "(none)");
	human_count(mi->n_params, a, sizeof a);
	printf("parameters:        %" PRIu64 " (%s)\n", mi->n_params, a);
	human_bytes(mi->tensor_data_bytes, a, sizeof a);
	printf("tensor data:       %" PRIu64 " bytes (%s)\n", mi->tensor_data_bytes, a);
	const char *ftn = mi->file_type >= 0 ? gguf_file_type_name(mi->file_type) : NULL;
	const char *mt = mi->main_tensor_type >= 0
	                     ? gguf_tensor_type_name((uint32_t)mi->main_tensor_type)
	                     : NULL;
	if (mi->file_type >= 0)
		printf("file type:         %" PRId64 " (%s)\n", mi->file_type,
		       ftn ? ftn : "unknown");
	else
		printf("file type:         (not set)\n");
	printf("main tensor type:  %s\n", mt ? mt : "(none)");
	printf("layers:            %" PRIu64 "\n", mi->n_layers);
	printf("embedding:         %" PRIu64 "\n", mi->n_embd);
	printf("feed-forward:      %" PRIu64 "\n", mi->n_ff);
	printf("heads:             %" PRIu64 "%s\n", mi->n_head,
	       mi->n_head_per_layer ? " (max; per layer)" : "");
	printf("kv heads:          %" PRIu64 "%s\n", mi->n_head_kv,
	       mi->n_head_kv_per_layer ? " (max; per layer)" : "");
	printf("key/value length:  %" PRIu64 " / %" PRIu64 "\n", mi->key_length, mi->value_length);
	printf("context length:    %" PRIu64 " (training)\n", mi->context_length);
	printf("vocabulary:        %" PRIu64 " tokens, tokenizer %s\n", mi->n_vocab,
	       tok && *tok ? tok : "(none)");
	printf("chat template:     %s\n", mi->has_chat_template ? "yes" : "no");
	uint64_t kvb = gguf_kv_bytes_per_token(mi, 2);
	human_bytes(kvb, a, sizeof a);
	human_bytes(kvb > UINT64_MAX / (mi->context_length ? mi->context_length : 1)
	                ? UINT64_MAX
	                : kvb * mi->context_length,
	            b, sizeof b);
	printf("kv cache (f16):    %" PRIu64 " bytes/token (%s); %s at the training context\n", kvb,
	       a, b);
	free(cpath);
	free(arch);
	free(name);
	free(tok);

	if (with_kv) {
		printf("\nmetadata:\n");
		for (size_t i = 0; i < gguf_n_kv(g); i++) {
			const struct gguf_kv *kv = gguf_kv_at(g, i);
			char *k = clean_string(kv->key, strlen(kv->key), false);
			printf("  %-40s %-6s ", k ? k : "", gguf_type_name(kv->type));
			free(k);
			print_kv_value(stdout, kv);
			printf("\n");
		}
	}
	if (with_tensors) {
		printf("\ntensors:\n");
		for (size_t i = 0; i < gguf_n_tensors(g); i++) {
			const struct gguf_tensor_info *ti = gguf_tensor_at(g, i);
			char shape[128];
			size_t o = 0;
			shape[0] = '\0';
			for (uint32_t d = 0; d < ti->n_dims && o < sizeof shape; d++)
				o += (size_t)snprintf(shape + o, sizeof shape - o, "%s%" PRIu64,
				                      d ? " x " : "", ti->ne[d]);
			const char *tn = gguf_tensor_type_name(ti->type);
			char *n = clean_string(ti->name, strlen(ti->name), false);
			printf("  %-32s %-8s %-24s offset %" PRIu64 "\n", n ? n : "", tn ? tn : "?",
			       shape, ti->offset);
			free(n);
		}
	}
}

static int cmd_info(int argc, char **argv)
{
	const char *path = NULL;
	bool json = false, with_kv = false, with_tensors = false;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			fputs(info_usage, stdout);
			return 0;
		} else if (!strcmp(a, "--json")) {
			json = true;
		} else if (!strcmp(a, "--kv")) {
			with_kv = true;
		} else if (!strcmp(a, "--tensors")) {
			with_tensors = true;
		} else if (a[0] == '-' && a[1]) {
			fprintf(stderr, "toki gguf: info: unknown option '%s'\n\n%s", a,
			        info_usage);
			return 2;
		} else if (!path) {
			path = a;
		} else {
			fprintf(stderr, "toki gguf: info: one FILE only\n\n%s", info_usage);
			return 2;
		}
	}
	if (!path) {
		fprintf(stderr, "toki gguf: info: no FILE given\n\n%s", info_usage);
		return 2;
	}
	struct gguf_error err;
	struct gguf *g = gguf_open(path, &err);
	if (!g) {
		fprintf(stderr, "toki gguf: %s: %s\n", path, err.text);
		return 1;
	}
	struct gguf_model_info mi;
	gguf_model_info_read(g, &mi);
	int rc = 0;
	if (json)
		rc = info_json(path, g, &mi, with_kv, with_tensors);
	else
		info_text(path, g, &mi, with_kv, with_tensors);
	gguf_close(g);
	if (fflush(stdout) != 0) {
		fprintf(stderr, "toki gguf: writing output: %s\n", strerror(errno));
		return 1;
	}
	return rc;
}

/* Parses a positive integer option value into *out (<= max). */
static bool parse_u32(const char *opt, const char *s, uint32_t max, uint32_t *out)
{
	char *end;
	errno = 0;
	unsigned long long v = s ? strtoull(s, &end, 10) : 0;
	if (!s || !*s || *end || errno || s[0] == '-' || v == 0 || v > max) {
		fprintf(stderr, "toki gguf: gen: %s needs an integer from 1 to %u\n", opt, max);
		return false;
	}
	*out = (uint32_t)v;
	return true;
}

static int gen_write(struct gguf_gen_params *p, bool explicit_shape, const char *params,
                     uint32_t embd, uint32_t layers, uint32_t heads, uint32_t kv_heads, uint32_t ff,
                     const char *out);

/* A whole text file, NUL-terminated, or NULL with the reason in err. */
static char *read_text_file(const char *path, char *err, size_t errlen)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		snprintf(err, errlen, "%s: %s", path, strerror(errno));
		return NULL;
	}
	size_t cap = 65536, n = 0;
	char *buf = malloc(cap);
	while (buf) {
		n += fread(buf + n, 1, cap - n - 1, f);
		if (n < cap - 1)
			break;
		char *b = realloc(buf, cap * 2);
		if (!b) {
			free(buf);
			buf = NULL;
			break;
		}
		buf = b;
		cap *= 2;
	}
	fclose(f);
	if (!buf) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	buf[n] = 0;
	return buf;
}

static int cmd_gen(int argc, char **argv)
{
	const char *out = NULL, *params = NULL, *type = "f16", *seed_s = NULL;
	const char *tokenizer = NULL, *tokenizer_config = NULL, *pre = NULL, *template_file = NULL;
	struct gguf_gen_params p;
	gguf_gen_params_default(&p);
	uint32_t embd = 0, layers = 0, heads = 0, kv_heads = 0, ff = 0;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *val = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
			fputs(gen_usage, stdout);
			return 0;
		}
		/* Every other option takes a value. */
		static const char *const with_value[] = {"-o",          "--output",
		                                         "--params",    "--embd",
		                                         "--layers",    "--heads",
		                                         "--kv-heads",  "--ff",
		                                         "--ctx",       "--seed",
		                                         "--type",      "--name",
		                                         "--tokenizer", "--tokenizer-config",
		                                         "--pre",       "--chat-template",
		                                         "--arch",      "--sliding-window"};
		bool known = false;
		for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++)
			known |= !strcmp(a, with_value[k]);
		if (!known) {
			fprintf(stderr, "toki gguf: gen: unknown argument '%s'\n\n%s", a,
			        gen_usage);
			return 2;
		}
		if (!val) {
			fprintf(stderr, "toki gguf: gen: %s needs a value\n", a);
			return 2;
		}
		i++;
		bool ok = true;
		if (!strcmp(a, "-o") || !strcmp(a, "--output"))
			out = val;
		else if (!strcmp(a, "--params"))
			params = val;
		else if (!strcmp(a, "--embd"))
			ok = parse_u32(a, val, 65536, &embd);
		else if (!strcmp(a, "--layers"))
			ok = parse_u32(a, val, 1024, &layers);
		else if (!strcmp(a, "--heads"))
			ok = parse_u32(a, val, 1024, &heads);
		else if (!strcmp(a, "--kv-heads"))
			ok = parse_u32(a, val, 1024, &kv_heads);
		else if (!strcmp(a, "--ff"))
			ok = parse_u32(a, val, 1u << 20, &ff);
		else if (!strcmp(a, "--ctx"))
			ok = parse_u32(a, val, 1u << 24, &p.context_length);
		else if (!strcmp(a, "--seed"))
			seed_s = val;
		else if (!strcmp(a, "--type"))
			type = val;
		else if (!strcmp(a, "--name"))
			p.name = val;
		else if (!strcmp(a, "--tokenizer"))
			tokenizer = val;
		else if (!strcmp(a, "--tokenizer-config"))
			tokenizer_config = val;
		else if (!strcmp(a, "--pre"))
			pre = val;
		else if (!strcmp(a, "--chat-template"))
			template_file = val;
		else if (!strcmp(a, "--sliding-window"))
			ok = parse_u32(a, val, 1u << 24, &p.sliding_window);
		else if (!strcmp(a, "--arch") && !gguf_gen_arch_parse(val, &p.arch)) {
			fprintf(stderr,
			        "toki gguf: gen: --arch: llama, qwen35, qwen35moe, gemma3 or "
			        "gpt-oss, not '%s'\n",
			        val);
			return 2;
		}
		if (!ok)
			return 2;
	}
	if (!out) {
		fprintf(stderr, "toki gguf: gen: -o FILE is required\n\n%s", gen_usage);
		return 2;
	}
	if (seed_s) {
		char *end;
		errno = 0;
		p.seed = strtoull(seed_s, &end, 0);
		if (!*seed_s || *end || errno || seed_s[0] == '-') {
			fprintf(stderr, "toki gguf: gen: --seed needs a non-negative integer\n");
			return 2;
		}
	}
	if (!strcmp(type, "f16")) {
		p.weight_type = GGML_TYPE_F16;
	} else if (!strcmp(type, "f32")) {
		p.weight_type = GGML_TYPE_F32;
	} else {
		fprintf(stderr, "toki gguf: gen: --type must be f16 or f32\n");
		return 2;
	}

	bool explicit_shape = embd || layers || heads || kv_heads || ff;
	char err[512];
	/* Whether --pre is needed depends on the tokenizer's kind, which
	 * gguf_gen_vocab_from_hf tells. */
	if ((tokenizer_config || pre) && !tokenizer) {
		fprintf(stderr,
		        "toki gguf: gen: --tokenizer-config and --pre go with --tokenizer\n");
		return 2;
	}
	struct gguf_gen_vocab vocab;
	char *tmpl = NULL;
	if (template_file && !(tmpl = read_text_file(template_file, err, sizeof err))) {
		fprintf(stderr, "toki gguf: gen: %s\n", err);
		return 1;
	}
	p.chat_template = tmpl;
	if (tokenizer) {
		if (gguf_gen_vocab_from_hf(tokenizer, tokenizer_config, pre, &vocab, err,
		                           sizeof err) != 0) {
			fprintf(stderr, "toki gguf: gen: %s\n", err);
			free(tmpl);
			return 1;
		}
		p.vocab = &vocab;
	}
	int rc = gen_write(&p, explicit_shape, params, embd, layers, heads, kv_heads, ff, out);
	if (tokenizer)
		gguf_gen_vocab_free(&vocab);
	free(tmpl);
	return rc;
}

/* Picks the shape and writes the file. */
static int gen_write(struct gguf_gen_params *pp, bool explicit_shape, const char *params,
                     uint32_t embd, uint32_t layers, uint32_t heads, uint32_t kv_heads, uint32_t ff,
                     const char *out)
{
	struct gguf_gen_params p = *pp;
	char err[512];
	if (explicit_shape) {
		if (params) {
			fprintf(stderr, "toki gguf: gen: --params and explicit dimensions exclude "
			                "each other\n");
			return 2;
		}
		if (!embd || !layers || !heads) {
			fprintf(stderr,
			        "toki gguf: gen: --embd, --layers and --heads go together\n");
			return 2;
		}
		p.n_embd = embd;
		p.n_layers = layers;
		p.n_head = heads;
		p.n_head_kv = kv_heads ? kv_heads : heads;
		p.n_ff = ff ? ff : (uint32_t)((8ull * embd / 3 + 63) / 64 * 64);
	} else if (params) {
		uint64_t n;
		if (!gguf_parse_param_count(params, &n)) {
			fprintf(
			    stderr,
			    "toki gguf: gen: --params wants a count like 24M, 1.5B or 500000\n");
			return 2;
		}
		if (!gguf_gen_params_for_size(&p, n, err, sizeof err)) {
			fprintf(stderr, "toki gguf: gen: %s\n", err);
			return 2;
		}
	}

	/* A shape llama.cpp cannot use is a usage error, found before writing. */
	if (!gguf_gen_params_check(&p, err, sizeof err)) {
		fprintf(stderr, "toki gguf: gen: %s\n", err);
		return 2;
	}
	if (gguf_write_random_llama(&p, out, err, sizeof err) != 0) {
		fprintf(stderr, "toki gguf: %s\n", err);
		return 1;
	}
	char pc[32];
	human_count(gguf_gen_param_count(&p), pc, sizeof pc);
	fprintf(stderr,
	        "toki gguf: wrote %s: %s, %s parameters, embd %u, layers %u, heads %u, kv heads "
	        "%u, ff %u, ctx %u, %s, seed %" PRIu64 "\n",
	        out, gguf_gen_arch_name(p.arch), pc, p.n_embd, p.n_layers, p.n_head, p.n_head_kv,
	        p.n_ff, p.context_length, p.weight_type == GGML_TYPE_F16 ? "f16" : "f32", p.seed);
	return 0;
}

int cmd_gguf(int argc, char **argv)
{
	if (argc < 2) {
		fputs(gguf_usage, stderr);
		return 2;
	}
	const char *sub = argv[1];
	if (!strcmp(sub, "-h") || !strcmp(sub, "--help") || !strcmp(sub, "help")) {
		fputs(gguf_usage, stdout);
		return 0;
	}
	if (!strcmp(sub, "info"))
		return cmd_info(argc - 1, argv + 1);
	if (!strcmp(sub, "gen"))
		return cmd_gen(argc - 1, argv + 1);
	fprintf(stderr, "toki gguf: unknown subcommand '%s'\n\n%s", sub, gguf_usage);
	return 2;
}
