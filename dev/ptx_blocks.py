#!/usr/bin/env python3
"""dev/ptx_blocks.py - the basic blocks of a kernel's PTX, and its machine-code size, read without a GPU.

  dev/ptx_blocks.py DUMP.ptx KERNEL_REGEX [--min N]

Why: the build machines have no disassembler (cuobjdump and nvdisasm come with the GPU machine's toolkit), yet
the PTX shows the control flow that ptxas starts from: which work sits in the loop, behind which branches, in
how many blocks. Per kernel whose mangled name matches KERNEL_REGEX: one line per basic block (its label, its
instruction count, the labels it branches to, its most frequent opcodes, and how many wgmma / mbarrier / TMA /
barrier instructions it holds), blocks shorter than --min instructions (default 0) left out; then, from the
.cubin beside the .ptx (dev/dump_attention_code.sh writes both), the kernel's machine-code size in
instructions (16 bytes each). Counts are of PTX instructions, not of what ptxas emits.
"""
import argparse, collections, os, re, subprocess, sys

from compare_ptx import elf_sections, ptx_entries  # the dump's two readers: one copy of each

LABEL = re.compile(r'^(\$L__BB\d+_\d+):')
BRANCH = re.compile(r'\bbra(?:\.uni)?\s+(\$L__BB\d+_\d+)')
SPECIAL = ('wgmma.mma_async', 'mbarrier', 'cp.async.bulk', 'bar.', 'barrier')


def blocks(body):
    """[(label, [opcode, ...], [branch target, ...])]; the first block is ENTRY. The body starts after the
    parameter list, at the entry's first `{`."""
    out, cur = [], ['ENTRY', [], []]
    for line in body[body.index('{'):].split('\n'):
        s = line.strip()
        m = LABEL.match(s)
        if m:
            out.append(cur)
            cur = [m.group(1), [], []]
            continue
        if not s or s.startswith('//') or s[0] in '{}.':
            continue
        tok = s.split()
        op = tok[1] if tok[0].startswith('@') else tok[0]
        cur[1].append(op.rstrip(';'))
        b = BRANCH.search(s)
        if b:
            cur[2].append(b.group(1))
    out.append(cur)
    return out


def cubin_text(path):
    """kernel name -> its machine code's instructions: the size of the cubin's .text.NAME section / 16."""
    if not os.path.exists(path):
        return {}
    return {sec['name'][len('.text.'):]: sec['size'] // 16
            for sec in elf_sections(open(path, 'rb').read()) if sec['name'].startswith('.text.')}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[1], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument('ptx')
    ap.add_argument('kernel_regex')
    ap.add_argument('--min', type=int, default=0, help='leave out blocks with fewer instructions')
    a = ap.parse_args()
    if not os.path.exists(a.ptx):
        sys.exit(f'ptx_blocks.py: no file {a.ptx} (make it with dev/dump_attention_code.sh OUTDIR FILE.cu)')
    found = {n: b for n, b in ptx_entries(open(a.ptx).read()).items() if re.search(a.kernel_regex, n)}
    if not found:
        sys.exit(f'ptx_blocks.py: no kernel of {a.ptx} matches {a.kernel_regex!r}')
    sass = cubin_text(re.sub(r'\.ptx$', '.cubin', a.ptx))
    names = subprocess.run(['c++filt'], input='\n'.join(found), capture_output=True, text=True).stdout.split('\n')
    for (name, body), demangled in zip(found.items(), names):
        bbs = blocks(body)
        print(f'{demangled}: {sum(len(b[1]) for b in bbs)} PTX instructions in {len(bbs)} blocks')
        for label, ops, succ in bbs:
            if len(ops) < a.min:
                continue
            top = collections.Counter(o.split('.')[0] for o in ops).most_common(6)
            special = sum(1 for o in ops if o.startswith(SPECIAL))
            print(f'  {label:14s} {len(ops):5d}  -> {",".join(succ) or "-":28s} '
                  f'{" ".join(f"{o}:{n}" for o, n in top)}  [{special} wgmma/mbarrier/TMA/barrier]')
        if name in sass:
            print(f'  machine code: {sass[name]} instructions')
        print()


if __name__ == '__main__':
    main()
