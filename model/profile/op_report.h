/* Printing the op profile's counters (op_profile.h) per op family, with the measured time on the
 * profiled backend and a PREDICTED time on H100 and H200 from a roofline over the counted FLOPs
 * and bytes (constants and their sources: gpu_roofline.h). Per op:
 *   t = max(mm_flops / tensor-core peak + flops / FP32 peak, bytes / HBM bandwidth)
 *       + calls · launch overhead,
 * bytes with bf16 activations (2 bytes per counted activation element). A family's time is the
 * sum over its ops. MFU = model FLOPs / (predicted time · bf16 tensor peak), where model FLOPs
 * are the counted matrix-product FLOPs (gemm, linear forward and backward: the multiply-adds the
 * network needs; luna recomputes nothing, so these are the 6·params·tokens-style FLOPs plus the
 * attention products). Every GPU figure is a model output and is printed as PREDICTED; the
 * calibrated column scales each family's H200 time by the ratio measured / PREDICTED of a GPU
 * profile (gpu_roofline.h, which says where and when). */
#ifndef LUNA_OP_REPORT_H
#define LUNA_OP_REPORT_H

#include <stdbool.h>
#include <stdio.h>

#include "model/profile/op_profile.h"

/* The per-family table and the predictions for `tokens` tokens (tokens/s and MFU). measured:
 * whether c[].seconds are meaningful (false for extrapolated counters); measured_act_bytes: the
 * profiled backend's activation element size (for its GB column). */
void luna_op_report_print(FILE *f, const luna_op_counter *c, bool measured, int measured_act_bytes,
                          double tokens, const char *unit);

/* A family's PREDICTED H200 time scaled by its calibration ratio (gpu_roofline.h; 1 when the
 * family has none). */
double luna_op_report_calibrated_h200(const char *family, double predicted_h200);

/* out = the affine function through (x1, c1) and (x2, c2), at x, field by field (x1 != x2).
 * The counted costs are affine in the batch size at fixed lengths (activation terms scale with
 * the rows, parameter terms and call counts do not), so two counted sizes give any other exactly;
 * the benchmarks check it at a third size (op_report_affine_error). */
void luna_op_counters_extrapolate(luna_op_counter *out, const luna_op_counter *c1, double x1,
                                  const luna_op_counter *c2, double x2, double x);

/* The largest relative difference of the summed FLOPs, bytes and calls between a and b. */
double luna_op_counters_max_rel_diff(const luna_op_counter *a, const luna_op_counter *b);

#endif
