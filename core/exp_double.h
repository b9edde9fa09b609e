/* exp(t) in double for t ≤ 0, shared by the CPU's and the CUDA backend's log_softmax_topk
 * (core/host_device.h): one definition, so both compute the same bits (up to libm's log after it).
 *
 * t = n·ln2 + r with |r| ≤ ln2/2 (ln2 split in two: r is exact), exp(r) by its Taylor series to
 * degree 13 in fused multiply-adds (truncation < 4e-18 relative), times 2^n built in the exponent
 * bits: within 1 ulp of libm's exp over [−708, 0] (tests/test_core.c). Below −708 (2^n would
 * be subnormal) it returns 0: such terms cannot move a sum that holds exp(0) = 1 from the row's
 * maximum. t = −inf gives 0, NaN gives NaN. Branch-free, so a CPU loop over it vectorises. */
#ifndef LUNA_CORE_EXP_DOUBLE_H
#define LUNA_CORE_EXP_DOUBLE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/host_device.h"

/* a·b rounded once, never fused with a following addition (nvcc fuses device code unless told;
 * its host pass is unused here; ISO C never
 * does, and the CPU execution harness's __dmul_rn is not fused either). */
#if defined(__CUDA_ARCH__) || (defined(LUNA_CUDA_EMU) && LUNA_CUDA_EMU)
#define LUNA_DMUL_RN(a, b) __dmul_rn((a), (b))
#else
#define LUNA_DMUL_RN(a, b) ((a) * (b))
#endif

LUNA_HD static inline int64_t luna_f64_bits(double x) {
    int64_t i;
    memcpy(&i, &x, sizeof i);
    return i;
}
LUNA_HD static inline double luna_f64_from_bits(int64_t i) {
    double x;
    memcpy(&x, &i, sizeof x);
    return x;
}

LUNA_HD static inline double luna_exp_nonpositive(double t) {
    const double log2e = 1.4426950408889634, ln2_hi = 6.93147180369123816490e-01,
                 ln2_lo = 1.90821492927058770002e-10, shifter = 6755399441055744.0; /* 1.5·2^52 */
    const double tc = t < -708.0 ? -708.0 : t; /* keeps n in the normal exponent range; NaN stays */
    /* n = round(tc·log2e): adding 1.5·2^52 leaves the rounded integer in the low mantissa bits */
    const double kd = LUNA_DMUL_RN(tc, log2e) + shifter;
    const double n = kd - shifter;
    const double r = fma(-n, ln2_lo, fma(-n, ln2_hi, tc));
    /* exp(r) = 1 + r·Q(r), Q(r) = Σ_{i<13} r^i/(i+1)! by Estrin's scheme: a Horner chain of 13
     * dependent fused multiply-adds made a CPU's log-softmax wait on their latency; this tree is 5
     * deep. The one rounding of 1 + r·Q keeps the result within 1 ulp of libm's. */
    const double r2 = LUNA_DMUL_RN(r, r), r4 = LUNA_DMUL_RN(r2, r2), r8 = LUNA_DMUL_RN(r4, r4);
    const double q01 = fma(0.5, r, 1.0), q23 = fma(1.0 / 24.0, r, 1.0 / 6.0);
    const double q45 = fma(1.0 / 720.0, r, 1.0 / 120.0), q67 = fma(1.0 / 40320.0, r, 1.0 / 5040.0);
    const double q89 = fma(1.0 / 3628800.0, r, 1.0 / 362880.0);
    const double qab = fma(1.0 / 479001600.0, r, 1.0 / 39916800.0);
    const double q03 = fma(q23, r2, q01), q47 = fma(q67, r2, q45), q8b = fma(qab, r2, q89);
    const double q07 = fma(q47, r4, q03), q8c = fma(1.0 / 6227020800.0, r4, q8b);
    const double p = fma(fma(q8c, r8, q07), r, 1.0);
    const double scale =
        luna_f64_from_bits((int64_t)((uint64_t)(luna_f64_bits(kd) - luna_f64_bits(shifter) + 1023)
                                     << 52)); /* 2^n; shifted unsigned: a NaN's bits overflow */
    return t < -708.0 ? 0.0 : p * scale;
}

#endif
