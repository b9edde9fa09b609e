#!/usr/bin/env python3
"""Compile every CUDA kernel file (model/kernels/cuda/*.cu) with nvcc --resource-usage for the
architectures luna ships (sm_80, sm_90a) and fail when a kernel spills registers or uses more
static shared memory than the 48 KiB default (a kernel that opts into more must say so here, in
ALLOWED). Prints one line per file: kernels, max registers, spills, max shared memory, max stack.
Run by .ci/run; needs nvcc on PATH (or CUDACXX)."""
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile

ARCHS = ["sm_80", "sm_90a"]
SMEM_LIMIT = 48 * 1024
ALLOWED = {}  # kernel name -> reason, for kernels that opt into more shared memory


def check(nvcc, root, srcdir, tmp, f, arch):
    """Compile one file's device code for one architecture (-cubin: no host pass, which the
    build has checked already); return (summary line, problems)."""
    cmd = [nvcc, f"-arch={arch}", "-std=c++17", "-I", root, "--resource-usage", "-Werror",
           "all-warnings", "-cubin", os.path.join(srcdir, f), "-o",
           os.path.join(tmp, f"{f}.{arch}.cubin")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    out = r.stdout + r.stderr
    if r.returncode != 0:
        return out, [f"{f} ({arch}): nvcc failed"]
    bad = []
    kernel, regs, spills, smem, stack, count = None, [], 0, [0], [0], 0
    for line in out.splitlines():
        m = re.search(r"Function properties for (\S+)", line)
        if m:
            kernel = m.group(1)
        if "Compiling entry function" in line:
            count += 1
        m = re.search(r"(\d+) bytes spill stores", line)
        if m and int(m.group(1)) > 0:
            spills += int(m.group(1))
            bad.append(f"{f} ({arch}): {kernel} spills {m.group(1)} bytes")
        m = re.search(r"(\d+) bytes stack frame", line)
        if m:
            stack.append(int(m.group(1)))
        m = re.search(r"Used (\d+) registers", line)
        if m:
            regs.append(int(m.group(1)))
        m = re.search(r"(\d+) bytes smem", line)
        if m:
            smem.append(int(m.group(1)))
            if int(m.group(1)) > SMEM_LIMIT and kernel not in ALLOWED:
                bad.append(f"{f} ({arch}): {kernel} uses {m.group(1)} bytes of "
                           f"shared memory (> {SMEM_LIMIT})")
    line = (f"{f:24s} {arch:7s} kernels {count:3d}  max registers {max(regs or [0]):3d}"
            f"  spill bytes {spills}  max smem {max(smem)}  max stack {max(stack)}")
    return line, bad


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    nvcc = os.environ.get("CUDACXX", "nvcc")
    srcdir = os.path.join(root, "model", "kernels", "cuda")
    files = sorted(f for f in os.listdir(srcdir) if f.endswith(".cu"))
    if not files:
        print("check_cuda_resources: no .cu files")
        return 0
    bad = []
    jobs = [(f, arch) for f in files for arch in ARCHS]
    with tempfile.TemporaryDirectory() as tmp, \
            concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = pool.map(lambda job: check(nvcc, root, srcdir, tmp, *job), jobs)
        for line, problems in results:  # in the order of jobs
            print(line)
            bad += problems
    for b in bad:
        print(f"check_cuda_resources: {b}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
