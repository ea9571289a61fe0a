#!/usr/bin/env node
// dev/tokenizer_expected.js - produces the expected GPT-2 ids that
// tests/test_tokenizer.c checks, from an independent implementation:
// js-tiktoken@1.0.21, getEncoding("gpt2").encode(text, [], []).
//
// Why: the C tokenizer must give exactly tiktoken's ids. js-tiktoken is a
// separate implementation (JavaScript regex engine + its own bundled ranks),
// so agreeing with it on awkward strings and on a whole book is real evidence.
//
// Get js-tiktoken without installing anything into the repository:
//   mkdir -p /tmp/jstk && cd /tmp/jstk && npm pack js-tiktoken@1.0.21 base64-js@1.5.1 &&
//   tar xzf js-tiktoken-1.0.21.tgz && mkdir -p package/node_modules/base64-js &&
//   tar xzf base64-js-1.5.1.tgz -C package/node_modules/base64-js --strip-components=1
// (its only dependency is base64-js; the gpt2 ranks are bundled in dist/index.cjs).
// Tarball sha256 seen: js-tiktoken-1.0.21.tgz 3b1f24b185565ca9a8d8f51466dfc4f99d67f1f05bc009258710ddb7a8d810fa,
//                      base64-js-1.5.1.tgz    b1b7a945b52685269083425216d6597e33d97bf21699d656e92fdb3eb5210a85
//
// Usage (repository root):
//   node dev/tokenizer_expected.js /tmp/jstk/package [--write] [--corpus FILE]
// Prints the C table of cases, and with --write replaces the block between the
// GENERATED markers in tests/test_tokenizer.c. --corpus FILE prints FILE's
// token count and id checksum (default .cache/corpus/mobydick.txt).
//
// Invalid UTF-8: a JavaScript string cannot hold bytes that are not UTF-8, so
// js-tiktoken cannot be asked directly. Our rule (tokenizer.h) is that each
// byte that does not start a valid UTF-8 sequence is one character of its own
// that is neither letter, number nor space. For those cases this script maps
// each such byte to a private-use character (U+F0000 + byte: also "other"),
// splits with js-tiktoken's own pattern, puts the raw bytes back, and runs a
// plain BPE over js-tiktoken's rank table. That path is checked against
// enc.encode on every valid case before it is used.
"use strict";
const fs = require("fs");
const path = require("path");

const args = process.argv.slice(2);
if (args.length < 1 || args[0].startsWith("--")) {
    console.error("usage: node dev/tokenizer_expected.js JS_TIKTOKEN_PACKAGE_DIR [--write] [--corpus FILE]\n" +
                  "  (see the top of this file for how to get js-tiktoken@1.0.21 with npm pack)");
    process.exit(2);
}
const pkgDir = path.resolve(args[0]);
const write = args.includes("--write");
const corpusArg = args.indexOf("--corpus");
const corpusPath = corpusArg >= 0 ? args[corpusArg + 1] : ".cache/corpus/mobydick.txt";
const pkg = JSON.parse(fs.readFileSync(path.join(pkgDir, "package.json"), "utf8"));
if (pkg.name !== "js-tiktoken" || pkg.version !== "1.0.21")
    throw new Error(`${pkgDir} holds ${pkg.name}@${pkg.version}, expected js-tiktoken@1.0.21`);
const { getEncoding } = require(path.join(pkgDir, "dist/index.cjs"));
const enc = getEncoding("gpt2");

// ---- the checksum the C test recomputes: sum over i of (i + 1) * id_i, mod 2^61 ----
const MOD = 1n << 61n;
function checksum(ids) {
    let s = 0n;
    ids.forEach((id, i) => { s = (s + BigInt(i + 1) * BigInt(id)) % MOD; });
    return s;
}

// ---- strict UTF-8 decoding with one private-use character per invalid byte ----
const PLACEHOLDER_BASE = 0xf0000;
function decodeWithPlaceholders(bytes) {
    let out = "";
    for (let i = 0; i < bytes.length;) {
        const b = bytes[i];
        const len = b < 0x80 ? 1 : (b >= 0xc2 && b <= 0xdf) ? 2 : (b >= 0xe0 && b <= 0xef) ? 3 : (b >= 0xf0 && b <= 0xf4) ? 4 : 0;
        let cp = -1;
        if (len === 1) cp = b;
        else if (len > 1 && i + len <= bytes.length) {
            cp = b & (0x7f >> len);
            for (let k = 1; k < len; k++) {
                const c = bytes[i + k];
                if ((c & 0xc0) !== 0x80) { cp = -1; break; }
                cp = (cp << 6) | (c & 0x3f);
            }
            if (cp >= 0 && ((len === 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
                            (len === 4 && (cp < 0x10000 || cp > 0x10ffff)))) cp = -1;
        }
        if (cp < 0) { out += String.fromCodePoint(PLACEHOLDER_BASE + b); i += 1; }
        else { out += String.fromCodePoint(cp); i += len; }
    }
    return out;
}
function encodeBackToBytes(str) {
    const parts = [];
    for (const ch of str) {
        const cp = ch.codePointAt(0);
        if (cp >= PLACEHOLDER_BASE && cp < PLACEHOLDER_BASE + 256) parts.push(Buffer.from([cp - PLACEHOLDER_BASE]));
        else parts.push(Buffer.from(ch, "utf8"));
    }
    return Buffer.concat(parts);
}
const rankOf = (bytes) => enc.rankMap.get(Array.from(bytes).join(","));
function plainBpe(bytes) { // merge the lowest-rank adjacent pair, leftmost first, until none is a token
    let parts = Array.from(bytes, (b) => Buffer.from([b]));
    for (;;) {
        let best = null, bestAt = -1;
        for (let i = 0; i + 1 < parts.length; i++) {
            const r = rankOf(Buffer.concat([parts[i], parts[i + 1]]));
            if (r !== undefined && (best === null || r < best)) { best = r; bestAt = i; }
        }
        if (best === null) break;
        parts.splice(bestAt, 2, Buffer.concat([parts[bestAt], parts[bestAt + 1]]));
    }
    return parts.map(rankOf);
}
function encodeBytesByRule(bytes) {
    const text = decodeWithPlaceholders(bytes);
    const ids = [];
    for (const m of text.matchAll(new RegExp(enc.patStr, "ug"))) ids.push(...plainBpe(encodeBackToBytes(m[0])));
    return ids;
}
function isValidUtf8(bytes) {
    try { new TextDecoder("utf-8", { fatal: true }).decode(bytes); return true; } catch (e) { return false; }
}

// ---- the cases: [name, bytes, repeat] ----
const S = (s) => Buffer.from(s, "utf8");
const B = (...xs) => Buffer.concat(xs.map((x) => (typeof x === "string" ? S(x) : Buffer.from(x))));
const cases = [
    ["hello world", S("Hello world"), 1],
    ["empty", S(""), 1],
    ["punctuation and contraction", S("Hello, world! How's it going?"), 1],
    ["contractions", S("they'll I'M don't We'VE it's 'tis rock'n'roll y'all'd she'd I've 'S 're"), 1],
    ["apostrophes", S("' '' ''s 's' x'  'll'"), 1],
    ["emoji with ZWJ and variation selectors", S("I \u2764\ufe0f \ud83c\udf55 and \ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67\u200d\ud83d\udc66 family \ud83c\udff3\ufe0f\u200d\ud83c\udf08 \ud83d\udc4d\ud83c\udffd!"), 1],
    ["CJK", S("\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\u4e2d\u6587\u5b57\u7b26\u3002\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8"), 1],
    ["combining marks", S("e\u0301 cafe\u0301 Z\u0351\u0308\u036b na\u00efve r\u00e9sum\u00e9 \u0915\u094d\u0937"), 1],
    ["tabs", S("a\tb\t\tc\t \td \t\t"), 1],
    ["runs of spaces", S("a  b   c    d     e      !"), 1],
    ["runs of newlines", S("line1\n\nline2\n\n\n\nline3\n \n  x\r\n windows\r\n"), 1],
    ["trailing spaces", S("trailing   "), 1],
    ["leading spaces", S("   leading"), 1],
    ["only whitespace", S(" \n\t  \n"), 1],
    ["digits next to letters", S("abc123def 4567890 3.14159 1,000,000 x2 2x 0x1F 2024-05-20 v1.2.3"), 1],
    ["numbers in other scripts", S("\u0663\u0664\u0665 \uff15\uff16 \u216b \u00bd \u00b2"), 1],
    ["mixed scripts", S("\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440! \u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5. \u0645\u0631\u062d\u0628\u0627 \u05e9\u05dc\u05d5\u05dd \u0928\u092e\u0938\u094d\u0924\u0947 abc\u0434\u0435\u0444"), 1],
    ["unicode whitespace", S("a\u00a0b\u3000c\u2028d\u0085e\ufefff\u2003 g \u00a0 h"), 1],
    ["endoftext as text", S("Hello<|endoftext|>world <|endoftext|> <|endoftext|>"), 1],
    ["invalid UTF-8", B("abc", [0xff, 0xfe], "def ", [0x80, 0x80], " ok ", [0xc3], "( ", [0xe2, 0x82],
                        " x", [0xed, 0xa0, 0x80], "y ", [0xf4, 0x90, 0x80, 0x80], " ", [0xc0, 0xaf], "z", [0xf0, 0x9f, 0x8d]), 1],
    ["invalid UTF-8 next to punctuation and spaces", B("!", [0xff], "? ", [0xfe], "a ", [0x80], "'s  ", [0xc3], "\n", [0xff]), 1],
    ["long repeated letter", S("a"), 3000],
    ["long repeated space", S(" "), 2000],
    ["long repeated dash", S("-"), 1000],
    ["long repeated word", S("ab"), 700],
    ["long repeated CJK", S("\u6f22"), 400],
    ["code", S("int main(void) {\n    printf(\"%d\\n\", x[i] >= 0 ? 1 : -1);\n    return 0; // done\n}\n"), 1],
];

// ---- check the by-rule path against js-tiktoken itself, then compute every case ----
let agree = 0;
const rows = [];
for (const [name, unit, repeat] of cases) {
    const bytes = Buffer.concat(Array(repeat).fill(unit));
    let ids;
    if (isValidUtf8(bytes)) {
        ids = enc.encode(bytes.toString("utf8"), [], []);
        if (bytes.length <= 4000) {
            const byRule = encodeBytesByRule(bytes);
            if (JSON.stringify(byRule) !== JSON.stringify(ids)) throw new Error(`by-rule path disagrees with js-tiktoken on "${name}"`);
            agree++;
        }
        if (enc.decode(ids) !== bytes.toString("utf8")) throw new Error(`js-tiktoken does not round-trip "${name}"`);
    } else {
        ids = encodeBytesByRule(bytes);
    }
    rows.push({ name, unit, repeat, ids, valid: isValidUtf8(bytes) });
}

function cString(buf) {
    let s = "";
    for (const b of buf) {
        if (b === 0x22) s += '\\"';
        else if (b === 0x5c) s += "\\\\";
        else if (b >= 0x20 && b < 0x7f && b !== 0x3f) s += String.fromCharCode(b);
        else s += "\\" + b.toString(8).padStart(3, "0");
    }
    return `"${s}"`;
}
const MAX_LISTED_IDS = 200;
let out = "/* BEGIN GENERATED by dev/tokenizer_expected.js from js-tiktoken@1.0.21 (do not edit by hand) */\n";
out += "static const TokenizerCase CASES[] = {\n";
for (const r of rows) {
    const listed = r.ids.length <= MAX_LISTED_IDS;
    out += `    {${JSON.stringify(r.name)}, ${cString(r.unit)}, ${r.unit.length}, ${r.repeat}, ${r.ids.length}, ` +
           `${checksum(r.ids)}ull, ${r.valid ? "true" : "false"},\n`;
    out += listed ? `     (const int[]){${r.ids.join(", ") || "0"}}},\n` : "     NULL},\n";
}
out += "};\n";

// ---- the stress text: tests/test_tokenizer.c builds the same bytes with the same generator ----
// splitmix64 from the seed; per step: with 1/4 probability one of STRESS_PIECES, else a code
// point from a random range of STRESS_RANGES (surrogates skipped); with invalidBytes, 1/64 of the
// steps instead emit one raw byte 0x80..0xff. Stops once `steps` steps are done.
const STRESS_RANGES = [[0x20, 0x7e], [0x00, 0x1f], [0x80, 0x24f], [0x300, 0x36f], [0x370, 0x52f], [0x590, 0x6ff],
    [0x900, 0x9ff], [0xe00, 0xe7f], [0x1680, 0x1680], [0x2000, 0x206f], [0x2100, 0x218f], [0x3000, 0x30ff],
    [0x4e00, 0x4fff], [0xac00, 0xad00], [0xfb00, 0xffff], [0x10000, 0x1034f], [0x1d400, 0x1d7ff],
    [0x1f300, 0x1f6ff], [0x1f900, 0x1f9ff], [0x20000, 0x2001f], [0xe0000, 0xe007f]];
const STRESS_PIECES = [" ", "  ", "   ", "\n", "\n\n", "\t", " \n", "\r\n", "'", "'s", "'t", "'re", "'ve", "'m",
    "'ll", "'d", " 's", "'S", "0", "123", " 42"];
function stressText(seed, steps, invalidBytes) {
    const M64 = (1n << 64n) - 1n;
    let state = BigInt(seed);
    const next = () => {
        state = (state + 0x9e3779b97f4a7c15n) & M64;
        let z = state;
        z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & M64;
        z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & M64;
        return z ^ (z >> 31n);
    };
    const below = (k) => Number(next() % BigInt(k));
    const parts = [];
    for (let step = 0; step < steps; step++) {
        if (invalidBytes && below(64) === 0) { parts.push(Buffer.from([0x80 + below(128)])); continue; }
        if (below(4) === 0) { parts.push(S(STRESS_PIECES[below(STRESS_PIECES.length)])); continue; }
        const [lo, hi] = STRESS_RANGES[below(STRESS_RANGES.length)];
        const cp = lo + below(hi - lo + 1);
        if (cp >= 0xd800 && cp <= 0xdfff) continue;
        parts.push(S(String.fromCodePoint(cp)));
    }
    return Buffer.concat(parts);
}
const STRESS_SEED = 20240520, STRESS_STEPS = 60000;
for (const [tag, invalid] of [["STRESS", false], ["STRESS_INVALID", true]]) {
    const bytes = stressText(STRESS_SEED, STRESS_STEPS, invalid);
    const ids = invalid ? encodeBytesByRule(bytes) : enc.encode(bytes.toString("utf8"), [], []);
    if (!invalid && JSON.stringify(encodeBytesByRule(bytes)) !== JSON.stringify(ids))
        throw new Error("by-rule path disagrees with js-tiktoken on the stress text");
    if (invalid === isValidUtf8(bytes)) throw new Error(`${tag}: unexpected UTF-8 validity`);
    out += `#define ${tag}_BYTES ${bytes.length}\n#define ${tag}_TOKENS ${ids.length}\n#define ${tag}_CHECKSUM ${checksum(ids)}ull\n`;
}
out += `#define STRESS_SEED ${STRESS_SEED}ull\n#define STRESS_STEPS ${STRESS_STEPS}\n`;

let corpusNote = "";
if (fs.existsSync(corpusPath)) {
    const bytes = fs.readFileSync(corpusPath);
    if (!isValidUtf8(bytes)) throw new Error(`${corpusPath} is not valid UTF-8`);
    const ids = enc.encode(bytes.toString("utf8"), [], []);
    const sha = require("crypto").createHash("sha256").update(bytes).digest("hex");
    out += `/* ${path.basename(corpusPath)}: ${bytes.length} bytes, sha256 ${sha} */\n`;
    out += `#define CORPUS_BYTES ${bytes.length}\n#define CORPUS_TOKENS ${ids.length}\n#define CORPUS_CHECKSUM ${checksum(ids)}ull\n`;
    corpusNote = `${corpusPath}: ${ids.length} tokens, checksum ${checksum(ids)}`;
} else {
    console.error(`note: ${corpusPath} not found; corpus numbers not produced (run scripts/setup_data.sh)`);
}
out += "/* END GENERATED */\n";

console.error(`${rows.length} cases; by-rule path agrees with js-tiktoken on ${agree} valid cases. ${corpusNote}`);
if (write) {
    const testPath = path.resolve(__dirname, "../tests/test_tokenizer.c");
    const src = fs.readFileSync(testPath, "utf8");
    const re = /\/\* BEGIN GENERATED[\s\S]*?\/\* END GENERATED \*\/\n/;
    if (!re.test(src)) throw new Error(`${testPath} has no GENERATED block to replace`);
    fs.writeFileSync(testPath, src.replace(re, out));
    console.error(`updated ${testPath}`);
} else {
    process.stdout.write(out);
}
