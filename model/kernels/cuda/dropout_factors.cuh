/* Dropout factors on the device (core/philox.h's mask): keep(i) for the element's index i in its
 * buffer, 1/(1 − p) kept and 0 dropped, scale = 1/(1 − p) computed on the host. Included inside
 * the anonymous namespace of the kernel files that drop (fused.cu, attention.cu). */

/* The dropout factor of element i (dropout_kernel's): 1/(1 − p) kept, 0 dropped; 1 when p = 0. */
__device__ inline float drop_factor(luna_rng_key key, int64_t i, float p, float scale) {
    if (!(p > 0.0f)) return 1.0f;
    return luna_rng_uniform(key, (uint64_t)i) >= p ? scale : 0.0f;
}

/* The factors of elements 4k .. 4k + 3 (drop_factor's): one Philox block gives the four words,
 * where drop_factor computes the block once per element. */
__device__ inline void drop_factors4(luna_rng_key key, uint64_t k, float p, float scale,
                                     float f[4]) {
    uint32_t w[4];
    luna_rng_block(key, k, w);
    f[0] = luna_rng_word_uniform(w[0]) >= p ? scale : 0.0f;
    f[1] = luna_rng_word_uniform(w[1]) >= p ? scale : 0.0f;
    f[2] = luna_rng_word_uniform(w[2]) >= p ? scale : 0.0f;
    f[3] = luna_rng_word_uniform(w[3]) >= p ? scale : 0.0f;
}

/* The factors of elements i .. i + 3: one Philox block when i is a multiple of 4 (the rows of the
 * model's widths), else drop_factor each; all 1 when p = 0. */
__device__ inline void drop4(luna_rng_key key, int64_t i, float p, float scale, float f[4]) {
    if (!(p > 0.0f)) {
        f[0] = f[1] = f[2] = f[3] = 1.0f;
    } else if (i % 4 == 0) {
        drop_factors4(key, (uint64_t)(i / 4), p, scale, f);
    } else {
        for (int e = 0; e < 4; e++)
            f[e] = drop_factor(key, i + e, p, scale);
    }
}

/* The kept elements' factor 1/(1 − p), computed once on the host (1 when p = 0). */
inline float drop_scale(float p) { return p > 0.0f ? 1.0f / (1.0f - p) : 1.0f; }
