#!/usr/bin/env bash
# Job: tokenizer encode throughput (`make bench` runs it via scripts/bench.sh). Times the C tokenizer
# (bin/test_tokenizer --bench: one thread, whole tokenizer_encode incl. UTF-8 validation, chunking and
# special scan) and, when the npm registry answers, npm tiktoken@1.0.22 (WASM build of tiktoken's Rust
# core; encode(text, "all") on the whole input with the same specials, no Kimi chunking) on the same inputs, with o200k_base
# ranks (the test stand-in vocabulary) and the Kimi pattern. Inputs: the udhr part of the tokenizer
# test corpus (532 languages) and this repository's C sources. Prints the results and rewrites the
# "## Tokenizer" section of docs/PERFORMANCE.md (other sections are left alone).
# Env: BENCH_SECONDS (default 3) per measurement, K3_TOK_OFFLINE=1 to skip npm.
set -eu
cd "$(dirname "$0")/.."
PY="${PYTHON:-/usr/bin/python3}"
SECS="${BENCH_SECONDS:-3}"
W=$(mktemp -d /tmp/k3tokbench.XXXXXX)
trap 'rm -rf "$W"' EXIT
make -s bin/test_tokenizer >/dev/null
mkdir -p "$W/o200k"
gzip -dc tests/tokenizer/o200k/tiktoken.model.gz > "$W/o200k/tiktoken.model"
cp tests/tokenizer/o200k/tokenizer_config.json "$W/o200k/"
gzip -dc tests/tokenizer/corpus.bin.gz > "$W/corpus.bin"
"$PY" - "$W/corpus.bin" "$W/udhr.txt" <<'EOF'
import sys
buf, p, out = open(sys.argv[1], "rb").read(), 0, []
while p < len(buf):
    nl = buf.index(b"\n", p); h = buf[p:nl].decode().split(" "); n = int(h[1])
    if h[3].startswith("udhr/"): out.append(buf[nl + 1:nl + 1 + n])
    p = nl + 1 + n + 1
open(sys.argv[2], "wb").write(b"\n".join(out))
EOF
git ls-files '*.c' '*.h' | grep -v unicode_classes.c | xargs cat > "$W/code.txt"

node_ok=0
if [ "${K3_TOK_OFFLINE:-0}" != 1 ] && command -v node >/dev/null && command -v npm >/dev/null &&
   timeout 10 npm view tiktoken@1.0.22 version >/dev/null 2>&1; then
  mkdir -p "$W/npm"
  (cd "$W/npm" && echo '{"private":true}' > package.json &&
   timeout 240 npm install --no-audit --no-fund --ignore-scripts --no-package-lock tiktoken@1.0.22 >/dev/null 2>&1) && node_ok=1
fi
cat > "$W/tt.mjs" <<'EOF'
import fs from "fs"; import path from "path"; import { createRequire } from "module";
const [base, ranksPath, file, secs] = process.argv.slice(2);
const { Tiktoken } = createRequire(path.join(base, "noop.js"))("tiktoken");
const PAT = [String.raw`[\p{Han}]+`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`\p{N}{1,3}`, String.raw` ?[^\s\p{L}\p{N}]+[\r\n]*`, String.raw`\s*[\r\n]+`, String.raw`\s+(?!\S)`, String.raw`\s+`].join("|");
const bfe = fs.readFileSync(ranksPath, "utf8"), nBase = bfe.split("\n").filter(l => l.trim()).length;
const atd = JSON.parse(fs.readFileSync(path.join(path.dirname(ranksPath), "tokenizer_config.json"), "utf8")).added_tokens_decoder;
const names = {}, special = {};
for (const [id, v] of Object.entries(atd)) names[Number(id) - nBase] = v.content;
for (let k = 0; k < 256; k++) special[names[k] ?? `<|reserved_token_${nBase + k}|>`] = nBase + k;
const enc = new Tiktoken(bfe, special, PAT);
const text = fs.readFileSync(file, "utf8"), bytes = Buffer.byteLength(text);
let reps = 0, n = 0, el = 0; const t0 = process.hrtime.bigint(), c0 = process.cpuUsage();
do { n = enc.encode(text, "all").length; reps++; el = Number(process.hrtime.bigint() - t0) / 1e9; } while (el < Number(secs) || reps < 2);
const c = process.cpuUsage(c0), cpu = (c.user + c.system) / 1e6;
console.log(`tiktoken ${bytes} ${n} ${(bytes * reps / cpu / 1e6).toFixed(2)} ${(bytes * reps / el / 1e6).toFixed(2)}`);
EOF

rows=""
for input in udhr code; do
  f="$W/$input.txt"
  c=$(bin/test_tokenizer --bench "$W/o200k" "$f" "$SECS")
  echo "C   $input: $c"
  bytes=$(echo "$c" | sed -E 's/.*encode ([0-9]+) bytes.*/\1/')
  toks=$(echo "$c" | sed -E 's/.*-> ([0-9]+) tokens.*/\1/')
  cwall=$(echo "$c" | sed -E 's/.* ([0-9.]+) MB\/s wall.*/\1/')
  ccpu=$(echo "$c" | sed -E 's/.* ([0-9.]+) MB\/s cpu.*/\1/')
  if [ "$node_ok" = 1 ]; then
    t=$(node "$W/tt.mjs" "$W/npm" "$W/o200k/tiktoken.model" "$f" "$SECS")
    echo "npm $input: $t"
    tcpu=$(echo "$t" | cut -d' ' -f4); twall=$(echo "$t" | cut -d' ' -f5)
    x=$(awk -v a="$ccpu" -v b="$tcpu" 'BEGIN { printf "%.1fx", a / b }')
    rows="$rows| $input | $bytes | $toks | $ccpu / $cwall | $tcpu / $twall | $x |"$'\n'
  else
    rows="$rows| $input | $bytes | $toks | $ccpu / $cwall | (npm not reachable) | |"$'\n'
  fi
done

cpu=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
mkdir -p docs
[ -f docs/PERFORMANCE.md ] || printf '# Performance\n\nMeasured numbers; each section names its machine and command.\n' > docs/PERFORMANCE.md
SECTION="$W/section.md"
cat > "$SECTION" <<EOF
## Tokenizer

Encode throughput, one thread, o200k_base ranks (199,998, the test stand-in for the Kimi vocabulary)
with the Kimi pattern and specials. Command: \`make bench\` (scripts/bench_tokenizer.sh,
BENCH_SECONDS=$SECS). Machine: ${cpu:-unknown CPU}, $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg) at
the start (shared machine: CPU-time rates are the comparable ones). $(date -u +%Y-%m-%d).

| input | bytes | tokens (C) | C tokenizer MB/s (cpu / wall) | npm tiktoken 1.0.22 MB/s (cpu / wall) | C vs tiktoken (cpu) |
|---|---|---|---|---|---|
${rows}
- udhr: the udhr part of tests/tokenizer/corpus.bin.gz (532 languages, up to 5,000 code points
  each): the hard case, many pieces that are not whole tokens. code: this repository's C sources.
- C: \`bin/test_tokenizer --bench\` = tokenizer_encode() on the whole input (UTF-8 validation,
  400k / 25k chunking, special scan, split, BPE). tiktoken: \`encode(text, "all")\` of the WASM
  build (fancy-regex split), same specials, no chunking: token counts differ only at the C side's
  400,000-code-point cuts.
- MB/s = 10^6 input bytes per second.
EOF
"$PY" - docs/PERFORMANCE.md "$SECTION" <<'EOF'
import sys, re
path, sec = sys.argv[1], open(sys.argv[2]).read().rstrip("\n") + "\n"
doc = open(path).read()
m = re.search(r"^## Tokenizer[ \t]*\n", doc, re.M)
if m:
    nxt = re.search(r"^## ", doc[m.end():], re.M)
    end = m.end() + nxt.start() if nxt else len(doc)
    doc = doc[:m.start()] + sec + ("\n" if nxt else "") + doc[end:]
else:
    doc = doc.rstrip("\n") + "\n\n" + sec
open(path, "w").write(doc)
EOF
echo "wrote the Tokenizer section of docs/PERFORMANCE.md"
