/* Two versions of specexport's MatMul kernel (matmul.c) in one process, interleaved: a SmolLM2-shaped sweep
 * (30 layers of [576, 960] [576, 576] [576, 3072] [1536, 576] weights, then the [576, 49152] head; each version
 * packs its own copy, ~540 MB, so every sweep reads its weights from memory, as a decode call does) per M rows,
 * two threads (the second spinning on a counter, as onnxruntime's pool does), the version that runs first
 * alternating; per M the median ms of a sweep of each and the median of their per-round ratio, and whether the
 * head's outputs are bit-identical. This file is compiled three times:
 *   K="-I specexport/kernels -I specexport/kernels/include"
 *   cc -O3 -march=native -std=gnu11 $K -c -DROLE_A -DMATMUL='"/path/old/matmul.c"' experiments/matmul_variants_ab.c -o /tmp/a.o
 *   cc -O3 -march=native -std=gnu11 $K -c -DROLE_B -DMATMUL='"matmul.c"' experiments/matmul_variants_ab.c -o /tmp/b.o
 *   cc -O3 -march=native experiments/matmul_variants_ab.c /tmp/a.o /tmp/b.o -o /tmp/mm_ab -lpthread
 *   /tmp/mm_ab 1,6,7,8,9,12,16,256 ROUNDS */
#if defined(ROLE_A) || defined(ROLE_B)
#if defined(ROLE_A)
#define P(x) a_##x
#else
#define P(x) b_##x
#endif
/* matmul.c's exported names, renamed per version */
#define specexport_threads P(threads)
#define specexport_parts P(parts)
#define specexport_matmul_op P(op)
#define specexport_matmul_bf16_op P(bf16_op)
#define specexport_matmul_dot_op P(dot_op)
#define specexport_matmul_dot P(dot)
#define specexport_matmul_amx P(amx)
#define specexport_swiglu_op P(swiglu_op)
#define specexport_swiglu_bf16_op P(swiglu_bf16_op)
#define specexport_swiglu_dot_op P(swiglu_dot_op)
#include MATMUL
#if defined(PACK_GLU) /* matmul.c since 2026-12-05 19:50: pack() takes whether B is MatMulSwiGLU's */
void *P(pack_f32)(const float *B, int64_t K, int64_t N) { return pack(B, K, N, F32, 0, 0); }
#elif defined(HAVE_AMX) /* matmul.c since 2026-12-05: pack() takes whether DOT panels are for AMX */
void *P(pack_f32)(const float *B, int64_t K, int64_t N) { return pack(B, K, N, F32, 0); }
#else
void *P(pack_f32)(const float *B, int64_t K, int64_t N) { return pack(B, K, N, F32); }
#endif
void P(run)(const float *x, const void *panels, float *y, int64_t M, int64_t K, int64_t N, int which) {
  Call c = {.x = x, .panels = panels, .y = y, .M = M, .K = K, .N = N, .format = F32, .nparts = 2};
  part(&c, which);
}
#else
#include "sweep_ab.h"
const void *specexport_ort = 0; /* ops.h's, unused here */
void specexport_kept_own(void **buf, size_t *cap) { (void)buf, (void)cap; } /* gqa.c's; buffers kept for life */
typedef void *Pack(const float *, int64_t, int64_t);
typedef void Run(const float *, const void *, float *, int64_t, int64_t, int64_t, int);
Pack a_pack_f32, b_pack_f32;
Run a_run, b_run;
static Run *const runs[2] = {a_run, b_run};
static void go(int which) { runs[curV](X, panels[curV][curI], Y, curM, KK[curI], NN[curI], which); }
int main(int argc, char **argv) {
  int Ms[32], nm, rounds;
  int64_t Mmax = args(argc, argv, Ms, &nm, &rounds);
  if (!Mmax) return 2;
  for (int i = 0; i < NW; i++) {
    float *B = weight(i);
    panels[0][i] = a_pack_f32(B, KK[i], NN[i]), panels[1][i] = b_pack_f32(B, KK[i], NN[i]);
    free(B);
  }
  float *Y0 = buffers(Mmax);
  sweep_and_report(Ms, nm, rounds, Y0);
  return 0;
}
#endif
