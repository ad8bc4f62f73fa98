/* The attention kernel's task body (specexport/kernels/gqa_rows.h, head size 64) without onnxruntime: nq
 * queries against `keys` keys of random numbers, one thread, the best of REPS calls, GFLOP/s on the scores and
 * outputs (4 nq keys D); query i sees keys - 16 + i / 3 + 1 keys (a 16-token block of 3 query heads per KV head
 * at the end of the cache), at least 1. OUT, if given, gets the outputs (float32), to compare two builds' bits.
 *   cc -O3 -march=native -std=gnu11 [-I DIR_WITH_A_VARIANT] -I specexport/kernels -I specexport/kernels/include \
 *      experiments/gqa_alone.c -o /tmp/gqa_alone -lm
 *   /tmp/gqa_alone NQ KEYS REPS [OUT]
 * A variant: copies of gqa.c and gqa_rows.h in DIR_WITH_A_VARIANT (gqa.c includes gqa_rows.h from its own
 * folder), e.g. with a phase removed, to see where the time goes (docs/benchmarks.md, 2026-12-05). */
#include "gqa.c"
#include <stdio.h>
#include <time.h>

OrtCustomOp specexport_matmul_op, specexport_matmul_bf16_op, specexport_matmul_dot_op, specexport_matmul4_op,
    specexport_swiglu_op, specexport_swiglu_bf16_op, specexport_swiglu_dot_op;
int specexport_matmul4_on(void) { return 0; }
int specexport_matmul_dot(void) { return 0; }

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s NQ KEYS REPS [OUT]\n", argv[0]);
    return 2;
  }
  int64_t nq = atoll(argv[1]), keys = atoll(argv[2]), reps = atoll(argv[3]), D = 64;
  int64_t nq4 = (nq + 3) / 4 * 4, nq16 = (nq + 15) & ~15, kpad = (keys + 15) & ~15;
  float *q = aligned_alloc(64, 4 * nq4 * D), *K = aligned_alloc(64, 4 * keys * D), *V = aligned_alloc(64, 4 * keys * D);
  float *sc = aligned_alloc(64, 4 * (nq16 + 32) * kpad), *qt = aligned_alloc(64, 4 * 64 * D), *out = aligned_alloc(64, 4 * nq * D);
  for (int64_t i = 0; i < nq4 * D; i++) q[i] = (float)((i * 7919) % 1000) / 4000.f - 0.125f;
  for (int64_t i = 0; i < keys * D; i++) {
    K[i] = (float)((i * 104729) % 1000) / 1000.f - 0.5f;
    V[i] = (float)((i * 7) % 1000) / 1000.f - 0.5f;
  }
  int64_t len[nq], orow[nq];
  const float *bias[nq4];
  for (int64_t i = 0; i < nq4; i++) bias[i] = NULL;
  for (int64_t i = 0; i < nq; i++) {
    len[i] = keys - 16 + i / 3 + 1;
    len[i] = len[i] > keys ? keys : len[i] < 1 ? 1 + i % keys : len[i];
    orow[i] = i * D;
  }
  double best = 1e9;
  for (int64_t r = 0; r < reps; r++) {
    double t = now();
    rows4(q, nq, sc, kpad, K, V, keys, len, bias, qt, out, orow);
    t = now() - t;
    best = t < best ? t : best;
  }
  if (argc > 4) {
    FILE *f = fopen(argv[4], "wb");
    if (!f || fwrite(out, 4, nq * D, f) != (size_t)(nq * D)) return 1;
    fclose(f);
  }
  printf("nq=%lld keys=%lld: %.3f ms, %.1f GFLOP/s\n", (long long)nq, (long long)keys, best * 1e3,
         4.0 * nq * keys * D / best / 1e9);
  return 0;
}
