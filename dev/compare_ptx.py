#!/usr/bin/env python3
"""dev/compare_ptx.py BEFORE.ptx AFTER.ptx - checks that a change left the generated code of existing kernels alone.

Compares the PTX of every kernel in BEFORE with the kernel of the same (demangled) name in AFTER, where the
flag-off instantiations carry one more template argument (DQ_SLICES = false, stripped here). Bodies are compared
with the kernel's own symbol replaced by a token and basic-block labels renumbered (ptxas numbers them by the
function's index in the file). Make the two files with the same flags, without -lineinfo, e.g.
  nvcc -O3 --use_fast_math -std=c++17 -gencode arch=compute_90a,code=sm_90a -I. -Xcompiler -fopenmp \
       --expt-relaxed-constexpr -ptx attention/cuda/attention_cuda.cu -o after.ptx
(and the same at the commit before the change). Exit status 1 if any kernel of BEFORE differs or is missing."""
import re, subprocess, sys
def entries(text):
    out = {}
    for m in re.finditer(r'^(?:\.visible )?\.entry (\S+)\(.*?^}\n', text, re.S | re.M):
        out[m.group(1)] = m.group(0)
    return out
def demangle(names):
    r = subprocess.run(['c++filt'], input='\n'.join(names), capture_output=True, text=True).stdout.split('\n')
    return r[:len(names)]
def key(dm):
    dm = re.sub(r'_GLOBAL__N__\w+', 'ANON', dm)       # the anonymous namespace's per-file hash
    dm = re.sub(r'<false>', '', dm)                     # a non-template kernel made template<bool DQ_SLICES>
    dm = re.sub(r', false>', '>', dm)                   # a bool DQ_SLICES appended to a template kernel
    dm = re.sub(r'^void ', '', dm)                      # template functions mangle their return type
    return dm
def normalised(path):
    e = entries(open(path).read())
    names = list(e)
    out = {}
    for n, dm in zip(names, demangle(names)):
        body = e[n].replace(n[2:], 'KERNEL')  # also names the kernel's local statics (_ZZ...E9cta_abort)
        body = re.sub(r'\$L__BB\d+_', '$L__BB_', body)
        body = re.sub(r'_GLOBAL__N__\w+?_cu_[0-9a-f]{8}', 'ANON', body)
        out[key(dm)] = body
    return out
b, a = normalised(sys.argv[1]), normalised(sys.argv[2])
same = [k for k in b if k in a and a[k] == b[k]]
bad = [k for k in b if k not in a or a[k] != b[k]]
for k in bad: print("DIFFERS or MISSING:", k[:150])
print(f"{sys.argv[1].split('/')[-1]}: {len(same)} of {len(b)} kernels identical; {len([k for k in a if k not in b])} new")
sys.exit(1 if bad else 0)
