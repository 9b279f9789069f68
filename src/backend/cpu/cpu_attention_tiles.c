/* cpu_attention_tiles.c — one head's causal attention products in register tiles (float32).
 *
 * Why: as GEMMs, one (sample, head) of gpt_tiny (T = 128, d = 32) is 24 library calls of a few
 * hundred thousand FLOPs each, forward and backward, about 6,000 a step; at that size the
 * library's dispatch, its packing and the masked half's blocks (5/8 of the square done at 32-row
 * blocks) cost as much as the products: attention took 4.5 ms a layer on the AVX-512 Xeon of
 * docs/PERFORMANCE.md for 252 MFLOP. Here a tile of rows × two vectors of columns stays in
 * registers through the whole sum, operands read where qkv holds them (the one exception: kᵀ and
 * vᵀ, transposed once per head into the caller's scratch), and a tile of rows t0 .. t0 + R reads
 * only columns up to its last row's diagonal, rounded up to a vector: about 9/16 of the square at
 * T = 128.
 *
 * The three products, each sum over its index ascending, in float with fused multiply-adds where
 * the CPU has them (as the GEMM library's kernels; this file alone is compiled with
 * -ffp-contract=fast, see CMakeLists.txt), the factor applied to the finished sum:
 *   cpu_att_rows_dot   out[t, s] = f · Σ_k x[t, k] · yt[k, s]   (scores q·kᵀ/√d; d att = dy·vᵀ)
 *   cpu_att_rows_mul   out[t, c] = f · Σ_s a[t, s] · v[s, c]    (y = att·v; dq = ds·k/√d)
 *   cpu_att_cols_mul   out[s, c] = f · Σ_t a[t, s] · v[t, c]    (dv = attᵀ·dy; dk = dsᵀ·q/√d)
 * over s ≤ t only where a row's causal range ends (the rest of a is 0: the softmax and its
 * backward write 0 above the diagonal, so leaving those terms out changes no sum but the sign of a
 * zero). A sum's order depends on T and d alone, never on the batch, the tile an element falls in
 * being a function of its row: a sample computes the same bits in any batch and on any replica. */
#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/cpu_vec.h"

/* Rows a tile keeps: with 32 vector registers (AVX-512) 8 rows × 2 vectors of sums plus the
 * operands; with 16, 4 rows. */
#if CPU_VEC_LANES == 16
#define ROWS 8
#else
#define ROWS 4
#endif
#define VECS 2

#define INLINE static inline __attribute__((always_inline))

/* One vector past a multiple of lanes, bounded by n: the vectors' part of columns [0, end). */
static int64_t vector_end(int64_t end, int64_t n)
{
    const int64_t up = (end + CPU_VEC_LANES - 1) / CPU_VEC_LANES * CPU_VEC_LANES, whole = n - n % CPU_VEC_LANES;
    return up < whole ? up : whole;
}

/* ---- out[t, s] = f · Σ_k x[t, k] · yt[k, s]: rows t0 .. t0 + rows, columns [0, cols) */

/* `rows` × `vecs` vectors of columns from s0 (both constants where called: the sums stay in registers) */
INLINE void dot_tile(const int rows, const int vecs, const float *x, int64_t ldx, const float *yt, int64_t ldy,
                     int64_t k_n, float f, float *out, int64_t ldo, int64_t t0, int64_t s0)
{
    cpu_vec acc[ROWS][VECS];
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < vecs; v++) acc[r][v] = CPU_VEC_ZERO;
    for (int64_t k = 0; k < k_n; k++) {
        const float *yk = yt + k * ldy + s0;
        cpu_vec b[VECS];
        for (int v = 0; v < vecs; v++) b[v] = cpu_vec_load(yk + v * CPU_VEC_LANES);
        for (int r = 0; r < rows; r++) {
            const float a = x[(t0 + r) * ldx + k];
            for (int v = 0; v < vecs; v++) acc[r][v] += a * b[v];
        }
    }
    for (int r = 0; r < rows; r++)
        for (int v = 0; v < vecs; v++) cpu_vec_store(out + (t0 + r) * ldo + s0 + v * CPU_VEC_LANES, f * acc[r][v]);
}

/* rows t0 .. t0 + rows (a constant where called), columns [0, cols) */
INLINE void dot_rows(const int rows, const float *x, int64_t ldx, const float *yt, int64_t ldy, int64_t k_n, float f,
                     float *out, int64_t ldo, int64_t t0, int64_t cols, int64_t n)
{
    const int64_t vend = vector_end(cols, n);
    int64_t s = 0;
    for (; s + VECS * CPU_VEC_LANES <= vend; s += VECS * CPU_VEC_LANES)
        dot_tile(rows, VECS, x, ldx, yt, ldy, k_n, f, out, ldo, t0, s);
    for (; s < vend; s += CPU_VEC_LANES) dot_tile(rows, 1, x, ldx, yt, ldy, k_n, f, out, ldo, t0, s);
    for (; s < cols; s++) /* past the last whole vector of a row of n */
        for (int r = 0; r < rows; r++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < k_n; k++) acc += x[(t0 + r) * ldx + k] * yt[k * ldy + s];
            out[(t0 + r) * ldo + s] = f * acc;
        }
}

void cpu_att_rows_dot(const float *x, int64_t ldx, const float *yt, int64_t ldy, int64_t k_n, float f, float *out,
                      int64_t ldo, int64_t t0, int64_t t1, int64_t n)
{
    int64_t t = t0;
    for (; t + ROWS <= t1; t += ROWS) dot_rows(ROWS, x, ldx, yt, ldy, k_n, f, out, ldo, t, t + ROWS, n);
    for (; t < t1; t++) dot_rows(1, x, ldx, yt, ldy, k_n, f, out, ldo, t, t + 1, n);
}

/* ---- out[r, c] = f · Σ_{i0 ≤ i < i1} w[i·wi + r·wr] · v[i, c], rows r of a tile: a row's sum of
 * v's rows weighted by a row of a (att·v: w = a's rows, wi = 1, wr = lda) or by a column of it
 * (attᵀ·v: w = a's columns, wi = lda, wr = 1) */

INLINE void sum_tile(const int rows, const int vecs, const float *w, int64_t wi, int64_t wr, const float *v,
                     int64_t ldv, int64_t i0, int64_t i1, float f, float *out, int64_t ldo, int64_t c0)
{
    cpu_vec acc[ROWS][VECS];
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < vecs; j++) acc[r][j] = CPU_VEC_ZERO;
    for (int64_t i = i0; i < i1; i++) {
        cpu_vec b[VECS];
        for (int j = 0; j < vecs; j++) b[j] = cpu_vec_load(v + i * ldv + c0 + j * CPU_VEC_LANES);
        for (int r = 0; r < rows; r++) {
            const float weight = w[i * wi + r * wr];
            for (int j = 0; j < vecs; j++) acc[r][j] += weight * b[j];
        }
    }
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < vecs; j++) cpu_vec_store(out + r * ldo + c0 + j * CPU_VEC_LANES, f * acc[r][j]);
}

/* a tile's rows, columns [0, width) */
INLINE void sum_rows(const int rows, const float *w, int64_t wi, int64_t wr, const float *v, int64_t ldv, int64_t i0,
                     int64_t i1, int64_t width, float f, float *out, int64_t ldo)
{
    const int64_t whole = width - width % CPU_VEC_LANES;
    int64_t c = 0;
    for (; c + VECS * CPU_VEC_LANES <= whole; c += VECS * CPU_VEC_LANES)
        sum_tile(rows, VECS, w, wi, wr, v, ldv, i0, i1, f, out, ldo, c);
    for (; c < whole; c += CPU_VEC_LANES) sum_tile(rows, 1, w, wi, wr, v, ldv, i0, i1, f, out, ldo, c);
    for (; c < width; c++)
        for (int r = 0; r < rows; r++) {
            float acc = 0.0f;
            for (int64_t i = i0; i < i1; i++) acc += w[i * wi + r * wr] * v[i * ldv + c];
            out[r * ldo + c] = f * acc;
        }
}

/* rows t: s < the tile's end (its last row's diagonal) */
void cpu_att_rows_mul(const float *a, int64_t lda, const float *v, int64_t ldv, int64_t width, float f, float *out,
                      int64_t ldo, int64_t t0, int64_t t1)
{
    int64_t t = t0;
    for (; t + ROWS <= t1; t += ROWS)
        sum_rows(ROWS, a + t * lda, 1, lda, v, ldv, 0, t + ROWS, width, f, out + t * ldo, ldo);
    for (; t < t1; t++) sum_rows(1, a + t * lda, 1, lda, v, ldv, 0, t + 1, width, f, out + t * ldo, ldo);
}

/* rows s: t from the tile's first row */
void cpu_att_cols_mul(const float *a, int64_t lda, const float *v, int64_t ldv, int64_t width, float f, float *out,
                      int64_t ldo, int64_t n)
{
    int64_t s = 0;
    for (; s + ROWS <= n; s += ROWS) sum_rows(ROWS, a + s, lda, 1, v, ldv, s, n, width, f, out + s * ldo, ldo);
    for (; s < n; s++) sum_rows(1, a + s, lda, 1, v, ldv, s, n, width, f, out + s * ldo, ldo);
}

/* By blocks of 16 × 16, which stay in the cache's lines both ways (a row of xt at a time wrote a
 * line per element and took as long as the products) */
void cpu_att_transpose(const float *x, int64_t ldx, int64_t rows, int64_t cols, float *xt)
{
    enum { B = 16 };
    for (int64_t r0 = 0; r0 < rows; r0 += B)
        for (int64_t c0 = 0; c0 < cols; c0 += B) {
            const int64_t r1 = r0 + B < rows ? r0 + B : rows, c1 = c0 + B < cols ? c0 + B : cols;
            for (int64_t c = c0; c < c1; c++)
                for (int64_t r = r0; r < r1; r++) xt[c * rows + r] = x[r * ldx + c];
        }
}
