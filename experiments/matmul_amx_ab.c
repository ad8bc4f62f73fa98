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
#include "sweep_ab.h"
#include <math.h>
const OrtApi *specexport_ort = 0; /* ops.h's, unused here */
void specexport_kept_own(void **buf, size_t *cap) { (void)buf, (void)cap; } /* gqa.c's; buffers kept for life */
static uint32_t *XP[2];
static void go(int which) {
  Call c = {.x = (const float *)XP[curV], .panels = panels[curV][curI], .y = Y, .M = curM, .K = dot_rows(KK[curI], curV),
            .N = NN[curI], .format = DOT, .amx = curV, .nparts = 2};
  (curV ? part_amx : part)(&c, which);
}
static void call(int v, int i) {
  curV = v, curI = i;
  pairs(X, curM, KK[i], dot_rows(KK[i], v), XP[v]); /* the activations as compute() rounds them, once per call */
  both();
}
int main(int argc, char **argv) {
  int Ms[32], nm, rounds;
  int64_t Mmax = args(argc, argv, Ms, &nm, &rounds);
  if (!Mmax) return 2;
  if (!amx()) return fprintf(stderr, "no AMX here (or SPECEXPORT_AMX=0)\n"), 2;
  for (int i = 0; i < NW; i++) {
    float *B = weight(i);
    panels[0][i] = pack(B, KK[i], NN[i], DOT, 0, 0), panels[1][i] = pack(B, KK[i], NN[i], DOT, 1, 0);
    free(B);
  }
  float *Y0 = buffers(Mmax);
  for (int v = 0; v < 2; v++) XP[v] = malloc(4 * Mmax * 1536);
  double (*t)[32][200] = calloc(2, sizeof *t);
  sweeps(Ms, nm, rounds, t, call);
  for (int m = 0; m < nm; m++) {
    heads(Ms[m], Y0, call);
    double rel = 0, md[5];
    for (int64_t e = 0; e < curM * 49152; e++)
      if (Y0[e] != 0) rel = fmax(rel, fabs(Y[e] - Y0[e]) / fabs(Y0[e]));
    /* AMX's rows alone: rows of the call against 1-row calls of the same rows */
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
    medians(t, m, rounds, md);
    printf("M=%d: VDPBF16PS %.2f ms, AMX %.2f ms, AMX/VDPBF16PS per round %.3f (%.2f-%.2f); max rel diff %.2g; AMX rows "
           "%s alone\n", Ms[m], md[0] * 1e3, md[1] * 1e3, md[2], md[3], md[4], rel, same ? "identical to" : "DIFFER from");
  }
  gen = -1;
  return 0;
}
