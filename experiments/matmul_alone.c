/* specexport's MatMul kernel (specexport/kernels/matmul.c) without onnxruntime: B packed once, then the best of
 * REPS calls of its task function on THREADS threads (started per call, as a pool would be woken), GFLOP/s; and
 * the CPU's own ceiling, one thread's chain of independent float32 FMAs and VDPBF16PS (bf16 pairs).
 *   cc -O3 -march=native -std=gnu11 -I specexport/kernels -I specexport/kernels/include \
 *      experiments/matmul_alone.c -o /tmp/matmul_alone -lm -lpthread
 *   /tmp/matmul_alone M K N FORMAT REPS THREADS     (FORMAT 0 float32, 1 bf16, 2 bf16dot, 3 bf16dot on AMX tiles)
 *   /tmp/matmul_alone peak */
#include "matmul.c"
#include <pthread.h>
#include <stdio.h>
#include <time.h>

const OrtApi *specexport_ort = 0; /* gqa.c's, unused here */

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static Call *call_;
static void *worker(void *p) {
  (call_->amx ? part_amx : part)(call_, (size_t)p);
  return NULL;
}

static void peak(void) {
#if defined(__AVX512F__)
  __m512 a[12], x = _mm512_set1_ps(1.0001f), y = _mm512_set1_ps(0.9999f);
  for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
  long n = 100000000;
  double t = now();
  for (long r = 0; r < n; r++)
    for (int i = 0; i < 12; i++) a[i] = _mm512_fmadd_ps(a[i], x, y);
  double dt = now() - t;
  float s = 0;
  for (int i = 0; i < 12; i++) s += _mm512_reduce_add_ps(a[i]);
  printf("float32 FMA, one thread: %.1f GFLOP/s (%g)\n", n * 12 * 32 / dt / 1e9, s);
#if defined(__AVX512BF16__)
  __m512bh p = (__m512bh)_mm512_set1_epi16(0x3f80);
  for (int i = 0; i < 12; i++) a[i] = _mm512_set1_ps((float)i);
  t = now();
  for (long r = 0; r < n; r++)
    for (int i = 0; i < 12; i++) a[i] = _mm512_dpbf16_ps(a[i], p, p);
  dt = now() - t;
  s = 0;
  for (int i = 0; i < 12; i++) s += _mm512_reduce_add_ps(a[i]);
  printf("VDPBF16PS, one thread: %.1f GFLOP/s (%g)\n", n * 12 * 64 / dt / 1e9, s);
#endif
#endif
}

int main(int argc, char **argv) {
  if (argc == 2) {
    peak();
    return 0;
  }
  if (argc != 7) {
    fprintf(stderr, "usage: %s M K N FORMAT REPS THREADS | %s peak\n", argv[0], argv[0]);
    return 2;
  }
  int64_t M = atoll(argv[1]), K = atoll(argv[2]), N = atoll(argv[3]);
  int format = atoi(argv[4]), reps = atoi(argv[5]), threads = atoi(argv[6]), tiles = format == 3;
  if (tiles && !amx()) return fprintf(stderr, "no AMX here (or SPECEXPORT_AMX=0)\n"), 2;
  format = tiles ? DOT : format;
  float *B = malloc(4 * K * N), *x = malloc(4 * M * K), *y = malloc(4 * M * N);
  uint32_t *xp = malloc(4 * M * (K + 32));
  for (int64_t i = 0; i < K * N; i++) B[i] = (float)((i * 7919) % 1000) / 1000.f - 0.5f;
  for (int64_t i = 0; i < M * K; i++) x[i] = (float)((i * 104729) % 1000) / 1000.f - 0.5f;
  Call c = {.x = x, .panels = pack(B, K, N, format, tiles, 0), .y = y, .M = M, .K = K, .N = N, .format = format,
            .amx = tiles};
  int64_t nv = (N + VL - 1) / VL;
  c.nparts = threads < nv ? threads : nv;
  call_ = &c;
  double best = 1e9;
  for (int r = 0; r < reps; r++) {
    double t = now();
    if (format == DOT) { /* as compute() does */
      pairs(x, M, K, dot_rows(K, tiles), xp);
      c.x = (const float *)xp, c.K = dot_rows(K, tiles);
    }
    pthread_t th[64];
    for (int i = 1; i < c.nparts; i++) pthread_create(&th[i], NULL, worker, (void *)(size_t)i);
    (tiles ? part_amx : part)(&c, 0);
    for (int i = 1; i < c.nparts; i++) pthread_join(th[i], NULL);
    double dt = now() - t;
    best = dt < best ? dt : best;
  }
  printf("M=%lld K=%lld N=%lld format %d, %d thread(s): best of %d %.3f ms, %.1f GFLOP/s\n", (long long)M,
         (long long)K, (long long)N, tiles ? 3 : format, (int)c.nparts, reps, best * 1e3, 2.0 * M * K * N / best / 1e9);
  return 0;
}
