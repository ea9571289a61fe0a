#!/usr/bin/env python3
"""tests/test_ptx_blocks.py - dev/ptx_blocks.py on a PTX file and a cubin written by the test, with known answers.

Why: the tool's counts go into results files (dev/results/keymajor_mask_split_2026-12-05.md), so its block
split, instruction counts, branch targets and machine-code size are checked here against inputs whose every
number is known: a two-kernel PTX module (a loop with a guarded block, inline asm in braces, predicated and
uniform branches, comments and directives that are not instructions) and a minimal ELF64 cubin whose
.text.KERNEL section holds a known number of 16-byte instructions. Also: the kernel regex picks one kernel,
and a missing file or a regex that matches nothing ends with a message that names it.

Usage: python3 tests/test_ptx_blocks.py   (ends with "N passed, N failed")
"""
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testing import check, summary  # noqa: E402

TOOL = os.path.join(ROOT, "dev", "ptx_blocks.py")

PTX = """//
// a module of two kernels
.version 8.8
.target sm_90a
.address_size 64

.visible .entry _Z4loopPf(
\t.param .u64 _Z4loopPf_param_0
)
{
\t.reg .pred %p<3>;
\t.reg .b32 %r<9>;
\t.reg .f32 %f<5>;

\tld.param.u64 %rd1, [_Z4loopPf_param_0];
\tmov.u32 %r1, 0;
$L__BB0_1:
\tsetp.gt.s32 %p1, %r1, 7;
\t@%p1 bra $L__BB0_3;
\t// a comment line
\tadd.f32 %f1, %f1, %f2;
\t{
\t.reg .pred acc;
\tsetp.ne.b32 acc, %r2, 0;
\twgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%f1}, %rd2, %rd3, acc, 1, 1, 0, 0;
\t}
\tmbarrier.arrive.shared::cta.b64 _, [%r3];
$L__BB0_3:
\tadd.s32 %r1, %r1, 1;
\tsetp.lt.s32 %p2, %r1, 16;
\t@%p2 bra $L__BB0_1;
\tbra.uni $L__BB0_4;
$L__BB0_4:
\tret;

}
\t// .globl\t_Z5otherv
.visible .entry _Z5otherv()
{
\tret;
}
"""


def elf_with_text(name, n_instructions):
    """A minimal ELF64 with sections: null, .shstrtab, .text.NAME (n_instructions x 16 bytes)."""
    shstr = b"\0.shstrtab\0.text." + name.encode() + b"\0"
    text = b"\x01" * (16 * n_instructions)
    ehsize, shentsize = 64, 64
    off_shstr = ehsize
    off_text = off_shstr + len(shstr)
    off_sh = off_text + len(text)
    hdr = bytearray(ehsize)
    hdr[0:4] = b"\x7fELF"
    hdr[4], hdr[5], hdr[6] = 2, 1, 1
    struct.pack_into("<Q", hdr, 0x28, off_sh)
    struct.pack_into("<HHHHHH", hdr, 0x34, ehsize, 0, 0, shentsize, 3, 1)
    def sh(name_off, typ, off, size):
        return struct.pack("<IIQQQQIIQQ", name_off, typ, 0, 0, off, size, 0, 0, 1, 0)
    shdrs = sh(0, 0, 0, 0) + sh(1, 3, off_shstr, len(shstr)) + sh(11, 1, off_text, len(text))
    return bytes(hdr) + shstr + text + shdrs


def run(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)


def main():
    with tempfile.TemporaryDirectory() as d:
        ptx = os.path.join(d, "unit.ptx")
        with open(ptx, "w") as f:
            f.write(PTX)
        with open(os.path.join(d, "unit.cubin"), "wb") as f:
            f.write(elf_with_text("_Z4loopPf", 7))

        r = run(ptx, "loop")
        out = r.stdout
        check(r.returncode == 0, f"exit status 0 (got {r.returncode}; {r.stderr.strip()})")
        check(out.startswith("loop(float*): 13 PTX instructions in 4 blocks"),
              "the kernel demangled, 13 instructions in 4 blocks: " + out.split("\n")[0])
        lines = [l.split() for l in out.split("\n") if l.startswith("  $") or l.startswith("  ENTRY")]
        check([l[0] for l in lines] == ["ENTRY", "$L__BB0_1", "$L__BB0_3", "$L__BB0_4"], "the four block labels")
        check([l[1] for l in lines] == ["2", "6", "4", "1"], "instructions per block 2, 6, 4, 1 (comments, "
              "directives and braces not counted; the inline asm's setp and wgmma counted)")
        check(lines[1][3] == "$L__BB0_3" and lines[2][3] == "$L__BB0_1,$L__BB0_4" and lines[3][3] == "-",
              "branch targets: the guard, the loop and the uniform branch; none after ret")
        check("[2 wgmma/mbarrier/TMA/barrier]" in out.split("\n")[2], "the loop block's wgmma and mbarrier counted")
        check("  machine code: 7 instructions" in out, "machine code from the cubin's .text section: 112 bytes, 7")
        check("other" not in out, "the regex picks one kernel")

        r = run(ptx, "loop", "--min", "3")
        kept = [l.split()[0] for l in r.stdout.split("\n") if l.startswith("  $") or l.startswith("  ENTRY")]
        check(kept == ["$L__BB0_1", "$L__BB0_3"], f"--min 3 leaves out the blocks of 2 and 1 (kept {kept})")

        r = run(ptx, "other")
        check(r.returncode == 0 and "other(): 1 PTX instructions in 1 blocks" in r.stdout
              and "machine code" not in r.stdout, "a kernel with no .text section in the cubin: no size line")

        r = run(ptx, "nosuchkernel")
        check(r.returncode != 0 and "no kernel of" in r.stderr and "nosuchkernel" in r.stderr,
              "a regex that matches nothing: refused, naming it")
        r = run(os.path.join(d, "missing.ptx"), "loop")
        check(r.returncode != 0 and "missing.ptx" in r.stderr and "dump_attention_code.sh" in r.stderr,
              "a missing file: refused, naming it and the tool that makes dumps")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
