/* attend_rows in bfloat16 (the bf16dot format) for one head size: included once per DV (head size / 16), as a
 * function dot<DV>. The same two paths as gqa_rows.h and the same float32 softmax; what differs is what
 * the two products multiply: q and K rounded to bfloat16 pairs of head dims for the scores, the softmax's
 * weights and V rounded to bfloat16 pairs of keys for the outputs, each pair multiplied and added by one
 * VDPBF16PS lane. A task rounds its K and V rows once (kb, vb) and both paths read those, so a score or an
 * output takes the same operands, lane for lane and in the same order, whichever path computes it (a verify
 * row still scores exactly as its decode row). DV is undefined after. */
#define DOT_CAT(a, b) a##b
#define DOT_NAME(dv) DOT_CAT(dot, dv)
#define DPV_NAME(dv) DOT_CAT(dpv, dv)
#define DLANE2_NAME(dv) DOT_CAT(dlane2_, dv)
#define DSCORE4_NAME(dv) DOT_CAT(dscore4_, dv)
#define DV2 ((DV + 1) / 2) /* vectors of 16 pairs per head row (an odd DV's last one half zeros) */

/* PB queries' outputs from their weights as pairs of keys (query r's pair jp at w[r * si + jp * sj]) and the
 * keys' V pairs vb [jp][D] (vb NULL: made from V's rows as they are read, keys of them; the same pairs): per
 * head dim (the lanes), the pairs' products summed in key order, divided by z[r] (the weights' float32 sum).
 * Both paths run it: a pair of weights is broadcast once for DV vectors of dims. */
#define PB (DV > 4 ? 2 : 4)
static inline __attribute__((always_inline)) void DPV_NAME(DV)(const uint32_t *w, int64_t si, int64_t sj, int64_t cnt,
                                                                const int64_t *len, const float *z, const uint32_t *vb,
                                                                const float *V, int64_t keys, float *out,
                                                                const int64_t *orow) {
  const int64_t D = 16 * DV;
  v16 a[PB][DV];
  for (int r = 0; r < PB; r++)
    for (int64_t c = 0; c < DV; c++) a[r][c] = (v16){0};
  int64_t n = 0;
  for (int r = 0; r < cnt; r++) n = len[r] > n ? len[r] : n;
  for (int64_t jp = 0; jp < (n + 1) / 2; jp++) {
    v16 wr[PB];
    for (int r = 0; r < PB; r++) wr[r] = bcast32(w + r * si + jp * sj);
    const float *v0 = V + 2 * jp * D, *v1 = 2 * jp + 1 < keys ? v0 + D : NULL;
    for (int64_t c = 0; c < DV; c++) {
      v16 v = vb ? load((const float *)(vb + jp * D + 16 * c)) : pair16(v0 + 16 * c, v1 ? v1 + 16 * c : NULL);
      for (int r = 0; r < PB; r++) a[r][c] = dp(a[r][c], wr[r], v);
    }
  }
  for (int r = 0; r < cnt; r++)
    for (int64_t c = 0; c < DV; c++) store(out + orow[r] + 16 * c, a[r][c] * (1.0f / z[r]));
}

/* As gqa_rows.h's lane2, on pairs: lanes l and l + 8 of 16 queries' scores against four keys, qt [P][16]
 * (pairs, lanes = queries), keys as rows of pairs */
static inline __attribute__((always_inline)) void DLANE2_NAME(DV)(const uint32_t *qt, const uint32_t *const *k, int l, v16 *b) {
  v16 p[4] = {{0}}, h[4] = {{0}};
  for (int64_t c = 0; c < DV2; c++) {
    v16 x = load((const float *)(qt + (16 * c + l) * 16)), y = load((const float *)(qt + (16 * c + l + 8) * 16));
    for (int i = 0; i < 4; i++) p[i] = dp(p[i], x, bcast32(k[i] + 16 * c + l)), h[i] = dp(h[i], y, bcast32(k[i] + 16 * c + l + 8));
  }
  for (int i = 0; i < 4; i++) b[i] = p[i] + h[i];
}

static inline __attribute__((always_inline)) void DSCORE4_NAME(DV)(const uint32_t *qt, const uint32_t *const *k, float *s) {
  v16 b0[4], b1[4], e0[4], e1[4];
  DLANE2_NAME(DV)(qt, k, 0, b0);
  DLANE2_NAME(DV)(qt, k, 4, b1);
  for (int i = 0; i < 4; i++) e0[i] = b0[i] + b1[i];
  DLANE2_NAME(DV)(qt, k, 2, b0);
  DLANE2_NAME(DV)(qt, k, 6, b1);
  for (int i = 0; i < 4; i++) e0[i] = e0[i] + (b0[i] + b1[i]);
  DLANE2_NAME(DV)(qt, k, 1, b0);
  DLANE2_NAME(DV)(qt, k, 5, b1);
  for (int i = 0; i < 4; i++) e1[i] = b0[i] + b1[i];
  DLANE2_NAME(DV)(qt, k, 3, b0);
  DLANE2_NAME(DV)(qt, k, 7, b1);
  for (int i = 0; i < 4; i++) store(s + 16 * i, e0[i] + (e1[i] + (b0[i] + b1[i])));
}

/* One task's attention as gqa_rows.h's rows<DV> (same arguments), products in bfloat16 pairs. Its scratch
 * also holds kb [keys][P] and vb [(keys + 1) / 2][D] (`kv`: P = 16 DV2 words per row, the D / 2 pairs of head
 * dims then zeros). */
static void DOT_NAME(DV)(const float *q, int64_t nq, float *sc, int64_t kpad, const float *K, const float *V,
                         int64_t keys, const int64_t *len, const float *const *bias, float *qt_, float *out,
                         const int64_t *orow, uint32_t *kv) {
  const int64_t D = 16 * DV, P = 16 * DV2, nq4 = (nq + QB - 1) / QB * QB;
  uint32_t *kb = kv, *vb = kv + keys * P, *qt = (uint32_t *)qt_;
  /* q as pairs, in place: row i's P (<= D) words over its D floats (each 16 read before 8 words are written) */
  uint32_t *qb = (uint32_t *)q;
  for (int64_t i = 0; i < nq4; i++) pairs_of(q + i * D, D, P, (uint32_t *)(q + i * D));
  if (nq < 3 * QB) { /* few queries: a dot product per (query, key); K's and V's pairs made as they are read */
    float z[nq4];
    for (int64_t j = 0; j < keys; j++) {
      v16 kj[DV2];
      for (int64_t c = 0; c < DV2; c++) kj[c] = dims16(K + j * D + 32 * c, 32 * c + 16 < D);
      for (int64_t i = 0; i < nq; i++) {
        v16 a = {0};
        for (int64_t c = 0; c < DV2; c++) a = dp(a, load((const float *)(qb + i * D + 16 * c)), kj[c]);
        sc[i * kpad + j] = hsum(a);
      }
    }
    for (int64_t i = 0; i < nq4; i++) { /* softmax over each query's keys; rows past nq all zero */
      float *s = sc + i * kpad;
      int64_t n = i < nq ? len[i] : 0;
      z[i] = 1.0f;
      if (n && bias[i])
        for (int64_t j = 0; j < n; j++) s[j] += bias[i][j];
      for (int64_t j = n; j < kpad; j++) s[j] = -INFINITY;
      if (!n) {
        memset(s, 0, kpad * sizeof(float));
        continue;
      }
      v16 mv = load(s);
      for (int64_t j = 16; j < kpad; j += 16) mv = sel(load(s + j) > mv, load(s + j), mv);
      float m = mv[0];
      for (int l = 1; l < 16; l++) m = mv[l] > m ? mv[l] : m;
      for (int64_t j = 0; j < kpad; j += 16) store(s + j, exp16(load(s + j) - m));
      z[i] = 0.0f; /* in key order, as the many-query path's lanes sum them */
      for (int64_t j = 0; j < n; j++) z[i] += s[j];
      pairs_of(s, kpad, kpad / 2, (uint32_t *)s); /* the weights as pairs of keys, in place */
    }
    for (int64_t i = 0; i < nq; i += PB)
      DPV_NAME(DV)((const uint32_t *)(sc + i * kpad), kpad, 1, nq - i < PB ? nq - i : PB, len + i, z + i, NULL, V,
                   keys, out, orow + i);
    return;
  }
  /* many queries: K's and V's pairs made once for the task's groups of 16 */
  for (int64_t j = 0; j < keys; j++) pairs_of(K + j * D, D, P, kb + j * P);
  for (int64_t j = 0; j < keys; j += 2) keypairs(V + j * D, j + 1 < keys ? V + (j + 1) * D : NULL, D, vb + j / 2 * D);
  const v16 ninf = (v16){0} - INFINITY;
  for (int64_t g0 = 0; g0 < nq; g0 += 16) {
    int64_t cnt = nq - g0 < 16 ? nq - g0 : 16, n = 0, n0 = len[g0];
    float *s = sc + g0 * kpad;
    i16 lv = {0};
    int nobias = 1;
    for (int r = 0; r < cnt; r++) {
      lv[r] = (int)len[g0 + r];
      n = len[g0 + r] > n ? len[g0 + r] : n;
      n0 = len[g0 + r] < n0 ? len[g0 + r] : n0;
      nobias &= !bias[g0 + r];
    }
    for (int64_t p = 0; p < P; p++)
      for (int r = 0; r < 16; r++) qt[p * 16 + r] = r < cnt ? qb[(g0 + r) * D + p] : 0;
    v16 mv = ninf, z = {0};
    for (int64_t j = 0; j < n; j += 4) {
      const uint32_t *k[4];
      for (int i = 0; i < 4; i++) k[i] = kb + (j + i < n ? j + i : n - 1) * P;
      DSCORE4_NAME(DV)(qt, k, s + j * 16);
      if (j + 4 <= n0 && nobias)
        for (int i = 0; i < 4; i++) mv = sel(load(s + (j + i) * 16) > mv, load(s + (j + i) * 16), mv);
    }
    if (!nobias) {
      for (int r = 0; r < cnt; r++)
        if (bias[g0 + r])
          for (int64_t j = 0; j < len[g0 + r]; j++) s[j * 16 + r] += bias[g0 + r][j];
      for (int64_t j = 0; j < n0; j++) mv = sel(load(s + j * 16) > mv, load(s + j * 16), mv);
    }
    for (int64_t j = n0 / 4 * 4; j < n; j++) {
      v16 x = sel((i16){0} + (int)j >= lv, ninf, load(s + j * 16));
      store(s + j * 16, x);
      mv = sel(x > mv, x, mv);
    }
    mv = sel(lv == 0, (v16){0}, mv);
    for (int64_t j = 0; j < n; j++) {
      v16 e = exp16(load(s + j * 16) - mv);
      store(s + j * 16, e);
      z += e;
    }
    if (n & 1) store(s + n * 16, (v16){0}); /* the last pair's second key: weight 0 */
    for (int64_t jp = 0; jp < (n + 1) / 2; jp++) /* [key][16] to [pair][16], in place */
      interleave(s + 2 * jp * 16, s + (2 * jp + 1) * 16, (uint32_t *)(s + jp * 16));
    float zs[16];
    store(zs, z);
    for (int64_t r = 0; r < cnt; r += PB) /* lane r's pair jp at [jp][r] */
      DPV_NAME(DV)((const uint32_t *)s + r, 1, 16, cnt - r < PB ? cnt - r : PB, len + g0 + r, zs + r, vb, V, keys, out,
                   orow + g0 + r);
  }
}
#undef PB
#undef DV2
#undef DV
