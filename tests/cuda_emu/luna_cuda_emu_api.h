/* luna-cuda-emu: the harness's own controls, callable from C and C++ tests (README.md here).
 *
 * The harness runs CUDA kernels on the CPU (one fiber per CUDA thread) and implements the
 * CUDA runtime and cuBLASLt entry points the backend uses, with NVIDIA's own declarations
 * (cuda_runtime_api.h, cublasLt.h): host code links luna_cuda_emu instead of libcudart and
 * libcublasLt and is otherwise unchanged. These functions exist only in the harness.
 *
 * Environment:
 *   LUNA_EMU_ORDER=forward|reverse|random[:SEED]  the order in which a block's threads (and the
 *       grid's blocks) run between two synchronisation points; default forward; random
 *       reshuffles at every scheduling pass from SEED (default 1).
 *   LUNA_EMU_ON_ERROR=abort|record  a kernel error (barrier or warp-mask misuse, deadlock,
 *       shared memory over its limit, a host pointer passed to a kernel) prints one line
 *       naming kernel, block and thread, then aborts (default), or is recorded as the sticky
 *       error cudaErrorLaunchFailure (the message stays readable with luna_emu_last_error).
 *   LUNA_EMU_STACK_KB=N  stack size of each CUDA thread's fiber (default 64, 256 under ASan).
 */
#ifndef LUNA_CUDA_EMU_API_H
#define LUNA_CUDA_EMU_API_H

#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { LUNA_EMU_FORWARD, LUNA_EMU_REVERSE, LUNA_EMU_RANDOM } luna_emu_order;
typedef enum { LUNA_EMU_ABORT, LUNA_EMU_RECORD } luna_emu_error_mode;

/* The thread order of later launches (overrides LUNA_EMU_ORDER); seed is used by RANDOM. */
void luna_emu_set_order(luna_emu_order order, uint64_t seed);
luna_emu_order luna_emu_get_order(void);
const char *luna_emu_order_name(luna_emu_order order);
/* What a kernel error does (overrides LUNA_EMU_ON_ERROR). */
void luna_emu_set_error_mode(luna_emu_error_mode mode);
/* The message of the last error the harness reported (kernel or API), "" if none. */
const char *luna_emu_last_error(void);
/* Kernel launches so far (LUNA_LAUNCH calls, as luna_cuda_launch_counter counts them: a launch
 * recorded by a stream capture once, its replays by graph launches not), and device bytes
 * currently allocated (cudaMalloc minus cudaFree). */
uint64_t luna_emu_launch_count(void);
uint64_t luna_emu_device_bytes(void);
/* Graph launches run so far (cudaGraphLaunch on a stream not capturing), and the recorded
 * operations they ran (kernels, copies, memsets, event records, cuBLASLt matmuls). */
uint64_t luna_emu_graph_launch_count(void);
uint64_t luna_emu_graph_node_count(void);
/* Calls so far at which the host waits for the device: cudaStreamSynchronize,
 * cudaDeviceSynchronize, cudaEventSynchronize, cudaEventQuery, cudaMemcpy, and cudaMemcpyAsync
 * with pageable host memory on either side (staged by the driver; the host may wait for the
 * stream), also such a copy run by a graph launch. */
uint64_t luna_emu_host_wait_count(void);
/* true: cublasLtMatmulAlgoGetHeuristic returns no algorithm for pointer-array batches (as a
 * library without them would), to test the callers' fallback. Default false. */
void luna_emu_cublaslt_refuse_pointer_arrays(bool refuse);

#ifdef __cplusplus
}
#endif

#endif
