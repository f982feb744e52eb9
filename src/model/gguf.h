/* GGUF (v2/v3) reader and a writer of random-weight llama test models.
 *
 * The reader parses only the metadata part of a file: header, key/value pairs
 * and tensor infos. Tensor data is never read (files can be tens of GB); only
 * its extent is checked against the file size. Every count and length in the
 * file is treated as hostile: each is checked against the bytes left in the
 * file before anything is allocated, so a malformed or truncated file yields an
 * error message, never a crash or a huge allocation.
 *
 * Ownership: a struct gguf owns everything reachable from it (keys, strings,
 * arrays, tensor infos); pointers returned by the accessors stay valid until
 * gguf_close(). struct gguf_model_info is a plain value that copies what it
 * needs, so it outlives the struct gguf it was read from.
 */
#ifndef TOKI_MODEL_GGUF_H
#define TOKI_MODEL_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define GGUF_MAGIC "GGUF"
#define GGUF_DEFAULT_ALIGNMENT 32
/* ggml tensors have at most four dimensions; llama.cpp rejects more. */
#define GGUF_MAX_DIMS 4

/* Value types of metadata, as numbered in the file. */
enum gguf_type {
	GGUF_TYPE_UINT8 = 0,
	GGUF_TYPE_INT8 = 1,
	GGUF_TYPE_UINT16 = 2,
	GGUF_TYPE_INT16 = 3,
	GGUF_TYPE_UINT32 = 4,
	GGUF_TYPE_INT32 = 5,
	GGUF_TYPE_FLOAT32 = 6,
	GGUF_TYPE_BOOL = 7,
	GGUF_TYPE_STRING = 8,
	GGUF_TYPE_ARRAY = 9,
	GGUF_TYPE_UINT64 = 10,
	GGUF_TYPE_INT64 = 11,
	GGUF_TYPE_FLOAT64 = 12,
	GGUF_TYPE_COUNT
};

/* The few ggml tensor types the writer uses; the reader knows them all (see
 * gguf_tensor_type_name) but keeps the raw number in struct gguf_tensor_info. */
enum {
	GGML_TYPE_F32 = 0,
	GGML_TYPE_F16 = 1,
	GGML_TYPE_Q8_0 = 8,
	GGML_TYPE_BF16 = 30,
};

/* A string from the file. data is NUL-terminated for convenience but may hold
 * embedded NULs (len is authoritative for values; keys and tensor names with
 * embedded NULs are rejected). */
struct gguf_str {
	uint64_t len;
	const char *data;
};

/* One metadata key/value. For arrays, arr_type/arr_n describe the elements and
 * val.arr points to arr_n elements in host layout: uint8_t..double for numbers,
 * uint8_t (0/1) for bools, struct gguf_str for strings. Nested arrays are
 * rejected (llama.cpp rejects them too). */
struct gguf_kv {
	const char *key;
	enum gguf_type type;
	enum gguf_type arr_type; /* only for GGUF_TYPE_ARRAY */
	uint64_t arr_n;          /* only for GGUF_TYPE_ARRAY */
	union {
		uint8_t u8;
		int8_t i8;
		uint16_t u16;
		int16_t i16;
		uint32_t u32;
		int32_t i32;
		float f32;
		bool b;
		uint64_t u64;
		int64_t i64;
		double f64;
		struct gguf_str str;
		const void *arr;
	} val;
};

struct gguf_tensor_info {
	const char *name;
	uint32_t n_dims;
	uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] is the fastest-varying dimension; unused = 1 */
	uint32_t type;              /* ggml type number */
	uint64_t offset;            /* from the start of the data section */
	uint64_t n_elements;
	uint64_t nbytes; /* 0 when the type is unknown to this reader */
	bool type_known;
};

struct gguf;

/* Why an open failed; a plain buffer so callers need not free anything. */
struct gguf_error {
	char text[256];
};

/* Opens and parses a GGUF file's metadata. Returns NULL and fills *err (which
 * may be NULL) on any error: I/O, not GGUF, unsupported version, truncation,
 * counts or lengths that do not fit in the file, tensor data past the end. */
struct gguf *gguf_open(const char *path, struct gguf_error *err);
/* The same over a memory buffer (tests, fuzzing). The buffer is only read
 * during the call; the result holds no pointer into it. */
struct gguf *gguf_open_memory(const void *data, size_t size, struct gguf_error *err);
void gguf_close(struct gguf *g);

uint32_t gguf_version(const struct gguf *g);
uint64_t gguf_file_size(const struct gguf *g);
uint32_t gguf_alignment(const struct gguf *g);
/* Where tensor data begins: the end of the metadata, padded to the alignment. */
uint64_t gguf_data_offset(const struct gguf *g);

/* Metadata, in file order. */
size_t gguf_n_kv(const struct gguf *g);
const struct gguf_kv *gguf_kv_at(const struct gguf *g, size_t i);
/* NULL if absent. Keys are unique (duplicates are rejected at open). */
const struct gguf_kv *gguf_find_key(const struct gguf *g, const char *key);

/* Typed getters: false if the key is absent or its value does not convert.
 * Integer getters accept any integer type whose value fits the target type
 * (converters are not consistent about u32 vs i32 vs u64); float getters
 * accept float types and integers. */
bool gguf_get_u32(const struct gguf *g, const char *key, uint32_t *out);
bool gguf_get_i32(const struct gguf *g, const char *key, int32_t *out);
bool gguf_get_u64(const struct gguf *g, const char *key, uint64_t *out);
bool gguf_get_i64(const struct gguf *g, const char *key, int64_t *out);
bool gguf_get_f32(const struct gguf *g, const char *key, float *out);
bool gguf_get_f64(const struct gguf *g, const char *key, double *out);
bool gguf_get_bool(const struct gguf *g, const char *key, bool *out);
/* The value of a string key, or NULL (absent or not a string). */
const char *gguf_get_string(const struct gguf *g, const char *key);

/* Array helpers on a kv (any kv; non-arrays give 0 / false / NULL). */
uint64_t gguf_kv_arr_n(const struct gguf_kv *kv);
/* Element i of an integer (or bool) array as int64 / uint64; false if out of
 * range, not an integer array, or the value does not fit. */
bool gguf_kv_arr_i64(const struct gguf_kv *kv, uint64_t i, int64_t *out);
bool gguf_kv_arr_u64(const struct gguf_kv *kv, uint64_t i, uint64_t *out);
bool gguf_kv_arr_f64(const struct gguf_kv *kv, uint64_t i, double *out);
const struct gguf_str *gguf_kv_arr_str(const struct gguf_kv *kv, uint64_t i);
/* Any scalar integer value of a kv, converted; false for other types. */
bool gguf_kv_to_i64(const struct gguf_kv *kv, int64_t *out);
bool gguf_kv_to_u64(const struct gguf_kv *kv, uint64_t *out);

/* Tensor infos, in file order. */
size_t gguf_n_tensors(const struct gguf *g);
const struct gguf_tensor_info *gguf_tensor_at(const struct gguf *g, size_t i);
const struct gguf_tensor_info *gguf_find_tensor(const struct gguf *g, const char *name);

const char *gguf_type_name(enum gguf_type t); /* "u32", "string", ... */
/* ggml tensor type names ("f16", "q4_K", ...); NULL for unknown numbers. */
const char *gguf_tensor_type_name(uint32_t ggml_type);
/* Elements per block and bytes per block of a ggml type; false if unknown. */
bool gguf_tensor_type_size(uint32_t ggml_type, uint32_t *block_size, uint32_t *type_size);
/* llama.cpp's general.file_type (llama_ftype) names: "F16", "Q4_K_M", ...;
 * NULL for unknown numbers. */
const char *gguf_file_type_name(int64_t ftype);

/* The facts about a model that sizing and routing need. Numbers absent from
 * the file are 0 (file_type: -1); strings absent are "". */
struct gguf_model_info {
	uint32_t version;
	char architecture[64];
	char name[256];
	char tokenizer_model[64]; /* tokenizer.ggml.model: "llama", "gpt2", ... */
	uint64_t n_layers;        /* <arch>.block_count */
	uint64_t n_embd;          /* <arch>.embedding_length */
	uint64_t n_ff;            /* <arch>.feed_forward_length (max if per layer) */
	uint64_t n_head;          /* max over layers when given per layer */
	uint64_t n_head_kv;       /* max over layers when given per layer */
	/* Sum over layers of the per-layer KV head count: what the KV cache
	 * really holds. Equals n_layers * n_head_kv when the count is uniform;
	 * smaller when some layers have fewer (or no) KV heads. */
	uint64_t n_head_kv_sum;
	bool n_head_per_layer;    /* head_count was an array */
	bool n_head_kv_per_layer; /* head_count_kv was an array */
	uint64_t key_length;      /* per head; default n_embd / n_head */
	uint64_t value_length;    /* per head; default n_embd / n_head */
	uint64_t context_length;  /* the training context */
	uint64_t n_vocab;
	bool has_chat_template;
	uint64_t file_size;
	uint64_t tensor_data_bytes; /* sum of tensor sizes (known types) */
	uint64_t n_params;          /* sum of tensor element counts */
	uint64_t n_tensors;
	uint64_t n_kv;
	int64_t file_type;        /* general.file_type; -1 if absent */
	int64_t main_tensor_type; /* ggml type holding the most bytes; -1 if none */
	uint32_t alignment;
};

/* Fills *mi from g. Returns false (and leaves what it could fill: sizes,
 * tensors, vocabulary) only if general.architecture is missing or longer
 * than 100 bytes; every other absence is a 0 in *mi. */
bool gguf_model_info_read(const struct gguf *g, struct gguf_model_info *mi);

/* KV-cache bytes one token occupies across all layers, K and V together, for
 * a cache whose elements take elem_bytes each (2 for f16):
 * n_head_kv_sum * (key_length + value_length) * elem_bytes, i.e.
 * n_layers * n_head_kv * (key_length + value_length) * elem_bytes for uniform
 * models. Saturates at UINT64_MAX on absurd numbers. Rounded up. */
uint64_t gguf_kv_bytes_per_token(const struct gguf_model_info *mi, double elem_bytes);
/* The same for a ggml cache type (llama-server's --cache-type-k/-v), exact for
 * block-quantised types (q8_0: 34 bytes per 32 elements). 0 if unknown type. */
uint64_t gguf_kv_bytes_per_token_type(const struct gguf_model_info *mi, uint32_t ggml_type_k,
                                      uint32_t ggml_type_v);

/* --- Writer: random-weight llama models (gguf_write.c) ------------------- */

/* The architectures the writer makes. Each takes the llama-style shape
 * (head size n_embd / n_head) and derives the rest:
 *  - qwen35 (Qwen 3.5/3.6, hybrid): every 4th layer gated attention with
 *    Q/K norms and interleaved multi-axis rotary sections, the others Gated
 *    DeltaNet (K heads = KV heads, V heads = heads, state and head size the
 *    head size, convolution kernel 4);
 *  - gemma3: sliding-window attention (window sliding_window) in five layers
 *    of every six, Q/K norms, pre- and post-norms, tied output;
 *  - gpt-oss: sliding window in every other layer, attention sinks and
 *    biases, 4 experts (2 used) of width n_ff with biases;
 *  - qwen35moe: qwen35's layers with 4 experts (2 used) of width n_ff and a
 *    gated shared expert of width n_ff in place of the dense feed-forward
 *    (the Qwen 3.5/3.6 MoE models: 35B-A3B and larger). */
enum gguf_gen_arch {
	GGUF_GEN_ARCH_LLAMA = 0,
	GGUF_GEN_ARCH_QWEN35,
	GGUF_GEN_ARCH_GEMMA3,
	GGUF_GEN_ARCH_GPT_OSS,
	GGUF_GEN_ARCH_QWEN35MOE,
};
/* general.architecture's spelling ("llama", "qwen35", "gemma3", "gpt-oss",
 * "qwen35moe"). */
const char *gguf_gen_arch_name(enum gguf_gen_arch a);
bool gguf_gen_arch_parse(const char *s, enum gguf_gen_arch *out);

struct gguf_gen_params {
	enum gguf_gen_arch arch; /* default llama */
	uint32_t sliding_window; /* gemma3, gpt-oss: attention window in tokens (default 128) */
	uint32_t n_embd;
	uint32_t n_layers;
	uint32_t n_head;
	uint32_t n_head_kv;
	uint32_t n_ff;
	uint32_t context_length;
	uint64_t seed;
	uint32_t weight_type; /* GGML_TYPE_F16 (default) or GGML_TYPE_F32 */
	const char *name;     /* general.name; NULL for a generated one */
	/* Another model's tokenizer instead of the built-in one (NULL: built-in). */
	const struct gguf_gen_vocab *vocab;
	/* The chat template to store (NULL: the vocabulary's, else ChatML). */
	const char *chat_template;
};

/* A real model's tokenizer for the writer, so that a random-weight model
 * tokenizes (and templates) exactly as that model does: a Hugging Face
 * tokenizer.json with a BPE model, and its tokenizer_config.json for the
 * special tokens and the chat template. Two kinds are written:
 *  - byte-level BPE (GPT-2, Llama 3, Qwen): tokenizer.ggml.model "gpt2",
 *    converted as llama.cpp's convert_hf_to_gguf.py does (ids in order,
 *    added special tokens as control tokens, other added tokens as
 *    user-defined ones, merges as "left right" strings). The caller names
 *    llama.cpp's pre-tokenizer type (tokenizer.ggml.pre), which the
 *    conversion script decides by hashing.
 *  - SentencePiece-style BPE (byte fallback, spaces written as U+2581:
 *    Llama 2, Mistral 7B, Gemma): tokenizer.ggml.model "llama", as the
 *    script writes these models from their tokenizer.model, with scores,
 *    token types (byte tokens <0xXX>, the unknown token), add_space_prefix
 *    and no merges; pre must be NULL. The scores come from the merges
 *    (-rank of the first merge that makes a token), so that llama.cpp's
 *    SentencePiece merging, highest score first, merges in the tokenizer's
 *    order.
 * A tokenizer that neither kind reproduces (another normalizer or
 * pre-tokenizer, merges llama.cpp would not make the same way, dropout,
 * ...) is refused with the reason: a model that tokenized differently from
 * its own tokenizer would be worse than none. */
struct gguf_gen_vocab {
	char **tokens;
	int32_t *types; /* tokenizer.ggml.token_type values */
	float *scores;  /* tokenizer.ggml.scores; NULL for byte-level BPE */
	uint32_t n;
	char **merges;
	uint32_t n_merges;
	char model[16]; /* tokenizer.ggml.model: "gpt2" or "llama" */
	char pre[64];
	int32_t bos, eos, eot, pad, unk; /* -1: none */
	int add_bos;                     /* -1: unset (the pre-tokenizer's default applies) */
	int add_eos;                     /* -1: unset */
	int add_space_prefix;            /* -1: unset */
	char *chat_template;             /* NULL when the config has none */
};
int gguf_gen_vocab_from_hf(const char *tokenizer_json, const char *config_json, const char *pre,
                           struct gguf_gen_vocab *v, char *err, size_t errlen);
void gguf_gen_vocab_free(struct gguf_gen_vocab *v);

/* Defaults: a ~24M-parameter f16 model with a 32768 context, seed 1. */
void gguf_gen_params_default(struct gguf_gen_params *p);
/* Parses "24M", "1.5B", "500k", "24000000" into a parameter count. */
bool gguf_parse_param_count(const char *s, uint64_t *out);
/* Picks n_embd (multiple of 64, head dim 64), n_layers, n_head, n_head_kv
 * (GQA 4:1 where the head count allows) and n_ff (~8/3 n_embd, multiple of 64)
 * so the model, with its vocabulary (p->vocab, else the built-in one), has about
 * n_params parameters.
 * Leaves context_length, seed, weight_type and name untouched. */
bool gguf_gen_params_for_size(struct gguf_gen_params *p, uint64_t n_params, char *err,
                              size_t errlen);
/* Whether the params describe a model the writer can produce and llama.cpp
 * can load (head size even and dividing n_embd, KV heads dividing heads,
 * sizes in range, f16/f32); false with the reason in err. */
bool gguf_gen_params_check(const struct gguf_gen_params *p, char *err, size_t errlen);
/* Total parameters the params would produce (vocabulary included): every
 * tensor's elements, as the writer plans them. */
uint64_t gguf_gen_param_count(const struct gguf_gen_params *p);
/* The size of the built-in vocabulary, and the ids of its special tokens. */
uint32_t gguf_gen_vocab_size(void);
enum {
	GGUF_GEN_TOKEN_UNK = 0,
	GGUF_GEN_TOKEN_BOS = 1,
	GGUF_GEN_TOKEN_EOS = 2,
	GGUF_GEN_TOKEN_IM_START = 3,
	GGUF_GEN_TOKEN_IM_END = 4,
	GGUF_GEN_TOKEN_BYTE0 = 5, /* <0x00>; <0xNN> is BYTE0 + NN */
};

/* Writes a llama GGUF with random weights (deterministic in p->seed on every
 * machine) and a built-in SentencePiece byte-fallback vocabulary with a ChatML
 * template, to path via path.tmp + fsync + rename. Tensor data is streamed in
 * chunks; memory use does not grow with the model. Returns 0, or -1 with a
 * message in err. */
int gguf_write_random_llama(const struct gguf_gen_params *p, const char *path, char *err,
                            size_t errlen);

#endif
