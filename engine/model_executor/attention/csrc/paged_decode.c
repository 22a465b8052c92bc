/* Paged decode attention on the CPU, for engine/model_executor/attention/cpu_native.py: float32 queries
 * and outputs, a float32, bf16 or fp8 (e4m3fn) cache (a bf16 or fp8 block's rows are widened to float32
 * once, into a per-thread buffer, and both passes read them there).
 *
 * One query token per sequence reads its context where it lies in the paged cache
 * [num_blocks, block_size, kv_heads, head_size] (K and V separately). A work item is one sequence and
 * a run of kv heads; each item reads every cache row of its context once, scores all the query heads
 * of its kv heads against it (GQA: the group shares the row), then takes the softmax-weighted sum of
 * the V rows. Scores are kept (two passes, not an online softmax) so each row is read once per pass
 * with no rescaling of the accumulators.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../../csrc/exp_simd.h"
#ifdef _OPENMP
#include <omp.h>
#else
static int omp_get_thread_num(void) { return 0; } /* built without OpenMP: one thread, pragmas ignored */
#endif

int stepscope_paged_decode_abi(void) { return 3; }

/* 16 floats: the compiler lowers it to one AVX-512 register, two AVX ones, or four NEON ones. */
typedef float vf __attribute__((vector_size(64)));
#define VL 16

static inline vf load_vf(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store_vf(float *p, vf v) { memcpy(p, &v, sizeof v); }

/* The sums of a, b, c, d in lanes 0, 4, 8, 12: halves are folded together pairwise, so four dot products
 * cost three rounds of shuffles instead of four separate horizontal sums. */
static inline vf sum4(vf a, vf b, vf c, vf d) {
    vf ab = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
            __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    vf cd = __builtin_shufflevector(c, d, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
            __builtin_shufflevector(c, d, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
    vf x = __builtin_shufflevector(ab, cd, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
           __builtin_shufflevector(ab, cd, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    x += __builtin_shufflevector(x, x, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    x += __builtin_shufflevector(x, x, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    return x;
}

/* scores[t] = scale * q . k_t for `rows` rows `row_stride` floats apart; head_size = chunks * VL.
 * Inlined with constant `chunks` for the common head sizes, so the accumulators stay in registers. */
static inline __attribute__((always_inline)) void score_rows(const float *q, const float *k, int64_t row_stride,
                                                             int rows, int chunks, float scale, float *scores) {
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
        const float *k0 = k + r * row_stride;
        vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
        for (int c = 0; c < chunks; c++) {
            const vf qc = load_vf(q + c * VL);
            a0 += qc * load_vf(k0 + c * VL);
            a1 += qc * load_vf(k0 + row_stride + c * VL);
            a2 += qc * load_vf(k0 + 2 * row_stride + c * VL);
            a3 += qc * load_vf(k0 + 3 * row_stride + c * VL);
        }
        const vf x = sum4(a0, a1, a2, a3);
        scores[r] = x[0] * scale;
        scores[r + 1] = x[4] * scale;
        scores[r + 2] = x[8] * scale;
        scores[r + 3] = x[12] * scale;
    }
    for (; r < rows; r++) {
        vf a = {0}, zero = {0};
        for (int c = 0; c < chunks; c++) a += load_vf(q + c * VL) * load_vf(k + r * row_stride + c * VL);
        scores[r] = sum4(a, zero, zero, zero)[0] * scale;
    }
}

/* acc += sum_t p[t] * v_t over `rows` rows; head_size = chunks * VL (at most 16 chunks). */
static inline __attribute__((always_inline)) void weigh_rows(const float *p, const float *v, int64_t row_stride,
                                                             int rows, int chunks, float *acc) {
    vf a[16];
    for (int c = 0; c < chunks; c++) a[c] = load_vf(acc + c * VL);
    for (int r = 0; r < rows; r++) {
        const float w = p[r];
        for (int c = 0; c < chunks; c++) a[c] += w * load_vf(v + r * row_stride + c * VL);
    }
    for (int c = 0; c < chunks; c++) store_vf(acc + c * VL, a[c]);
}

static void score_rows_any(const float *q, const float *k, int64_t row_stride, int rows, int head_size,
                           float scale, float *scores) {
    switch (head_size) {
        case 64: score_rows(q, k, row_stride, rows, 4, scale, scores); return;
        case 128: score_rows(q, k, row_stride, rows, 8, scale, scores); return;
        default: break;
    }
    if (head_size % VL == 0 && head_size <= 16 * VL) {
        score_rows(q, k, row_stride, rows, head_size / VL, scale, scores);
        return;
    }
    for (int r = 0; r < rows; r++) {
        float dot = 0.0f;
        for (int d = 0; d < head_size; d++) dot += q[d] * k[r * row_stride + d];
        scores[r] = dot * scale;
    }
}

static void weigh_rows_any(const float *p, const float *v, int64_t row_stride, int rows, int head_size,
                           float *acc) {
    switch (head_size) {
        case 64: weigh_rows(p, v, row_stride, rows, 4, acc); return;
        case 128: weigh_rows(p, v, row_stride, rows, 8, acc); return;
        default: break;
    }
    if (head_size % VL == 0 && head_size <= 16 * VL) {
        weigh_rows(p, v, row_stride, rows, head_size / VL, acc);
        return;
    }
    for (int r = 0; r < rows; r++)
        for (int d = 0; d < head_size; d++) acc[d] += p[r] * v[r * row_stride + d];
}

/* Ask for `rows` rows' first `span` bytes, a cache line (64 bytes) at a time. */
static inline void prefetch_rows(const char *p, int64_t row_bytes, int rows, int64_t span) {
    for (int r = 0; r < rows; r++)
        for (int64_t off = 0; off < span; off += 64) __builtin_prefetch(p + r * row_bytes + off, 0, 3);
}

enum { CACHE_F32 = 0, CACHE_BF16 = 1, CACHE_FP8 = 2 };

/* A block's part of the cache as floats with its row stride: in place for a float32 cache; for a bf16
 * one (its bits are a float32's top half) or an fp8 one (through a table of its 256 values) rows
 * r0 .. r0+rows-1 widened into `tmp`, `span` floats a row. */
typedef struct {
    const char *base;   /* the cache */
    int kind;           /* CACHE_F32, CACHE_BF16 or CACHE_FP8: element size 4, 2 or 1 */
    const float *fp8;   /* the value of each fp8 byte */
} cache_t;

static inline const float *block_rows(cache_t c, int64_t off, int64_t row_stride, int rows, int64_t span,
                                      float *tmp, int64_t *stride) {
    if (c.kind == CACHE_F32) {
        *stride = row_stride;
        return (const float *)c.base + off;
    }
    for (int r = 0; r < rows; r++) {
        float *d = tmp + r * span;
        if (c.kind == CACHE_FP8) {
            const uint8_t *s = (const uint8_t *)c.base + off + r * row_stride;
            for (int64_t i = 0; i < span; i++) d[i] = c.fp8[s[i]];
        } else {
            const uint16_t *s = (const uint16_t *)c.base + off + r * row_stride;
            for (int64_t i = 0; i < span; i++) ((uint32_t *)d)[i] = (uint32_t)s[i] << 16;
        }
    }
    *stride = span;
    return tmp;
}

/* float8 e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, S.1111.111 is NaN. */
static void fp8_e4m3fn_table(float *t) {
    for (int b = 0; b < 256; b++) {
        const int e = (b >> 3) & 15, m = b & 7;
        const float mag = e == 15 && m == 7 ? NAN : e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8 + m), e - 10);
        t[b] = b & 128 ? -mag : mag;
    }
}

/* Where one work item's context lies: its block table, and the part of each cache row its kv heads span
 * (from its first kv head's vector on). Heads h_first .. h_first+h_count-1 read kv head h / group. */
typedef struct {
    const int32_t *table;
    int seq_len, num_blocks, block_size, head_size, group, h_first, h_count;
    int64_t row_stride, block_stride, item_off, span, elem, row_bytes;
} item_t;

/* One pass over an item's context: pass 1 (weigh = 0) fills scores[h][t] = scale * q_h . k_t from the K
 * cache, pass 2 (weigh = 1) adds p[h][t] * v_t into acc[h] from the V cache (p is scores by then). Both go
 * through a block four rows at a time, every head at each, so its rows are read front to back; and they
 * ask for the same rows of the next block meanwhile, since blocks lie scattered and the hardware
 * prefetcher stops at each one's end. Inlined with `weigh` constant, so each pass has its own loop. */
static inline __attribute__((always_inline)) void item_pass(const item_t *it, cache_t cache, int weigh,
                                                            const float *q, float scale, float *scores,
                                                            float *acc, float *rows_tmp) {
    for (int b = 0; b < it->num_blocks; b++) {
        const int64_t boff = it->table[b] * it->block_stride + it->item_off;
        const int t0 = b * it->block_size;
        const int rows = it->seq_len - t0 < it->block_size ? it->seq_len - t0 : it->block_size;
        const char *next = b + 1 < it->num_blocks
                               ? cache.base + (it->table[b + 1] * it->block_stride + it->item_off) * it->elem
                               : NULL;
        int64_t rs;
        const float *block = block_rows(cache, boff, it->row_stride, rows, it->span, rows_tmp, &rs);
        for (int r0 = 0; r0 < rows; r0 += 4) {
            const int n = rows - r0 < 4 ? rows - r0 : 4;
            if (next != NULL) prefetch_rows(next + r0 * it->row_bytes, it->row_bytes, n, it->span * it->elem);
            for (int hi = 0; hi < it->h_count; hi++) {
                const float *kv = block + r0 * rs + (int64_t)(hi / it->group) * it->head_size;
                float *s = scores + (int64_t)hi * it->seq_len + t0 + r0;
                if (weigh)
                    weigh_rows_any(s, kv, rs, n, it->head_size, acc + (int64_t)hi * it->head_size);
                else
                    score_rows_any(q + (int64_t)(it->h_first + hi) * it->head_size, kv, rs, n, it->head_size,
                                   scale, s);
            }
        }
    }
}

static void decode_item(const float *q, cache_t k_cache, cache_t v_cache, const int32_t *table,
                        int seq_len, int num_heads, int num_kv_heads, int kv_first, int kv_count, int head_size,
                        int block_size, float scale, float *out, float *scores, float *acc, float *rows_tmp) {
    const int group = num_heads / num_kv_heads;
    const int h_count = kv_count * group;
    const int64_t row_stride = (int64_t)num_kv_heads * head_size;
    const int64_t elem = k_cache.kind == CACHE_F32 ? 4 : k_cache.kind == CACHE_BF16 ? 2 : 1;
    const item_t it = {.table = table, .seq_len = seq_len, .num_blocks = (seq_len + block_size - 1) / block_size,
                       .block_size = block_size, .head_size = head_size, .group = group,
                       .h_first = kv_first * group, .h_count = h_count, .row_stride = row_stride,
                       .block_stride = (int64_t)block_size * row_stride, .item_off = (int64_t)kv_first * head_size,
                       .span = (int64_t)kv_count * head_size, .elem = elem, .row_bytes = row_stride * elem};
    /* Pass 1: scores[h][t] = scale * q_h . k_t */
    item_pass(&it, k_cache, 0, q, scale, scores, acc, rows_tmp);
    /* Softmax per head; the 1/sum is applied to the output at the end. */
    float inv_sum[h_count];
    for (int hi = 0; hi < h_count; hi++) {
        float *s = scores + (int64_t)hi * seq_len;
        float mx = -INFINITY;
        for (int t = 0; t < seq_len; t++) mx = s[t] > mx ? s[t] : mx;
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int t = 0; t < seq_len; t++) {
            s[t] = exp_clamped(s[t] - mx);
            sum += s[t];
        }
        inv_sum[hi] = 1.0f / sum;
    }
    /* Pass 2: acc[h] = sum_t p[h][t] * v_t */
    memset(acc, 0, sizeof(float) * (size_t)h_count * head_size);
    item_pass(&it, v_cache, 1, q, scale, scores, acc, rows_tmp);
    for (int hi = 0; hi < h_count; hi++) {
        float *o = out + (int64_t)(it.h_first + hi) * head_size;
        const float *a = acc + (int64_t)hi * head_size;
        for (int d = 0; d < head_size; d++) o[d] = a[d] * inv_sum[hi];
    }
}

/* q [num_seqs, num_heads, head_size] float32 (rows q_seq_stride apart), out likewise (out_seq_stride);
 * the caches of cache_kind (CACHE_F32, CACHE_BF16, CACHE_FP8); block_tables [num_seqs, table_stride] int32; seq_lens
 * [num_seqs] int32, each >= 1. Returns 0, or -1 when its work buffer could not be allocated (nothing
 * written then). */
int stepscope_paged_decode(const float *q, int64_t q_seq_stride, const void *k_cache, const void *v_cache,
                           int cache_kind, const int32_t *block_tables, int64_t table_stride, const int32_t *seq_lens,
                           int num_seqs, int num_heads, int num_kv_heads, int head_size, int block_size,
                           int kv_heads_per_item, float scale, float *out, int64_t out_seq_stride, int num_threads) {
    const int splits = (num_kv_heads + kv_heads_per_item - 1) / kv_heads_per_item;
    const int items = num_seqs * splits;
    const int group = num_heads / num_kv_heads;
    int max_len = 0;
    for (int i = 0; i < num_seqs; i++) max_len = seq_lens[i] > max_len ? seq_lens[i] : max_len;
    /* Per thread: scores [heads of an item][max_len], the accumulators [heads of an item][head_size], and
     * for a bf16 or fp8 cache one block's rows of the item widened [block_size][kv heads of an item * head_size]. */
    const size_t item_heads = (size_t)kv_heads_per_item * group;
    const size_t widened = cache_kind != CACHE_F32 ? (size_t)block_size * kv_heads_per_item * head_size : 0;
    const size_t per_thread = item_heads * ((size_t)max_len + (size_t)head_size) + widened;
    if (num_threads < 1) num_threads = 1;
    float *buf = malloc(sizeof(float) * per_thread * (size_t)num_threads);
    if (buf == NULL) return -1;
    float fp8[256];
    fp8_e4m3fn_table(fp8);
    const cache_t k = {(const char *)k_cache, cache_kind, fp8}, v = {(const char *)v_cache, cache_kind, fp8};
#pragma omp parallel num_threads(num_threads)
    {
        float *scores = buf + per_thread * (size_t)omp_get_thread_num();
        float *acc = scores + item_heads * (size_t)max_len;
        float *rows_tmp = acc + item_heads * (size_t)head_size;
#pragma omp for schedule(dynamic, 1)
        for (int item = 0; item < items; item++) {
            const int seq = item / splits, split = item % splits;
            const int kv_first = split * kv_heads_per_item;
            const int kv_count = kv_first + kv_heads_per_item <= num_kv_heads ? kv_heads_per_item
                                                                              : num_kv_heads - kv_first;
            decode_item(q + seq * q_seq_stride, k, v, block_tables + seq * table_stride, seq_lens[seq], num_heads,
                        num_kv_heads, kv_first, kv_count, head_size, block_size, scale, out + seq * out_seq_stride,
                        scores, acc, rows_tmp);
        }
    }
    free(buf);
    return 0;
}
