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

#define LUNA_GPU_CALIBRATED_ON "H200, 2026-11-28 (GPU run 8)"

/* ms measured (each family's share of the 70 ms profile) over the H200 roofline's ms */
static const luna_gpu_calibration luna_gpu_calibration_h200[] = {
    {"linear", 28.35 / 14.04, 1}, /* rewritten: projections of one input batched */
    {"gemm", 13.2 / 3.65, 0}, /* per-head grids: small products, pointer arrays or strided alike */
    {"residual_norm", 7.14 / 2.66, 1}, /* rewritten: backward's sums in its row pass */
    {"causal_contraction", 5.46 / 1.45, 0},
    {"bias_relu_dropout", 4.62 / 2.49, 1}, /* rewritten: backward's sums in its pass */
    {"cross_entropy", 2.66 / 0.94, 1}, /* rewritten: the row's sums in one read */
    {"softmax_dropout", 2.17 / 0.87, 0},
    {"embedding", 1.82 / 0.13, 0},
    {"optimizer", 1.68 / 0.71, 0},
    {"dropout", 1.12 / 0.24, 1}, /* rewritten: one Philox block per four elements */
    {"elementwise", 0.63 / 0.26, 0},
    {"activation", 0.49 / 0.15, 0},
    {"clip", 0.35 / 0.18, 0},
    {"positions", 0.28 / 0.04, 1}, /* rewritten: the batch's n positions tabulated once */
    {NULL, 1.0, 0},
};

#endif
