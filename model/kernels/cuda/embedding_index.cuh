/* embedding_backward from an index of the positions of each token, built on the device. Included
 * by embedding.cu, in its anonymous namespace.
 *
 * dtable[tok, c] += scale·dout[i, c] over the positions i of tok in increasing order — the CPU's
 * order of additions, so the result is the CPU's bit for bit. The older kernel (emb_bwd_kernel)
 * had each (tok, c) owner walk every token of the batch; here the positions are sorted by token
 * first, stably and without atomics, so each token's owner walks only its own positions:
 *   1. tiles of kTile positions: each position's rank among the earlier equal tokens of its tile,
 *      and each token's count in the tile (the thread of its first occurrence writes it);
 *   2. per token: the counts over the tiles, summed;
 *   3. one block: the exclusive scan of the totals over the vocabulary (where each token's run of
 *      positions starts);
 *   4. per token: the counts turned into the start of its run within each tile (in place);
 *   5. per position: order[start of its token's run in its tile + rank] = position;
 *   6. a block per token: its columns, adding the rows of its positions in order.
 * Scratch (int32): rank [n], order [n], counts [tiles·V], total and start [V] each. */

constexpr int kTile = 1024;

inline int64_t index_tiles(int64_t n) { return (n + kTile - 1) / kTile; }

__global__ void tile_rank_kernel(int32_t *rank, int32_t *counts, const int32_t *tokens, int64_t n,
                                 int V, int padding_idx) {
    LUNA_SHARED(int32_t, tile, kTile);
    const int64_t t = blockIdx.x, i = t * kTile + threadIdx.x;
    const int m = n - t * kTile < kTile ? (int)(n - t * kTile) : kTile;
    const int tok = i < n ? tokens[i] : -1;
    tile[threadIdx.x] = tok;
    __syncthreads();
    if (i >= n || tok == padding_idx) return;
    int before = 0, all = 0;
    for (int j = 0; j < m; j++) {
        const int same = tile[j] == tok;
        before += j < (int)threadIdx.x ? same : 0;
        all += same;
    }
    rank[i] = before;
    if (before == 0) counts[t * V + tok] = all;
}

__global__ void token_totals_kernel(int32_t *total, const int32_t *counts, int64_t tiles, int V) {
    GRID_STRIDE(tok, V) {
        int32_t s = 0;
        for (int64_t t = 0; t < tiles; t++)
            s += counts[t * V + tok];
        total[tok] = s;
    }
}

/* start[v] = Σ_{u<v} total[u]: one block, each thread a contiguous slice, then a scan of the
 * slice sums (Hillis–Steele over shared memory). */
constexpr int kScanThreads = 1024;
__global__ void token_starts_kernel(int32_t *start, const int32_t *total, int V) {
    LUNA_SHARED(int32_t, sums, kScanThreads);
    const int per = (V + kScanThreads - 1) / kScanThreads;
    const int lo = threadIdx.x * per, hi = lo + per < V ? lo + per : V;
    int32_t s = 0;
    for (int v = lo; v < hi; v++)
        s += total[v];
    sums[threadIdx.x] = s;
    __syncthreads();
    for (int off = 1; off < kScanThreads; off *= 2) {
        const int32_t add = threadIdx.x >= (unsigned)off ? sums[threadIdx.x - off] : 0;
        __syncthreads();
        sums[threadIdx.x] += add;
        __syncthreads();
    }
    int32_t run = threadIdx.x > 0 ? sums[threadIdx.x - 1] : 0;
    for (int v = lo; v < hi; v++) {
        start[v] = run;
        run += total[v];
    }
}

__global__ void tile_starts_kernel(int32_t *counts, const int32_t *start, int64_t tiles, int V) {
    GRID_STRIDE(tok, V) {
        int32_t run = start[tok];
        for (int64_t t = 0; t < tiles; t++) {
            const int32_t c = counts[t * V + tok];
            counts[t * V + tok] = run;
            run += c;
        }
    }
}

__global__ void scatter_kernel(int32_t *order, const int32_t *tile_start, const int32_t *rank,
                               const int32_t *tokens, int64_t n, int V, int padding_idx) {
    GRID_STRIDE(i, n) {
        const int tok = tokens[i];
        if (tok == padding_idx) continue;
        order[tile_start[(i / kTile) * V + tok] + rank[i]] = (int32_t)i;
    }
}

constexpr int kRowThreads = 128;
template <typename T>
__global__ void token_rows_kernel(float *dtable, const T *dout, const int32_t *order,
                                  const int32_t *start, const int32_t *total, int d, float scale,
                                  int padding_idx) {
    const int tok = blockIdx.x;
    if (tok == padding_idx) return;
    const int32_t s = start[tok], e = s + total[tok];
    if (s == e) return;
    for (int c = threadIdx.x; c < d; c += kRowThreads) {
        float *row = dtable + (int64_t)tok * d + c;
        float acc = *row;
        for (int32_t k = s; k < e; k++)
            acc = __fadd_rn(acc, __fmul_rn(scale, load(dout, (int64_t)order[k] * d + c)));
        *row = acc;
    }
}

/* int32 words of scratch the index needs for n positions and V tokens */
inline int64_t index_words(int64_t n, int V) { return 2 * n + index_tiles(n) * V + 2 * (int64_t)V; }

template <typename T>
cudaError_t indexed_backward(cudaStream_t s, float *dtable, const T *dout, const int32_t *tokens,
                             int64_t n, int V, int d, float scale, int padding_idx,
                             int32_t *scratch) {
    const int64_t tiles = index_tiles(n);
    int32_t *rank = scratch, *order = rank + n, *counts = order + n, *total = counts + tiles * V,
            *start = total + V;
    cudaError_t e = cudaMemsetAsync(counts, 0, sizeof(int32_t) * (size_t)(tiles * V), s);
    if (e != cudaSuccess) return e;
    LUNA_LAUNCH(tile_rank_kernel, (unsigned)tiles, kTile, 0, s, rank, counts, tokens, n, V,
                padding_idx);
    LUNA_LAUNCH(token_totals_kernel, grid_blocks(V, kThreads), kThreads, 0, s, total, counts, tiles,
                V);
    LUNA_LAUNCH(token_starts_kernel, 1, kScanThreads, 0, s, start, total, V);
    LUNA_LAUNCH(tile_starts_kernel, grid_blocks(V, kThreads), kThreads, 0, s, counts, start, tiles,
                V);
    LUNA_LAUNCH(scatter_kernel, grid_blocks(n, kThreads), kThreads, 0, s, order, counts, rank,
                tokens, n, V, padding_idx);
    LUNA_LAUNCH(token_rows_kernel<T>, (unsigned)V, kRowThreads, 0, s, dtable, dout, order, start,
                total, d, scale, padding_idx);
    return cudaGetLastError();
}
