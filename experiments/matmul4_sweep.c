/* specexport's int4 MatMulNBits (kernels/matmul4.c, the AVX2 or AVX512-VNNI build as the compiler's flags pick) alone:
 * SmolLM2-135M's 121 int4 weights (30 layers of [576, 960] [576, 576] [576, 3072] [1536, 576], then the [576, 49152]
 * head; 84 MB packed, so every sweep reads them from memory as a draft call does), two threads (the second spinning
 * on a counter, as onnxruntime's pool does), M = 1, 2, 4, 8 rows: the median ms of 15 sweeps. Weights and
 * activations are made up; only the time is read. Build and run (compare two versions by building each):
 *   cc -O3 -march=native -std=gnu11 -I specexport/kernels -I specexport/kernels/include \
 *     experiments/matmul4_sweep.c -o /tmp/m4sweep -lpthread && /tmp/m4sweep */
#include <pthread.h>
#include <stdio.h>
#include <time.h>
#define specexport_matmul4_op x_op
#define specexport_matmul4_on x_on
#include "matmul4.c"
const OrtApi *specexport_ort = 0;
void specexport_kept_own(void **b, size_t *c) { (void)b, (void)c; }
int specexport_parts(void) { return 2; }
#define NW 121
static Kernel ks[NW];
static Call cs[NW];
static volatile int gen = 0, done1 = 0;
static int cur;
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
/* the second thread: part 1 of call `cur` whenever `gen` moves */
static void *worker(void *a) {
  (void)a;
  for (int g = 0;;) {
    while (gen == g) ;
    if ((g = gen) < 0) return 0;
    part(&cs[cur], 1);
    __atomic_store_n(&done1, g, __ATOMIC_RELEASE);
  }
}
/* call i on both threads */
static void both(int i) {
  cur = i;
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  int g = gen + 1;
  gen = g;
  part(&cs[i], 0);
  while (__atomic_load_n(&done1, __ATOMIC_ACQUIRE) != g) ;
}
static int cmp(const void *a, const void *b) { return *(double *)a < *(double *)b ? -1 : 1; }
int main(void) {
  static const int64_t shape[4][2] = {{576, 960}, {576, 576}, {576, 3072}, {1536, 576}};
  float *x = malloc(4 * 16 * 1536), *y = malloc(4 * 16 * 49152);
  for (int i = 0; i < 16 * 1536; i++) x[i] = (i % 13) * 0.1f - 0.6f;
  int8_t *qa[2]; /* 16 rows of activations quantised for K = 576 and K = 1,536 */
  float *sa[2];
  int32_t *as[2];
  for (int t = 0; t < 2; t++) {
    int64_t K = t ? 1536 : 576, nb = K / 32;
    qa[t] = aligned_alloc(64, 16 * nb * 32), sa[t] = malloc(4 * 16 * nb), as[t] = malloc(4 * 16 * nb);
    quantise(x, 0, 16, K, nb, qa[t], sa[t], as[t]);
  }
  double bytes = 0;
  for (int i = 0; i < NW; i++) { /* packed as create() packs them, with made-up nibbles and scales */
    int64_t K = i < NW - 1 ? shape[i % 4][0] : 576, N = i < NW - 1 ? shape[i % 4][1] : 49152;
    Kernel k = {.K = K, .N = N, .nb = (K + 31) / 32, .np = (N + 63) / 64};
    size_t wb = k.np * k.nb * 256 * NG, sb = sizeof(float) * k.np * k.nb * GC * NG;
    k.w = aligned_alloc(64, wb), k.s = aligned_alloc(64, sb);
    for (size_t e = 0; e < wb; e++) k.w[e] = (uint8_t)(e * 7919 >> 3);
    for (size_t e = 0; e < sb / 4; e++) k.s[e] = 0.001f * (e % 7);
    ks[i] = k, bytes += wb + sb;
  }
  pthread_t th;
  pthread_create(&th, 0, worker, 0);
  int Ms[] = {1, 2, 4, 8};
  for (int m = 0; m < 4; m++) {
    for (int i = 0; i < NW; i++) {
      int t = ks[i].K == 1536;
      Call c = {.k = &ks[i], .x = x, .qa = qa[t], .sa = sa[t], .asum = as[t], .y = y, .M = Ms[m], .nparts = 2};
      cs[i] = c;
    }
    double ts[15];
    for (int r = 0; r < 15; r++) {
      double t0 = now();
      for (int i = 0; i < NW; i++) both(i);
      ts[r] = now() - t0;
    }
    qsort(ts, 15, sizeof(double), cmp);
    printf("M=%d: %.2f ms a sweep (median of 15), %.1f GB/s of packed weights (%.0f MB)\n", Ms[m], ts[7] * 1e3,
           bytes / ts[7] / 1e9, bytes / 1e6);
  }
  gen = -1;
  pthread_join(th, 0);
}
