/* One task of the attention kernel, float32 (attend) against AMX tiles (attend_amx, gqa_amx.h), without
 * onnxruntime: a row of `keys` cached tokens of random numbers, a block of TB new tokens at its end, SmolLM2's
 * head (D = 64, 3 query heads per KV head), one thread, the best of REPS calls of each, interleaved.
 *   cc -O3 -march=native -std=gnu11 [-I DIR_WITH_A_VARIANT] -I specexport/kernels -I specexport/kernels/include \
 *      experiments/gqa_amx_alone.c -o /tmp/gqa_amx_alone -lm
 *   /tmp/gqa_amx_alone KEYS TB REPS */
#include "gqa.c"
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

OrtCustomOp specexport_matmul_op, specexport_matmul_bf16_op, specexport_matmul_dot_op, specexport_matmul4_op,
    specexport_swiglu_op, specexport_swiglu_bf16_op, specexport_swiglu_dot_op;
int specexport_matmul4_on(void) { return 0; }
int specexport_matmul_dot(void) { return 1; }
int specexport_matmul_amx(void) { return 1; }

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
  if (argc < 4) return fprintf(stderr, "usage: %s KEYS TB REPS\n", argv[0]), 2;
  int64_t keys = atoll(argv[1]), T = atoll(argv[2]), reps = atoll(argv[3]), D = 64, S = keys + 64, H = 9, Hkv = 3;
  if (syscall(SYS_arch_prctl, 0x1023, 18)) return fprintf(stderr, "no AMX grant\n"), 1;
  Kernel k = {.heads = H, .kv_heads = Hkv, .rotary = 0, .scale = 0.125f};
  int64_t qs = (H + 2 * Hkv) * D;
  float *qkv = aligned_alloc(64, 4 * T * qs), *pk = aligned_alloc(64, 4 * Hkv * S * D), *pv = aligned_alloc(64, 4 * Hkv * S * D);
  float *out = aligned_alloc(64, 4 * T * H * D);
  for (int64_t i = 0; i < T * qs; i++) qkv[i] = (float)((i * 7919) % 1000) / 250.f - 2.0f;
  for (int64_t i = 0; i < Hkv * S * D; i++) pk[i] = (float)((i * 104729) % 1000) / 250.f - 2.0f, pv[i] = (float)((i * 7) % 1000) / 1000.f - 0.5f;
  int32_t seq = (int32_t)(keys - 1);
  Call c = {.k = &k, .B = 1, .T = T, .S = S, .D = D, .L = (int64_t)keys, .prompt = 0, .qp = qkv, .kp = qkv + H * D,
            .vp = qkv + (H + Hkv) * D, .qs = qs, .ks = qs, .vs = qs, .seqlens = &seq, .pk = pk, .pv = pv, .out = out};
  c.tblock = T, c.nblocks = 1;
  double best[2] = {1e9, 1e9};
  for (int64_t r = 0; r < reps; r++)
    for (int w = 0; w < 2; w++) {
      double t = now();
      (w ? attend_amx : attend)(&c, 0);
      t = now() - t;
      best[w] = t < best[w] ? t : best[w];
    }
  printf("keys=%lld T=%lld (%lld queries): float32 %.3f ms, AMX %.3f ms (%.2fx)\n", (long long)keys, (long long)T,
         (long long)(T * 3), best[0] * 1e3, best[1] * 1e3, best[0] / best[1]);
  return 0;
}
