/* gguf_gen_vocab_from_hf: Hugging Face tokenizer files as `toki gguf gen
 * --tokenizer` converts them, and what the written GGUF then says. Small
 * hand-written tokenizer.json / tokenizer_config.json files; the real
 * models' vocabularies are checked against llama-server and the models' own
 * tokenizers in tests/integration/test_tokenizer_spm.py. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tmpdir.h"
#include "model/gguf.h"
#include "tokenizer/vocab.h"

static int setup_tmpdir(void **state)
{
	(void)state;
	return tmpdir_make("toki-hfvocab");
}

static int teardown_tmpdir(void **state)
{
	(void)state;
	tmpdir_remove();
	return 0;
}

/* Writes text to tmpdir/name and returns the path (a static buffer per slot). */
static const char *put(int slot, const char *name, const char *text)
{
	static char paths[4][512];
	snprintf(paths[slot], sizeof paths[slot], "%s/%s", tmpdir, name);
	FILE *f = fopen(paths[slot], "w");
	assert_non_null(f);
	assert_int_equal(fputs(text, f) >= 0, 1);
	assert_int_equal(fclose(f), 0);
	return paths[slot];
}

/* A byte-level BPE tokenizer with Qwen's special tokens. */
static const char bpe_json[] =
    "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \",\": 3},"
    " \"merges\": [\"a b\"]},"
    " \"added_tokens\": [{\"id\": 4, \"content\": \"<|endoftext|>\", \"special\": true},"
    " {\"id\": 5, \"content\": \"<|im_end|>\", \"special\": true}]}";

/* The GGUF gen writes for vocabulary v, opened. */
static struct gguf *write_and_open(const struct gguf_gen_vocab *v)
{
	struct gguf_gen_params p;
	gguf_gen_params_default(&p);
	p.n_embd = 64;
	p.n_layers = 1;
	p.n_head = p.n_head_kv = 1;
	p.n_ff = 64;
	p.context_length = 256;
	p.vocab = v;
	char path[512], err[256];
	snprintf(path, sizeof path, "%s/model.gguf", tmpdir);
	if (gguf_write_random_llama(&p, path, err, sizeof err) != 0)
		fail_msg("write: %s", err);
	struct gguf_error gerr;
	struct gguf *g = gguf_open(path, &gerr);
	if (!g)
		fail_msg("open: %s", gerr.text);
	return g;
}

/* A config whose bos_token is null (Qwen's) names no BOS. llama.cpp cannot
 * be told "none" (an absent id is 11 for a BPE vocabulary, 1 for a
 * SentencePiece one: here ",", which /props then reported), so gen names
 * the pad token, as llama.cpp's converter does for these models from their
 * config.json, and never adds it. */
static void test_null_bos_names_the_pad_token(void **state)
{
	(void)state;
	const char *tj = put(0, "tokenizer.json", bpe_json);
	const char *tc = put(1, "tokenizer_config.json",
	                     "{\"bos_token\": null, \"eos_token\": \"<|im_end|>\","
	                     " \"pad_token\": \"<|endoftext|>\", \"add_bos_token\": true}");
	struct gguf_gen_vocab v;
	char err[256];
	assert_int_equal(gguf_gen_vocab_from_hf(tj, tc, "qwen2", &v, err, sizeof err), 0);
	assert_int_equal(v.bos, 4);
	assert_int_equal(v.eos, 5);
	assert_int_equal(v.add_bos, 0);
	struct gguf *g = write_and_open(&v);
	uint32_t id = 0;
	bool add = true;
	assert_true(gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &id));
	assert_int_equal(id, 4);
	assert_true(gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add));
	assert_false(add);
	gguf_close(g);
	gguf_gen_vocab_free(&v);

	/* Without a pad token: the EOS, a control token as well. */
	tc =
	    put(1, "tokenizer_config.json", "{\"bos_token\": null, \"eos_token\": \"<|im_end|>\"}");
	assert_int_equal(gguf_gen_vocab_from_hf(tj, tc, "qwen2", &v, err, sizeof err), 0);
	assert_int_equal(v.bos, 5);
	assert_int_equal(v.add_bos, 0);
	gguf_gen_vocab_free(&v);

	/* A config that names its BOS keeps it. */
	tc = put(1, "tokenizer_config.json",
	         "{\"bos_token\": \"<|endoftext|>\", \"eos_token\": \"<|im_end|>\"}");
	assert_int_equal(gguf_gen_vocab_from_hf(tj, tc, "qwen2", &v, err, sizeof err), 0);
	assert_int_equal(v.bos, 4);
	assert_int_equal(v.add_bos, -1);
	gguf_gen_vocab_free(&v);
}

/* DeepSeek V3's config (and other older transformers' ones) names its
 * tokens as serialized AddedToken objects, {"__type": "AddedToken",
 * "content": ...}, not strings: the BOS, EOS and pad are their contents. */
static void test_added_token_objects(void **state)
{
	(void)state;
	const char *tj = put(0, "tokenizer.json", bpe_json);
	const char *tc = put(
	    1, "tokenizer_config.json",
	    "{\"add_bos_token\": true, \"add_eos_token\": false,"
	    " \"bos_token\": {\"__type\": \"AddedToken\", \"content\": \"<|endoftext|>\","
	    " \"lstrip\": false, \"normalized\": true, \"rstrip\": false, \"single_word\": false},"
	    " \"eos_token\": {\"__type\": \"AddedToken\", \"content\": \"<|im_end|>\"},"
	    " \"pad_token\": {\"__type\": \"AddedToken\", \"content\": \"<|im_end|>\"}}");
	struct gguf_gen_vocab v;
	char err[256];
	assert_int_equal(gguf_gen_vocab_from_hf(tj, tc, "deepseek-v3", &v, err, sizeof err), 0);
	assert_int_equal(v.bos, 4);
	assert_int_equal(v.eos, 5);
	assert_int_equal(v.pad, 5);
	assert_int_equal(v.add_bos, 1);
	struct gguf *g = write_and_open(&v);
	uint32_t id = 0;
	bool add = false;
	assert_true(gguf_get_u32(g, "tokenizer.ggml.bos_token_id", &id));
	assert_int_equal(id, 4);
	assert_true(gguf_get_u32(g, "tokenizer.ggml.eos_token_id", &id));
	assert_int_equal(id, 5);
	assert_true(gguf_get_bool(g, "tokenizer.ggml.add_bos_token", &add));
	assert_true(add);
	gguf_close(g);
	gguf_gen_vocab_free(&v);
}

/* SentencePiece's space, U+2581, kept apart so that no hex escape runs on. */
#define SP "\xe2\x96\x81"

/* A SentencePiece-style tokenizer.json (Llama 2's layout): byte fallback,
 * a leading "▁" and spaces as "▁". MERGES is spliced in. */
#define SPM_JSON(MERGES)                                                                           \
	"{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": ["                             \
	"{\"type\": \"Prepend\", \"prepend\": \"" SP "\"},"                                        \
	"{\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"" SP "\"}]},"    \
	" \"pre_tokenizer\": null,"                                                                \
	" \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": ["                    \
	"{\"SpecialToken\": {\"id\": \"<s>\"}}, {\"Sequence\": {\"id\": \"A\"}}]},"                \
	" \"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"unk_token\": \"<unk>\","       \
	" \"vocab\": {\"<unk>\": 0, \"<s>\": 1, \"</s>\": 2, \"<0x0A>\": 3, \"" SP "\": 4,"        \
	" \"a\": 5, \"b\": 6, \"" SP "a\": 7, \"ab\": 8, \"" SP "ab\": 9},"                        \
	" \"merges\": [" MERGES "]},"                                                              \
	" \"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true},"              \
	" {\"id\": 1, \"content\": \"<s>\", \"special\": true},"                                   \
	" {\"id\": 2, \"content\": \"</s>\", \"special\": true},"                                  \
	" {\"id\": 10, \"content\": \"<x>\", \"special\": false}]}"

/* Both merge formats: "left right" and ["left", "right"]. */
#define ALL_MERGES "\"" SP " a\", \"a b\", [\"" SP "a\", \"b\"], \"" SP " ab\""

/* Written as llama.cpp writes a SentencePiece model: "llama", scores from
 * the merges, token types, no merges, add_bos from the post-processor; and
 * toki's tokenizer reads it back and merges in the tokenizer's order. */
static void test_sentencepiece_style(void **state)
{
	(void)state;
	const char *tj = put(0, "spm.json", SPM_JSON(ALL_MERGES));
	const char *tc =
	    put(1, "spm_config.json", "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}");
	struct gguf_gen_vocab v;
	char err[256];
	if (gguf_gen_vocab_from_hf(tj, tc, NULL, &v, err, sizeof err) != 0)
		fail_msg("%s", err);
	assert_string_equal(v.model, "llama");
	assert_int_equal(v.n, 11);
	assert_int_equal(v.n_merges, 0);
	assert_int_equal(v.add_space_prefix, 1);
	assert_int_equal(v.add_bos, 1);
	assert_int_equal(v.add_eos, 0);
	assert_int_equal(v.bos, 1);
	assert_int_equal(v.eos, 2);
	assert_int_equal(v.unk, 0);
	static const int32_t types[] = {2, 3, 3, 6, 1, 1, 1, 1, 1, 1, 4};
	static const float scores[] = {0, 0, 0, 0, 0, 0, 0, -1, -2, -3, 0};
	for (uint32_t i = 0; i < v.n; i++) {
		assert_int_equal(v.types[i], types[i]);
		assert_true(v.scores[i] == scores[i]);
	}
	struct gguf *g = write_and_open(&v);
	assert_string_equal(gguf_get_string(g, "tokenizer.ggml.model"), "llama");
	assert_null(gguf_find_key(g, "tokenizer.ggml.merges"));
	assert_null(gguf_find_key(g, "tokenizer.ggml.pre"));
	struct vocab *tv = vocab_from_gguf(g, err, sizeof err);
	if (!tv)
		fail_msg("%s", err);
	struct token_list out = {0};
	static const char text[] = "ab a<x>ab\n";
	assert_int_equal(vocab_tokenize(tv, text, strlen(text), 1, 1, &out), 0);
	/* <s> ▁ab ▁a <x> ▁ab <0x0A>: a "▁" after the user-defined token too */
	static const token_t want[] = {1, 9, 7, 10, 9, 3};
	assert_int_equal(out.n, sizeof want / sizeof want[0]);
	for (size_t i = 0; i < out.n; i++)
		assert_int_equal(out.v[i], want[i]);
	token_list_free(&out);
	vocab_free(tv);
	gguf_close(g);
	gguf_gen_vocab_free(&v);
}

/* What llama.cpp would tokenize differently is refused with the reason. */
static void test_sentencepiece_refusals(void **state)
{
	(void)state;
	struct gguf_gen_vocab v;
	char err[256];
	/* "▁" + "ab" make "▁ab" but are not a merge: llama.cpp would merge them. */
	const char *tj = put(0, "spm.json", SPM_JSON("\"" SP " a\", \"a b\", \"" SP "a b\""));
	assert_int_equal(gguf_gen_vocab_from_hf(tj, NULL, NULL, &v, err, sizeof err), -1);
	assert_non_null(strstr(err, "are not one of its merges"));
	/* --pre belongs to byte-level BPE; byte-level BPE needs it. */
	tj = put(0, "spm.json", SPM_JSON(ALL_MERGES));
	assert_int_equal(gguf_gen_vocab_from_hf(tj, NULL, "llama-bpe", &v, err, sizeof err), -1);
	assert_non_null(strstr(err, "--pre is for byte-level BPE"));
	tj = put(0, "bpe.json", bpe_json);
	assert_int_equal(gguf_gen_vocab_from_hf(tj, NULL, NULL, &v, err, sizeof err), -1);
	assert_non_null(strstr(err, "needs --pre"));
	/* A byte-level tokenizer stays "gpt2", merges and all. */
	assert_int_equal(gguf_gen_vocab_from_hf(tj, NULL, "qwen2", &v, err, sizeof err), 0);
	assert_string_equal(v.model, "gpt2");
	assert_null(v.scores);
	assert_int_equal(v.n_merges, 1);
	gguf_gen_vocab_free(&v);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_null_bos_names_the_pad_token),
	    cmocka_unit_test(test_added_token_objects),
	    cmocka_unit_test(test_sentencepiece_style),
	    cmocka_unit_test(test_sentencepiece_refusals),
	};
	return cmocka_run_group_tests(tests, setup_tmpdir, teardown_tmpdir);
}
