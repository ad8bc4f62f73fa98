/* MatMulNBits (com.microsoft) for a quantised target with int4 weights and int8 activations (`--quantize-target
 * int4 --target-activations int8`): Y [..., N] = A [..., K] x dequant(B), B 4-bit [N, K / 32, 16] symmetric (the
 * value q - 8, no zero points), one float32 scale per column and block of 32 k. Registered only for sessions
 * whose options carry specexport.matmul_nbits=int8 (backends/ort.py sets it for such targets and for quantised drafts),
 * on CPUs with AVX512-VNNI, and with AVX2 and FMA (the same integer sums by other instructions: see the AVX2
 * version below).
 *
 * Why: onnxruntime's int8 path of MatMulNBits ran a SmolLM2 decode step at 2.6-4.3x the time its weights take
 * to read, and each verify row cost ~6% of a step (docs/benchmarks.md, issue 17's int4 tables). Here the weights
 * are repacked once, at session creation, so that one 64-byte load holds 16 columns x 8 k as nibbles: byte i of
 * lane c holds k = 8j + i (low nibble) and 8j + 4 + i (high nibble); two masks make the u8 operands of two
 * VPDPBUSD, each 16 columns x 4 k of multiply-adds against 4 broadcast int8 activations. Four such groups make
 * a 64-column panel, so a row has 4 independent accumulator chains (one row alone is not bound by VPDPBUSD's
 * latency); a thread owns a contiguous range of panels and reads each once per block of up to 3 rows (4-bit
 * weights in calls of 4 rows or more: each half panel, 2 groups, once per block of up to 6 rows; see `part`).
 *
 * Numerics (this defines the int4-a8 target when the kernel runs): each row's activations are quantised per
 * block of 32 k on their own (scale max|a| / 127, round to nearest even), the block's products summed exactly
 * in int32, minus 8 x the block's activation sum, converted to float and added as fma(dot, a_scale x w_scale,
 * y) block after block in order. Every step depends on the row alone, so a row's output is bit-identical
 * whatever rows share its call: verify rows score exactly as decode rows, trees included.
 *
 * 8-bit weights ([N, K / 32, 32], the value q - 128: `--draft self:int8`): the block's exact int32 dot of (q - 128)
 * x the block's quantised activations, then scaled and added as above, one fma a block. The AVX512-VNNI path keeps
 * the bytes as they are (a 64-byte load: 16 columns x 4 k) and takes one VPDPBUSD per 4 k, 128 x the activation
 * sum off; the AVX2 path runs them as two blocks of nibbles in a row (q = 16 hi + lo: hi, the value hi - 8, then
 * lo, the value lo; `create`'s nibble, sh = 1 in its loops), the hi block's int32 dot x 16 added to the lo one's
 * before the block is scaled. Both reach the same integers, so a draft quantised so scores the same on either.
 * Why: SmolLM2's int4 self-draft agreed with its target's greedy token at 0.75 of positions, an int8 one at 0.97
 * (teacher-forced, 16 Spec-Bench prompts, 2026-12-07), and onnxruntime's own 8-bit MatMulNBits took 11.7 ms a
 * one-row call of the draft against 6.9 for the int4 one on this kernel (`epyc-zen3`). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "ops.h"

int specexport_parts(void);

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define MM4_512 1
#endif
#if defined(MATMUL4)
#define QB 32 /* k per block (the bundle's block_size) */
#define GC 16 /* columns per group: one vector of int32 lanes */
#define NG 4  /* groups per panel: 4 independent chains of VPDPBUSD per row, 64 columns */
#define RB4 3 /* rows per register block over a whole panel: 3 x 4 int32 and 3 x 4 float accumulators */
#define RB2 6 /* rows per register block over half a panel (2 groups), for calls of 4 rows or more */

typedef struct {
  uint8_t *w; /* [panels][nb][4 (j)][NG][64] nibbles: see the header (8-bit weights on AVX512-VNNI: [panels][nq][8 (j)]
               * [NG][64] bytes, 16 columns x 4 k a load) */
  float *s;   /* [panels][blocks][NG * GC] */
  int64_t K, N, nb, np;
  int64_t nq; /* blocks of K (of activations and scales): nb for 4-bit weights, nb / 2 for 8-bit ones */
  int sh;     /* 0 for 4-bit weights; 1 for 8-bit (in the AVX2 path nibble block b is block b >> 1 of k, hi where
               * b is even) */
} Kernel;

typedef struct {
  const Kernel *k;
  const float *x;      /* the activations [M][K] */
  const int8_t *qa;    /* [M][nq * QB] */
  const float *sa;     /* [M][nq] */
  const int32_t *asum; /* [M][nq]: 8 x the block's sum of activations */
  float *y;
  int64_t M, nparts;
} Call;

#if defined(MM4_512)
/* y[r0 .. r0 + R) x the G groups from g0 of panel p: R, G and W8 constants per instance, so the accumulators stay
 * in registers. Whatever R, G and g0, a row's column sums the same int32 block dots and adds them in the same
 * block order, so its output does not depend on the instance that ran it. W8: 8-bit weights, laid out as bytes
 * (create): one VPDPBUSD per 4 k of the u8 value q against 4 int8 activations, then 128 x the block's sum off, the
 * block's exact int32 dot of (q - 128) x qa that the AVX2 path reaches by two nibble blocks (4-bit: two VPDPBUSD
 * per 8 k on the masked nibbles, 8 x the sum off) */
#define ROWS(R, G, W8)                                                                                        \
  static void rows##R##_##G##_##W8(const Kernel *k, const Call *c, int64_t p, int64_t r0, int g0) {         \
    const int64_t nb = k->nb, nq = k->nq, Kp = nq * QB;                                                     \
    const int J = W8 ? 8 : 4, step = W8 ? 4 : 8; /* loads of 64 bytes a group and block, k each covers */   \
    const __m512i m4 = _mm512_set1_epi8(0x0f);                                                              \
    __m512 acc[R][G];                                                                                       \
    for (int r = 0; r < R; r++)                                                                             \
      for (int i = 0; i < G; i++) acc[r][i] = _mm512_setzero_ps();                                          \
    const uint8_t *w = k->w + p * nb * 256 * NG + 64 * g0;                                                  \
    const float *s = k->s + p * nq * GC * NG + GC * g0;                                                     \
    for (int64_t b = 0; b < nq; b++) {                                                                      \
      __m512i d[R][G];                                                                                      \
      for (int r = 0; r < R; r++)                                                                           \
        for (int i = 0; i < G; i++) d[r][i] = _mm512_setzero_si512();                                       \
      for (int j = 0; j < J; j++, w += 64 * NG) {                                                           \
        __m512i a0[R], a1[R];                                                                               \
        for (int r = 0; r < R; r++) {                                                                       \
          const int32_t *q = (const int32_t *)(c->qa + (r0 + r) * Kp + b * QB + step * j);                  \
          a0[r] = _mm512_set1_epi32(q[0]), a1[r] = W8 ? a0[r] : _mm512_set1_epi32(q[1]);                    \
        }                                                                                                   \
        for (int i = 0; i < G; i++) {                                                                       \
          __m512i v = _mm512_load_si512((const void *)(w + 64 * i));                                        \
          if (W8) {                                                                                         \
            for (int r = 0; r < R; r++) d[r][i] = _mm512_dpbusd_epi32(d[r][i], v, a0[r]);                   \
          } else {                                                                                          \
            __m512i lo = _mm512_and_si512(v, m4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m4);       \
            for (int r = 0; r < R; r++) {                                                                   \
              d[r][i] = _mm512_dpbusd_epi32(d[r][i], lo, a0[r]);                                            \
              d[r][i] = _mm512_dpbusd_epi32(d[r][i], hi, a1[r]);                                            \
            }                                                                                               \
          }                                                                                                 \
        }                                                                                                   \
      }                                                                                                     \
      for (int r = 0; r < R; r++) {                                                                         \
        int64_t x = (r0 + r) * nq + b;                                                                      \
        __m512i z = _mm512_set1_epi32(c->asum[x] << (W8 ? 4 : 0)); /* 8 x the sum, or 128 x */              \
        __m512 sa = _mm512_set1_ps(c->sa[x]);                                                               \
        for (int i = 0; i < G; i++) {                                                                       \
          __m512 dot = _mm512_cvtepi32_ps(_mm512_sub_epi32(d[r][i], z));                                    \
          acc[r][i] = _mm512_fmadd_ps(dot, _mm512_mul_ps(_mm512_load_ps(s + b * NG * GC + i * GC), sa), acc[r][i]); \
        }                                                                                                   \
      }                                                                                                     \
    }                                                                                                       \
    for (int i = 0; i < G; i++) {                                                                           \
      int64_t n0 = (p * NG + g0 + i) * GC, cols = k->N - n0 < GC ? k->N - n0 : GC;                          \
      if (cols <= 0) break;                                                                                 \
      __mmask16 mask = cols == GC ? 0xffff : (__mmask16)((1u << cols) - 1);                                 \
      for (int r = 0; r < R; r++) _mm512_mask_storeu_ps(c->y + (r0 + r) * k->N + n0, mask, acc[r][i]);      \
    }                                                                                                       \
  }
#define ROWS_BOTH(R, G) ROWS(R, G, 0) ROWS(R, G, 1)
ROWS_BOTH(1, 4)
ROWS_BOTH(2, 4)
ROWS_BOTH(3, 4)
ROWS(1, 2, 0) /* half panels: 4-bit weights only (`part`) */
ROWS(2, 2, 0)
ROWS(3, 2, 0)
ROWS(4, 2, 0)
ROWS(5, 2, 0)
ROWS(6, 2, 0)
typedef void (*Rows)(const Kernel *, const Call *, int64_t, int64_t, int);
static const Rows rows4[2][RB4 + 1] = {{NULL, rows1_4_0, rows2_4_0, rows3_4_0}, {NULL, rows1_4_1, rows2_4_1, rows3_4_1}};
static const Rows rows2[RB2 + 1] = {NULL, rows1_2_0, rows2_2_0, rows3_2_0, rows4_2_0, rows5_2_0, rows6_2_0};

/* Calls of up to 3 rows take whole panels, 3 rows at a time: a row alone has 4 chains of VPDPBUSD. From 4 rows
 * on, 4-bit weights take half panels, up to 6 rows at a time: each weight byte is unpacked once per 6 rows
 * instead of per 3, and 4 rows run as one block instead of 2 + 2. 8-bit weights have nothing to unpack and keep
 * whole panels at every M (8 rows: 2 + 3 + 3, the panel read from memory by the first block, from cache by the
 * others): their half panels, each pass reading two of every four 64-byte lines of a panel twice the 4-bit one's
 * size, swept SmolLM2's 121 weights 1.1-1.4x slower at 4-16 rows (experiments/matmul4_variants_ab.c -DBITS=8,
 * 2026-12-07, `epyc-zen4`). The rows in blocks as even as they go (9 rows: 5 + 4) */
static void part(void *arg, size_t p) {
  const Call *c = arg;
  const Kernel *k = c->k;
  int64_t p0 = k->np * (int64_t)p / c->nparts, p1 = k->np * ((int64_t)p + 1) / c->nparts;
  int half = c->M > RB4 && !k->sh, rb = half ? RB2 : RB4, G = half ? 2 : NG;
  const Rows *fn = half ? rows2 : rows4[k->sh];
  int64_t nblk = (c->M + rb - 1) / rb;
  for (int64_t q = p0; q < p1; q++)
    for (int g0 = 0; g0 < NG; g0 += G)
      for (int64_t i = 0, r = 0; i < nblk; i++) {
        int64_t r1 = c->M * (i + 1) / nblk;
        fn[r1 - r](k, c, q, r, g0);
        r = r1;
      }
}

/* rows [m0, m1) of x [M, K] as int8 per block of QB k (zero past K), their scales and 8 x their sums. Vectorised,
 * with the scalar arithmetic of the header: max|a| is exact, 127 / max|a| one float division, a x inv one float
 * product, and VCVTPS2DQ rounds to nearest even (the default MXCSR mode, as nearbyintf). */
static void quantise(const float *x, int64_t m0, int64_t m1, int64_t K, int64_t nb, int8_t *qa, float *sa, int32_t *asum) {
  const __m512 sign = _mm512_set1_ps(-0.0f);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  for (int64_t m = m0; m < m1; m++)
    for (int64_t b = 0; b < nb; b++) {
      const float *a = x + m * K + b * QB;
      int64_t n = K - b * QB < QB ? K - b * QB : QB;
      __mmask16 k0 = n >= 16 ? 0xffff : (__mmask16)((1u << n) - 1), k1 = n >= QB ? 0xffff : n <= 16 ? 0 : (__mmask16)((1u << (n - 16)) - 1);
      __m512 v0 = _mm512_maskz_loadu_ps(k0, a), v1 = _mm512_maskz_loadu_ps(k1, a + 16);
      float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1)));
      /* a NaN in the block makes its scale NaN, so the row's outputs are NaN (the runtime refuses non-finite
       * logits) rather than finite numbers from whatever the NaN converted to */
      int nan = _mm512_cmp_ps_mask(v0, v0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(v1, v1, _CMP_UNORD_Q);
      __m512 inv = _mm512_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
      __m512i q0 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v0, inv)), lo), hi);
      __m512i q1 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v1, inv)), lo), hi);
      int8_t *q = qa + (m * nb + b) * QB;
      _mm_storeu_si128((__m128i *)q, _mm512_cvtepi32_epi8(q0));
      _mm_storeu_si128((__m128i *)(q + 16), _mm512_cvtepi32_epi8(q1));
      sa[m * nb + b] = nan ? NAN : amax / 127.0f;
      asum[m * nb + b] = 8 * _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
    }
}

#else
/* A thread's prefetch cursors into the panel after the one its blocks read: `lines` cache lines of its
 * nibbles and `slines` of its scales per block (b) a block function runs, spread so that the panel's passes
 * (h0, row blocks) bring in the whole next panel by the time they end. Without them the passes wait on each
 * line of a panel they read first: SmolLM2's 121 int4 weights (84 MB packed) swept from memory at 1-2 rows
 * took 4.1-5.2 ms, with them 2.8-4.1 (AVX2, 2026-12-06, epyc-zen3; docs/benchmarks.md "The int4 draft's
 * weights prefetched"). */
typedef struct {
  const char *w, *wend, *s, *send;
  int lines, slines;
} Ahead;
static inline void ahead(Ahead *a) {
  for (int i = 0; i < a->lines && a->w < a->wend; i++, a->w += 64) __builtin_prefetch(a->w, 0, 1);
  for (int i = 0; i < a->slines && a->s < a->send; i++, a->s += 64) __builtin_prefetch(a->s, 0, 1);
}
/* AVX2 without VNNI (8 int32 lanes: a 64-byte group's 16 columns as two halves of 8, "half-groups" hg = 2 i + h,
 * at byte 32 hg of each (panel, block, j) unit). VPDPBUSD's exact 4-product sums become VPMADDUBSW (u8 nibble x
 * s8 activation, adjacent pairs into int16: |15 x 127 x 2| = 3,810, never saturates) added in int16 over the
 * block's 4 j, lo and hi (16 products a lane, |sum| <= 30,480 < 32,767: exact), then VPMADDWD by 1 into int32:
 * the same integer block dot as VPDPBUSD's, so the same float arithmetic after it and the same bits. */
#define ROWS(R, H, W8)                                                                                        \
  static void rows##R##_##H##_##W8(const Kernel *k, const Call *c, int64_t p, int64_t r0, int h0, Ahead *ah) { \
    const int64_t nb = k->nb, nq = k->nq, Kp = nq * QB;                                                     \
    const int sh = W8;                                                                                      \
    const __m256i m4 = _mm256_set1_epi8(0x0f), one = _mm256_set1_epi16(1);                                  \
    __m256 acc[R][H];                                                                                       \
    __m256i hi8[R][H]; /* 8-bit weights: the hi half-block's dot x 16, until the lo half adds its own */      \
    for (int r = 0; r < R; r++)                                                                             \
      for (int h = 0; h < H; h++) acc[r][h] = _mm256_setzero_ps(), hi8[r][h] = _mm256_setzero_si256();      \
    const uint8_t *w = k->w + p * nb * 256 * NG + 32 * h0;                                                  \
    const float *s = k->s + p * nq * GC * NG + 8 * h0;                                                      \
    for (int64_t b = 0; b < nb; b++) {                                                                      \
      __m256i d[R][H];                                                                                      \
      ahead(ah);                                                                                            \
      for (int r = 0; r < R; r++)                                                                           \
        for (int h = 0; h < H; h++) d[r][h] = _mm256_setzero_si256();                                       \
      _Pragma("GCC unroll 1") /* unrolled, GCC held all 4 j's products at once and spilled them */         \
      for (int j = 0; j < 4; j++, w += 64 * NG)                                                             \
        for (int h = 0; h < H; h++) {                                                                       \
          __m256i v = _mm256_load_si256((const void *)(w + 32 * h));                                        \
          __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);         \
          for (int r = 0; r < R; r++) {                                                                     \
            const int32_t *q = (const int32_t *)(c->qa + (r0 + r) * Kp + (b >> sh) * QB + 8 * j);           \
            __m256i t = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(q[0])),                 \
                                         _mm256_maddubs_epi16(hi, _mm256_set1_epi32(q[1])));                \
            d[r][h] = _mm256_add_epi16(d[r][h], t);                                                         \
          }                                                                                                 \
        }                                                                                                   \
      const int lo = (int)(b & sh); /* 8-bit: the block's lo half (no sum off), after its hi half */          \
      for (int r = 0; r < R; r++) {                                                                         \
        int64_t x = (r0 + r) * nq + (b >> sh);                                                              \
        __m256i z = _mm256_set1_epi32(lo ? 0 : c->asum[x]);                                                 \
        __m256 sa = _mm256_set1_ps(c->sa[x]);                                                               \
        for (int h = 0; h < H; h++) {                                                                       \
          __m256i dot = _mm256_sub_epi32(_mm256_madd_epi16(d[r][h], one), z);                               \
          if (sh && !lo) {                                                                                  \
            hi8[r][h] = _mm256_slli_epi32(dot, 4);                                                          \
            continue;                                                                                       \
          }                                                                                                 \
          if (lo) dot = _mm256_add_epi32(dot, hi8[r][h]); /* the 8-bit block's exact dot */                 \
          acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot),                                              \
                                      _mm256_mul_ps(_mm256_load_ps(s + (b >> sh) * NG * GC + 8 * h), sa), acc[r][h]); \
        }                                                                                                   \
      }                                                                                                     \
    }                                                                                                       \
    for (int h = 0; h < H; h++) {                                                                           \
      int64_t n0 = p * NG * GC + 8 * (h0 + h), cols = k->N - n0 < 8 ? k->N - n0 : 8;                         \
      if (cols <= 0) break;                                                                                 \
      for (int r = 0; r < R; r++) {                                                                         \
        float *y = c->y + (r0 + r) * k->N + n0;                                                             \
        if (cols == 8) {                                                                                    \
          _mm256_storeu_ps(y, acc[r][h]);                                                                   \
        } else {                                                                                            \
          float t[8];                                                                                       \
          _mm256_storeu_ps(t, acc[r][h]);                                                                   \
          memcpy(y, t, sizeof(float) * cols);                                                               \
        }                                                                                                   \
      }                                                                                                     \
    }                                                                                                       \
  }
#define ROWS_BOTH(R, H) ROWS(R, H, 0) ROWS(R, H, 1)
ROWS_BOTH(1, 4)
ROWS_BOTH(2, 4)
ROWS_BOTH(3, 2)
ROWS_BOTH(1, 1)
ROWS_BOTH(2, 1)
ROWS_BOTH(3, 1)
ROWS_BOTH(4, 1)
ROWS_BOTH(5, 1)
ROWS_BOTH(6, 1)
ROWS_BOTH(7, 1)
ROWS_BOTH(8, 1)
typedef void (*Rows)(const Kernel *, const Call *, int64_t, int64_t, int, Ahead *);
#define RB1 8 /* rows per register block over one half-group: 8 int16 accumulators */
static const Rows rows1[2][RB1 + 1] = {{NULL, rows1_1_0, rows2_1_0, rows3_1_0, rows4_1_0, rows5_1_0, rows6_1_0, rows7_1_0, rows8_1_0},
                                       {NULL, rows1_1_1, rows2_1_1, rows3_1_1, rows4_1_1, rows5_1_1, rows6_1_1, rows7_1_1, rows8_1_1}};

/* One row takes a panel's 8 half-groups 4 at a time, 2 rows 4 at a time, 3 rows 2 at a time (each weight byte
 * unpacked once per call); from 4 rows on, one half-group at a time, up to 8 rows at a time (9 rows: 5 + 4).
 * While a panel's passes run, the next panel of the thread's share is prefetched (Ahead). */
static void part(void *arg, size_t p) {
  const Call *c = arg;
  const Kernel *k = c->k;
  int64_t p0 = k->np * (int64_t)p / c->nparts, p1 = k->np * ((int64_t)p + 1) / c->nparts;
  int H = c->M <= 2 ? 4 : c->M == 3 ? 2 : 1;
  const int w8 = k->sh;
  static const Rows fewer[2][4] = {{NULL, rows1_4_0, rows2_4_0, rows3_2_0}, {NULL, rows1_4_1, rows2_4_1, rows3_2_1}};
  Rows few = fewer[w8][c->M <= 3 ? c->M : 0];
  int64_t nblk = (c->M + RB1 - 1) / RB1, passes = 2 * NG / H * nblk; /* 1 block up to 8 rows */
  const int64_t wbytes = k->nb * 256 * NG, sbytes = k->nq * GC * NG * 4; /* a panel's nibbles and scales */
  Ahead ah = {.lines = (int)((wbytes / 64 + passes * k->nb - 1) / (passes * k->nb)),
              .slines = (int)((sbytes / 64 + passes * k->nb - 1) / (passes * k->nb))};
  for (int64_t q = p0; q < p1; q++) {
    const char *wn = (const char *)k->w + (q + 1) * wbytes, *sn = (const char *)k->s + (q + 1) * sbytes;
    ah.w = wn, ah.wend = q + 1 < p1 ? wn + wbytes : wn, ah.s = sn, ah.send = q + 1 < p1 ? sn + sbytes : sn;
    for (int h0 = 0; h0 < 2 * NG; h0 += H)
      if (c->M <= 3)
        few(k, c, q, 0, h0, &ah);
      else
        for (int64_t i = 0, r = 0; i < nblk; i++) {
          int64_t r1 = c->M * (i + 1) / nblk;
          rows1[w8][r1 - r](k, c, q, r, h0, &ah);
          r = r1;
        }
  }
}

/* rows [m0, m1) of x [M, K] as int8 per block of QB k (zero past K), their scales and 8 x their sums: the
 * AVX-512 version's arithmetic (max|a| exact, one division, one product, VCVTPS2DQ to nearest even, the int32
 * values packed to int8 exactly: they lie in [-127, 127]) in 8-lane vectors. */
static void quantise(const float *x, int64_t m0, int64_t m1, int64_t K, int64_t nb, int8_t *qa, float *sa,
                     int32_t *asum) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7); /* the two packs' int32 groups back in order */
  for (int64_t m = m0; m < m1; m++)
    for (int64_t b = 0; b < nb; b++) {
      const float *a = x + m * K + b * QB;
      int64_t n = K - b * QB < QB ? K - b * QB : QB;
      float tail[QB]; /* a last block short of QB k, zero past K */
      if (n < QB) {
        memset(tail, 0, sizeof tail), memcpy(tail, a, sizeof(float) * n);
        a = tail;
      }
      __m256 v[4], mx = _mm256_setzero_ps();
      int nan = 0;
      for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(a + 8 * i);
        mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[i]));
        nan |= _mm256_movemask_ps(_mm256_cmp_ps(v[i], v[i], _CMP_UNORD_Q));
      }
      __m128 m2 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
      m2 = _mm_max_ps(m2, _mm_movehl_ps(m2, m2));
      float amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_shuffle_ps(m2, m2, 1)));
      __m256 inv = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
      __m256i q[4], sum = _mm256_setzero_si256();
      for (int i = 0; i < 4; i++) {
        q[i] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv)), lo), hi);
        sum = _mm256_add_epi32(sum, q[i]);
      }
      __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      _mm256_storeu_si256((__m256i *)(qa + (m * nb + b) * QB), _mm256_permutevar8x32_epi32(bytes, order));
      __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
      s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
      sa[m * nb + b] = nan ? NAN : amax / 127.0f;
      asum[m * nb + b] = 8 * _mm_cvtsi128_si32(s4);
    }
}

#endif

static void quant_part(void *arg, size_t p) {
  const Call *c = arg;
  int64_t m0 = c->M * (int64_t)p / c->nparts, m1 = c->M * ((int64_t)p + 1) / c->nparts;
  quantise(c->x, m0, m1, c->k->K, c->k->nq, (int8_t *)c->qa, (float *)c->sa, (int32_t *)c->asum);
}


static OrtStatus *compute(void *op, OrtKernelContext *ctx) {
  Kernel *k = op;
  const OrtValue *a;
  TRY(ort->KernelContext_GetInput(ctx, 0, &a));
  int64_t ad[8];
  size_t ar;
  TRY(dims(a, ad, &ar, 8));
  if (ar < 1 || ar > 8 || ad[ar - 1] != k->K)
    return ort->CreateStatus(ORT_INVALID_ARGUMENT, "MatMulNBits (specexport): A's last dimension is not K");
  int64_t M = 1, yd[8];
  for (size_t i = 0; i + 1 < ar; i++) M *= ad[i], yd[i] = ad[i];
  yd[ar - 1] = k->N;
  OrtValue *y;
  const float *x;
  TRY(ort->KernelContext_GetOutput(ctx, 0, yd, ar, &y));
  TRY(ort->GetTensorMutableData((OrtValue *)a, (void **)&x));
  Call c = {.k = k, .x = x, .M = M};
  TRY(ort->GetTensorMutableData(y, (void **)&c.y));
  if (M == 0) return NULL;
  int8_t *qa = aligned_alloc(64, (size_t)(M * k->nq * QB));
  float *sa = malloc(sizeof(float) * M * k->nq);
  int32_t *asum = malloc(sizeof(int32_t) * M * k->nq);
  OrtStatus *st = NULL;
  if (!qa || !sa || !asum) {
    st = ort->CreateStatus(ORT_FAIL, "MatMulNBits (specexport): out of memory");
  } else {
    c.qa = qa, c.sa = sa, c.asum = asum;
    /* the rows' quantisation split between the threads too for a large call (each row's own: any split
     * gives the same bytes); a 256-row call at K = 1,536 quantised on one thread took ~40% of the call */
    c.nparts = M * k->K >= (1 << 14) ? (specexport_parts() < M ? specexport_parts() : M) : 1;
    if (c.nparts == 1)
      quant_part(&c, 0);
    else
      st = ort->KernelContext_ParallelFor(ctx, quant_part, (size_t)c.nparts, (size_t)c.nparts, &c);
    c.nparts = specexport_parts() < k->np ? specexport_parts() : k->np;
    if (!st && c.nparts == 1)
      part(&c, 0);
    else if (!st)
      st = ort->KernelContext_ParallelFor(ctx, part, (size_t)c.nparts, (size_t)c.nparts, &c);
  }
  free(qa), free(sa), free(asum);
  return st;
}

static OrtStatus *constant(const OrtKernelInfo *info, size_t i, const void **data, int64_t *d, size_t *r) {
  int is_const = 0;
  const OrtValue *v = NULL;
  TRY(ort->KernelInfoGetConstantInput_tensor(info, i, &is_const, &v));
  if (!is_const || !v) return ort->CreateStatus(ORT_FAIL, "MatMulNBits (specexport): B and scales must be constants");
  TRY(dims(v, d, r, 4));
  return ort->GetTensorMutableData((OrtValue *)v, (void **)data);
}

/* the 4-bit value of k in a block's bytes: 4-bit weights hold k = 2t in byte t's low nibble, 2t + 1 in its high
 * one; 8-bit weights hold k in byte k, q = 16 hi + lo (value q - 128 = 16 (hi - 8) + lo), and the AVX2 path runs
 * such a block as two 4-bit blocks, hi (value hi - 8, its dot x 16) then lo (value lo, so no 8 x the sum) */
static uint8_t nibble(const uint8_t *src, int64_t bits, int high, int kk) {
  if (bits == 4) return (src[kk / 2] >> (4 * (kk & 1))) & 15;
  return high ? src[kk] >> 4 : src[kk] & 15;
}

static OrtStatus *create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info, void **out) {
  (void)op, (void)api;
  int64_t K, N, bits, block;
  TRY(ort->KernelInfoGetAttribute_int64(info, "K", &K));
  TRY(ort->KernelInfoGetAttribute_int64(info, "N", &N));
  TRY(ort->KernelInfoGetAttribute_int64(info, "bits", &bits));
  TRY(ort->KernelInfoGetAttribute_int64(info, "block_size", &block));
  size_t inputs = 0;
  TRY(ort->KernelInfo_GetInputCount(info, &inputs));
  if ((bits != 4 && bits != 8) || block != QB || inputs != 3 || K < 1 || N < 1)
    return ort->CreateStatus(ORT_INVALID_ARGUMENT, "MatMulNBits (specexport): only 4- and 8-bit weights in blocks of "
                                                   "32 without zero points are taken: set SPECEXPORT_MATMUL4=0");
  const uint8_t *B;
  const float *S;
  int64_t bd[4], sd[4];
  size_t br, sr;
  TRY(constant(info, 1, (const void **)&B, bd, &br));
  TRY(constant(info, 2, (const void **)&S, sd, &sr));
  int64_t nq = (K + QB - 1) / QB, nb = bits == 8 ? 2 * nq : nq, np = (N + GC * NG - 1) / (GC * NG);
  int64_t scales = sr == 2 ? sd[0] * sd[1] : sr == 1 ? sd[0] : -1;
  if (br != 3 || bd[0] != N || bd[1] != nq || bd[2] != QB * bits / 8 || scales != N * nq)
    return ort->CreateStatus(ORT_INVALID_ARGUMENT, "MatMulNBits (specexport): B or scales not shaped "
                                                   "[N, K/32, 32 x bits / 8], [N, K/32]");
  Kernel *k = calloc(1, sizeof(Kernel));
  size_t wbytes = (size_t)(np * nb * 256 * NG), sbytes = sizeof(float) * np * nq * GC * NG;
  if (!k || !(k->w = aligned_alloc(64, wbytes)) || !(k->s = aligned_alloc(64, sbytes))) {
    if (k) free(k->w), free(k);
    return ort->CreateStatus(ORT_FAIL, "MatMulNBits (specexport): out of memory packing a weight");
  }
  k->K = K, k->N = N, k->nb = nb, k->np = np, k->nq = nq, k->sh = bits == 8;
  memset(k->w, 0x88, wbytes); /* columns past N: nibbles 8 (their scales are 0; they are never stored) */
  memset(k->s, 0, sbytes);
  for (int64_t n = 0; n < N; n++) {
    int64_t p = n / (GC * NG), i = n / GC % NG, c = n % GC;
#if defined(MM4_512)
    if (bits == 8) { /* the bytes as they are, a column's 4 k together: 8 loads of 64 bytes a group and block */
      for (int64_t bq = 0; bq < nq; bq++) {
        for (int j = 0; j < 8; j++)
          memcpy(k->w + (((p * nq + bq) * 8 + j) * NG + i) * 64 + 4 * c, B + (n * nq + bq) * QB + 4 * j, 4);
        k->s[((p * nq + bq) * NG + i) * GC + c] = S[n * nq + bq];
      }
      continue;
    }
#endif
    for (int64_t b = 0; b < nb; b++) {
      const int64_t bq = b >> k->sh; /* the block of k */
      const uint8_t *src = B + (n * nq + bq) * (QB * bits / 8);
      for (int j = 0; j < 4; j++)
        for (int t = 0; t < 4; t++) {
          int k0 = 8 * j + t, k1 = 8 * j + 4 + t, hi = !(b & 1);
          k->w[(((p * nb + b) * 4 + j) * NG + i) * 64 + 4 * c + t] = (uint8_t)(nibble(src, bits, hi, k0) |
                                                                               nibble(src, bits, hi, k1) << 4);
        }
      if (!(b & k->sh)) k->s[((p * nq + bq) * NG + i) * GC + c] = S[n * nq + bq];
    }
  }
  *out = k;
  return NULL;
}

static void destroy(void *op) {
  Kernel *k = op;
  free(k->w), free(k->s), free(k);
}

static const char *name(const OrtCustomOp *op) { (void)op; return "MatMulNBits"; }
static ONNXTensorElementDataType in_type(const OrtCustomOp *op, size_t i) {
  (void)op;
  return i == 1 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
static ONNXTensorElementDataType out_type(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
static size_t three(const OrtCustomOp *op) { (void)op; return 3; }
static size_t one(const OrtCustomOp *op) { (void)op; return 1; }
static OrtCustomOpInputOutputCharacteristic required(const OrtCustomOp *op, size_t i) { (void)op, (void)i; return INPUT_OUTPUT_REQUIRED; }
static int since(const OrtCustomOp *op) { (void)op; return 1; }
static int until(const OrtCustomOp *op) { (void)op; return 1 << 30; }

OrtCustomOp specexport_matmul4_op = {
    .version = API_VERSION, .GetName = name, .GetExecutionProviderType = provider, .GetInputType = in_type,
    .GetInputTypeCount = three, .GetOutputType = out_type, .GetOutputTypeCount = one, .KernelDestroy = destroy,
    .GetInputCharacteristic = required, .GetOutputCharacteristic = required, .GetInputMemoryType = mem_type,
    .CreateKernelV2 = create, .KernelComputeV2 = compute, .GetStartVersion = since, .GetEndVersion = until,
};
#endif

/* whether sessions that ask for it (specexport.matmul_nbits=int8) get this kernel: AVX512-VNNI and AVX2 builds,
 * unless SPECEXPORT_MATMUL4=0 */
int specexport_matmul4_on(void) {
#if defined(MATMUL4)
  const char *e = getenv("SPECEXPORT_MATMUL4");
  return !(e && !strcmp(e, "0"));
#else
  return 0;
#endif
}
