/* Run by CTest only in sanitizer builds (-DLUNA_SANITIZE=ON), which passes when the output
 * contains AddressSanitizer's "heap-buffer-overflow ... READ of size 4": a kernel reads x[n] of a
 * cudaMalloc buffer of exactly n floats (the fake cudaMalloc allocates exactly the bytes asked
 * for, so the first byte past the end is poisoned). Exits 0 only if ASan missed it, and then
 * CTest fails the test for lack of the message. */
#include <stdio.h>

#include "tests/cuda_emu/selftest_kernels.h"

int main(void) {
    enum { N = 37 };
    float *x = NULL, *out = NULL;
    if (cudaMalloc((void **)&x, N * sizeof(float)) != cudaSuccess ||
        cudaMalloc((void **)&out, sizeof(float)) != cudaSuccess)
        return 1;
    cudaMemset(x, 0, N * sizeof(float));
    fprintf(stderr, "launching read_past_end_kernel (reads x[%d] of %d floats)\n", N, N);
    cudaError_t e = selftest_read_past_end(out, x, N);
    fprintf(stderr, "AddressSanitizer did not report the read (launch status %d)\n", (int)e);
    cudaFree(x);
    cudaFree(out);
    return 0;
}
