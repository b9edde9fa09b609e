// luna-cuda-emu: fibers, one per CUDA thread. On x86-64 a context switch is a dozen instructions
// (callee-saved registers, MXCSR and the x87 control word, the stack pointer); glibc's
// swapcontext makes a sigprocmask system call per switch and is only the fallback on other
// architectures. Stacks come from a pool (one per thread slot of a block, reused by every block
// and launch), each mmap-ed with a guard page below it, so a stack overflow faults at once.
// -DLUNA_EMU_UCONTEXT forces the swapcontext path (for comparison).
// Under AddressSanitizer every switch is announced (__sanitizer_{start,finish}_switch_fiber).
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "emu_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#define LUNA_EMU_ASAN 1
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#else
#define LUNA_EMU_ASAN 0
#endif

#if defined(__x86_64__) && !defined(LUNA_EMU_UCONTEXT)
#define LUNA_EMU_ASM_SWITCH 1
#else
#define LUNA_EMU_ASM_SWITCH 0
#include <ucontext.h>
#endif

namespace luna_emu {
namespace {

#if LUNA_EMU_ASM_SWITCH
// luna_emu_swap(save, to): pushes the callee-saved state, stores rsp in *save, loads `to` and
// pops the state saved there. luna_emu_start is where a new fiber "returns" to: r12 = argument,
// r13 = entry (set by fiber_make), with rsp 16-byte aligned before the call as the ABI wants.
extern "C" void luna_emu_swap(void **save, void *to);
extern "C" void luna_emu_start();
asm(R"(
    .text
    .globl luna_emu_swap
    .type luna_emu_swap, @function
luna_emu_swap:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $16, %rsp
    stmxcsr 8(%rsp)
    fnstcw (%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    fldcw (%rsp)
    ldmxcsr 8(%rsp)
    addq $16, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size luna_emu_swap, .-luna_emu_swap
    .globl luna_emu_start
    .type luna_emu_start, @function
luna_emu_start:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size luna_emu_start, .-luna_emu_start
)");
void *g_sched_sp = nullptr;
#else
ucontext_t g_sched_uctx;
#endif

struct stack_slot {
    char *lo = nullptr;
    size_t size = 0;
};
std::vector<stack_slot> g_pool;
#if LUNA_EMU_ASAN
const void *g_sched_stack_bottom = nullptr; // the scheduler's stack, for ASan
size_t g_sched_stack_size = 0;
#endif

size_t stack_bytes() {
    static size_t bytes = [] {
        const char *env = getenv("LUNA_EMU_STACK_KB");
        long kb = env ? atol(env) : (LUNA_EMU_ASAN ? 256 : 64);
        if (kb < 16) kb = 16;
        return (size_t)kb * 1024;
    }();
    return bytes;
}

stack_slot &slot_stack(int slot) {
    if ((size_t)slot >= g_pool.size()) g_pool.resize((size_t)slot + 1);
    stack_slot &s = g_pool[(size_t)slot];
    if (!s.lo) {
        size_t page = (size_t)sysconf(_SC_PAGESIZE), size = stack_bytes();
        void *m =
            mmap(nullptr, size + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) {
            fprintf(stderr, "luna-cuda-emu: out of memory for fiber stacks\n");
            abort();
        }
        mprotect(m, page, PROT_NONE); // guard page: an overflowing fiber faults here
        s.lo = (char *)m + page;
        s.size = size;
    }
    return s;
}

} // namespace

void fiber_make(fiber *f, int slot, void (*entry)(void *), void *arg) {
    stack_slot &s = slot_stack(slot);
    f->stack = s.lo;
    f->stack_size = s.size;
    f->asan_fake = nullptr;
#if LUNA_EMU_ASAN
    // Frames of fibers abandoned earlier on this stack may have left poisoned redzones.
    __asan_unpoison_memory_region(s.lo, s.size);
#endif
#if LUNA_EMU_ASM_SWITCH
    // From the new stack pointer up: x87 cw / MXCSR (16 bytes), r15 r14 r13 r12 rbx rbp, return
    // address luna_emu_start at top - 8; after its `ret` rsp = top is 16-aligned, so the callee
    // of luna_emu_start's call begins with rsp = 8 (mod 16), as the ABI wants.
    uintptr_t top = (uintptr_t)(s.lo + s.size) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)(top - 9 * 8);
    uint32_t mxcsr;
    uint16_t fpucw;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(fpucw));
    sp[0] = fpucw;
    sp[1] = mxcsr;
    sp[2] = 0;               // r15
    sp[3] = 0;               // r14
    sp[4] = (uint64_t)entry; // r13
    sp[5] = (uint64_t)arg;   // r12
    sp[6] = 0;               // rbx
    sp[7] = 0;               // rbp
    sp[8] = (uint64_t)&luna_emu_start;
    f->sp = sp;
#else
    if (!f->uctx) f->uctx = new ucontext_t;
    ucontext_t *u = (ucontext_t *)f->uctx;
    getcontext(u);
    u->uc_stack.ss_sp = s.lo;
    u->uc_stack.ss_size = s.size;
    u->uc_link = nullptr;
    makecontext(u, (void (*)())entry, 1, arg); // one pointer argument: fine on LP64 glibc ports
#endif
}

void fiber_switch_to(fiber *f) {
#if LUNA_EMU_ASAN
    void *fake = nullptr;
    __sanitizer_start_switch_fiber(&fake, f->stack, f->stack_size);
#endif
#if LUNA_EMU_ASM_SWITCH
    luna_emu_swap(&g_sched_sp, f->sp);
#else
    swapcontext(&g_sched_uctx, (ucontext_t *)f->uctx);
#endif
#if LUNA_EMU_ASAN
    __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
}

void fiber_yield(fiber *f, bool finished) {
#if LUNA_EMU_ASAN
    __sanitizer_start_switch_fiber(finished ? nullptr : &f->asan_fake, g_sched_stack_bottom,
                                   g_sched_stack_size);
#endif
    (void)finished;
#if LUNA_EMU_ASM_SWITCH
    luna_emu_swap(&f->sp, g_sched_sp);
#else
    swapcontext((ucontext_t *)f->uctx, &g_sched_uctx);
#endif
#if LUNA_EMU_ASAN
    __sanitizer_finish_switch_fiber(f->asan_fake, &g_sched_stack_bottom, &g_sched_stack_size);
#endif
}

void fiber_started() {
#if LUNA_EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &g_sched_stack_bottom, &g_sched_stack_size);
#endif
}

} // namespace luna_emu
