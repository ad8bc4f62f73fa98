/* MatMul for onnxruntime's CPU provider, as specexport's fused graphs use it: Y [..., M, N] = A [..., M, K] x B
 * [K, N], float32, B a weight (a constant). Registered in the ONNX domain under MatMul's own name, so a session
 * that loads the library runs it in place of onnxruntime's kernel with the graph unchanged; a MatMul whose B is
 * not a constant [K, N] runs onnxruntime's own kernel through InvokeOp.
 *
 * Why: a decode or verify call multiplies a few rows (M = B x T: 1 to a few dozen) by every weight of the model,
 * so on a CPU its time is the weights' read from memory, ~11 ms for SmolLM2's layers on 2 cores. onnxruntime's
 * MLAS took 1.3-1.4x its one-row time for 8 rows and 1.7x for 16: it streams its packed weights with no
 * software prefetch, so the memory idles while it computes. Here B is packed once, at session creation, into
 * panels of PW columns x K rows (48 columns with AVX-512), which lie end to end; each thread owns a contiguous
 * share of them and reads them as one stream. Up to RB rows (9 with AVX-512: 9 x 3 vectors, 27 accumulators)
 * take one pass over each panel, its software prefetches running a fixed distance ahead of the reads, so a
 * decode call of up to 9 rows costs what one row does (6 x 4 blocks took two passes for 7-9 rows: 1.2-1.37x
 * the memory-bound time of 6, 2026-12-05, epyc-zen4). More rows take passes of equal size (10 rows: 5 + 5;
 * with 8-row blocks 9 rows as 5 + 4 took 0.78x the time of 8 + 1), and while they pass over one panel,
 * software prefetches bring in the next, spread evenly over the passes, so the memory stays busy however many
 * rows; with more than two passes the panel is taken KC rows at a time so every pass finds them in cache.
 * onnxruntime's packed copy is not made (its MatMul never runs), so memory holds one copy of the weights as
 * before; the pages of the bundle's file that packing read are handed back.
 *
 * Numerics: every output element is one chain of fused multiply-adds over k = 0 .. K-1 in order, from 0 (a
 * block that stops at KC carries its sums on through Y, exactly), so a row's result is bit-identical whatever
 * rows share its call: a verify row scores exactly as the same token's decode row, a prefill chunk's rows as
 * one-token calls, a batch's rows as the same requests alone.
 *
 * bfloat16 weights (a session whose options carry specexport.matmul_weights=bf16, backend "onnxruntime-bf16"):
 * B is rounded to bfloat16 (to nearest, ties to even) when packed, and widened back to float32 in registers as it
 * is read (a 16-bit shift, exact), so the multiply-adds, their order and the row-consistency above are unchanged;
 * the weights' read, what a decode call costs, halves. Only the weights are rounded: activations, the cache and
 * every sum stay float32.
 *
 * AVX-512 only by default (gqa.c registers it when __AVX512F__): the AVX2 build (8-float vectors, 6 x 16
 * blocks) is correct but ran float32 calls at 0.84-1.0x MLAS's speed on an AVX2-only AMD EPYC (2026-12-06);
 * SPECEXPORT_MATMUL=1 turns it on there, =0 off everywhere. Its bfloat16 weights (no other kernel holds them)
 * run on any build. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "ops.h"

#if defined(__AVX512F__)
#define VL 16 /* floats per vector */
#define PV 3  /* vectors per panel: 9 x 3 = 27 accumulators of 32 registers */
#define RB 9  /* rows per register block */
#else
#define VL 8 /* AVX2 (and anything else): 8 floats */
#define PV 2 /* 6 x 2 = 12 accumulators of 16 registers */
#define RB 6
#endif
typedef float vec __attribute__((vector_size(VL * 4)));
typedef float vecu __attribute__((vector_size(VL * 4), aligned(4)));

static inline vec ld(const float *p) { return *(const vecu *)p; }
static inline void st(float *p, vec v) { *(vecu *)p = v; }

/* c + a * b rounded once, lane for lane as fmaf */
static inline vec fma_(vec a, vec b, vec c) {
#if defined(__AVX512F__)
  return (vec)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
  return (vec)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)c);
#else
  vec r;
  for (int i = 0; i < VL; i++) r[i] = __builtin_fmaf(a[i], b[i], c[i]);
  return r;
#endif
}

#define PW (VL * PV) /* a panel's columns */
#ifndef DIST
#define DIST 16384 /* one pass over a panel: how far ahead of the row being read the prefetches run */
#endif
#ifndef KC
#define KC (65536 / PW) /* rows of a panel per step when many rows pass over it (256 kB) */
#endif

static int parts_ = 0; /* how many threads share a call's columns: onnxruntime's pool size (specexport_threads) */

/* The runtime sets its onnxruntime pool size here (kernels.set_threads); the CPU count until then. */
void specexport_threads(int n) { parts_ = n > 0 ? n : 0; }

static int parts(void) {
  if (parts_ <= 0) {
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    parts_ = n > 0 ? (int)n : 1;
  }
  return parts_;
}
int specexport_parts(void) { return parts(); } /* matmul4.c splits its calls the same way */

/* y[r, VL j .. VL j + VL) for r < ROWS (<= RB), j < NVEC (<= PV): the chain over k0 .. k1 of x's rows and a panel's vectors,
 * carried on from y when k0 > 0 (exactly: a float stored and loaded is the same float); `w` is the panel at row
 * k0 (rows of PW floats). `ahead` (a cursor into the part's stream) gets up to `lines` prefetches per row.
 * ROWS: a constant of each instance (one per row count up to RB: the accumulators stay in registers). */
#define BLOCK(NAME, NVEC, ROWS, W, LD, MAC)                                                                         \
  static void NAME(const float *x, int64_t K, int64_t k0, int64_t k1, const void *w_, float *y, int64_t N,        \
                   int64_t cols, const char **ahead, const char *limit, int lines) {                             \
    const W *w = w_;                                                                                            \
    vec a[ROWS][NVEC];                                                                                          \
    for (int r = 0; r < ROWS; r++)                                                                              \
      for (int j = 0; j < NVEC; j++) a[r][j] = k0 ? get(y + r * N + VL * j, cols - VL * j) : (vec){0};         \
    for (int64_t k = k0; k < k1; k++, w += PW) {                                                                \
      if (lines)                                                                                                \
        for (int i = 0; i < lines && *ahead < (limit ? limit : (const char *)w + DIST); i++, *ahead += 64)     \
          __builtin_prefetch(*ahead, 0, 1);                                                                     \
      vec b[NVEC];                                                                                              \
      for (int j = 0; j < NVEC; j++) b[j] = LD(w + VL * j);                                                     \
      for (int r = 0; r < ROWS; r++) {                                                                          \
        vec s = bcast(x + r * K + k);                                                                           \
        for (int j = 0; j < NVEC; j++) a[r][j] = MAC(s, b[j], a[r][j]);                                        \
      }                                                                                                         \
    }                                                                                                           \
    for (int r = 0; r < ROWS; r++)                                                                              \
      for (int j = 0; j < NVEC; j++) put(y + r * N + VL * j, a[r][j], cols - VL * j);                          \
  }

/* the first n (<= VL used) floats at p as a vector, the rest 0; and back */
static inline vec get(const float *p, int64_t n) {
  if (n >= VL) return ld(p);
  vec v = {0};
  for (int64_t i = 0; i < n; i++) v[i] = p[i];
  return v;
}
static inline void put(float *p, vec v, int64_t n) {
  if (n >= VL)
    st(p, v);
  else
    for (int64_t i = 0; i < n; i++) p[i] = v[i];
}
/* VL bfloat16 values at p, widened to float32 (exactly: a bfloat16 is a float32's upper 16 bits) */
static inline vec ld_bf16(const uint16_t *p) {
#if defined(__AVX512F__)
  return (vec)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)p)), 16));
#elif defined(__AVX2__)
  return (vec)_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const void *)p)), 16));
#else
  vec v;
  for (int i = 0; i < VL; i++) {
    uint32_t u = (uint32_t)p[i] << 16;
    memcpy(&v[i], &u, 4);
  }
  return v;
#endif
}

/* x rounded to bfloat16: to nearest, ties to even (as torch's bfloat16 conversion); NaN stays NaN */
static inline uint16_t to_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

static inline vec bcast(const float *p) {
#if defined(__AVX512F__)
  return (vec)_mm512_set1_ps(*p); /* folds into the multiply-add as a broadcast operand */
#else
  float f = *p;
#if defined(__AVX__)
  return (vec)_mm256_set1_ps(f);
#else
  vec v;
  for (int i = 0; i < VL; i++) v[i] = f;
  return v;
#endif
#endif
}

#if defined(__AVX512BF16__)
/* c + a0 b0 + a1 b1 per lane, a and b each a pair of bfloat16 per lane (VDPBF16PS: exact products, each sum
 * rounded to nearest even, denormals read and written as 0) */
static inline vec dot2(vec a, vec b, vec c) { return (vec)_mm512_dpbf16_ps((__m512)c, (__m512bh)a, (__m512bh)b); }
#define DOT_BLOCKS(NVEC) ROWS(d, NVEC, float, ld, dot2)
#define DOT(NAME) NAME
#else
#define DOT_BLOCKS(NVEC)
#define DOT(NAME) NULL
#endif

/* each block, for every R <= RB, for float32 panels (f), bfloat16 panels (h), and panels of bfloat16 pairs
 * multiplied by pairs of bfloat16 activations (d, where the CPU has avx512_bf16) */
#define ROWS6(F, NVEC, W, LD, MAC)                                                                         \
  BLOCK(r1_##NVEC##F, NVEC, 1, W, LD, MAC) BLOCK(r2_##NVEC##F, NVEC, 2, W, LD, MAC)                        \
  BLOCK(r3_##NVEC##F, NVEC, 3, W, LD, MAC) BLOCK(r4_##NVEC##F, NVEC, 4, W, LD, MAC)                        \
  BLOCK(r5_##NVEC##F, NVEC, 5, W, LD, MAC) BLOCK(r6_##NVEC##F, NVEC, 6, W, LD, MAC)
#if RB == 9
#define ROWS(F, NVEC, W, LD, MAC)                                                                          \
  ROWS6(F, NVEC, W, LD, MAC) BLOCK(r7_##NVEC##F, NVEC, 7, W, LD, MAC) BLOCK(r8_##NVEC##F, NVEC, 8, W, LD, MAC) \
  BLOCK(r9_##NVEC##F, NVEC, 9, W, LD, MAC)
#else
#define ROWS ROWS6
#endif
#define BLOCKS(NVEC) ROWS(f, NVEC, float, ld, fma_) ROWS(h, NVEC, uint16_t, ld_bf16, fma_) DOT_BLOCKS(NVEC)
typedef void Block(const float *, int64_t, int64_t, int64_t, const void *, float *, int64_t, int64_t,
                   const char **, const char *, int);
BLOCKS(1)
BLOCKS(2)
#if PV == 3
BLOCKS(3)
#define ROWP(F, R) {NULL, r##R##_1##F, r##R##_2##F, r##R##_3##F}
#define DROWP(R) {NULL, DOT(r##R##_1d), DOT(r##R##_2d), DOT(r##R##_3d)}
#define ROWS9(F) \
  ROWP(F, 1), ROWP(F, 2), ROWP(F, 3), ROWP(F, 4), ROWP(F, 5), ROWP(F, 6), ROWP(F, 7), ROWP(F, 8), ROWP(F, 9)
static Block *const blocks[3][RB + 1][PV + 1] = {
    {{NULL}, ROWS9(f)},
    {{NULL}, ROWS9(h)},
    {{NULL}, DROWP(1), DROWP(2), DROWP(3), DROWP(4), DROWP(5), DROWP(6), DROWP(7), DROWP(8), DROWP(9)}};
#else
#define ROWP(F, R) {NULL, r##R##_1##F, r##R##_2##F}
static Block *const blocks[3][RB + 1][PV + 1] = {
    {{NULL}, ROWP(f, 1), ROWP(f, 2), ROWP(f, 3), ROWP(f, 4), ROWP(f, 5), ROWP(f, 6)},
    {{NULL}, ROWP(h, 1), ROWP(h, 2), ROWP(h, 3), ROWP(h, 4), ROWP(h, 5), ROWP(h, 6)},
    {{NULL}}};
#endif

/* The weight formats: F32 as given; BF16 rounded to bfloat16, widened in registers (float32 math); DOT rounded
 * to bfloat16 and stored as pairs of rows (k = 2p, 2p + 1) per column, multiplied with the activations rounded to
 * bfloat16 pairs (VDPBF16PS): a call then runs as a float32 call over K / 2 "rows" of 32-bit pairs. */
enum { F32, BF16, DOT };

typedef struct {
  const float *x;
  const void *panels; /* B as ceil(N / PW) panels of K rows x PW columns, zero-padded; float or bfloat16 */
  float *y;
  int64_t M, K, N, nparts;
  int format; /* the panels' elements: F32, BF16 or DOT (x and K are then the activations' pairs) */
  int amx;    /* DOT on AMX tiles (part_amx): K is then a multiple of 16 pairs */
  float *glu; /* MatMulSwiGLU: its output [M, F]; the panels come in (gate, up) pairs (pack's glu), N = 2 PW P */
  int64_t F;
  volatile int oom; /* a part could not allocate its scratch */
} Call;

/* e^x (x <= 0) and silu(g) = g sigmoid(g) for VL lanes: the sigmoid from e = exp(-|g|) (never overflows), 1 / (1 + e)
 * for g >= 0, e / (1 + e). Without AVX-512 in 8-lane vectors: GCC compares 16-float vectors there lane by lane
 * (2026-12-06); the same numbers. */
#if VL == 16
#define expv exp16
#else
static inline vec expv(vec x) { return EXP_BITS(x); }
#endif
static inline vec silu(vec g) {
  vec e = expv(sel(g < 0, g, -g)), one = (vec){0} + 1.0f;
  return g * sel(g >= 0, one / (one + e), e / (one + e));
}
/* MatMulSwiGLU's epilogue for `rows` rows: o[r, j] = silu(g[r, j]) u[r, j], j < n, u = g + PW (the pair's up
 * panel beside its gate panel); gs and os the rows' strides */
static void glu_rows(const float *g, int64_t gs, float *o, int64_t os, int64_t n, int64_t rows) {
  for (int64_t r = 0; r < rows; r++, g += gs, o += os) {
    int64_t j = 0;
    for (; j + VL <= n; j += VL) st(o + j, silu(ld(g + j)) * ld(g + PW + j));
    if (j < n) {
      float gb[VL] = {0}, ub[VL] = {0};
      memcpy(gb, g + j, (n - j) * 4), memcpy(ub, g + PW + j, (n - j) * 4);
      vec t = silu(ld(gb)) * ld(ub);
      memcpy(o + j, &t, (n - j) * 4);
    }
  }
}
/* pair q's epilogue for rows [m0, m1): g, its gate panel's sums at row 0 (rows of `gs` floats, the up panel's
 * beside them) */
static void glu_pair(const Call *c, const float *g, int64_t gs, int64_t q, int64_t m0, int64_t m1) {
  glu_rows(g + m0 * gs, gs, c->glu + m0 * c->F + PW * q, c->F, c->F - PW * q < PW ? c->F - PW * q : PW, m1 - m0);
}

/* Task p: its share of the VL-column vectors, panel by panel (vectors [a, b) of each), in passes of at most RB
 * rows (as many rows in each) over all K. Its panels lie end to end in memory: while it reads one, the next is
 * prefetched (a cursor spread evenly over the passes, so the memory stays busy however many rows), what its
 * register blocks then find in cache. */
/* Task p's share of a call (part and part_amx): its VL-column vectors [v0, v1), and its panels' stream for the
 * prefetch cursor: `ahead` starts at its first panel with one pass over each, at its second with several
 * (each panel's passes then bring in the next one); `end` is past its last panel. */
typedef struct {
  int64_t v0, v1;
  const char *end, *ahead;
} Share;
/* the vectors a share is made of: one, or MatMulSwiGLU's whole (gate, up) panel pairs */
static int64_t share_unit(const Call *c) { return c->glu ? 2 * PV : 1; }
static Share share(const Call *c, size_t p, int64_t bytes, int64_t passes) {
  int64_t unit = share_unit(c), nu = (c->N + VL - 1) / VL / unit;
  Share s = {nu * (int64_t)p / c->nparts * unit, nu * ((int64_t)p + 1) / c->nparts * unit};
  s.end = (const char *)c->panels + (s.v1 + PV - 1) / PV * bytes;
  s.ahead = (const char *)c->panels + (s.v0 / PV + (passes > 1)) * bytes;
  return s;
}
/* how far a pass's prefetches may run: `to` (within the panels after the one being read), never past the
 * share's end; NULL with one pass (then DIST ahead of the reads) */
static const char *pace(const Share *s, const char *to, int64_t passes) {
  return passes == 1 ? NULL : to < s->end ? to : s->end;
}

static void part(void *arg, size_t p) {
  const Call *c = arg;
  const int64_t K = c->K, N = c->N, es = c->format == BF16 ? 2 : 4, bytes = K * PW * es;
  int64_t passes = (c->M + RB - 1) / RB, rp = (c->M + passes - 1) / passes; /* rows per pass, balanced */
  /* One pass (M <= RB): the cursor starts at the part's first byte and keeps DIST ahead of the row being read,
   * up to twice as fast as the reads (a panel row is PW * 4 / 64 lines). Several: it starts at the second panel
   * and brings in a panel over the passes over the one before, at the pace the work goes. */
  int lines = (int)(passes == 1 ? 2 * PW * es / 64 : (PW * es / 64 + passes - 1) / passes);
  if (lines < 1) lines = 1; /* a bfloat16 panel row of the AVX2 build is half a line */
  const char *base = (const char *)c->panels;
  Share sh = share(c, p, bytes, passes);
  /* MatMulSwiGLU: a gate panel's sums and then its up panel's into this thread's [M, 2 PW] buffer, the
   * epilogue from there (in cache) into the output: the product [M, 2F] is never written out */
  static __thread void *pb;
  static __thread size_t pcap;
  float *pair = c->glu ? kept(&pb, &pcap, sizeof(float) * c->M * 2 * PW) : NULL;
  if (c->glu && !pair) {
    ((Call *)c)->oom = 1;
    return;
  }
  for (int64_t v = sh.v0; v < sh.v1;) {
    int64_t panel = v / PV, a = v % PV, b = sh.v1 - panel * PV < PV ? sh.v1 - panel * PV : PV;
    const char *w = base + (panel * K * PW + VL * a) * es;
    int64_t n0 = VL * v, cols = N - n0 < VL * (b - a) ? N - n0 : VL * (b - a);
    float *y = pair ? pair + (panel & 1) * PW + VL * a : c->y + n0;
    int64_t ys = pair ? 2 * PW : N;
    /* more than two passes: KC rows of the panel at a time (256 kB, kept in L2 while every pass reads them) */
    int64_t kc = passes > 2 ? KC : K;
    for (int64_t k0 = 0; k0 < K; k0 += kc) {
      int64_t k1 = k0 + kc < K ? k0 + kc : K;
      for (int64_t r = 0, pass = 1; r < c->M; r += rp, pass++) {
        const char *limit =
            pace(&sh, base + (panel + 1) * bytes + (bytes * (k0 * passes + pass * (k1 - k0))) / (K * passes), passes);
        int R = c->M - r < rp ? (int)(c->M - r) : (int)rp;
        blocks[c->format][R][b - a](c->x + r * K, K, k0, k1, w + k0 * PW * es, y + r * ys, ys, cols, &sh.ahead,
                                    limit, lines);
      }
    }
    if (pair && panel % 2) glu_pair(c, pair, 2 * PW, panel / 2, 0, c->M);
    v = (panel + 1) * PV;
  }
}

/* AMX (CPUs with amx_bf16; DOT only). TDPBF16PS multiplies a tile of up to 16 rows x 16 pairs of activations by
 * a 16-pair x 16-column tile of weights in one instruction, 8x the multiply-adds of VDPBF16PS per cycle, and its
 * weight operand is exactly a DOT panel's layout (a row of 32-bit pairs per column), read in place with the
 * panel's row stride. It does not round as a chain of VDPBF16PS does (each of its steps sums 16 pairs its own
 * way: on Xeon family 6 model 207, 2026-12-05, 219 of 256 test sums differ in the last bits), so where the CPU
 * has it EVERY DOT call runs on it, a decode row included: a row's sums are then one chain of tile steps over k
 * in order, from 0, whatever rows share its call (the same row-consistency as above, for a numerically different
 * bf16dot target than on a CPU without AMX; a row's bits do not depend on how many rows its tile is configured
 * for either: experiments/matmul_amx_ab.c and tests/test_bf16_weights.py check both). K is padded to whole
 * 16-pair steps with zero pairs, in x and in the panels. Linux hands a process the tile registers only on request
 * (arch_prctl); where it refuses, or SPECEXPORT_AMX=0, DOT runs on VDPBF16PS. */
#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__linux__)
#include <sys/syscall.h>
#define HAVE_AMX 1
static int granted = -1; /* whether Linux gave this process the tile registers (asked once) */
static int amx(void) {      /* read when a kernel is made: a session made with SPECEXPORT_AMX=0 keeps VDPBF16PS */
  const char *e = getenv("SPECEXPORT_AMX");
  if (e && !strcmp(e, "0")) return 0;
  if (granted < 0) granted = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
  return granted;
}
/* One block of up to 16 rows of x (pairs, row stride K; as many as the tiles are configured for), or two
 * (`two`: x and x + 16 K, 16 rows each), by a panel's first n (1..3) 16-column tiles, over all K: the sums in
 * tiles 0-2 (the second block's 3-5), the activations in 6, the weights in 7, loaded for each product, so the
 * second block's products find the step's weight rows in L1 (0.83 kB of operands from L2 per tile product
 * instead of 1.33 for one block). Every sums' tile is a chain of steps over k in order from zero, whatever the
 * blocks: the same bits. Two blocks with the sums stored straight into y: the MatMuls of a 256-token bf16dot
 * chunk at 1,024 cached tokens 0.93-0.95x the time of one block at a time through a buffer (2026-12-05,
 * xeon-m207; docs/benchmarks.md "Prefill in longer calls, without the LM head; AMX rows in pairs"). */
#define AMX_STEP(J, S) /* sums S += activations x the panel's tile J (literal tile numbers: the intrinsics paste them) */ \
  do {                                                                                                              \
    _tile_loadd(7, w + k * PW + VL * J, PW * 4);                                                                    \
    _tile_dpbf16ps(S, 6, 7);                                                                                        \
  } while (0)
static void amx_block(const uint32_t *x, int64_t K, const uint32_t *w, int n, int two, float *out, int64_t os,
                      const char **ahead, const char *limit, int lines) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  if (two) {
    _tile_zero(3);
    _tile_zero(4);
    _tile_zero(5);
  }
  for (int64_t k = 0; k < K; k += 16) {
    for (int i = 0; i < lines && *ahead < (limit ? limit : (const char *)(w + k * PW) + DIST); i++, *ahead += 64)
      __builtin_prefetch(*ahead, 0, 1);
    _tile_loadd(6, x + k, K * 4);
    AMX_STEP(0, 0);
    if (n > 1) AMX_STEP(1, 1);
    if (n > 2) AMX_STEP(2, 2);
    if (!two) continue;
    _tile_loadd(6, x + 16 * K + k, K * 4);
    AMX_STEP(0, 3);
    if (n > 1) AMX_STEP(1, 4);
    if (n > 2) AMX_STEP(2, 5);
  }
  _tile_stored(0, out, os);
  _tile_stored(1, out + VL, os);
  _tile_stored(2, out + 2 * VL, os);
  if (two) {
    _tile_stored(3, out + 4 * os, os); /* 16 rows of os / 4 floats on */
    _tile_stored(4, out + 4 * os + VL, os);
    _tile_stored(5, out + 4 * os + 2 * VL, os);
  }
}

/* tiles 0-6 (sums, activations) of R rows, 7 (weights) of 16 pair-rows; 64 bytes a row */
static void configure(int R) {
  TileConfig cfg = {.palette = 1};
  for (int t = 0; t < 8; t++) cfg.rows[t] = t < 7 ? R : 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
}

/* part() for DOT on AMX: the same share of columns and the same panel stream, the panel outermost so its passes
 * (one per 16 rows, two at a time while 32 rows are left; a last block of fewer rows gets tiles of
 * that many: a decode row costs one row's products) find it in cache; each block's sums are stored into y, or
 * through a 32 x PW buffer where the tiles would run past y's rows or columns. */
static void part_amx(void *arg, size_t p) {
  const Call *c = arg;
  const int64_t K = c->K, N = c->N, bytes = K * PW * 4, passes = (c->M + 15) / 16;
  int R = 0; /* the rows the tiles are configured for */
  float out[32 * PW] __attribute__((aligned(64)));
  /* prefetches per 16-row step of the panel (16 x PW x 4 bytes): as part()'s per row, times 16 */
  int lines = (int)(passes == 1 ? 2 * 16 * PW * 4 / 64 : (16 * PW * 4 / 64 + passes - 1) / passes);
  const char *base = (const char *)c->panels;
  Share sh = share(c, p, bytes, passes);
  for (int64_t v = sh.v0; v < sh.v1;) {
    int64_t panel = v / PV, a = v % PV, b = sh.v1 - panel * PV < PV ? sh.v1 - panel * PV : PV;
    const uint32_t *w = (const uint32_t *)c->panels + panel * K * PW + VL * a;
    int64_t n0 = VL * v, cols = N - n0 < VL * (b - a) ? N - n0 : VL * (b - a);
    for (int64_t r = 0, pass = 1, rows; r < c->M; r += rows, pass += (rows + 15) / 16) {
      rows = c->M - r >= 32 ? 32 : c->M - r < 16 ? (int)(c->M - r) : 16; /* two blocks, one, or the last's rows */
      const char *limit = pace(&sh, base + (panel + 1) * bytes + bytes * (pass + (rows > 16)) / passes, passes);
      if ((rows > 16 ? 16 : rows) != R) configure(R = rows > 16 ? 16 : rows); /* a block's rows */
      int whole = cols == PW && rows % 16 == 0; /* the tiles' rows and columns all in y: stored there */
      float *o = whole ? c->y + r * N + n0 : out;
      amx_block((const uint32_t *)c->x + r * K, K, w, (int)(b - a), rows > 16, o, whole ? N * 4 : PW * 4, &sh.ahead,
                limit, rows > 16 ? 2 * lines : lines);
      for (int i = 0; i < rows && !whole; i++) memcpy(c->y + (r + i) * N + n0, out + i * PW, 4 * cols);
    }
    v = (panel + 1) * PV;
  }
  _tile_release();
}
#else
#define HAVE_AMX 0
static int amx(void) { return 0; }
static void part_amx(void *arg, size_t p) { (void)arg, (void)p; }
#endif

/* a DOT weight's panel rows for K: its (K + 1) / 2 pairs, a multiple of 16 on AMX (the tiles' steps) */
static int64_t dot_rows(int64_t K, int amx) { return amx ? ((K + 1) / 2 + 15) / 16 * 16 : (K + 1) / 2; }

/* B [K, N] as panels (see Call) in `format`, in a fresh 64-byte aligned buffer; NULL when out of memory. DOT:
 * dot_rows(K) panel rows of 32-bit pairs, row p: k = 2p in the low half, 2p + 1 in the high half (0 past K).
 * glu (MatMulSwiGLU's B, gate and up side by side, F = N / 2 columns each): panel 2q holds the gate's columns
 * [q PW, q PW + PW) and panel 2q + 1 the up projection's same columns (glu_panels(N) columns in all). */
static int64_t glu_panels(int64_t N) { return 2 * PW * ((N / 2 + PW - 1) / PW); }
#define PACK_GLU /* pack() takes glu (experiments/matmul_variants_ab.c builds older copies too) */
static void *pack(const float *B, int64_t K, int64_t N, int format, int amx, int glu) {
  int64_t F = N / 2, np = glu ? glu_panels(N) / PW : (N + PW - 1) / PW, es = format == BF16 ? 2 : 4;
  int64_t rows = format == DOT ? dot_rows(K, amx) : K;
  char *panels = aligned_alloc(64, (size_t)(np * rows * PW * es));
  if (!panels) return NULL;
  for (int64_t p = 0; p < np; p++)
    for (int64_t k = 0; k < rows; k++) {
      char *dst = panels + (p * rows + k) * PW * es;
      int64_t n0 = glu ? p % 2 * F + p / 2 * PW : p * PW, end = glu ? p % 2 * F + F : N;
      int64_t cols = end - n0 < PW ? end - n0 : PW;
      memset(dst, 0, PW * es);
      if (format == BF16)
        for (int64_t i = 0; i < cols; i++) ((uint16_t *)dst)[i] = to_bf16(B[k * N + n0 + i]);
      else if (format == DOT)
        for (int64_t i = 0; i < cols; i++)
          ((uint32_t *)dst)[i] = (2 * k < K ? to_bf16(B[2 * k * N + n0 + i]) : 0) |
                                 (uint32_t)(2 * k + 1 < K ? to_bf16(B[(2 * k + 1) * N + n0 + i]) : 0) << 16;
      else
        memcpy(dst, B + k * N + n0, sizeof(float) * cols);
    }
  return panels;
}

/* x [M, K] rounded to bfloat16 pairs [M, (K + 1) / 2] (DOT's activations; low half k = 2p, high 2p + 1): in
 * memory, each row's values in order as bfloat16 (VCVTNEPS2BF16, 16 at a time: to nearest even, denormals to
 * 0, which VDPBF16PS reads as 0 anyway), zeros from K up to 2 K2 (K2 >= (K + 1) / 2 pairs a row: the panels'
 * rows, see dot_rows). The same k always takes the same path, whatever M. */
static void pairs(const float *x, int64_t M, int64_t K, int64_t K2, uint32_t *out) {
  for (int64_t m = 0; m < M; m++, x += K, out += K2) {
    uint16_t *h = (uint16_t *)out;
    int64_t k = 0;
#if defined(__AVX512BF16__)
    for (; k + 16 <= K; k += 16) _mm256_storeu_si256((void *)(h + k), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + k)));
#endif
    for (; k < K; k++) h[k] = to_bf16(x[k]);
    for (; k < 2 * K2; k++) h[k] = 0;
  }
}

/* Task p of `parts`: rows [M p / parts, M (p + 1) / parts) of pairs() */
typedef struct {
  const float *x;
  int64_t M, K, K2, parts;
  uint32_t *out;
} Pairs;
static void pairs_part(void *arg, size_t p) {
  const Pairs *a = arg;
  int64_t m0 = a->M * (int64_t)p / a->parts, m1 = a->M * ((int64_t)p + 1) / a->parts;
  pairs(a->x + m0 * a->K, m1 - m0, a->K, a->K2, a->out + m0 * a->K2);
}

extern OrtCustomOp specexport_matmul_bf16_op, specexport_matmul_dot_op, specexport_swiglu_op, specexport_swiglu_bf16_op,
    specexport_swiglu_dot_op;

typedef struct {
  OrtOp *fallback; /* onnxruntime's MatMul, for the B this kernel does not take */
  void *panels;    /* B packed, when B is a constant [K, N] (a weight); else NULL and the fallback runs */
  int64_t K, N;
  int64_t Np;      /* the panels' columns: N, or MatMulSwiGLU's pairs of gate and up panels (glu_panels) */
  int format;      /* F32, or what the session's specexport.matmul_weights asked for (bf16: BF16, bf16dot: DOT) */
  int amx;         /* DOT on AMX tiles (part_amx) */
  int rows;        /* prefill calls with K > N split by rows (rows_part) */
  int swiglu;      /* MatMulSwiGLU: y = silu(x B[:, :N/2]) * x B[:, N/2:] */
} Kernel;

/* onnxruntime's own MatMul (batched or vector B): the output shape as numpy's matmul broadcasts it */
static OrtStatus *fallback(Kernel *k, OrtKernelContext *ctx, const OrtValue *a, const OrtValue *b, const int64_t *ad,
                           size_t ar, const int64_t *bd, size_t br) {
  if (ar < 1 || br < 1 || ar > 8 || br > 8) return ort->CreateStatus(ORT_INVALID_ARGUMENT, "MatMul (specexport): ranks 1 to 8 only");
  int64_t yd[8];
  size_t yr = 0;
  if (br == 1) { /* A [..., K] x B [K] */
    for (size_t i = 0; i + 1 < ar; i++) yd[yr++] = ad[i];
  } else if (ar == 1) { /* A [K] x B [..., K, N] */
    for (size_t i = 0; i + 2 < br; i++) yd[yr++] = bd[i];
    yd[yr++] = bd[br - 1];
  } else { /* batch dims broadcast, then [M, N] */
    size_t n = (ar > br ? ar : br) - 2;
    for (size_t i = 0; i < n; i++) {
      int64_t x = i + ar >= n + 2 ? ad[i + ar - n - 2] : 1, w = i + br >= n + 2 ? bd[i + br - n - 2] : 1;
      yd[yr++] = x == 1 ? w : x;
    }
    yd[yr++] = ad[ar - 2];
    yd[yr++] = bd[br - 1];
  }
  OrtValue *y;
  TRY(ort->KernelContext_GetOutput(ctx, 0, yd, yr, &y));
  const OrtValue *in[2] = {a, b};
  OrtValue *out[1] = {y};
  return ort->InvokeOp(ctx, k->fallback, in, 2, out, 1);
}

/* Prefill calls whose activations are wider than the output (K > N: the MLP's down projection) split their ROWS
 * between the threads, each over every panel, instead of the columns: each thread then reads only its half of x
 * (for a 512-token float32 chunk 1.5 MB, which stays in its core's L2, where all of x, 3 MB, streamed from L3
 * once per panel), and those are the rows its core just wrote (onnxruntime's elementwise ops before it split by
 * rows). The weights are read by both threads, which at 256+ rows is cheap beside the multiply-adds. Every
 * element is the same chain either way: the same bits. A 512-token chunk at 988 cached 0.95x (bf16dot) and
 * 0.97-0.99x (float32) the time; 128-256 rows level (2026-12-05, xeon-m207; docs/benchmarks.md "Rows, not
 * columns"). SPECEXPORT_MATMUL_ROWS=0 (read when a kernel is made) keeps the column split. */
#define ROWS_FROM 256

typedef struct {
  const Call *c;
  int64_t step; /* the parts' rows are multiples of this (a register or tile block) */
  int product;  /* 0: MatMulSwiGLU's epilogue alone (an AMX product split by columns) */
} Rows;
static void rows_part(void *arg, size_t p) {
  const Rows *r = arg;
  const Call *c = r->c;
  int64_t blocks = (c->M + r->step - 1) / r->step;
  int64_t m0 = blocks * (int64_t)p / c->nparts * r->step, m1 = blocks * ((int64_t)p + 1) / c->nparts * r->step;
  if (m1 > c->M) m1 = c->M;
  if (m0 > m1) m0 = m1;
  Call s = *c; /* x's rows are K 32-bit elements (floats, or bf16dot's pairs) */
  s.x = (const float *)((const char *)c->x + m0 * c->K * 4), s.M = m1 - m0, s.nparts = 1;
  s.y = c->y ? c->y + m0 * c->N : NULL, s.glu = c->glu ? c->glu + m0 * c->F : NULL;
  if (r->product && s.M > 0) (c->amx ? part_amx : part)(&s, 0);
  if (s.oom) ((Call *)c)->oom = 1;
  if (c->glu && c->amx) /* the tiles' sums went to the caller's buffer (all pairs): the epilogue of these rows */
    for (int64_t q = 0; q < c->N / (2 * PW); q++) glu_pair(c, c->y + 2 * PW * q, c->N, q, m0, m1);
}

static OrtStatus *compute(void *op, OrtKernelContext *ctx) {
  Kernel *k = op;
  const OrtValue *a, *b;
  TRY(ort->KernelContext_GetInput(ctx, 0, &a));
  TRY(ort->KernelContext_GetInput(ctx, 1, &b));
  int64_t ad[8], bd[8];
  size_t ar, br;
  TRY(dims(a, ad, &ar, 8));
  TRY(dims(b, bd, &br, 8));
  if (!k->panels || ar < 1 || ar > 8) return fallback(k, ctx, a, b, ad, ar, bd, br);
  if (br != 2 || bd[0] != k->K || bd[1] != k->N)
    return ort->CreateStatus(ORT_FAIL, "MatMul (specexport): B is not the constant it was packed from");
  if (ad[ar - 1] != k->K)
    return ort->CreateStatus(ORT_INVALID_ARGUMENT, "MatMul (specexport): A's last dimension is not B's first");
  Call c = {.K = k->K, .N = k->Np, .M = 1, .panels = k->panels, .format = k->format, .amx = k->amx};
  int64_t yd[8];
  for (size_t i = 0; i + 1 < ar; i++) c.M *= ad[i], yd[i] = ad[i];
  yd[ar - 1] = k->swiglu ? k->N / 2 : k->N;
  OrtValue *y;
  TRY(ort->KernelContext_GetOutput(ctx, 0, yd, ar, &y));
  TRY(ort->GetTensorMutableData((OrtValue *)a, (void **)&c.x));
  TRY(ort->GetTensorMutableData(y, (void **)&c.y));
  if (c.M == 0 || c.N == 0) return NULL;
  if (k->swiglu) { /* part() keeps each panel pair's sums in its own buffer; the tiles' go to one [M, N] here */
    static __thread void *gb;
    static __thread size_t gcap;
    c.glu = c.y, c.F = k->N / 2, c.y = NULL;
    if (c.amx && !(c.y = kept(&gb, &gcap, sizeof(float) * c.M * c.N)))
      return ort->CreateStatus(ORT_FAIL, "MatMulSwiGLU (specexport): out of memory");
  }
  if (c.format == DOT) { /* the activations as bfloat16 pairs: a call over K / 2 rows of pairs */
    c.K = dot_rows(k->K, c.amx);
    /* into the calling thread's kept buffer; a prefill chunk's rows split between the threads */
    static __thread void *kb;
    static __thread size_t cap;
    uint32_t *buf = kept(&kb, &cap, sizeof(uint32_t) * c.M * c.K);
    if (!buf) return ort->CreateStatus(ORT_FAIL, "MatMul (specexport): out of memory");
    Pairs pa = {.x = c.x, .M = c.M, .K = k->K, .K2 = c.K, .parts = c.M >= 128 ? parts() : 1, .out = buf};
    if (pa.parts == 1)
      pairs(c.x, c.M, k->K, c.K, buf);
    else
      TRY(ort->KernelContext_ParallelFor(ctx, pairs_part, (size_t)pa.parts, (size_t)pa.parts, &pa));
    c.x = (const float *)buf;
  }
  int64_t nv = (c.N + VL - 1) / VL;
  static const char *oom = "MatMulSwiGLU (specexport): out of memory for a thread's scratch";
  if (k->rows && c.M >= ROWS_FROM && (k->K > k->N || k->swiglu) && parts() > 1) {
    c.nparts = parts();
    Rows r = {&c, c.amx ? 32 : RB, 1};
    TRY(ort->KernelContext_ParallelFor(ctx, rows_part, (size_t)c.nparts, (size_t)c.nparts, &r));
    return c.oom ? ort->CreateStatus(ORT_FAIL, oom) : NULL;
  }
  int64_t units = nv / share_unit(&c);
  c.nparts = parts() < units ? parts() : units;
  if (c.nparts == 1)
    (c.amx ? part_amx : part)(&c, 0);
  else
    TRY(ort->KernelContext_ParallelFor(ctx, c.amx ? part_amx : part, (size_t)c.nparts, (size_t)c.nparts, &c));
  if (c.oom) return ort->CreateStatus(ORT_FAIL, oom);
  if (!c.glu || !c.amx) return NULL;
  /* the tiles' epilogue: a decode or verify call's few rows on this thread, else each thread a share of the rows */
  c.nparts = c.M < 64 ? 1 : parts();
  Rows r = {&c, 1, 0};
  if (c.nparts == 1) return rows_part(&r, 0), NULL;
  return ort->KernelContext_ParallelFor(ctx, rows_part, (size_t)c.nparts, (size_t)c.nparts, &r);
}

static void destroy(void *op);
static OrtStatus *create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info, void **out) {
  (void)api;
  Kernel *k = calloc(1, sizeof(Kernel));
  if (!k) return ort->CreateStatus(ORT_FAIL, "MatMul (specexport): out of memory");
  k->swiglu = op == &specexport_swiglu_op || op == &specexport_swiglu_bf16_op || op == &specexport_swiglu_dot_op;
  k->format = op == &specexport_matmul_bf16_op || op == &specexport_swiglu_bf16_op ? BF16
              : op == &specexport_matmul_dot_op || op == &specexport_swiglu_dot_op ? DOT : F32;
  k->amx = k->format == DOT && amx();
  const char *rows = getenv("SPECEXPORT_MATMUL_ROWS");
  k->rows = !(rows && !strcmp(rows, "0"));
  const char *names[1] = {"T"};
  ONNXTensorElementDataType types[1] = {ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT};
  OrtStatus *st = ort->CreateOp(info, "MatMul", "", 13, names, types, 1, NULL, 0, 2, 1, &k->fallback);
  if (st) {
    free(k);
    return st;
  }
  /* a weight (a constant [K, N] B): packed once here; onnxruntime's copy is then never read again */
  int constant = 0;
  const OrtValue *b = NULL;
  if ((st = ort->KernelInfoGetConstantInput_tensor(info, 1, &constant, &b))) ort->ReleaseStatus(st), constant = 0;
  int64_t bd[8];
  size_t br = 0;
  const float *B = NULL;
  if (constant && b && (st = dims(b, bd, &br, 8))) ort->ReleaseStatus(st), br = 0;
  if (br == 2 && bd[0] > 0 && bd[1] > 0 && (st = ort->GetTensorMutableData((OrtValue *)b, (void **)&B)))
    ort->ReleaseStatus(st), B = NULL;
  if (br == 2 && B) {
    k->K = bd[0], k->N = bd[1];
    k->Np = k->swiglu ? glu_panels(k->N) : k->N;
    if (!(k->panels = pack(B, k->K, k->N, k->format, k->amx, k->swiglu && k->N % 2 == 0))) {
      ort->ReleaseOp(k->fallback);
      free(k);
      return ort->CreateStatus(ORT_FAIL, "MatMul (specexport): out of memory packing a weight");
    }
#ifdef MADV_PAGEOUT
    /* onnxruntime maps a bundle's weights from its file: the pages packing read are clean copies of the file,
     * which the kernel may drop now (no effect on memory of its own; nothing is lost either way) */
    uintptr_t lo = ((uintptr_t)B + 4095) & ~(uintptr_t)4095, hi = ((uintptr_t)(B + k->K * k->N)) & ~(uintptr_t)4095;
    if (hi > lo) madvise((void *)lo, hi - lo, MADV_PAGEOUT);
#endif
  }
  if (k->swiglu && (!k->panels || k->N % 2)) {
    destroy(k);
    return ort->CreateStatus(ORT_INVALID_ARGUMENT, "MatMulSwiGLU (specexport): the weight must be a constant [K, 2F] "
                                                   "(gate and up side by side); rebuild the bundle");
  }
  *out = k;
  return NULL;
}

static void destroy(void *op) {
  Kernel *k = op;
  if (k->fallback) ort->ReleaseOp(k->fallback);
  free(k->panels);
  free(k);
}

static const char *name(const OrtCustomOp *op) { (void)op; return "MatMul"; }
static const char *name_swiglu(const OrtCustomOp *op) { (void)op; return "MatMulSwiGLU"; }
static ONNXTensorElementDataType type(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
static size_t two(const OrtCustomOp *op) { (void)op; return 2; }
static size_t one(const OrtCustomOp *op) { (void)op; return 1; }
static OrtCustomOpInputOutputCharacteristic required(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return INPUT_OUTPUT_REQUIRED; }
static int since(const OrtCustomOp *op) { (void)op; return 1; }
static int until(const OrtCustomOp *op) { (void)op; return 1 << 30; }

#define MATMUL_OP(NAME)                                                                                     \
  {                                                                                                        \
    .version = API_VERSION, .GetName = NAME, .GetExecutionProviderType = provider, .GetInputType = type,   \
    .GetInputTypeCount = two, .GetOutputType = type, .GetOutputTypeCount = one, .KernelDestroy = destroy, \
    .GetInputCharacteristic = required, .GetOutputCharacteristic = required, .GetInputMemoryType = mem_type, \
    .CreateKernelV2 = create, .KernelComputeV2 = compute, .GetStartVersion = since, .GetEndVersion = until, \
  }
/* one op per weight format: gqa.c registers the one a session's options ask for; create() tells which */
OrtCustomOp specexport_matmul_op = MATMUL_OP(name), specexport_matmul_bf16_op = MATMUL_OP(name),
            specexport_matmul_dot_op = MATMUL_OP(name);
/* MatMulSwiGLU (domain specexport; the graph's function of the same name is its definition, what runs where this
 * library does not): the MLP's gate and up projection and silu(gate) * up in one kernel, per weight format. B is
 * packed with the gate's and the up projection's panels in pairs (pack's glu); part() runs a pair's two panels
 * into its thread's [M, 2 PW] buffer and writes the pair's silu(gate) * up from there, so the product is never
 * written out (on AMX, part_amx's sums go to one [M, N] buffer and rows_part runs the epilogue). The products are
 * the MatMul's chains, the epilogue elementwise: rows stay independent of their call. */
OrtCustomOp specexport_swiglu_op = MATMUL_OP(name_swiglu), specexport_swiglu_bf16_op = MATMUL_OP(name_swiglu),
            specexport_swiglu_dot_op = MATMUL_OP(name_swiglu);

/* whether DOT runs on AMX tiles here (a build for a CPU with amx_bf16, the tiles granted, SPECEXPORT_AMX not 0) */
int specexport_matmul_amx(void) { return amx(); }

/* whether this build has the DOT format (avx512_bf16) */
int specexport_matmul_dot(void) {
#if defined(__AVX512BF16__)
  return 1;
#else
  return 0;
#endif
}
