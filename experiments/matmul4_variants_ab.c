/* Two versions of specexport's int4 MatMulNBits (kernels/matmul4.c, the AVX2 or AVX512-VNNI build as the flags pick)
 * in one process, interleaved: SmolLM2-135M's 121 int4 weights (30 layers of [576, 960] [576, 576] [576, 3072]
 * [1536, 576], then the [576, 49152] head) packed as the op packs them, with made-up nibbles and scales (84 MB per
 * version, so every sweep reads them from memory, as a draft call does), two threads (the second spinning on a
 * counter, as onnxruntime's pool does), per M rows the median ms of a sweep of each, the median of their per-round
 * ratio, and whether the head's outputs are bit-identical. Compiled three times:
 *   K="-I specexport/kernels -I specexport/kernels/include"
 *   cc -O3 -march=native -std=gnu11 $K -c -DROLE_A -DSRC='"/path/old/matmul4.c"' experiments/matmul4_variants_ab.c -o /tmp/a.o
 *   cc -O3 -march=native -std=gnu11 $K -c -DROLE_B -DSRC='"matmul4.c"' experiments/matmul4_variants_ab.c -o /tmp/b.o
 *   cc -O3 -march=native experiments/matmul4_variants_ab.c /tmp/a.o /tmp/b.o -o /tmp/m4_ab -lpthread
 *   /tmp/m4_ab 1,2,4,8 ROUNDS
 * (-DBITS=8 in both roles' compiles: 8-bit weights, 168 MB a version)
 * (an old version's directory needs its ops.h beside its matmul4.c) */
#if defined(ROLE_A) || defined(ROLE_B)
#if defined(ROLE_A)
#define P(x) a_##x
#else
#define P(x) b_##x
#endif
#define specexport_matmul4_op P(op) /* matmul4.c's exported names, renamed per version */
#define specexport_matmul4_on P(on)
#include SRC
#ifndef BITS
#define BITS 4
#endif
/* a [K, N] weight as create() lays it out: BITS-bit values (-DBITS=8: 8-bit) and a scale per column and block of
 * 32 k, made up */
void *P(make)(int64_t K, int64_t N) {
  Kernel *k = calloc(1, sizeof(Kernel));
  k->K = K, k->N = N, k->nq = (K + QB - 1) / QB, k->np = (N + GC * NG - 1) / (GC * NG);
  k->sh = BITS == 8, k->nb = k->nq << k->sh;
  size_t wb = (size_t)(k->np * k->nb * 256 * NG), sb = sizeof(float) * k->np * k->nq * GC * NG;
  k->w = aligned_alloc(64, wb), k->s = aligned_alloc(64, sb);
  for (size_t e = 0; e < wb; e++) k->w[e] = (uint8_t)(e * 7919 >> 3);
  for (size_t e = 0; e < sb / 4; e++) k->s[e] = 0.001f * (float)(e % 7);
  return k;
}
/* thread `which` of 2's part of y [M, N] = x [M, K] x the weight, x's rows quantised by `prep` */
static int8_t *qa[2];
static float *sa[2];
static int32_t *as[2];
void P(prep)(const float *x, int64_t M) { /* x [M, 1536] quantised for K = 576 and 1,536 */
  for (int t = 0; t < 2; t++) {
    int64_t K = t ? 1536 : 576, nb = K / QB;
    qa[t] = aligned_alloc(64, (size_t)(M * nb * QB)), sa[t] = malloc(4 * M * nb), as[t] = malloc(4 * M * nb);
    quantise(x, 0, M, K, nb, qa[t], sa[t], as[t]);
  }
}
void P(run)(void *kernel, float *y, int64_t M, int which) {
  const Kernel *k = kernel;
  int t = k->K == 1536;
  Call c = {.k = k, .qa = qa[t], .sa = sa[t], .asum = as[t], .y = y, .M = M, .nparts = 2};
  part(&c, (size_t)which);
}
#else
#include "sweep_ab.h"
const void *specexport_ort = 0; /* ops.h's, unused here */
void specexport_kept_own(void **buf, size_t *cap) { (void)buf, (void)cap; } /* gqa.c's */
int specexport_parts(void) { return 2; }                                       /* matmul.c's */
typedef void *Make(int64_t, int64_t);
typedef void Prep(const float *, int64_t);
typedef void Run(void *, float *, int64_t, int);
Make a_make, b_make;
Prep a_prep, b_prep;
Run a_run, b_run;
static Run *const runs[2] = {a_run, b_run};
static void go(int which) { runs[curV](panels[curV][curI], Y, curM, which); }
int main(int argc, char **argv) {
  int Ms[32], nm, rounds;
  int64_t Mmax = args(argc, argv, Ms, &nm, &rounds);
  if (!Mmax) return 2;
  for (int i = 0; i < NW; i++) {
    shape(i);
    panels[0][i] = a_make(KK[i], NN[i]), panels[1][i] = b_make(KK[i], NN[i]);
  }
  float *Y0 = buffers(Mmax);
  a_prep(X, Mmax), b_prep(X, Mmax);
  sweep_and_report(Ms, nm, rounds, Y0);
  return 0;
}
#endif
