/* What experiments/matmul_variants_ab.c and matmul_amx_ab.c share: a SmolLM2-shaped sweep of NW weights (30 layers
 * of [576, 960] [576, 576] [576, 3072] [1536, 576], then the [576, 49152] head) run by two threads (the second
 * spinning on a counter, as onnxruntime's pool does), two ways interleaved. The includer defines go(which): thread
 * `which`'s part of weight curI the way curV. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define NW (30 * 4 + 1)
static void *panels[2][NW];
static int64_t KK[NW], NN[NW], curM;
static float *X, *Y;
static int curV, curI;
static volatile int gen = 0, done1 = 0;
static void go(int which);
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
static void *worker(void *arg) {
  (void)arg;
  for (int g = 0;;) {
    while (gen == g) ;
    if ((g = gen) < 0) return NULL;
    go(1);
    __atomic_store_n(&done1, g, __ATOMIC_RELEASE);
  }
}
/* weight curI the way curV on both threads */
static void both(void) {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  int g = gen + 1;
  gen = g;
  go(0);
  while (__atomic_load_n(&done1, __ATOMIC_ACQUIRE) != g) ;
}
/* call(v, i) where nothing but go() differs between the ways: weight i the way v on both threads */
__attribute__((unused)) static void call_both(int v, int i) {
  curV = v, curI = i;
  both();
}
static int cmp(const void *a, const void *b) { return *(double *)a < *(double *)b ? -1 : *(double *)a > *(double *)b; }
/* weight i's shape into KK[i], NN[i] */
static void shape(int i) {
  static const int64_t kn[4][2] = {{576, 960}, {576, 576}, {576, 3072}, {1536, 576}};
  KK[i] = i < NW - 1 ? kn[i % 4][0] : 576, NN[i] = i < NW - 1 ? kn[i % 4][1] : 49152;
}
/* weight i's shape, and its values (deterministic) in a fresh buffer */
__attribute__((unused)) static float *weight(int i) {
  shape(i);
  float *B = malloc(4 * KK[i] * NN[i]);
  for (int64_t e = 0; e < KK[i] * NN[i]; e++) B[e] = (float)((e * 7919 + i) % 1000) / 1000.f - 0.5f;
  return B;
}
/* t[way][m][round]: seconds of a whole sweep at Ms[m] rows, the way that runs first alternating; the worker
 * thread is started here. call(v, i): one weight's call the way v (call_both, or the includer's own; it ends
 * with both()). */
static void sweeps(const int *Ms, int nm, int rounds, double (*t)[32][200], void (*call)(int, int)) {
  pthread_t th;
  pthread_create(&th, NULL, worker, NULL);
  for (int r = 0; r < rounds; r++)
    for (int m = 0; m < nm; m++)
      for (int k = 0; k < 2; k++) {
        int v = (r + m + k) & 1;
        curM = Ms[m];
        double t0 = now();
        for (int i = 0; i < NW; i++) call(v, i);
        t[v][m][r] = now() - t0;
      }
}
/* the median of way 0's, of way 1's and of their per-round ratio (sorts t[.][m]) */
static void medians(double (*t)[32][200], int m, int rounds, double out[5]) {
  double q[200];
  for (int r = 0; r < rounds; r++) q[r] = t[1][m][r] / t[0][m][r];
  qsort(t[0][m], rounds, sizeof(double), cmp), qsort(t[1][m], rounds, sizeof(double), cmp);
  qsort(q, rounds, sizeof(double), cmp);
  out[0] = t[0][m][rounds / 2], out[1] = t[1][m][rounds / 2], out[2] = q[rounds / 2], out[3] = q[0], out[4] = q[rounds - 1];
}
/* argv: "M1,M2,... ROUNDS" into Ms / nm / rounds; the largest M; 0 on bad arguments (the usage printed) */
static int64_t args(int argc, char **argv, int *Ms, int *nm, int *rounds) {
  if (argc != 3) return fprintf(stderr, "usage: %s M1,M2,... ROUNDS\n", argv[0]), 0;
  *nm = 0, *rounds = atoi(argv[2]);
  for (char *s = strtok(argv[1], ","); s && *nm < 32; s = strtok(NULL, ",")) Ms[(*nm)++] = atoi(s);
  if (*rounds < 1 || *rounds > 200) return fprintf(stderr, "ROUNDS: 1 to 200\n"), 0;
  int64_t Mmax = 1;
  for (int m = 0; m < *nm; m++) Mmax = Ms[m] > Mmax ? Ms[m] : Mmax;
  return Mmax;
}
/* X (Mmax rows of activations, deterministic) and Y, and a copy of Y's size */
static float *buffers(int64_t Mmax) {
  X = malloc(4 * Mmax * 1536), Y = malloc(4 * Mmax * 49152);
  for (int64_t i = 0; i < Mmax * 1536; i++) X[i] = (float)(i % 97) / 97.f - 0.5f;
  return malloc(4 * Mmax * 49152);
}
/* the head's outputs at M rows both ways: way 0's into Y0, way 1's left in Y */
static void heads(int M, float *Y0, void (*call)(int, int)) {
  curM = M;
  call(0, NW - 1);
  memcpy(Y0, Y, 4 * curM * 49152);
  call(1, NW - 1);
}
/* per M: both ways' median ms, the median (and range) of their per-round ratio, and whether the head's outputs
 * are the same bits both ways (Y0: a buffer of Y's size) */
__attribute__((unused)) static void report(const int *Ms, int nm, int rounds, double (*t)[32][200], float *Y0,
                                                 void (*call)(int, int)) {
  for (int m = 0; m < nm; m++) {
    heads(Ms[m], Y0, call);
    double md[5];
    medians(t, m, rounds, md);
    int same = !memcmp(Y0, Y, 4 * curM * 49152);
    printf("M=%d: A %.2f ms, B %.2f ms, B/A per round %.3f (%.2f-%.2f), outputs %s\n", Ms[m], md[0] * 1e3,
           md[1] * 1e3, md[2], md[3], md[4], same ? "identical" : "DIFFER");
  }
}
/* the sweeps of both ways at each M and their report, then the worker thread told to end (ways that differ only
 * in go(): call_both) */
__attribute__((unused)) static void sweep_and_report(const int *Ms, int nm, int rounds, float *Y0) {
  double(*t)[32][200] = calloc(2, sizeof *t);
  sweeps(Ms, nm, rounds, t, call_both);
  report(Ms, nm, rounds, t, Y0, call_both);
  gen = -1;
}
