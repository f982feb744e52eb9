/* A reproduction, at the level of one ggml op, of why exact mode did not
 * hold on ggml-vulkan over lavapipe (docs/exact.md, "GPU backends"; the
 * upstream report is docs/upstream-ggml-vulkan-coopmat.md).
 *
 * ggml_mul_mat(A, B) with A an f16 matrix of 256 x 256 and B the first N
 * columns (tokens) of an f32 tensor, on the Vulkan device and on the CPU:
 * 1. for each N, the largest difference between the two, and how many
 *    elements are off by more than 1 (f16 rounding stays under 0.2; the
 *    values are about 10);
 * 2. whether the Vulkan result depends on what the columns past N hold
 *    (which a matrix product of N columns must not read): once zeros, once
 *    random values ("pad-dep");
 * 3. whether it depends on what ran before it: the same product again
 *    after a larger product of other values ("hist-dep").
 * Build and run: bench/vk_matmul_repro.sh. GGML_VK_DISABLE_COOPMAT=1 takes
 * the cooperative-matrix shaders out. */
#include <ggml-alloc.h>
#include <ggml-backend.h>
#include <ggml.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { K = 256, M = 256, PAD = 64, MAXN = 200 };

static uint32_t rng;
static float frand(void)
{
	rng = rng * 1664525u + 1013904223u;
	return (float)(rng >> 8) / 16777216.0f * 2.0f - 1.0f;
}

/* out = A * B[:, :n], where the PAD columns past n hold pad_random ? random
 * values : zeros. */
static void mul_mat(ggml_backend_t be, int n, int pad_random, uint32_t seed, float *out)
{
	struct ggml_init_params ip = {16 * 1024 * 1024, NULL, true};
	struct ggml_context *ctx = ggml_init(ip);
	struct ggml_tensor *a = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, K, M);
	struct ggml_tensor *big = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, n + PAD);
	struct ggml_tensor *b = ggml_view_2d(ctx, big, K, n, big->nb[1], 0);
	struct ggml_tensor *r = ggml_mul_mat(ctx, a, b);
	struct ggml_cgraph *g = ggml_new_graph(ctx);
	ggml_build_forward_expand(g, r);
	ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
	static ggml_fp16_t ad[K * M];
	static float bd[K * (MAXN + PAD)];
	rng = 77;
	for (int i = 0; i < K * M; i++)
		ad[i] = ggml_fp32_to_fp16(frand());
	rng = seed;
	for (int i = 0; i < K * n; i++)
		bd[i] = frand();
	rng = 9;
	for (int i = K * n; i < K * (n + PAD); i++)
		bd[i] = pad_random ? frand() : 0.0f;
	ggml_backend_tensor_set(a, ad, 0, ggml_nbytes(a));
	ggml_backend_tensor_set(big, bd, 0, ggml_nbytes(big));
	ggml_gallocr_t ga = ggml_gallocr_new(ggml_backend_get_default_buffer_type(be));
	ggml_gallocr_alloc_graph(ga, g);
	ggml_backend_graph_compute(be, g);
	ggml_backend_tensor_get(r, out, 0, ggml_nbytes(r));
	ggml_gallocr_free(ga);
	ggml_backend_buffer_free(buf);
	ggml_free(ctx);
}

int main(void)
{
	ggml_backend_load_all();
	ggml_backend_dev_t vkdev = ggml_backend_dev_by_name("Vulkan0");
	if (!vkdev) {
		fprintf(stderr, "no Vulkan0 device (GGML_VK_VISIBLE_DEVICES=0 shows lavapipe)\n");
		return 2;
	}
	ggml_backend_t vk = ggml_backend_dev_init(vkdev, NULL);
	ggml_backend_t cpu = ggml_backend_dev_init(ggml_backend_dev_by_name("CPU"), NULL);
	printf("device: %s; GGML_VK_DISABLE_COOPMAT=%s\n", ggml_backend_dev_description(vkdev),
	       getenv("GGML_VK_DISABLE_COOPMAT") ? getenv("GGML_VK_DISABLE_COOPMAT") : "(unset)");
	printf("%4s %12s %8s %8s %8s\n", "N", "max|vk-cpu|", "off>1", "pad-dep", "hist-dep");
	static float ref[M * MAXN], x[M * MAXN], y[M * MAXN], z[M * MAXN], junk[M * MAXN];
	int bad = 0, dep_sizes = 0;
	for (int n = 56; n <= MAXN; n += n < 72 ? 1 : 9) {
		mul_mat(cpu, n, 0, 5, ref);
		mul_mat(vk, n, 0, 5, x);
		mul_mat(vk, n, 1, 5, y);
		mul_mat(vk, MAXN, 1, 1234, junk);
		mul_mat(vk, n, 0, 5, z);
		double mx = 0;
		int off = 0, pad = 0, hist = 0;
		for (int i = 0; i < M * n; i++) {
			double d = fabs((double)ref[i] - x[i]);
			mx = d > mx ? d : mx;
			off += d > 1.0;
			pad += memcmp(&x[i], &y[i], sizeof x[i]) != 0;
			hist += memcmp(&x[i], &z[i], sizeof x[i]) != 0;
		}
		bad += off > 0;
		dep_sizes += hist > 0;
		printf("%4d %12.4f %8d %8d %8d\n", n, mx, off, pad, hist);
	}
	printf("%d sizes wrong, %d depend on what ran before\n", bad, dep_sizes);
	ggml_backend_free(vk);
	ggml_backend_free(cpu);
	return bad ? 1 : 0;
}
