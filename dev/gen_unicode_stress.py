#!/usr/bin/env python3
"""dev/gen_unicode_stress.py - writes a seeded random text that stresses GPT-2
pre-tokenization: code points from many scripts and planes, emoji, controls,
Unicode spaces, runs of spaces/tabs/newlines and contractions, all mixed.

Why: comparing our ids with tiktoken's on ordinary prose (dev/bench_tokenizer.sh)
exercises only a few code paths; this text exercises the class tables and the
whitespace and apostrophe rules on every script at once.

Usage: dev/gen_unicode_stress.py [--chars N] [--seed S] [--no-disputed] > FILE
  --no-disputed  leave out U+0085 (NEL) and U+FEFF (BOM), the two characters on
                 which the references disagree: JavaScript's \\s (js-tiktoken, and
                 so ours) excludes NEL and includes BOM, Rust's \\s (tiktoken) is
                 the Unicode White_Space set, which does the opposite.
"""
import argparse
import random
import sys

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--chars", type=int, default=300000)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--no-disputed", action="store_true")
args = ap.parse_args()
rng = random.Random(args.seed)
ranges = [(0x20, 0x7E), (0x00, 0x1F), (0x80, 0x24F), (0x300, 0x36F), (0x370, 0x52F), (0x590, 0x6FF),
          (0x900, 0x9FF), (0xE00, 0xE7F), (0x1680, 0x1680), (0x2000, 0x206F), (0x2100, 0x218F),
          (0x3000, 0x30FF), (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0xFB00, 0xFFFF), (0x10000, 0x1034F),
          (0x1D400, 0x1D7FF), (0x1F300, 0x1F6FF), (0x1F900, 0x1F9FF), (0x20000, 0x2001F), (0xE0000, 0xE007F)]
pieces = [" ", "  ", "   ", "\n", "\n\n", "\t", " \n", "\r\n", "'", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d",
          " 's", "'S", "0", "123", " 42"]
out = []
while len(out) < args.chars:
    if rng.random() < 0.25:
        out.append(rng.choice(pieces))
        continue
    lo, hi = rng.choice(ranges)
    cp = rng.randint(lo, hi)
    if 0xD800 <= cp <= 0xDFFF or (args.no_disputed and cp in (0x85, 0xFEFF)):
        continue
    out.append(chr(cp))
sys.stdout.buffer.write("".join(out).encode("utf-8"))
