/* Cost accounting of the backend ops, for the benchmarks: a counting layer that wraps any
 * backend's op table. While attached, be->ops points at a table whose entries compute the op's
 * cost from its arguments (shapes only, never data), add it to a per-op counter and forward to the
 * real table, so the model code runs unchanged and the results are bit-identical. Only the
 * benchmarks attach it: without it nothing is counted and nothing costs anything.
 *
 * What is counted per op (model/profile/op_profile.c has each formula next to its op):
 *   mm_flops   multiply-add FLOPs of the matrix products that run on tensor cores on a GPU
 *              (gemm, linear_forward/backward): 2·M·N·K;
 *   flops      every other FLOP (elementwise, normalisations, the causal scan, reductions,
 *              optimizer), approximated as a few FLOPs per element where the op's math says so;
 *   act_elems  activation elements read + written (bytes = act_elems · sizeof(act_dtype), so the
 *              same count predicts fp32 on the CPU and bf16 on a GPU);
 *   bytes      every other byte read + written (fp32 parameters, gradients, statistics, int32
 *              tokens, optimizer state).
 * Bytes are the minimum traffic: each operand read once and each result written once (a kernel
 * that makes two passes moves more than counted). */
#ifndef LUNA_OP_PROFILE_H
#define LUNA_OP_PROFILE_H

#include <stdbool.h>
#include <stdio.h>

#include "core/backend.h"

/* Number of ops (function pointers) in struct luna_ops. */
#define LUNA_OP_COUNT ((int)(sizeof(luna_ops) / sizeof(luna_status(*)(void))))

typedef struct {
    double calls;
    double mm_flops;
    double flops;
    double act_elems;
    double bytes;
    double seconds; /* wall time between a synchronize before and after the op (timing on) */
} luna_op_counter;

typedef struct luna_op_profile luna_op_profile;

/* Wraps be->ops (be->ops now points at the counting table). timing: synchronize the backend
 * around each op and add its wall time (a device backend then runs one op at a time). At most one
 * profile is attached in a process at a time (the wrappers find it through a static pointer, as
 * the op signatures carry only the backend); a second attach is an error. */
luna_status luna_op_profile_attach(luna_op_profile **out, luna_backend *be, bool timing);
/* Restores be->ops and frees the profile (NULL: no-op). */
void luna_op_profile_detach(luna_op_profile *p);
/* Zeroes the counters (e.g. after warmup steps). */
void luna_op_profile_reset(luna_op_profile *p);
/* The counters, indexed by op (the order of struct luna_ops); LUNA_OP_COUNT entries. */
const luna_op_counter *luna_op_profile_counters(const luna_op_profile *p);

/* The op's member name in struct luna_ops ("linear_forward") and its family ("linear"), for
 * 0 <= op < LUNA_OP_COUNT. */
const char *luna_op_name(int op);
const char *luna_op_family(int op);

#endif
