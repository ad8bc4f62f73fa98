/* attend_rows for one head size: included once per DV (head size / 16), which the includer defines, as a
 * function rows<DV> of its own, so that a query block's accumulators are registers; DV is undefined after. */
#define ROWS_CAT(a, b) a##b
#define ROWS_NAME(dv) ROWS_CAT(rows, dv)
#define PV_NAME(dv) ROWS_CAT(pv, dv)
#define LANE2_NAME(dv) ROWS_CAT(lane2_, dv)
#define SCORE4_NAME(dv) ROWS_CAT(score4_, dv)
#define PAIR_NAME(dv) ROWS_CAT(pair_, dv)
#define OUT16_NAME(dv) ROWS_CAT(out16_, dv)

/* The outputs of PB queries (4; 2 at head sizes over 64 where AVX-512 is, so that the sums stay in registers):
 * sums of exp-weighted V rows, and of the weights, both in key order (so that a tree's token sums the same
 * terms in the same order as its decode call will), then divided. Query r's weight of key j is
 * w[r * si + j * sj]; the first cnt (<= PB) queries are stored. The head's columns of W floats go CW at a
 * time (all of them where AVX-512 is; 16 floats where AVX2 is, whose 16 registers hold 4 x 2 sums): every
 * output element is the same chain of multiply-adds either way. */
#define PB (W == 16 && DV > 4 ? 2 : 4)
#define CW (W == 16 ? DV : 2)
static inline void PV_NAME(DV)(const float *w, int64_t si, int64_t sj, int64_t cnt, const int64_t *len,
                               const float *V, float *out, const int64_t *orow) {
  const int64_t D = 16 * DV;
  int64_t n = 0;
  for (int r = 0; r < cnt; r++) n = len[r] > n ? len[r] : n;
  float z[PB] = {0};
  for (int64_t j = 0; j < n; j++)
    for (int r = 0; r < PB; r++) z[r] += w[r * si + j * sj];
  vw acc[PB][D / W];
  for (int r = 0; r < PB; r++)
    for (int64_t c = 0; c < D / W; c++) acc[r][c] = (vw){0};
  for (int64_t j0 = 0; j0 < n; j0 += PV_KEYS) { /* a block's V rows stay in L1 for the column passes */
    int64_t j1 = j0 + PV_KEYS < n ? j0 + PV_KEYS : n;
    for (int64_t c0 = 0; c0 < D / W; c0 += CW) {
      vw a[PB][CW];
      for (int r = 0; r < PB; r++)
        for (int64_t c = 0; c < CW; c++) a[r][c] = acc[r][c0 + c];
      for (int64_t j = j0; j < j1; j++) {
        vw wr[PB];
        for (int r = 0; r < PB; r++) wr[r] = (vw){0} + w[r * si + j * sj];
        for (int64_t c = 0; c < CW; c++) {
          vw v = loadw(V + j * D + W * (c0 + c));
          for (int r = 0; r < PB; r++) a[r][c] += wr[r] * v;
        }
      }
      for (int r = 0; r < PB; r++)
        for (int64_t c = 0; c < CW; c++) acc[r][c0 + c] = a[r][c];
    }
  }
  for (int r = 0; r < cnt; r++)
    for (int64_t c = 0; c < D / W; c++) storew(out + orow[r] + W * c, acc[r][c] * (1.0f / z[r]));
}

/* Scores of 16 queries (qt [D][16], lanes = queries) against four keys k[0..3], stored as s[16 i + lane]:
 * per lane l of the head, sum over c of q[16c + l] k[16c + l], then the lanes in hsum's tree
 * ((b0 + b4) + (b2 + b6)) + ((b1 + b5) + (b3 + b7)) with b_l = lane l + lane l + 8, in that order so that
 * few partial sums are live at once. The 16 queries are NG vectors of W lanes, and the keys go KP at a time
 * (4 where AVX-512 is; 2 where AVX2 is, so that 2 x 2 x 2 partial sums stay in its 16 registers, each key
 * element broadcast once for both halves of the queries): the same sums, lane for lane. */
#define KP (W == 16 ? 4 : 2)
#define NG (16 / W)
static inline void LANE2_NAME(DV)(const float *qt, const float *const *k, int l, vw (*b)[NG]) {
  vw p[KP][NG] = {{{0}}}, h[KP][NG] = {{{0}}};
  for (int64_t c = 0; c < DV; c++) {
    vw x[NG], y[NG];
    for (int g = 0; g < NG; g++)
      x[g] = loadw(qt + (16 * c + l) * 16 + W * g), y[g] = loadw(qt + (16 * c + l + 8) * 16 + W * g);
    for (int i = 0; i < KP; i++)
      for (int g = 0; g < NG; g++) p[i][g] += x[g] * k[i][16 * c + l], h[i][g] += y[g] * k[i][16 * c + l + 8];
  }
  for (int i = 0; i < KP; i++)
    for (int g = 0; g < NG; g++) b[i][g] = p[i][g] + h[i][g];
}

/* t = b_l + b_(l + 4) for the KP keys (LANE2's sums of lanes l and l + 4), the tree's first adds */
static inline void PAIR_NAME(DV)(const float *qt, const float *const *k, int l, vw (*t)[NG]) {
  vw b0[KP][NG], b1[KP][NG];
  LANE2_NAME(DV)(qt, k, l, b0);
  LANE2_NAME(DV)(qt, k, l + 4, b1);
  for (int i = 0; i < KP; i++)
    for (int g = 0; g < NG; g++) t[i][g] = b0[i][g] + b1[i][g];
}

static inline void SCORE4_NAME(DV)(const float *qt, const float *const *keys, float *s) {
  for (int i0 = 0; i0 < 4; i0 += KP) {
    const float *const *k = keys + i0;
    vw e0[KP][NG], e1[KP][NG], t[KP][NG];
    PAIR_NAME(DV)(qt, k, 0, e0);
    PAIR_NAME(DV)(qt, k, 2, t);
    for (int i = 0; i < KP; i++)
      for (int g = 0; g < NG; g++) e0[i][g] = e0[i][g] + t[i][g];
    PAIR_NAME(DV)(qt, k, 1, e1);
    PAIR_NAME(DV)(qt, k, 3, t);
    for (int i = 0; i < KP; i++)
      for (int g = 0; g < NG; g++) storew(s + 16 * (i0 + i) + W * g, e0[i][g] + (e1[i][g] + t[i][g]));
  }
}

/* The outputs of 16 queries (lanes) from their weights s [n][16] and the weights' sums z (in key order): per
 * W dims of the head and W of the queries (16 where AVX-512 is, else 8: W x W sums in registers), each
 * query's sum of weight * V element in key order (the same FMAs as PV's), divided. */
static inline void OUT16_NAME(DV)(const float *s, int64_t n, const vw *z, const float *V, int64_t cnt, float *out,
                                  const int64_t *orow) {
  const int64_t D = 16 * DV;
  vw rz[NG];
  for (int h = 0; h < NG; h++) rz[h] = 1.0f / z[h];
  for (int64_t d0 = 0; d0 < D; d0 += W)
    for (int g = 0; g < cnt; g += W) {
      vw o[W];
      for (int d = 0; d < W; d++) o[d] = (vw){0};
      for (int64_t j = 0; j < n; j++) {
        vw w = loadw(s + j * 16 + g);
        for (int d = 0; d < W; d++) o[d] += w * V[j * D + d0 + d];
      }
      for (int64_t r = 0; r < W && g + r < cnt; r++)
        for (int d = 0; d < W; d++) out[orow[g + r] + d0 + d] = o[d][r] * rz[g / W][r];
    }
}

/* One task's attention, head size D = 16 * DV: nq queries q [nq4, D] (nq4: nq rounded up to QB, the extra
 * rows zero), scratch scores sc [nq rounded up to 16, kpad] and qt [D, 16], keys [0, keys) of K and V [S, D];
 * len[i]: the keys query i sees (causal); bias[i]: its additive bias row or NULL; its output at out + orow[i].
 * A score is the same sum whichever path computes it: per lane l of the head, q[16c + l] k[16c + l] summed
 * over c from zero (so each `+=` has one product to fuse: one FMA per term), then the lanes as hsum's tree. */
static void ROWS_NAME(DV)(const float *q, int64_t nq, float *sc, int64_t kpad, const float *K, const float *V,
                          int64_t keys, const int64_t *len, const float *const *bias, float *qt, float *out,
                          const int64_t *orow) {
  const int64_t D = 16 * DV, nq4 = (nq + QB - 1) / QB * QB;
  if (nq < 3 * QB) { /* few queries (decode rows): a dot product per (query, key), each key read once */
    int64_t j = 0;
#if defined(__AVX512F__)
    for (; j + 16 <= keys; j += 16) /* 16 keys a query, their sums' trees together (hsum16) */
      for (int64_t i = 0; i < nq; i++) {
        v16 qi[DV], a[16];
        for (int64_t c = 0; c < DV; c++) qi[c] = load(q + i * D + 16 * c);
        for (int jj = 0; jj < 16; jj++) {
          a[jj] = (v16){0};
          for (int64_t c = 0; c < DV; c++) a[jj] += qi[c] * load(K + (j + jj) * D + 16 * c);
        }
        store(sc + i * kpad + j, hsum16(a));
      }
#endif
    for (; j < keys; j++) { /* a dot product per (query, key): lanes l and l + 8 apart where W is 8 */
      for (int64_t c = 0; c < D; c += 16) /* this key's V row, for the outputs' sums, and a later key's K row */
        __builtin_prefetch(V + j * D + c, 0, 2), __builtin_prefetch(K + (j + 8 < keys ? j + 8 : j) * D + c, 0, 3);
      for (int64_t i = 0; i < nq; i++) {
        vw a[NG] = {{0}};
        for (int64_t c = 0; c < DV; c++)
          for (int h = 0; h < NG; h++) a[h] += loadw(q + i * D + 16 * c + W * h) * loadw(K + j * D + 16 * c + W * h);
        sc[i * kpad + j] = hsumw(a);
      }
    }
    for (int64_t i = 0; i < nq4; i++) { /* softmax over each query's keys; rows past nq all zero */
      float *s = sc + i * kpad;
      int64_t n = i < nq ? len[i] : 0;
      if (n && bias[i])
        for (int64_t j = 0; j < n; j++) s[j] += bias[i][j];
      for (int64_t j = n; j < kpad; j++) s[j] = -INFINITY;
      if (!n) {
        memset(s, 0, kpad * sizeof(float));
        continue;
      }
      vw mv = loadw(s);
      for (int64_t j = W; j < kpad; j += W) mv = sel(loadw(s + j) > mv, loadw(s + j), mv);
      float m = mv[0];
      for (int l = 1; l < W; l++) m = mv[l] > m ? mv[l] : m;
      for (int64_t j = 0; j < kpad; j += W) storew(s + j, expw(loadw(s + j) - m));
    }
    for (int64_t i = 0; i < nq; i += PB)
      PV_NAME(DV)(sc + i * kpad, kpad, 1, nq - i < PB ? nq - i : PB, len + i, V, out, orow + i);
    return;
  }
  /* many (verify blocks, prefill chunks): 16 queries as the lanes of a vector (16 / W vectors of W), their q
   * transposed once (qt [D][16]); four keys at a time broadcast from the cache rows as they are read (score4);
   * the scores stay [key][16 queries] through the softmax and the outputs (out16) */
  const vw ninf = (vw){0} - INFINITY;
  for (int64_t g0 = 0; g0 < nq; g0 += 16) {
    int64_t cnt = nq - g0 < 16 ? nq - g0 : 16, n = 0, n0 = len[g0]; /* n0: keys every lane sees, unmasked */
    float *s = sc + g0 * kpad;
    iw lv[NG] = {{0}};
    int nobias = 1;
    for (int r = 0; r < cnt; r++) {
      lv[r / W][r % W] = (int)len[g0 + r];
      n = len[g0 + r] > n ? len[g0 + r] : n;
      n0 = len[g0 + r] < n0 ? len[g0 + r] : n0;
      nobias &= !bias[g0 + r];
    }
    for (int64_t d = 0; d < D; d++)
      for (int r = 0; r < 16; r++) qt[d * 16 + r] = r < cnt ? q[(g0 + r) * D + d] : 0.0f;
    vw mv[NG], z[NG];
    for (int h = 0; h < NG; h++) mv[h] = ninf, z[h] = (vw){0};
    for (int64_t j = 0; j < n; j += 4) { /* rows up to j + 3 < kpad are scratch; keys past n repeat n - 1 */
      const float *k[4];
      for (int i = 0; i < 4; i++) k[i] = K + (j + i < n ? j + i : n - 1) * D;
      SCORE4_NAME(DV)(qt, k, s + j * 16);
      if (j + 4 <= n0 && nobias) /* the softmax's largest score, as the scores come */
        for (int i = 0; i < 4; i++)
          for (int h = 0; h < NG; h++) {
            vw x = loadw(s + (j + i) * 16 + W * h);
            mv[h] = sel(x > mv[h], x, mv[h]);
          }
    }
    if (!nobias) { /* softmax over each lane's keys, as the few queries'; its largest score after the bias */
      for (int r = 0; r < cnt; r++)
        if (bias[g0 + r])
          for (int64_t j = 0; j < len[g0 + r]; j++) s[j * 16 + r] += bias[g0 + r][j];
      for (int64_t j = 0; j < n0; j++)
        for (int h = 0; h < NG; h++) {
          vw x = loadw(s + j * 16 + W * h);
          mv[h] = sel(x > mv[h], x, mv[h]);
        }
    }
    for (int64_t j = n0 / 4 * 4; j < n; j++)
      for (int h = 0; h < NG; h++) {
        vw x = sel((iw){0} + (int)j >= lv[h], ninf, loadw(s + j * 16 + W * h));
        storew(s + j * 16 + W * h, x);
        mv[h] = sel(x > mv[h], x, mv[h]);
      }
    for (int h = 0; h < NG; h++) mv[h] = sel(lv[h] == 0, (vw){0}, mv[h]); /* a padding lane: no keys, weights 0 */
    for (int64_t j = 0; j < n; j++) /* the weights, and their sums in key order */
      for (int h = 0; h < NG; h++) {
        vw e = expw(loadw(s + j * 16 + W * h) - mv[h]);
        storew(s + j * 16 + W * h, e);
        z[h] += e;
      }
    OUT16_NAME(DV)(s, n, z, V, cnt, out, orow + g0);
  }
}
#undef PB
#undef CW
#undef KP
#undef NG
#undef DV
