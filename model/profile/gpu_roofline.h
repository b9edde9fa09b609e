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

#endif
