/* bf16dot's MatMul two ways in one process, interleaved: DOT panels through VDPBF16PS (part) and through AMX tiles
 * (part_amx), on a SmolLM2-shaped sweep (30 layers of [576, 960] [576, 576] [576, 3072] [1536, 576] weights, then
 * the [576, 49152] head; each way packs its own copy, ~270 MB in bfloat16, so a sweep reads its weights from
 * memory as a decode call does), two threads (the second spinning on a counter, as onnxruntime's pool does), the
 * way that runs first alternating. Per M: the median ms of a sweep each, the median per-round ratio, the largest
 * relative difference between the two ways' head outputs, and whether AMX's rows are the same bits at every M
 * (rows of an M-row call against the same rows alone in 1-row calls, whose tiles are configured for one row).
 *   cc -O3 -march=native -std=gnu11 -I specexport/kernels -I specexport/kernels/include \
 *     experiments/matmul_amx_ab.c -o /tmp/mm_amx -lpthread -lm && /tmp/mm_amx 1,9,16,64,256 ROUNDS */
#include "matmul.c"
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <time.h>
const OrtApi *specexport_ort = 0; /* ops.h's, unused here */
#define NW (30 * 4 + 1)
static void *panels[2][NW];
static int64_t KK[NW], NN[NW], curM;
static float *X, *Y;
static uint32_t *XP[2];
static int curV, curI;
static volatile int gen = 0, done1 = 0;
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
static void go(int which) {
  int64_t K = KK[curI];
  Call c = {.x = (const float *)XP[curV], .panels = panels[curV][curI], .y = Y, .M = curM, .K = dot_rows(K, curV),
            .N = NN[curI], .format = DOT, .amx = curV, .nparts = 2};
  (curV ? part_amx : part)(&c, which);
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
static void call(int v, int i) {
  curV = v, curI = i;
  /* the activations as compute() rounds them, here once per call as there */
  pairs(X, curM, KK[i], dot_rows(KK[i], v), XP[v]);
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  int g = gen + 1;
  gen = g;
  go(0);
  while (__atomic_load_n(&done1, __ATOMIC_ACQUIRE) != g) ;
}
static int cmp(const void *a, const void *b) { return *(double *)a < *(double *)b ? -1 : *(double *)a > *(double *)b; }
int main(int argc, char **argv) {
  if (argc != 3) return fprintf(stderr, "usage: %s M1,M2,... ROUNDS\n", argv[0]), 2;
  if (!amx()) return fprintf(stderr, "no AMX here (or SPECEXPORT_AMX=0)\n"), 2;
  int Ms[32], nm = 0, rounds = atoi(argv[2]);
  for (char *s = strtok(argv[1], ","); s && nm < 32; s = strtok(NULL, ",")) Ms[nm++] = atoi(s);
  if (rounds < 1 || rounds > 200) return fprintf(stderr, "ROUNDS: 1 to 200\n"), 2;
  static const int64_t shape[4][2] = {{576, 960}, {576, 576}, {576, 3072}, {1536, 576}};
  int64_t Mmax = 1;
  for (int m = 0; m < nm; m++) Mmax = Ms[m] > Mmax ? Ms[m] : Mmax;
  for (int i = 0; i < NW; i++) {
    KK[i] = i < NW - 1 ? shape[i % 4][0] : 576, NN[i] = i < NW - 1 ? shape[i % 4][1] : 49152;
    float *B = malloc(4 * KK[i] * NN[i]);
    for (int64_t e = 0; e < KK[i] * NN[i]; e++) B[e] = (float)((e * 7919 + i) % 1000) / 1000.f - 0.5f;
    panels[0][i] = pack(B, KK[i], NN[i], DOT, 0), panels[1][i] = pack(B, KK[i], NN[i], DOT, 1);
    free(B);
  }
  X = malloc(4 * Mmax * 1536), Y = malloc(4 * Mmax * 49152);
  for (int v = 0; v < 2; v++) XP[v] = malloc(4 * Mmax * 1536);
  float *Y0 = malloc(4 * Mmax * 49152), *Y1 = malloc(4 * 49152);
  for (int64_t i = 0; i < Mmax * 1536; i++) X[i] = (float)(i % 97) / 97.f - 0.5f;
  pthread_t th;
  pthread_create(&th, NULL, worker, NULL);
  double (*t)[32][200] = calloc(2, sizeof *t);
  for (int r = 0; r < rounds; r++)
    for (int m = 0; m < nm; m++)
      for (int k = 0; k < 2; k++) {
        int v = (r + m + k) & 1;
        curM = Ms[m];
        double t0 = now();
        for (int i = 0; i < NW; i++) call(v, i);
        t[v][m][r] = now() - t0;
      }
  for (int m = 0; m < nm; m++) {
    curM = Ms[m];
    call(0, NW - 1);
    memcpy(Y0, Y, 4 * curM * 49152);
    call(1, NW - 1);
    double q[200], rel = 0;
    for (int64_t e = 0; e < curM * 49152; e++)
      if (Y0[e] != 0) rel = fmax(rel, fabs(Y[e] - Y0[e]) / fabs(Y0[e]));
    /* AMX's rows alone: each row of the call against a 1-row call of that row */
    int same = 1;
    memcpy(Y0, Y, 4 * curM * 49152);
    float *keep = X;
    for (int64_t row = 0; row < curM && same; row += curM > 8 ? curM / 8 : 1) {
      X = keep + row * 576, curM = 1;
      call(1, NW - 1);
      same = !memcmp(Y, Y0 + row * 49152, 4 * 49152);
      curM = Ms[m];
    }
    X = keep;
    for (int r = 0; r < rounds; r++) q[r] = t[1][m][r] / t[0][m][r];
    qsort(t[0][m], rounds, sizeof(double), cmp), qsort(t[1][m], rounds, sizeof(double), cmp);
    qsort(q, rounds, sizeof(double), cmp);
    printf("M=%d: VDPBF16PS %.2f ms, AMX %.2f ms, AMX/VDPBF16PS per round %.3f (%.2f-%.2f); max rel diff %.2g; AMX rows "
           "%s alone\n", Ms[m], t[0][m][rounds / 2] * 1e3, t[1][m][rounds / 2] * 1e3, q[rounds / 2], q[0], q[rounds - 1],
           rel, same ? "identical to" : "DIFFER from");
  }
  (void)Y1;
  gen = -1;
  return 0;
}
