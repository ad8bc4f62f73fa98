/* What gqa.c and matmul.c share: onnxruntime's API (gqa.c's RegisterCustomOps sets it), TRY, a tensor's dims,
 * a kept buffer, the AMX tile configuration. */
#pragma once
#include <stdint.h>
#include <stdlib.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "onnxruntime_c_api.h"

#define API_VERSION 17 /* KernelContext_ParallelFor (onnxruntime 1.17) is the newest entry used */

/* matmul4.c's MatMulNBits is built (and gqa.c registers it): with VPDPBUSD on AVX512-VNNI, with VPMADDUBSW on
 * AVX2 + FMA */
#if (defined(__AVX512VNNI__) && defined(__AVX512BW__)) || (defined(__AVX2__) && defined(__FMA__))
#define MATMUL4 1
#endif

extern const OrtApi *specexport_ort;
#define ort specexport_ort

#define TRY(x)                    \
  do {                            \
    OrtStatus *st_ = (x);         \
    if (st_) return st_;          \
  } while (0)

/* every op here runs on the CPU provider, its inputs and outputs in its default memory */
static inline const char *provider(const OrtCustomOp *op) { (void)op; return "CPUExecutionProvider"; }
static inline OrtMemType mem_type(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return OrtMemTypeDefault; }

/* v's rank, and its dims into out when the rank is at most max (out's length) */
static inline OrtStatus *dims(const OrtValue *v, int64_t *out, size_t *rank, size_t max) {
  OrtTensorTypeAndShapeInfo *info;
  TRY(ort->GetTensorTypeAndShape(v, &info));
  OrtStatus *st = ort->GetDimensionsCount(info, rank);
  if (!st && *rank <= max) st = ort->GetDimensions(info, out, *rank);
  ort->ReleaseTensorTypeAndShapeInfo(info);
  return st;
}

/* LDTILECFG's 64-byte operand (AMX: matmul.c's part_amx, gqa_amx.h's attend_amx) */
typedef struct {
  uint8_t palette, start;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
} __attribute__((packed)) TileConfig;

/* A thread's kept buffer (a pair of its __thread variables) to free when the thread exits (gqa.c) */
void specexport_kept_own(void **buf, size_t *cap);

/* *buf grown to at least `bytes` (64-byte aligned, whole pages) and kept for the next call: a fresh block per
 * call was a fresh mapping of up to a few MB, page faults and all. NULL (and *cap 0) when memory runs out.
 * `buf` and `cap` are the calling thread's own (__thread); freed when it exits. */
static inline void *kept(void **buf, size_t *cap, size_t bytes) {
  if (bytes > *cap) {
    if (!*buf) specexport_kept_own(buf, cap);
    free(*buf);
    *cap = (bytes + 4095) & ~(size_t)4095;
    if (!(*buf = aligned_alloc(64, *cap))) *cap = 0;
  }
  return *buf;
}

/* 16 floats as one vector (two AVX2 registers where AVX-512 is not), and the exp the attention's softmax and
 * matmul.c's SwiGLU share */
typedef float v16 __attribute__((vector_size(64)));               /* 16 floats */
typedef float v16u __attribute__((vector_size(64), aligned(4))); /* the same at any float's address */
typedef int i16 __attribute__((vector_size(64)));

/* a where the mask m is all ones, else b, lane by lane: a and b vectors of floats of any width, m the ints of it
 * (a comparison's result) */
#define sel(m, a, b) ((__typeof__(a))(((m) & (__typeof__(m))(a)) | (~(m) & (__typeof__(m))(b))))

/* e^r for |r| <= ln 2 / 2 (r = x - n ln 2, n an integer: Cephes' two-part ln 2), Cephes' expf polynomial; x and
 * n any vector of floats (16 here, 8 in gqa.c's AVX2 build) */
#define EXP_R(x, n)                                                                                           \
  ({                                                                                                          \
    __typeof__(x) r_ = (x) - (n) * 0.693359375f + (n) * 2.12194440e-4f, p_ = (__typeof__(x)){0} + 1.9875691500e-4f; \
    p_ = p_ * r_ + 1.3981999507e-3f;                                                                          \
    p_ = p_ * r_ + 8.3334519073e-3f;                                                                          \
    p_ = p_ * r_ + 4.1665795894e-2f;                                                                          \
    p_ = p_ * r_ + 1.6666665459e-1f;                                                                          \
    p_ = p_ * r_ + 5.0000001201e-1f;                                                                          \
    p_ * r_ * r_ + r_ + 1.0f;                                                                                 \
  })

/* e^x for x <= 0 with 2^n built in the exponent's bits (adding 1.5 * 2^23 leaves n in the low bits of t); 0
 * below -87.3. x any vector of floats. */
#define EXP_BITS(x)                                                                                           \
  ({                                                                                                          \
    __typeof__(x) x_ = (x), z_ = {0};                                                                         \
    __typeof__(x_ < z_) under_ = x_ < z_ - 87.3f;                                                             \
    x_ = sel(under_, z_ - 87.3f, x_);                                                                         \
    __typeof__(x) t_ = x_ * 1.44269504088896341f + 12582912.0f;                                               \
    __typeof__(x) p_ = EXP_R(x_, t_ - 12582912.0f) * (__typeof__(x))(((__typeof__(under_))t_ + (127 - 0x4b400000)) << 23); \
    sel(under_, z_, p_);                                                                                      \
  })

/* exp of 16 floats x <= 0 (a score less its row's largest): 2^n * p(r), n = x / ln 2 rounded to nearest,
 * r = x - n ln 2 (Cephes' expf polynomial, ~1 ulp); 0 below -87.3 (a masked score: -inf). 2^n is applied by
 * VSCALEFPS where AVX-512 is (the many-query path 1.03x faster than building 2^n in the exponent's bits, the
 * AMX path's task 1.07-1.1x; the same floats: p * 2^n is exact either way, 2026-12-05), else built in the
 * exponent's bits (adding 1.5 * 2^23 leaves n in the low bits of t). */
static inline v16 exp16(v16 x) {
#if defined(__AVX512F__)
  __mmask16 under = _mm512_cmp_ps_mask((__m512)x, _mm512_set1_ps(-87.3f), _CMP_LT_OQ);
  __m512 n = _mm512_roundscale_ps(_mm512_mul_ps((__m512)x, _mm512_set1_ps(1.44269504088896341f)),
                                  _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  return (v16)_mm512_maskz_scalef_ps(~under, (__m512)EXP_R(x, (v16)n), n);
#else
  return EXP_BITS(x);
#endif
}
