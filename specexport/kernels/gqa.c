/* GroupQueryAttention for onnxruntime's CPU provider, as specexport's fused graphs use it: q, k and v packed
 * in `query` (q pre-scaled, `scale` 1), past and present bound to the same buffers (the new K/V written into
 * slots past..past+T-1 in place), the rotary inside (non-interleaved, cos/sin tables [positions, D/2] at
 * the tokens' position_ids), an optional additive attention_bias [B or 1, 1, T, total_len] (a tree's mask).
 * Registered in the domain com.microsoft under the contrib op's name, so a session that loads this library
 * runs it in place of onnxruntime's kernel with the graph unchanged (custom kernels take precedence).
 *
 * (q, k and v as three inputs, graphs built before 2026-12-03, are taken too.)
 *
 * Why: onnxruntime's CPU kernel runs two one-row GEMMs per (row, query head), so a KV head's cache is read
 * once per query head that shares it, every pair pays a GEMM's set-up, and its float reductions are plain
 * loops; and it refuses several new tokens per row when a batch of more than one row has a past. Here a task
 * is one (row, KV head, block of up to 16 new tokens): the block's queries of the G query heads that share
 * the KV head are scored against each key as it is read (one dot product per query while few, 16 keys'
 * sums' trees at once (hsum16); else 16
 * queries as the lanes of a vector against keys broadcast from the cache, the same sums lane for lane),
 * softmax with a vectorised exp, and the outputs as register-blocked sums of V rows. Each row's cache is
 * streamed once per block (per 16 queries on the second path), at any T and any B. Semantics as onnxruntime's: seqlens_k[b] + 1 is row b's total length; when
 * total_sequence_length equals T ("first prompt") rows have no past and shorter rows are right-padded.
 * Head sizes: multiples of 16 up to 128 (others are refused at the first call). */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "ops.h"

const OrtApi *specexport_ort; /* ops.h: matmul.c uses it too */

typedef struct {
  int64_t heads, kv_heads, rotary;
  float scale;
  int amx; /* attend_amx (gqa_amx.h): a bf16dot session whose MatMuls run on AMX */
} Kernel;

typedef struct {
  const Kernel *k;
  volatile int oom; /* a task could not allocate its scratch */
  int64_t B, T, S, D, L, tblock, nblocks;
  int prompt;
  const float *qp, *kp, *vp, *cos, *sin, *bias; /* head 0 of token 0's q, k, v */
  int64_t qs, ks, vs;                           /* floats from a token's row to the next */
  const int64_t *pos;
  const int32_t *seqlens;
  float *pk, *pv, *out;
  int bias_rows; /* bias dims[0]: B, or 1 when broadcast over rows */
  int zero_bias; /* the bias is zeros wherever a query looks (every causal call's): skipped */
} Call;

static void rotate(float *dst, const float *src, const float *cos, const float *sin, int64_t D, int rot) {
  int64_t h = D / 2;
  if (!rot) {
    memcpy(dst, src, D * sizeof(float));
    return;
  }
  for (int64_t i = 0; i < h; i++) {
    float x1 = src[i], x2 = src[i + h];
    dst[i] = x1 * cos[i] - x2 * sin[i];
    dst[i + h] = x2 * cos[i] + x1 * sin[i];
  }
}

static int64_t past_of(const Call *c, int64_t b) {
  return c->prompt ? 0 : (int64_t)c->seqlens[b] + 1 - c->T;
}

/* the keys row b's new token t sees (causal) */
static int64_t seen(const Call *c, int64_t b, int64_t t) {
  int64_t total = (int64_t)c->seqlens[b] + 1;
  return c->prompt ? (t + 1 < total ? t + 1 : total) : past_of(c, b) + t + 1;
}

/* Task (b, kv head): rotate this step's keys and write them and the values into slots past..past+T-1. */
static void write_kv(void *arg, size_t task) {
  const Call *c = arg;
  const Kernel *k = c->k;
  int64_t b = task / k->kv_heads, h = task % k->kv_heads, D = c->D;
  int64_t past = past_of(c, b);
  for (int64_t t = 0; t < c->T; t++) {
    int64_t bt = b * c->T + t, p = c->pos ? c->pos[bt] : past + t;
    size_t slot = ((b * k->kv_heads + h) * c->S + past + t) * D;
    rotate(c->pk + slot, c->kp + bt * c->ks + h * D, c->cos + p * (D / 2), c->sin + p * (D / 2), D, k->rotary);
    memcpy(c->pv + slot, c->vp + bt * c->vs + h * D, D * sizeof(float));
  }
}

static inline v16 load(const float *p) { return *(const v16u *)p; }

static inline void store(float *p, v16 v) { *(v16u *)p = v; }

/* the sum of 8 lanes as a tree: c_m = b_m + b_m+4, then (c0 + c2) + (c1 + c3) */
typedef float v8 __attribute__((vector_size(32)));
static inline float hsum8(v8 b) {
  typedef float v4 __attribute__((vector_size(16)));
  v4 c = __builtin_shufflevector(b, b, 0, 1, 2, 3) + __builtin_shufflevector(b, b, 4, 5, 6, 7);
  return (c[0] + c[2]) + (c[1] + c[3]);
}

/* the sum of a vector's lanes as a tree (4 shuffles and adds): lane l + lane l + 8, then hsum8's */
static inline float hsum(v16 a) {
  return hsum8(__builtin_shufflevector(a, a, 0, 1, 2, 3, 4, 5, 6, 7) +
               __builtin_shufflevector(a, a, 8, 9, 10, 11, 12, 13, 14, 15));
}

/* hsum of 16 vectors at once: s[j] = hsum(a[j]), each sum the same adds of the same lanes in the same order
 * (so the same bits) as hsum's: a butterfly of 4 steps whose adds pair lanes as hsum's tree does (l + 8, then
 * + 4, then (0 + 2) + (1 + 3)), 30 shuffles and adds for the 16 sums instead of ~10 operations each */
#if defined(__AVX512F__)
static inline v16 hsum16(const v16 *a) {
  __m512 u[8], v[4], w[2];
  for (int p = 0; p < 8; p++) /* lanes 0-7: a[2p]'s b_l = a_l + a_l+8; lanes 8-15: a[2p + 1]'s */
    u[p] = _mm512_add_ps(_mm512_shuffle_f32x4((__m512)a[2 * p], (__m512)a[2 * p + 1], 0x44),
                         _mm512_shuffle_f32x4((__m512)a[2 * p], (__m512)a[2 * p + 1], 0xee));
  for (int p = 0; p < 4; p++) /* 128-bit block b: key 4p + b's c_m = b_m + b_m+4 */
    v[p] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * p], u[2 * p + 1], 0x88),
                         _mm512_shuffle_f32x4(u[2 * p], u[2 * p + 1], 0xdd));
  for (int p = 0; p < 2; p++) /* block b: (c0 + c2, c1 + c3) of key 8p + b, then of key 8p + 4 + b */
    w[p] = _mm512_add_ps(_mm512_shuffle_ps(v[2 * p], v[2 * p + 1], 0x44), _mm512_shuffle_ps(v[2 * p], v[2 * p + 1], 0xee));
  /* block b: the sums of keys b, 4 + b, 8 + b, 12 + b; then lanes to key order */
  __m512 r = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], 0x88), _mm512_shuffle_ps(w[0], w[1], 0xdd));
  return (v16)_mm512_permutexvar_ps(_mm512_set_epi32(15, 11, 7, 3, 14, 10, 6, 2, 13, 9, 5, 1, 12, 8, 4, 0), r);
}
#endif

/* The floats a register holds: 16 where AVX-512 is, else 8. AVX2's 16 registers hold a quarter of what the
 * AVX-512 blocks keep live (32 of 16 floats), so there gqa_rows.h runs its blocks in narrower pieces, each
 * output the same sums in the same order (2026-12-06, AMD EPYC family 25 model 1: v16 blocks on AVX2 spilled,
 * a 256-token chunk's attention at 0.41x onnxruntime's). */
#if defined(__AVX512F__)
#define W 16
#else
#define W 8
#endif
typedef float vw __attribute__((vector_size(4 * W)));
typedef float vwu __attribute__((vector_size(4 * W), aligned(4)));
typedef int iw __attribute__((vector_size(4 * W)));
static inline vw loadw(const float *p) { return *(const vwu *)p; }
static inline void storew(float *p, vw v) { *(vwu *)p = v; }
#if W == 16
#define expw exp16
#else
static inline vw expw(vw x) { return EXP_BITS(x); } /* exp16's numbers, 8 lanes at a time */
#endif
/* hsum of a vector of 16 lanes held as 16 / W vectors: the same tree */
static inline float hsumw(const vw *a) {
#if W == 16
  return hsum(a[0]);
#else
  return hsum8(a[0] + a[1]);
#endif
}

#define PV_KEYS 32 /* keys per block of the outputs' sums: a block's V rows come from memory once, for every pass */
#define QB 4 /* a task's query rows are padded to a multiple of QB; fewer than 3 QB take the dot-product path */

/* rows1 .. rows8: attend_rows for head sizes 16 .. 128 (gqa_rows.h names each from DV and undefines DV) */
#define DV 1
#include "gqa_rows.h"
#define DV 2
#include "gqa_rows.h"
#define DV 3
#include "gqa_rows.h"
#define DV 4
#include "gqa_rows.h"
#define DV 5
#include "gqa_rows.h"
#define DV 6
#include "gqa_rows.h"
#define DV 7
#include "gqa_rows.h"
#define DV 8
#include "gqa_rows.h"

static __typeof__(rows1) *const rows[9] = {NULL, rows1, rows2, rows3, rows4, rows5, rows6, rows7, rows8}; /* by D / 16 */

/* Every thread's kept buffers (ops.h kept), freed by a key's destructor when it exits: onnxruntime's calling
 * thread runs a share of each call, so a caller that runs each request on a thread of its own would leave a few
 * MB behind per thread. The library is linked -z nodelete: a thread may exit after the library is dlclosed. */
#define KEPT_MAX 8 /* the library keeps five */
static __thread struct {
  void **buf;
  size_t *cap;
} owned[KEPT_MAX];
static __thread int nowned;
static pthread_key_t owner;
static pthread_once_t owner_once = PTHREAD_ONCE_INIT;

static void release(void *unused) {
  (void)unused;
  for (int i = 0; i < nowned; i++) {
    free(*owned[i].buf);
    *owned[i].buf = NULL, *owned[i].cap = 0;
  }
  nowned = 0;
}

static void owner_key(void) { pthread_key_create(&owner, release); }

void specexport_kept_own(void **buf, size_t *cap) {
  for (int i = 0; i < nowned; i++)
    if (owned[i].buf == buf) return;
  if (nowned == KEPT_MAX) return; /* kept for the thread's life, as before */
  pthread_once(&owner_once, owner_key);
  pthread_setspecific(owner, owned); /* non-NULL: the destructor runs at the thread's exit */
  owned[nowned].buf = buf, owned[nowned++].cap = cap;
}

/* A task's scratch: one buffer per thread, kept and grown to the largest task it has run (a fresh block per
 * task was a fresh mapping of a few hundred kB, every task of every layer) */
static void *scratch(size_t bytes) {
  static __thread void *buf;
  static __thread size_t cap;
  return kept(&buf, &cap, bytes);
}

/* The queries of task (b, kv head h, tokens [t0, t1)), query i = (t - t0) G + g for query head g of the G that
share h: its q rotated and scaled into q [i][D], the keys it sees (len), its output's offset (orow), its bias
row or NULL, its position */
static void queries(const Call *c, int64_t b, int64_t h, int64_t t0, int64_t t1, float *q, int64_t *len,
                    int64_t *orow, const float **bias, int64_t *pos) {
  const Kernel *k = c->k;
  int64_t G = k->heads / k->kv_heads, D = c->D, past = past_of(c, b);
  float scale = k->scale != 0.0f ? k->scale : 1.0f / sqrtf((float)D);
  for (int64_t t = t0; t < t1; t++) {
    const float *row = c->qp + (b * c->T + t) * c->qs;
    int64_t p = c->pos ? c->pos[b * c->T + t] : past + t;
    for (int64_t g = 0; g < G; g++) {
      int64_t i = (t - t0) * G + g;
      rotate(q + i * D, row + (h * G + g) * D, c->cos + p * (D / 2), c->sin + p * (D / 2), D, k->rotary);
      for (int64_t d = 0; d < D; d++) q[i * D + d] *= scale;
      len[i] = seen(c, b, t), pos[i] = p;
      orow[i] = ((b * c->T + t) * k->heads + h * G + g) * D;
      bias[i] = c->bias && !c->zero_bias ? c->bias + ((c->bias_rows > 1 ? b : 0) * c->T + t) * c->L : NULL;
    }
  }
}

/* Task (b, kv head, block of tokens): the attention of the block's tokens for the G query heads. */
static void attend(void *arg, size_t task) {
  const Call *c = arg;
  const Kernel *k = c->k;
  int64_t G = k->heads / k->kv_heads, D = c->D;
  int64_t blk = task % c->nblocks, bh = task / c->nblocks, b = bh / k->kv_heads, h = bh % k->kv_heads;
  int64_t t0 = blk * c->tblock, t1 = t0 + c->tblock < c->T ? t0 + c->tblock : c->T, nt = t1 - t0;
  int64_t past = past_of(c, b), total = (int64_t)c->seqlens[b] + 1;
  int64_t nq = nt * G, nq4 = (nq + QB - 1) / QB * QB, nq16 = (nq + 15) & ~15;
  int64_t keys = c->prompt ? (t1 < total ? t1 : total) : past + t1; /* keys any query sees */
  int64_t kpad = (keys + 15) & ~15;
  const float *K = c->pk + (b * k->kv_heads + h) * c->S * D, *V = c->pv + (b * k->kv_heads + h) * c->S * D;
  float *q = scratch(sizeof(float) * (nq4 * D + nq16 * kpad + 16 * D)); /* sizes: multiples of 64 B */
  if (!q) {
    ((Call *)c)->oom = 1;
    return;
  }
  float *sc = q + nq4 * D, *qt = sc + nq16 * kpad;
  int64_t len[nq], orow[nq], pos[nq];
  const float *bias[nq4];
  memset(q + nq * D, 0, (nq4 - nq) * D * sizeof(float));
  queries(c, b, h, t0, t1, q, len, orow, bias, pos);
  rows[D / 16](q, nq, sc, kpad, K, V, keys, len, bias, qt, c->out, orow);
}

#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__AVX512BF16__) && defined(__linux__)
#include "gqa_amx.h"
#define GQA_AMX 1
#else
#define GQA_AMX 0
static void attend_amx(void *arg, size_t task) { attend(arg, task); }
#endif

/* whether b[0..n) are all zeros of either sign (adding them changes no sum) */
static inline int zeros(const float *b, int64_t n) {
  typedef int i16u __attribute__((vector_size(64), aligned(4)));
  const int32_t *u = (const int32_t *)b;
  i16 acc = {0};
  int64_t j = 0;
  for (; j + 16 <= n; j += 16) acc |= *(const i16u *)(u + j);
  int any = 0;
  for (; j < n; j++) any |= u[j];
  for (int l = 0; l < 16; l++) any |= acc[l];
  return !(any & 0x7fffffff);
}

static OrtStatus *fail(const char *msg) { return ort->CreateStatus(ORT_INVALID_ARGUMENT, msg); }

static OrtStatus *input(OrtKernelContext *ctx, size_t i, const OrtValue **v, const void **data) {
  *v = NULL;
  *data = NULL;
  TRY(ort->KernelContext_GetInput(ctx, i, v));
  if (*v) TRY(ort->GetTensorMutableData((OrtValue *)*v, (void **)data));
  return NULL;
}

static OrtStatus *compute(void *op, OrtKernelContext *ctx) {
  const Kernel *k = op;
  const OrtValue *v[11];
  const void *p[11];
  for (size_t i = 0; i < 11; i++) TRY(input(ctx, i, &v[i], &p[i]));
  if (!v[0] || !v[3] || !v[4] || !v[5] || !v[6]) return fail("GroupQueryAttention (specexport): query, past_key, past_value, seqlens_k and total_sequence_length are required");
  if (!v[1] != !v[2]) return fail("GroupQueryAttention (specexport): key and value come together, or packed in query");
  if (k->rotary && (!v[7] || !v[8])) return fail("GroupQueryAttention (specexport): do_rotary needs cos_cache and sin_cache");
  int64_t qd[4], kd[4], bd[4], cd[4];
  size_t r;
  TRY(dims(v[0], qd, &r, 4));
  if (r != 3) return fail("GroupQueryAttention (specexport): query must be [B, T, H D] or [B, T, (H + 2 Hkv) D]");
  TRY(dims(v[3], kd, &r, 4));
  if (r != 4) return fail("GroupQueryAttention (specexport): past_key must be [B, Hkv, S, D]");
  Call c = {.k = k, .B = qd[0], .T = qd[1], .S = kd[2], .D = kd[3]};
  int64_t H = k->heads * c.D, Hkv = k->kv_heads * c.D;
  c.qp = p[0];
  if (v[1]) { /* q, k and v apart (graphs built before 2026-12-03) */
    int64_t ed[4], vd[4];
    TRY(dims(v[1], ed, &r, 4));
    if (r != 3 || ed[0] != c.B || ed[1] != c.T || ed[2] != Hkv) return fail("GroupQueryAttention (specexport): key must be [B, T, Hkv D]");
    TRY(dims(v[2], vd, &r, 4));
    if (r != 3 || vd[0] != c.B || vd[1] != c.T || vd[2] != Hkv) return fail("GroupQueryAttention (specexport): value must be [B, T, Hkv D]");
    c.kp = p[1], c.vp = p[2], c.qs = H, c.ks = c.vs = Hkv;
  } else { /* packed: a token's row is its q heads, then k, then v */
    c.kp = c.qp + H, c.vp = c.qp + H + Hkv, c.qs = c.ks = c.vs = H + 2 * Hkv;
  }
  if (kd[0] != c.B || kd[1] != k->kv_heads || qd[2] != c.qs)
    return fail("GroupQueryAttention (specexport): query and past_key shapes disagree");
  if (c.D % 16 || c.D < 16 || c.D > 128)
    return fail("GroupQueryAttention (specexport): head size must be a multiple of 16 up to 128 (run with SPECEXPORT_KERNELS=0)");
  if (k->rotary) {
    TRY(dims(v[7], cd, &r, 4));
    if (r != 2 || cd[1] != c.D / 2) return fail("GroupQueryAttention (specexport): cos_cache must be [positions, D/2]");
  }
  c.L = *(const int32_t *)p[6];
  c.prompt = c.L == c.T;
  c.seqlens = p[5];
  c.cos = p[7];
  c.sin = p[8];
  c.pos = p[9];
  c.bias = p[10];
  if (v[10]) {
    TRY(dims(v[10], bd, &r, 4));
    if (r != 4 || (bd[0] != 1 && bd[0] != c.B) || bd[1] != 1 || bd[2] != c.T || bd[3] != c.L)
      return fail("GroupQueryAttention (specexport): attention_bias must be [B or 1, 1, T, total_sequence_length]");
    c.bias_rows = (int)bd[0];
  }
  if (c.prompt && c.T > c.S) return fail("GroupQueryAttention (specexport): T exceeds the cache");
  for (int64_t b = 0; b < c.B; b++) {
    int64_t total = (int64_t)c.seqlens[b] + 1;
    if (total > c.S || total > c.L || (!c.prompt && total < c.T))
      return fail("GroupQueryAttention (specexport): seqlens_k out of range for the cache and T");
  }
  if (c.pos && k->rotary)
    for (int64_t i = 0; i < c.B * c.T; i++)
      if (c.pos[i] < 0 || c.pos[i] >= cd[0]) return fail("GroupQueryAttention (specexport): a position_ids entry is past the rotary tables");
  c.zero_bias = c.bias != NULL; /* checked once here, not by every task that reads a row */
  for (int64_t b = 0; b < c.B && c.zero_bias; b++)
    for (int64_t t = 0; t < c.T && c.zero_bias; t++)
      c.zero_bias = zeros(c.bias + ((c.bias_rows > 1 ? b : 0) * c.T + t) * c.L, seen(&c, b, t));
  int64_t od[3] = {c.B, c.T, k->heads * c.D};
  OrtValue *o0, *o1, *o2;
  TRY(ort->KernelContext_GetOutput(ctx, 0, od, 3, &o0));
  TRY(ort->KernelContext_GetOutput(ctx, 1, kd, 4, &o1));
  TRY(ort->KernelContext_GetOutput(ctx, 2, kd, 4, &o2));
  TRY(ort->GetTensorMutableData(o0, (void **)&c.out));
  TRY(ort->GetTensorMutableData(o1, (void **)&c.pk));
  TRY(ort->GetTensorMutableData(o2, (void **)&c.pv));
  size_t cache = sizeof(float) * c.B * k->kv_heads * c.S * c.D;
  if (c.pk != p[3]) memcpy(c.pk, p[3], cache); /* present not bound to past: start from a copy */
  if (c.pv != p[4]) memcpy(c.pv, p[4], cache);
  TRY(ort->KernelContext_ParallelFor(ctx, write_kv, c.B * k->kv_heads, 0, &c));
  int64_t tb = k->amx ? 32 : 16; /* on tiles a task converts its row's K and V once: fewer, longer tasks */
  c.tblock = c.T <= tb ? c.T : tb;
  c.nblocks = (c.T + c.tblock - 1) / c.tblock;
  TRY(ort->KernelContext_ParallelFor(ctx, k->amx ? attend_amx : attend, c.B * k->kv_heads * c.nblocks, 0, &c));
  return c.oom ? ort->CreateStatus(ORT_FAIL, "GroupQueryAttention (specexport): out of memory for scratch") : NULL;
}

static OrtStatus *create(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info, void **out) {
  (void)op;
  (void)api;
  Kernel *k = calloc(1, sizeof(Kernel));
  OrtStatus *st = ort->KernelInfoGetAttribute_int64(info, "num_heads", &k->heads);
  if (!st) st = ort->KernelInfoGetAttribute_int64(info, "kv_num_heads", &k->kv_heads);
  if (st || k->heads <= 0 || k->kv_heads <= 0 || k->heads % k->kv_heads) {
    free(k);
    if (st) ort->ReleaseStatus(st);
    return fail("GroupQueryAttention (specexport): num_heads and kv_num_heads must be positive, num_heads a multiple");
  }
  if ((st = ort->KernelInfoGetAttribute_float(info, "scale", &k->scale))) ort->ReleaseStatus(st), k->scale = 0.0f;
  if ((st = ort->KernelInfoGetAttribute_int64(info, "do_rotary", &k->rotary))) ort->ReleaseStatus(st), k->rotary = 0;
  int64_t x = 0;
  if (!(st = ort->KernelInfoGetAttribute_int64(info, "rotary_interleaved", &x)) && x) {
    free(k);
    return fail("GroupQueryAttention (specexport): rotary_interleaved is not supported");
  }
  if (st) ort->ReleaseStatus(st);
  *out = k;
  return NULL;
}

/* gqa_amx_op's kernels: attend_amx */
static OrtStatus *create_amx(const OrtCustomOp *op, const OrtApi *api, const OrtKernelInfo *info, void **out) {
  OrtStatus *st = create(op, api, info, out);
  if (!st) ((Kernel *)*out)->amx = 1;
  return st;
}

static const char *name(const OrtCustomOp *op) { (void)op; return "GroupQueryAttention"; }
static ONNXTensorElementDataType in_type(const OrtCustomOp *op, size_t i) {
  (void)op;
  return i == 5 || i == 6 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 : i == 9 ? ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 : ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
}
static size_t in_count(const OrtCustomOp *op) { (void)op; return 11; }
static ONNXTensorElementDataType out_type(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT; }
static size_t out_count(const OrtCustomOp *op) { (void)op; return 3; }
static void destroy(void *k) { free(k); }
static OrtCustomOpInputOutputCharacteristic in_kind(const OrtCustomOp *op, size_t i) {
  (void)op;
  return i == 0 || i == 3 || i == 4 || i == 5 || i == 6 ? INPUT_OUTPUT_REQUIRED : INPUT_OUTPUT_OPTIONAL;
}
static OrtCustomOpInputOutputCharacteristic out_kind(const OrtCustomOp *op, size_t i) { (void)op; (void)i; return INPUT_OUTPUT_REQUIRED; }

extern OrtCustomOp specexport_matmul_op, specexport_matmul_bf16_op, specexport_matmul_dot_op, specexport_swiglu_op,
    specexport_swiglu_bf16_op, specexport_swiglu_dot_op; /* matmul.c */
int specexport_matmul_dot(void);
int specexport_matmul_amx(void);
extern OrtCustomOp specexport_matmul4_op; /* matmul4.c (AVX512-VNNI and AVX2 builds) */
int specexport_matmul4_on(void);

/* Whether a session gets matmul.c's MatMul: by default where this build has AVX-512; SPECEXPORT_MATMUL=0 off,
 * =1 on anywhere; bfloat16 weights (bf16 = 1) have no other kernel, so on anywhere unless turned off. The
 * runtime asks before it offers bf16 (kernels.matmul_on). */
int specexport_matmul_on(int bf16) {
  const char *mm = getenv("SPECEXPORT_MATMUL");
  if (mm && !strcmp(mm, "0")) return 0;
#if defined(__AVX512F__)
  return 1;
#else
  return bf16 || (mm && !strcmp(mm, "1"));
#endif
}

#define GQA_OP(CREATE)                                                                                   \
  {                                                                                                      \
    .version = API_VERSION, .GetName = name, .GetExecutionProviderType = provider, .GetInputType = in_type, \
    .GetInputTypeCount = in_count, .GetOutputType = out_type, .GetOutputTypeCount = out_count,             \
    .KernelDestroy = destroy, .GetInputCharacteristic = in_kind, .GetOutputCharacteristic = out_kind,      \
    .GetInputMemoryType = mem_type, .CreateKernelV2 = CREATE, .KernelComputeV2 = compute,                 \
  }
static OrtCustomOp gqa_op = GQA_OP(create), gqa_amx_op = GQA_OP(create_amx);

/* Whether a bf16dot session's attention runs on AMX tiles (gqa_amx.h): where its MatMuls do (SPECEXPORT_AMX not
 * 0, the tiles granted), unless SPECEXPORT_ATTENTION_AMX=0 (the float32 attention: another bf16dot target, to
 * compare). Read when a session is made; the runtime asks, to describe the target's numerics
 * (kernels.attention_amx). */
int specexport_attention_amx(void) {
  const char *e = getenv("SPECEXPORT_ATTENTION_AMX");
  return GQA_AMX && !(e && !strcmp(e, "0")) && specexport_matmul_dot() && specexport_matmul_amx();
}

/* the session option `key` into out (size 16), "" when it is not set (or too long to be one of ours) */
static void option(const OrtSessionOptions *options, const char *key, char out[16]) {
  size_t len = 16;
  OrtStatus *st = ort->GetSessionConfigEntry(options, key, out, &len);
  if (st) ort->ReleaseStatus(st), out[0] = 0;
}

OrtStatus *ORT_API_CALL RegisterCustomOps(OrtSessionOptions *options, const OrtApiBase *base) {
  ort = base->GetApi(API_VERSION);
  if (!ort) return NULL; /* the runtime is older than API 17: nothing registered, its own kernel runs */
  OrtCustomOpDomain *domain;
  char val[16] = "";
  option(options, "specexport.matmul_weights", val);
  int bf16 = !strcmp(val, "bf16"), dot = !strcmp(val, "bf16dot") && specexport_matmul_dot();
  TRY(ort->CreateCustomOpDomain("com.microsoft", &domain));
  /* a bf16dot session on AMX: the attention's products on the tiles too */
  int tiles = dot && specexport_matmul_on(1) && specexport_attention_amx();
  TRY(ort->CustomOpDomain_Add(domain, tiles ? &gqa_amx_op : &gqa_op));
  /* matmul4.c's MatMulNBits, for an int4 target with int8 activations (backends/ort.py asks for it) */
  char nbits[16] = "";
  option(options, "specexport.matmul_nbits", nbits);
#if defined(MATMUL4)
  if (!strcmp(nbits, "int8") && specexport_matmul4_on()) TRY(ort->CustomOpDomain_Add(domain, &specexport_matmul4_op));
#endif
  TRY(ort->AddCustomOpDomain(options, domain));
  /* matmul.c's MatMul, bfloat16 weights where the session's options ask for them (backend onnxruntime-bf16) */
  if (!specexport_matmul_on(bf16 || dot)) return NULL;
  OrtCustomOpDomain *onnx;
  TRY(ort->CreateCustomOpDomain("", &onnx));
  TRY(ort->CustomOpDomain_Add(onnx, dot ? &specexport_matmul_dot_op : bf16 ? &specexport_matmul_bf16_op : &specexport_matmul_op));
  TRY(ort->AddCustomOpDomain(options, onnx));
  /* MatMulSwiGLU in the same weight format (graphs built since 2026-12-05; a graph's own function definition runs
   * where this is not registered) */
  OrtCustomOpDomain *ours;
  TRY(ort->CreateCustomOpDomain("specexport", &ours));
  TRY(ort->CustomOpDomain_Add(ours, dot ? &specexport_swiglu_dot_op : bf16 ? &specexport_swiglu_bf16_op : &specexport_swiglu_op));
  return ort->AddCustomOpDomain(options, ours);
}
