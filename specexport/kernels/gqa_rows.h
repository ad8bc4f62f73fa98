/* attend_rows for one head size: included once per DV (head size / 16), which the includer defines, as a
 * function rows<DV> of its own, so that a query block's accumulators are registers; DV is undefined after. */
#define ROWS_CAT(a, b) a##b
#define ROWS_NAME(dv) ROWS_CAT(rows, dv)
/* One task's attention, head size D = 16 * DV: nq queries q [nq4, D] (nq4: nq rounded up to QB, the extra
 * rows zero), scratch scores sc [nq4, kpad] and kt [D, 16], keys [0, keys) of K and V [S, D]; len[i]: the
 * keys query i sees (causal); bias[i]: its additive bias row or NULL; its output at out + orow[i]. */
static void ROWS_NAME(DV)(const float *q, int64_t nq, float *sc, int64_t kpad, const float *K, const float *V,
                          int64_t keys, const int64_t *len, const float *const *bias, float *kt, float *out,
                          const int64_t *orow) {
  const int64_t D = 16 * DV, nq4 = (nq + QB - 1) / QB * QB;
  if (nq < 3 * QB) { /* few queries: a dot product per (query, key), each key read once for all */
    for (int64_t j = 0; j < keys; j++) {
      v16 kj[DV];
      for (int64_t c = 0; c < DV; c++) kj[c] = load(K + j * D + 16 * c);
      for (int64_t i = 0; i < nq; i++) {
        v16 a = {0}; /* from zero, so that each `+=` has one product to fuse: one FMA per term, the same
                      * in both paths whichever products a compiler would otherwise pick to fuse */
        for (int64_t c = 0; c < DV; c++) a += load(q + i * D + 16 * c) * kj[c];
        sc[i * kpad + j] = hsum(a);
      }
    }
  } else { /* many: 16 keys at a time transposed, so that a query's 16 scores are vectors of broadcast
            * products; the same sums as the dot products lane for lane (partial sums per lane l of the head,
            * then hsum's tree), so a token's scores do not depend on which path its call takes */
    for (int64_t j0 = 0; j0 < keys; j0 += 16) {
      int64_t m = keys - j0 < 16 ? keys - j0 : 16;
      for (int64_t jj = 0; jj < 16; jj++)
        for (int64_t d = 0; d < D; d++) kt[d * 16 + jj] = jj < m ? K[(j0 + jj) * D + d] : 0.0f;
      for (int64_t i = 0; i < nq; i++) {
        const float *qi = q + i * D;
        v16 p[16];
        for (int l = 0; l < 16; l++) p[l] = (v16){0};
        for (int64_t c = 0; c < DV; c++)
          for (int l = 0; l < 16; l++) p[l] += qi[16 * c + l] * load(kt + (16 * c + l) * 16);
        for (int l = 0; l < 8; l++) p[l] += p[l + 8];
        for (int l = 0; l < 4; l++) p[l] += p[l + 4];
        store(sc + i * kpad + j0, (p[0] + p[2]) + (p[1] + p[3]));
      }
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
    v16 mv = load(s);
    for (int64_t j = 16; j < kpad; j += 16) mv = sel(load(s + j) > mv, load(s + j), mv);
    float m = mv[0];
    for (int l = 1; l < 16; l++) m = mv[l] > m ? mv[l] : m;
    for (int64_t j = 0; j < kpad; j += 16) store(s + j, exp16(load(s + j) - m));
  }
  /* outputs: QB queries' sums of exp-weighted V rows in registers, and of the weights (in key order, so
   * that a tree's token sums the same terms in the same order as its decode call will), then divided */
  for (int64_t i = 0; i < nq4; i += QB) {
    v16 a[QB][DV];
    float z[QB] = {0};
    for (int r = 0; r < QB; r++)
      for (int64_t c = 0; c < DV; c++) a[r][c] = (v16){0};
    int64_t n = 0;
    for (int r = 0; r < QB && i + r < nq; r++) n = len[i + r] > n ? len[i + r] : n;
    for (int64_t j = 0; j < n; j++) {
      for (int r = 0; r < QB; r++) z[r] += sc[(i + r) * kpad + j];
      for (int64_t c = 0; c < DV; c++) {
        v16 v = load(V + j * D + 16 * c);
        for (int r = 0; r < QB; r++) a[r][c] += sc[(i + r) * kpad + j] * v;
      }
    }
    for (int r = 0; r < QB && i + r < nq; r++)
      for (int64_t c = 0; c < DV; c++) store(out + orow[i + r] + 16 * c, a[r][c] * (1.0f / z[r]));
  }
}
#undef DV
