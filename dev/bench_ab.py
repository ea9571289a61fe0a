#!/usr/bin/env python3
"""dev/bench_ab.py - bench_attention consoles of several builds (and rounds) as one markdown table.

  dev/bench_ab.py NAME=GLOB [NAME=GLOB ...] [--ratio]

Why: an A/B of attention kernels is a set of bench_attention consoles, one per build and alternating round
(`dev/device_session.sh` attnab writes attnab_R_new.txt / attnab_R_old.txt; hand-made calls write any names),
and its results file wants one table: per shape and mode, each build's mean fwd and bwd time over its rounds,
each build's fwd and bwd change against the first one named (the baseline), and whether the build's forward and
backward rounds each all lie on one side of the baseline's ("all below" / "all above": no round of one reaches a
round of the other; "overlap": a mean change inside the rounds' spread, not a result). A row a build lacks shows "-";
a console line whose NaN/Inf column is not 0 makes the script fail, naming the file: such a time measures a
broken kernel. --ratio prints the changes as ratios (x.xxx) instead of percent.

Input lines are bench_attention's rows: `B.. H.. T.. D..  mode  fwd ms  bwd ms  f+b ms  ...  NaN/Inf ...`.
"""
import argparse
import glob
import re
import signal
import sys

ROW = re.compile(r'^(B\d+ H\d+ T\d+ D\d+)\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+\S+\s+\S+\s+\S+\s+(\d+)')


def read(name, pattern):
    """(shape, mode) -> (mean fwd ms, mean bwd ms, rounds, the rounds' fwd ms, the rounds' bwd ms) over the files of
    `pattern`, keys in the order the rows appear"""
    files = sorted(glob.glob(pattern))
    if not files:
        sys.exit(f"bench_ab.py: {name}={pattern} matches no file")
    times = {}
    for f in files:
        n = 0
        for line in open(f):
            m = ROW.match(line)
            if not m:
                continue
            if int(m.group(6)) != 0:
                sys.exit(f"bench_ab.py: {f}: {m.group(1)} {m.group(2)} has {m.group(6)} NaN/Inf outputs; "
                         "its time measures a broken kernel")
            times.setdefault((m.group(1), m.group(2)), []).append((float(m.group(3)), float(m.group(4))))
            n += 1
        if n == 0:
            sys.exit(f"bench_ab.py: {f} holds no bench_attention row (B.. H.. T.. D.. mode fwd bwd ...)")
    return {k: (sum(x[0] for x in xs) / len(xs), sum(x[1] for x in xs) / len(xs), len(xs), [x[0] for x in xs],
                [x[1] for x in xs]) for k, xs in times.items()}


def apart(new, base):
    """whether every round of `new` (one op's times) lies below or above every round of `base`"""
    if max(new) < min(base):
        return 'all below'
    if min(new) > max(base):
        return 'all above'
    return 'overlap'


def main():
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # piped into head: stop quietly
    ap = argparse.ArgumentParser(description=__doc__.split('\n\n')[1], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument('builds', nargs='+', metavar='NAME=GLOB', help='the first is the baseline')
    ap.add_argument('--ratio', action='store_true', help='changes as new/base ratios, not percent')
    a = ap.parse_args()
    builds = []
    for b in a.builds:
        if '=' not in b:
            sys.exit(f"bench_ab.py: '{b}' is not NAME=GLOB (e.g. main='out/main_*.txt')")
        name, pattern = b.split('=', 1)
        builds.append((name, read(name, pattern)))
    rows = []
    for _, data in builds:
        rows += [k for k in data if k not in rows]

    def change(new, old):
        return f'{new / old:.3f}' if a.ratio else f'{100 * (new / old - 1):+.1f}%'

    base_name, base = builds[0]
    head = ['shape', 'mode'] + [f'{n} fwd / bwd ms (rounds)' for n, _ in builds]
    head += [f'{n} vs {base_name}: fwd / bwd' for n, _ in builds[1:]]
    head += [f'{n} fwd / bwd rounds vs {base_name}\'s' for n, _ in builds[1:]]
    print('| ' + ' | '.join(head) + ' |')
    print('|' + '---|' * 2 + '---:|' * (len(head) - 2))
    for key in rows:
        cells = list(key)
        for _, data in builds:
            m = data.get(key)
            cells.append(f'{m[0]:.4f} / {m[1]:.4f} ({m[2]})' if m else '-')
        for _, data in builds[1:]:
            m, mb = data.get(key), base.get(key)
            cells.append(f'{change(m[0], mb[0])} / {change(m[1], mb[1])}' if m and mb else '-')
        for _, data in builds[1:]:
            m, mb = data.get(key), base.get(key)
            cells.append(f'{apart(m[3], mb[3])} / {apart(m[4], mb[4])}' if m and mb else '-')
        print('| ' + ' | '.join(cells) + ' |')

if __name__ == '__main__':
    main()
