/* Fused pointwise ops on the CPU, float32, for engine/model_executor/layers/cpu_ops.py.
 *
 * Each op reads its rows once and writes its result once, where the torch path makes one full pass
 * through memory per elementary op (a residual add, a square, a mean, a scale, a cast, a weight...).
 * The arithmetic follows transformers' order (rms: x * rsqrt(mean(x^2) + eps), then times weight;
 * rope: x1 * cos - x2 * sin, x2 * cos + x1 * sin; silu: g / (1 + exp(-g)), times up), and the build
 * turns off fused multiply-add contraction, so every product is rounded as torch rounds it. Two things
 * differ from torch: the order of the sum of squares, and silu's exp (csrc/exp_simd.h, within 2e-7 of it).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../../csrc/exp_simd.h"

int stepscope_cpu_ops_abi(void) { return 1; }

/* Rows of work below which one thread does it all: a parallel region costs a few microseconds. */
#define PARALLEL_MIN_FLOATS (1 << 16)

static inline float row_inv_rms(const float *x, int dim, float eps) {
    float acc[16] = {0};
    int d = 0;
    for (; d + 16 <= dim; d += 16)
        for (int l = 0; l < 16; l++) acc[l] += x[d + l] * x[d + l];
    float sum = 0.0f;
    for (int l = 0; l < 16; l++) sum += acc[l];
    for (; d < dim; d++) sum += x[d] * x[d];
    return 1.0f / sqrtf(sum / (float)dim + eps);
}

/* out[r] = weight * (s * inv_rms(s)) with s = x[r] (+ residual[r], the sum then stored back into x[r]
 * as the new residual stream). Rows are `x_stride`, `res_stride` and `out_stride` floats apart. */
void stepscope_rms_norm_f32(float *x, int64_t x_stride, const float *residual, int64_t res_stride,
                            const float *weight, int64_t rows, int dim, float eps, float *out, int64_t out_stride,
                            int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * dim >= PARALLEL_MIN_FLOATS) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        float *xr = x + r * x_stride;
        if (residual != NULL) {
            const float *rr = residual + r * res_stride;
            for (int d = 0; d < dim; d++) xr[d] += rr[d];
        }
        const float inv = row_inv_rms(xr, dim, eps);
        float *o = out + r * out_stride;
        for (int d = 0; d < dim; d++) o[d] = weight[d] * (xr[d] * inv);
    }
}

/* The attention block's q/k preparation in one pass per head: an optional per-head rms norm (q_weight
 * for query heads, k_weight for kv heads; NULL for none), then neox rotary embedding of the first
 * `rotary_dim` features with cos/sin rows of `cos_sin` [max_position, rotary_dim] (cos half, sin half)
 * at each token's position. Reads q and k heads from qkv rows (`qkv_stride` floats apart, q heads
 * first, then k heads), writes q_out [tokens, num_heads * head_dim] and k_out [tokens, num_kv_heads *
 * head_dim], both contiguous. Returns 0, or -1 (nothing written) when a position lies outside
 * [0, max_position). */
int stepscope_qk_norm_rope_f32(const float *qkv, int64_t qkv_stride, int64_t tokens, int num_heads,
                                int num_kv_heads, int head_dim, int rotary_dim, const float *q_weight,
                                const float *k_weight, float eps, const float *cos_sin, const int64_t *positions,
                                int64_t max_position, float *q_out, float *k_out, int num_threads) {
    for (int64_t t = 0; t < tokens; t++)
        if (positions[t] < 0 || positions[t] >= max_position) return -1;
    const int heads = num_heads + num_kv_heads, half = rotary_dim / 2;
#pragma omp parallel for num_threads(num_threads) if (tokens * heads * head_dim >= PARALLEL_MIN_FLOATS) \
    schedule(static)
    for (int64_t t = 0; t < tokens; t++) {
        const float *cs = cos_sin + positions[t] * rotary_dim;
        const float *cos = cs, *sin = cs + half;
        for (int h = 0; h < heads; h++) {
            const int is_q = h < num_heads;
            const float *src = qkv + t * qkv_stride + (int64_t)h * head_dim;
            float *dst = is_q ? q_out + (t * num_heads + h) * (int64_t)head_dim
                              : k_out + (t * num_kv_heads + (h - num_heads)) * (int64_t)head_dim;
            const float *w = is_q ? q_weight : k_weight;
            float normed[head_dim];
            if (w != NULL) {
                const float inv = row_inv_rms(src, head_dim, eps);
                for (int d = 0; d < head_dim; d++) normed[d] = w[d] * (src[d] * inv);
            } else {
                memcpy(normed, src, sizeof(float) * (size_t)head_dim);
            }
            for (int d = 0; d < half; d++) {
                const float x1 = normed[d], x2 = normed[d + half];
                dst[d] = x1 * cos[d] - x2 * sin[d];
                dst[d + half] = x2 * cos[d] + x1 * sin[d];
            }
            for (int d = rotary_dim; d < head_dim; d++) dst[d] = normed[d];
        }
    }
    return 0;
}

/* out[r] = silu(gate) * up, where row r of x holds gate (dim floats) then up (dim floats). */
void stepscope_silu_and_mul_f32(const float *x, int64_t x_stride, int64_t rows, int dim, float *out,
                                int64_t out_stride, int num_threads) {
#pragma omp parallel for num_threads(num_threads) if (rows * dim >= PARALLEL_MIN_FLOATS) schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const float *g = x + r * x_stride, *u = g + dim;
        float *o = out + r * out_stride;
        /* 16 lanes: left to itself GCC picks 8 (AVX2 width) here, which wastes half of an AVX-512 register. */
#pragma omp simd simdlen(16)
        for (int d = 0; d < dim; d++) o[d] = g[d] / (1.0f + exp_clamped(-g[d])) * u[d];
    }
}
