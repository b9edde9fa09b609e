/* The ONE place for the GPU constants of the cost model's PREDICTED times (op_report.h). Every
 * number is a vendor peak, not a measurement: a roofline from them is an optimistic bound.
 *
 * Sources:
 *  - NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column; nvidia.com/en-us/data-center/h100,
 *    datasheet PDF 2023): BF16 Tensor Core 1,979 TFLOPS *with sparsity* -> 989 TFLOPS dense;
 *    TF32 Tensor Core 989 with sparsity -> 494 dense; FP32 (non-tensor) 67 TFLOPS; GPU memory
 *    80 GB HBM3 at 3.35 TB/s.
 *  - NVIDIA H200 Tensor Core GPU datasheet (H200 SXM; nvidia.com/en-us/data-center/h200, 2024):
 *    the same compute figures as H100 SXM (same GH100 die and clocks); 141 GB HBM3e at
 *    4.8 TB/s.
 *  - Kernel launch overhead: a few microseconds per kernel as seen on the timeline for
 *    back-to-back launches on one stream (NVIDIA CUDA C++ Best Practices Guide, "Asynchronous
 *    and Overlapping Transfers"/launch-latency discussion; ~3-5 µs commonly measured without CUDA
 *    graphs). We take 4 µs; CUDA graphs would cut it to ~1 µs or less.
 * Units: FLOP/s, byte/s, seconds. */
#ifndef LUNA_GPU_ROOFLINE_H
#define LUNA_GPU_ROOFLINE_H

typedef struct {
    const char *name;
    double mm_flops_per_s;   /* tensor-core GEMM peak for the activation type (bf16 dense) */
    double fp32_flops_per_s; /* non-tensor FP32 peak (elementwise, scans, reductions) */
    double tf32_flops_per_s; /* TF32 tensor-core peak (fp32 activations with --tf32) */
    double bytes_per_s;      /* HBM bandwidth */
    double launch_s;         /* per-kernel launch overhead */
} luna_gpu_spec;

#define LUNA_GPU_LAUNCH_S 4e-6

static const luna_gpu_spec luna_gpu_h100_sxm = {"H100 SXM", 989e12,  67e12,
                                                494e12,     3.35e12, LUNA_GPU_LAUNCH_S};
static const luna_gpu_spec luna_gpu_h200_sxm = {"H200 SXM", 989e12, 67e12,
                                                494e12,     4.8e12, LUNA_GPU_LAUNCH_S};

/* The calibration: per op family, the time measured on a GPU over the roofline's PREDICTED time
 * for the same work (measured / predicted), from one profile of a 32k-token bf16 update of
 * luna_base_tied (`bench-model --update --profile --batch 1024`, each op synchronised; the table
 * in docs/benchmarks.md, "GPU"). A calibrated prediction multiplies a family's roofline time by its
 * ratio; a family without a ratio keeps its roofline time (ratio 1). `changed`: the family's
 * kernels were rewritten after the profile, so its ratio is stale (an upper bound until the next
 * profile; re-measure and replace the row). */
typedef struct {
    const char *family;
    double ratio;
    int changed;
} luna_gpu_calibration;

#define LUNA_GPU_CALIBRATED_ON "H200, 2026-11-26 (GPU run 6)"

static const luna_gpu_calibration luna_gpu_calibration_h200[] = {
    {"linear", 29.0 / 14.0, 1},            /* the bias-gradient column sums rewritten since */
    {"residual_norm", 12.0 / 2.7, 1},      /* its dγ/dβ column sums rewritten since */
    {"causal_contraction", 14.0 / 1.4, 1}, /* chunked since (it was a scan) */
    {"gemm", 8.0 / 3.6, 0},
    {"bias_relu_dropout", 8.0 / 2.5, 1}, /* its bias-gradient column sums rewritten since */
    {"softmax_dropout", 10.0 / 0.9, 0},
    {"embedding", 5.0 / 0.1, 0},
    {"cross_entropy", 5.0 / 1.4, 0},
    {"optimizer", 6.0 / 0.7, 1}, /* full blocks since (8 threads a block before) */
    {NULL, 1.0, 0},
};

#endif
