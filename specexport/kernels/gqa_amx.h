/* The attention on AMX tiles, for a bf16dot target on a CPU with amx_bf16 (gqa.c registers it in place of
 * attend() when the session's MatMuls run bf16dot on AMX): a task as attend()'s (one row, one KV head, a block of
 * new tokens), its products summed by TDPBF16PS, everything else float32.
 *
 * Numerics (one target, whatever the call): q (rotated, scaled), K, the softmax's weights and V are rounded to
 * bfloat16 (to nearest even) where the tiles multiply them.
 *  - Scores: a tile of 16 keys x 16 queries = K's rows x q's transposed pairs, over the head in 32-dim steps
 *    from 0; a key's score depends on that key and that query only.
 *  - Softmax: float32, as attend()'s many-query path (largest score, the weights' sum in key order, exp16).
 *  - Outputs: query i's keys [0, A_i) on tiles (16 queries x 16 dims += 16 queries x 32 keys' weights as pairs
 *    times 32 keys' V rows as pairs, in key order from 0; a query's weights of keys >= A_i are 0 there), then keys
 *    [A_i, len_i) as float32 FMAs in key order, carried on from the tile's sums. A_i = position_i + 1 - 16 (0 at
 *    least): a function of the query's own position, so its decode call and any verify call that holds it split
 *    its keys at the same place. Keys below A_i are the committed cache in every call (a tree's or chain's new
 *    tokens sit at most 15 deep: verify profiles up to T = 16), identical in both; the new tokens, where a
 *    tree's masked branches interleave zeros, are all in the float32 part, whose zero terms add nothing. A tile's
 *    sums are not a chain of roundings (each step sums 16 pairs its own way), so without that split a tree's rows
 *    would not score as their decode calls (deeper trees: the load's drift check finds it, and recycle drafts
 *    chains). Blocks of 32 keys are absolute (keys 32m..32m+31), so a query's terms sit at the same places in
 *    every call; blocks past its A_i add +0.
 * Cost: K and V are converted once per task (K to bfloat16 rows, V to pairs of rows); the scores and the
 * weighted sums of V then take ~1/16 the cycles of attend()'s FMAs; the softmax's exp is what remains. */
#include <immintrin.h>

/* r[i] (16 dwords each) transposed in place: r[i][j] <- r[j][i] */
static inline void transpose16(__m512i *r) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]), t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]), r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]), r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int b = 0; b < 4; b++) { /* r[4a + b]'s 128-bit lane L holds rows 4a..4a+3 of column 4L + b */
    __m512i u0 = _mm512_shuffle_i32x4(r[b], r[4 + b], 0x44), u1 = _mm512_shuffle_i32x4(r[b], r[4 + b], 0xee);
    __m512i u2 = _mm512_shuffle_i32x4(r[8 + b], r[12 + b], 0x44), u3 = _mm512_shuffle_i32x4(r[8 + b], r[12 + b], 0xee);
    t[b] = _mm512_shuffle_i32x4(u0, u2, 0x88), t[4 + b] = _mm512_shuffle_i32x4(u0, u2, 0xdd);
    t[8 + b] = _mm512_shuffle_i32x4(u1, u3, 0x88), t[12 + b] = _mm512_shuffle_i32x4(u1, u3, 0xdd);
  }
  for (int i = 0; i < 16; i++) r[i] = t[i];
}

/* 16 pairs (a[i], b[i]) as bfloat16, a in each dword's low half */
static inline __m512i pair16(v16 a, v16 b) {
  const __m512i mix = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                                       21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(mix, (__m512i)_mm512_cvtne2ps_pbh((__m512)b, (__m512)a));
}

/* n floats at x (a multiple of 16) as bfloat16 into h (to nearest even, as VCVTNE2PS2BF16), zeros up to m */
static inline void to_bf16_row(const float *x, int64_t n, uint16_t *h, int64_t m) {
  int64_t i = 0;
  for (; i + 32 <= n; i += 32)
    _mm512_storeu_si512(h + i, (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(x + i)));
  for (; i < n; i += 16) _mm256_storeu_si256((void *)(h + i), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + i)));
  for (; i < m; i++) h[i] = 0;
}

#define AMX_PV(G) /* tile numbers are literals (the intrinsics paste them) */ \
  do { _tile_loadd(5, vi + kb2 * 16 * D + 16 * (g0 + (G)), D * 4); _tile_dpbf16ps(G, 4, 5); } while (0)
#define AMX_STORE(G) _tile_stored(G, ob + 16 * (g0 + (G)), D * 4)

/* Task (b, kv head, block of tokens), as attend(): the attention of the block's tokens for the G query heads. */
static void attend_amx(void *arg, size_t task) {
  const Call *c = arg;
  const Kernel *k = c->k;
  int64_t G = k->heads / k->kv_heads, D = c->D, DP = (D + 31) & ~31, DG = D / 16;
  int64_t blk = task % c->nblocks, bh = task / c->nblocks, b = bh / k->kv_heads, h = bh % k->kv_heads;
  int64_t t0 = blk * c->tblock, t1 = t0 + c->tblock < c->T ? t0 + c->tblock : c->T, nt = t1 - t0;
  int64_t past = past_of(c, b), total = (int64_t)c->seqlens[b] + 1, nq = nt * G, nq16 = (nq + 15) & ~15;
  int64_t keys = c->prompt ? (t1 < total ? t1 : total) : past + t1, kpad = (keys + 31) & ~31;
  const float *K = c->pk + (b * k->kv_heads + h) * c->S * D, *V = c->pv + (b * k->kv_heads + h) * c->S * D;
  /* scratch: q [nq16][D] f32, scores [kpad][16] f32, K [kpad][DP] bf16, V pairs [kpad/2][D] u32, q pairs
   * [DP/32][16][16] u32, weights as pairs [2][16][16] u32 (two blocks of 32 keys), outputs [16][D] f32 (each a
   * multiple of 64 B) */
  size_t fq = nq16 * D, fs = kpad * 16, fk = kpad * DP / 2, fv = kpad / 2 * D, fqt = DP / 32 * 256, fo = 16 * D;
  float *q = scratch(sizeof(float) * (fq + fs + fk + fv + fqt + 512 + fo));
  if (!q) {
    ((Call *)c)->oom = 1;
    return;
  }
  float *s = q + fq, *ob = s + fs + fk + fv + fqt + 512;
  uint16_t *kb = (uint16_t *)(s + fs);
  uint32_t *vi = (uint32_t *)(s + fs + fk), *qt = vi + fv, *pa = qt + fqt;
  int64_t len[nq16], orow[nq16], cut[nq16]; /* cut: A_i above */
  const float *bias[nq16];
  queries(c, b, h, t0, t1, q, len, orow, bias, cut);
  for (int64_t i = 0; i < nq; i++) { /* from the position to A_i (a prompt's padded rows see fewer keys than it) */
    cut[i] = cut[i] + 1 - 16 > 0 ? cut[i] + 1 - 16 : 0;
    cut[i] = cut[i] < len[i] ? cut[i] : len[i];
  }
  int64_t cmax = 0, n = 0;
  for (int64_t i = 0; i < nq; i++) cmax = cut[i] > cmax ? cut[i] : cmax, n = len[i] > n ? len[i] : n;
  int64_t n32 = (n + 31) & ~31; /* the scores take 32 keys at a time */
  for (int64_t j = 0; j < n32; j++) /* K's rows as bfloat16 (zeros past the keys and the head) */
    to_bf16_row(K + j * D, j < keys ? D : 0, kb + j * DP, DP);
  /* V's rows as pairs: dword d of pair j/2 = (V[j][d], V[j + 1][d]); zeros from cmax to the block's end (their
   * weights are 0, and 0 x a stale slot's NaN would not be) */
  for (int64_t j = 0; j < (cmax + 31) / 32 * 32; j += 2)
    for (int64_t g = 0; g < DG; g++) {
      v16 v0 = j < cmax ? load(V + j * D + 16 * g) : (v16){0}, v1 = j + 1 < cmax ? load(V + (j + 1) * D + 16 * g) : (v16){0};
      _mm512_storeu_si512(vi + j / 2 * D + 16 * g, pair16(v0, v1));
    }
  TileConfig cfg = {.palette = 1};
  for (int t = 0; t < 8; t++) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  _tile_loadconfig(&cfg);
  const v16 ninf = (v16){0} - INFINITY;
  for (int64_t g0q = 0; g0q < nq; g0q += 16) {
    int64_t cnt = nq - g0q < 16 ? nq - g0q : 16, gn = 0, n0 = len[g0q];
    i16 lv = {0}, av = {0};
    int nobias = 1;
    for (int r = 0; r < cnt; r++) {
      lv[r] = (int)len[g0q + r], av[r] = (int)cut[g0q + r];
      gn = len[g0q + r] > gn ? len[g0q + r] : gn;
      n0 = len[g0q + r] < n0 ? len[g0q + r] : n0;
      nobias &= !bias[g0q + r];
    }
    /* q's pairs, transposed: qt[c][p][r] = (q[r][32c + 2p], q[r][32c + 2p + 1]), zeros past cnt and the head */
    memset(qt, 0, sizeof(uint32_t) * fqt);
    for (int r = 0; r < cnt; r++) {
      uint16_t hq[DP];
      to_bf16_row(q + (g0q + r) * D, D, hq, DP);
      for (int64_t p = 0; p < DP / 2; p++) qt[(p / 16) * 256 + (p % 16) * 16 + r] = hq[2 * p] | (uint32_t)hq[2 * p + 1] << 16;
    }
    switch (DP / 32) { /* tiles 2.. hold q's pairs for the whole pass over the keys */
    case 4: _tile_loadd(5, qt + 3 * 256, 64); /* fall through */
    case 3: _tile_loadd(4, qt + 2 * 256, 64); /* fall through */
    case 2: _tile_loadd(3, qt + 256, 64); /* fall through */
    default: _tile_loadd(2, qt, 64);
    }
    /* scores [key][16 queries], two 16-key blocks in flight (sums in tiles 0 and 6, keys in 1 and 7), each
     * block's rows masked (keys past a query's length: -inf; a tree's bias added) and taken into the
     * softmax's largest score while in cache */
    v16 mv = ninf, z = {0};
    for (int64_t j0 = 0; j0 < gn + 32; j0 += 32) {
      if (j0 < gn) {
        _tile_zero(0);
        _tile_zero(6);
        for (int64_t cc = 0; cc < DP / 32; cc++) {
          _tile_loadd(1, kb + j0 * DP + 32 * cc, DP * 2);
          _tile_loadd(7, kb + (j0 + 16) * DP + 32 * cc, DP * 2);
          switch (cc) { /* q's pairs for dims 32 cc.. are in tile 2 + cc (literal tile numbers) */
          case 0: _tile_dpbf16ps(0, 1, 2); _tile_dpbf16ps(6, 7, 2); break;
          case 1: _tile_dpbf16ps(0, 1, 3); _tile_dpbf16ps(6, 7, 3); break;
          case 2: _tile_dpbf16ps(0, 1, 4); _tile_dpbf16ps(6, 7, 4); break;
          default: _tile_dpbf16ps(0, 1, 5); _tile_dpbf16ps(6, 7, 5);
          }
        }
        _tile_stored(0, s + j0 * 16, 64);
        _tile_stored(6, s + (j0 + 16) * 16, 64);
      }
      if (j0 == 0) continue; /* the block before: its tile stores have landed while these ran */
      int64_t ja = j0 - 32, jb = j0 < gn ? j0 : gn;
      if (!nobias)
        for (int r = 0; r < cnt; r++)
          if (bias[g0q + r])
            for (int64_t j = ja; j < jb && j < len[g0q + r]; j++) s[j * 16 + r] += bias[g0q + r][j];
      for (int64_t j = ja; j < jb; j++) {
        v16 x = load(s + j * 16);
        if (j >= n0) /* some query's keys end before j */
          x = sel((i16){0} + (int)j >= lv, ninf, x), store(s + j * 16, x);
        mv = (v16)_mm512_max_ps((__m512)x, (__m512)mv);
      }
    }
    mv = sel(lv == 0, (v16){0}, mv);
    for (int64_t j = 0; j < gn; j++) { /* the weights; their sum in key order (one chain: a tree's new tokens
                                          * sit at other slots than once committed, so no split by slot) */
      v16 e = exp16(load(s + j * 16) - mv);
      store(s + j * 16, e);
      z += e;
    }
    /* keys [0, cut) on tiles, 32 at a time: the weights as pairs, transposed to [query][pair] */
    int64_t gc = 0, amin = av[0];
    for (int r = 0; r < cnt; r++) gc = av[r] > gc ? av[r] : gc, amin = av[r] < amin ? av[r] : amin;
    int64_t nb = (gc + 31) / 32;
    for (int64_t g0 = 0; g0 < DG; g0 += 4) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t kb2 = -1; kb2 < nb; kb2++) {
        if (kb2 + 1 < nb) { /* the next block's weights, made while this one's run on the tiles */
          __m512i w[16]; /* (over 4 x 16 dims, D > 64, the same block is made again: the same bits) */
          int64_t j0 = (kb2 + 1) * 32;
          if (j0 + 32 <= amin) /* every query's tile part holds the whole block */
            for (int p = 0; p < 16; p++) w[p] = pair16(load(s + (j0 + 2 * p) * 16), load(s + (j0 + 2 * p + 1) * 16));
          else
            for (int p = 0; p < 16; p++) {
              int64_t j = j0 + 2 * p;
              v16 e0 = sel((i16){0} + (int)j < av, load(s + j * 16), (v16){0});
              v16 e1 = sel((i16){0} + (int)(j + 1) < av, load(s + (j + 1) * 16), (v16){0});
              w[p] = pair16(e0, e1);
            }
          transpose16(w);
          for (int r = 0; r < 16; r++) _mm512_storeu_si512(pa + ((kb2 + 1) & 1) * 256 + r * 16, w[r]);
        }
        if (kb2 < 0) continue;
        _tile_loadd(4, pa + (kb2 & 1) * 256, 64);
        AMX_PV(0);
        if (g0 + 1 < DG) AMX_PV(1);
        if (g0 + 2 < DG) AMX_PV(2);
        if (g0 + 3 < DG) AMX_PV(3);
      }
      AMX_STORE(0);
      if (g0 + 1 < DG) AMX_STORE(1);
      if (g0 + 2 < DG) AMX_STORE(2);
      if (g0 + 3 < DG) AMX_STORE(3);
    }
    /* keys [cut, len) in float32, carried on from the tiles' sums; then divided by the weights' sum */
    for (int r = 0; r < cnt; r++) {
      v16 o[8];
      for (int64_t g = 0; g < DG; g++) o[g] = load(ob + r * D + 16 * g);
      for (int64_t j = av[r]; j < lv[r]; j++) {
        v16 w = (v16){0} + s[j * 16 + r];
        for (int64_t g = 0; g < DG; g++) o[g] += w * load(V + j * D + 16 * g);
      }
      for (int64_t g = 0; g < DG; g++) store(c->out + orow[g0q + r] + 16 * g, o[g] * (1.0f / z[r]));
    }
  }
  _tile_release();
}
#undef AMX_PV
#undef AMX_STORE
