#!/usr/bin/env python3
"""dev/compare_ptx.py - checks that a change left the generated code of existing kernels alone.

  dev/compare_ptx.py [--renames FILE] [--diff N] BEFORE.ptx AFTER.ptx
  dev/compare_ptx.py [--renames FILE] [--diff N] --dirs BEFORE_DIR AFTER_DIR

The first form compares two PTX files. The second compares two dumps of dev/dump_attention_code.sh (every
attention translation unit's .ptx and .cubin): each kernel of BEFORE is looked up by name in the whole of
AFTER, whichever file it sits in there, so kernels may move between translation units; a .sm80 file is only
compared with .sm80 files. Two things are compared per kernel:
  PTX    the kernel's body, with its own symbol replaced by a token, basic-block labels renumbered (ptxas
         numbers them by the function's index in the file), virtual registers renamed in order of first use
         (their numbers depend on the rest of the module), `.pragma "nounroll"` loop hints dropped (a rolled
         loop's hint on a loop that was never unrolled; the machine code below shows whether it mattered) and
         every other symbol it names demangled and normalised like the kernel names;
  cubin  the machine code (the .text.KERNEL section's bytes: the SASS), its relocations (offset, type and the
         normalised symbol), the registers it uses, and the sizes of its shared-memory and parameter banks.
Kernel names are normalised: the anonymous namespace's per-file hash (and the hashes in an internal global's
_INTERNAL_ name, e.g. a file's g_hang_record) are dropped, a trailing bool
DQ_SLICES = false is stripped (a non-template kernel made template<bool>), and then --renames applies: a
file of lines `OLD => NEW` (Python regular expressions over the normalised, demangled name of BEFORE, NEW
may use \\1 ...; `#` starts a comment), for kernels renamed on purpose (e.g. into a template family); NEW
`-` marks kernels removed on purpose (counted apart, not compared). `OLD @ UNIT => NEW` applies to the kernels of
one translation unit's dump only (UNIT: the dump's file name without .ptx / .cubin), e.g. a copy of a kernel
that a lab object no longer carries.
--diff N prints, under each kernel whose PTX differs, the first N lines of a unified diff of the two normalised
bodies (what moved: an instruction's order, a register's class, a new spill), against AFTER's first kernel of
that name.
Make the files with the same flags, without -lineinfo (dev/dump_attention_code.sh does).
Exit status 1 if any kernel of BEFORE differs or is missing in AFTER."""
import difflib, glob, os, re, struct, subprocess, sys

RENAMES = []
DIFF_LINES = 0  # --diff N

def demangle(names):
    names = list(names)
    if not names:
        return []
    r = subprocess.run(['c++filt'], input='\n'.join(names), capture_output=True, text=True).stdout.split('\n')
    return r[:len(names)]

def key(dm):
    dm = re.sub(r'\(anonymous namespace\)::', 'ANON::', dm)
    dm = re.sub(r'_GLOBAL__N__\w+', 'ANON', dm)        # the anonymous namespace's per-file hash
    # the two per-compilation hashes of an internal global's name (_INTERNAL_<hash>_<len>_<file>_cu_<hash>), the
    # file name kept
    dm = re.sub(r'_INTERNAL_[0-9a-f]+_(\d+_\w+?_cu)_[0-9a-f]+\b', r'_INTERNAL_\1', dm)
    dm = re.sub(r'_INTERNAL_[0-9a-f]+_', '_INTERNAL_', dm)
    dm = re.sub(r'<false>', '', dm)                     # a non-template kernel made template<bool DQ_SLICES>
    dm = re.sub(r', false>', '>', dm)                   # a bool DQ_SLICES appended to a template kernel
    dm = re.sub(r'^void ', '', dm)                      # template functions mangle their return type
    return dm

def unit(path):
    """The translation unit a dump file is of: its name without .ptx / .cubin (and .sm80)."""
    return re.sub(r'(\.sm80)?\.(ptx|cubin)$', '', os.path.basename(path)) if path else None

def renamed(k, path=None):
    for old, new, where in RENAMES:
        if where is not None and where != unit(path):
            continue
        k2 = re.sub('^' + old + '$', new, k)
        if k2 != k:
            return k2
    return k

def load_renames(path):
    out = []
    for line in open(path):
        line = line.split('#', 1)[0].strip()
        if not line:
            continue
        if '=>' not in line:
            sys.exit(f"{path}: a line without '=>': {line!r} (write OLD_REGEX => NEW)")
        old, new = (x.strip() for x in line.split('=>', 1))
        where = None
        if ' @ ' in old:  # OLD @ UNIT: only the kernels of that translation unit's dump (e.g. a lab object's copy)
            old, where = (x.strip() for x in old.rsplit(' @ ', 1))
        out.append((old, new, where))
    return out

SYM = re.compile(r'_Z[A-Za-z0-9_]+')

def normalise_symbols(texts):
    """Demangles and normalises every mangled symbol in the texts (one c++filt call), returns the texts."""
    toks = sorted({t for s in texts for t in SYM.findall(s)})
    base = {t: re.sub(r'_param_\d+$', '', t) for t in toks}
    dm = dict(zip(sorted(set(base.values())), demangle(sorted(set(base.values())))))
    rep = {t: '<' + renamed(key(dm[base[t]])) + '>' + t[len(base[t]):] for t in toks}
    return [SYM.sub(lambda m: rep[m.group(0)], s) for s in texts]

# ---- PTX ----
ENTRY = re.compile(r'^(?:\.visible )?\.entry (\S+)\(', re.M)
NEXT = re.compile(r'^(?:\t// \.globl|(?:\.visible |\.weak |\.extern )?\.(?:entry|func) )', re.M)

def ptx_entries(text):
    """name -> the whole .entry, up to the next function (or its `// .globl` line) or the end of the file. Not up
    to the first `}` in column 0: inline asm blocks close with one, and the body would end there."""
    out = {}
    for m in ENTRY.finditer(text):
        n = NEXT.search(text, m.end())
        out[m.group(1)] = text[m.start():n.start() if n else len(text)].rstrip() + '\n'
    return out

LOOP_HINT = re.compile(r'^\t\.pragma "nounroll";\n', re.M)

REG = re.compile(r'%(rd|rs|fd|hh|r|f|h|p|b)(\d+)\b')

def renumber_registers(body):
    """Virtual registers renamed in order of first use per class, and the .reg counts dropped: NVVM's
    numbering depends on what else the module holds, so the same code can come out with other numbers."""
    body = re.sub(r'(\.reg \.\w+\s+%\w+)<\d+>;', r'\1<>;', body)
    seen = {}
    def sub(m):
        k = (m.group(1), m.group(2))
        if k not in seen:
            seen[k] = sum(1 for c in seen if c[0] == m.group(1))
        return f'%{m.group(1)}_{seen[k]}'
    return REG.sub(sub, body)

def ptx_kernels(path):
    e = ptx_entries(open(path).read())
    names = list(e)
    bodies = []
    for n in names:
        body = e[n].replace(n[2:], 'KERNEL')  # also names the kernel's local statics (_ZZ...E9cta_abort)
        body = re.sub(r'\$L__BB\d+_', '$L__BB_', body)
        body = LOOP_HINT.sub('', body)  # a loop hint: what ptxas made of it is the cubin comparison's
        bodies.append(renumber_registers(body))
    bodies = normalise_symbols(bodies)
    return [(renamed(key(dm), path), b, path) for dm, b in zip(demangle(names), bodies)]

# ---- cubin (ELF64) ----
def elf_sections(data):
    (shoff,) = struct.unpack_from('<Q', data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', data, 0x3A)
    secs = []
    for i in range(shnum):
        name, typ, flags, addr, off, size, link, info, align, entsize = struct.unpack_from(
            '<IIQQQQIIQQ', data, shoff + i * shentsize)
        secs.append(dict(name=name, type=typ, off=off, size=size, link=link, info=info, entsize=entsize))
    strtab = secs[shstrndx]
    def sname(o):
        b = data[strtab['off'] + o:]
        return b[:b.index(b'\0')].decode()
    for s in secs:
        s['name'] = sname(s['name'])
    return secs

EIATTR_REGCOUNT = 0x2f

def nv_info_regs(data, sec, syms):
    """Kernel symbol -> register count, from the cubin's .nv.info section (entries: format u8, attribute u8,
    then for format 4 a u16 size and that many payload bytes, else a u16 value; EIATTR_REGCOUNT's payload is
    the kernel's symbol index and the count, u32 each)."""
    out = {}
    if not sec:
        return out
    o, end = sec['off'], sec['off'] + sec['size']
    while o + 4 <= end:
        fmt, attr, size = struct.unpack_from('<BBH', data, o)
        if fmt == 0x04 and attr == EIATTR_REGCOUNT:
            sym, regs = struct.unpack_from('<II', data, o + 4)
            out[syms[sym]] = regs
        o += 4 + (size if fmt == 0x04 else 0)
    return out

def cubin_kernels(path):
    data = open(path, 'rb').read()
    secs = elf_sections(data)
    symtab = next(s for s in secs if s['type'] == 2)
    strs = secs[symtab['link']]
    def cstr(o):
        b = data[strs['off'] + o:]
        return b[:b.index(b'\0')].decode()
    syms = []
    for i in range(symtab['size'] // 24):
        st_name, st_info, st_other, st_shndx, st_value, st_size = struct.unpack_from(
            '<IBBHQQ', data, symtab['off'] + 24 * i)
        syms.append(cstr(st_name))
    by_name = {s['name']: s for s in secs}
    regs = nv_info_regs(data, by_name.get('.nv.info'), syms)
    kernels = {}
    for s in secs:
        if not s['name'].startswith('.text.'):
            continue
        k = s['name'][len('.text.'):]
        code = data[s['off']:s['off'] + s['size']]
        relocs = []
        for rname, is_rela in (('.rel.text.' + k, False), ('.rela.text.' + k, True)):
            r = by_name.get(rname)
            if not r:
                continue
            ent = 24 if is_rela else 16
            for j in range(r['size'] // ent):
                off, info = struct.unpack_from('<QQ', data, r['off'] + ent * j)
                add = struct.unpack_from('<q', data, r['off'] + ent * j + 16)[0] if is_rela else 0
                relocs.append(f"{off:x} {info & 0xffffffff} {syms[info >> 32]} {add}")
        sizes = {p: by_name[p + k]['size'] for p in ('.nv.shared.', '.nv.constant0.') if p + k in by_name}
        desc = f"regs {regs.get(k, '?')}, shared {sizes.get('.nv.shared.', 0)}, " \
               f"params {sizes.get('.nv.constant0.', 0)}"
        kernels[k] = (code, relocs, desc)
    names = list(kernels)
    texts = normalise_symbols(['\n'.join(kernels[n][1]) for n in names])
    return [(renamed(key(dm), path), (kernels[n][0], t, kernels[n][2]), path)
            for n, dm, t in zip(names, demangle(names), texts)]

def merge(paths, reader):
    """name -> [(code, file)]: one name may stand in several units (a file-local kernel of the same name)."""
    out = {}
    for p in paths:
        for k, v, path in reader(p):
            out.setdefault(k, []).append((v, path))
    return out

def compare(label, b, a):
    """Every (name, code) of BEFORE must have an identical (name, code) in AFTER."""
    n_same = n_all = n_removed = 0
    ok = True
    for k, versions in b.items():
        if k == '-':
            n_removed += len(versions)
            continue
        left = [v for v, _ in a.get(k, [])]
        for v, path in versions:
            n_all += 1
            if v in left:
                left.remove(v)
                n_same += 1
                continue
            ok = False
            where = 'MISSING' if k not in a else 'DIFFERS'
            extra = ''
            if k in a and isinstance(v, tuple):
                extra = ' (' + v[2] + ' -> ' + ', '.join(x[0][2] for x in a[k]) + ')'
            print(f"{label} {where}: {k[:200]} [{os.path.basename(path)}]{extra}")
            if DIFF_LINES and k in a and isinstance(v, str):
                diff = difflib.unified_diff(v.split('\n'), a[k][0][0].split('\n'), 'before', 'after', lineterm='', n=2)
                for line in list(diff)[:DIFF_LINES]:
                    print('    ' + line)
    n_new = sum(len(vs) for k, vs in a.items()) - n_same
    gone = f"; {n_removed} removed on purpose (--renames ... => -)" if n_removed else ""
    print(f"{label}: {n_same} of {n_all} kernels identical{gone}; {n_new} others in AFTER")
    return ok

def main(argv):
    global RENAMES, DIFF_LINES
    if '--renames' in argv:
        i = argv.index('--renames')
        RENAMES = load_renames(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    if '--diff' in argv:
        i = argv.index('--diff')
        DIFF_LINES = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2:]
    if argv and argv[0] == '--dirs' and len(argv) == 3:
        bdir, adir = argv[1], argv[2]
        ok = True
        for suffix_is_sm80 in (False, True):
            def pick(d, ext):
                fs = sorted(glob.glob(os.path.join(d, '*' + ext)))
                return [f for f in fs if f.endswith('.sm80' + ext) == suffix_is_sm80]
            tag = 'sm_80' if suffix_is_sm80 else 'sm_90a'
            bp, ap = pick(bdir, '.ptx'), pick(adir, '.ptx')
            if not bp:
                continue
            ok &= compare(f'[{tag} ptx]', merge(bp, ptx_kernels), merge(ap, ptx_kernels))
            bc, ac = pick(bdir, '.cubin'), pick(adir, '.cubin')
            ok &= compare(f'[{tag} sass]', merge(bc, cubin_kernels), merge(ac, cubin_kernels))
        return 0 if ok else 1
    if len(argv) == 2:
        return 0 if compare(os.path.basename(argv[0]), merge([argv[0]], ptx_kernels), merge([argv[1]], ptx_kernels)) else 1
    print(__doc__)
    return 2

if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
