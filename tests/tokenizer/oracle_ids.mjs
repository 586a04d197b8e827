// Job: expected ids for the tokenizer parity corpus, computed by npm tiktoken@1.0.22 (the WASM build of
// tiktoken's Rust core) with the Kimi pattern, specials from a tokenizer_config.json and the Kimi
// wrapper's 400k / 25k chunking: the logic of shared/tools/tokenizer-oracle/kimi_oracle.cjs, run over
// every corpus record in one process.
// usage: node tests/tokenizer/oracle_ids.mjs NODE_MODULES_PARENT RANKS CONFIG CORPUS > expected.txt
// Output: one line per record, ids space-separated.
import fs from "fs";
import path from "path";
import { createRequire } from "module";

const [base, ranksPath, configPath, corpusPath] = process.argv.slice(2);
const req = createRequire(path.join(path.resolve(base), "noop.js"));
const { Tiktoken } = req("tiktoken");
const PAT = [String.raw`[\p{Han}]+`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
  String.raw`\p{N}{1,3}`, String.raw` ?[^\s\p{L}\p{N}]+[\r\n]*`, String.raw`\s*[\r\n]+`, String.raw`\s+(?!\S)`, String.raw`\s+`].join("|");
const bfe = fs.readFileSync(ranksPath, "utf8");
const nBase = bfe.split("\n").filter(l => l.trim()).length;
const atd = JSON.parse(fs.readFileSync(configPath, "utf8")).added_tokens_decoder;
const names = {};
for (const [id, v] of Object.entries(atd)) names[Number(id) - nBase] = v.content;
const special = {};
for (let k = 0; k < 256; k++) special[names[k] ?? `<|reserved_token_${nBase + k}|>`] = nBase + k;
const enc = new Tiktoken(bfe, special, PAT);
const pyspace = c => (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c === 0x85 || c === 0xa0 || c === 0x1680 ||
  (c >= 0x2000 && c <= 0x200a) || c === 0x2028 || c === 0x2029 || c === 0x202f || c === 0x205f || c === 0x3000;
function* runs(cps, max) { // tokenization_kimi.py _split_whitespaces_or_nonwhitespaces
  let len = 0, sp = cps.length ? pyspace(cps[0]) : false, start = 0;
  for (let i = 0; i < cps.length; i++) { const now = pyspace(cps[i]);
    if (sp !== now) { len = 1; sp = now; } else if (++len > max) { yield cps.slice(start, i); start = i; len = 1; } }
  yield cps.slice(start);
}
function kimiEncode(text, allowSpecial) {
  const cps = Array.from(text, ch => ch.codePointAt(0)), ids = [];
  for (let i = 0; i < cps.length; i += 400000)
    for (const r of runs(cps.slice(i, i + 400000), 25000)) {
      let s = ""; for (let k = 0; k < r.length; k += 8192) s += String.fromCodePoint(...r.slice(k, k + 8192));
      for (const id of (allowSpecial ? enc.encode(s, "all") : enc.encode(s, [], []))) ids.push(id);
    }
  return ids;
}
const buf = fs.readFileSync(corpusPath), lines = [];
for (let p = 0; p < buf.length;) {
  const nl = buf.indexOf(10, p), hdr = buf.subarray(p, nl).toString("latin1").split(" ");
  if (hdr[0] !== "@") throw new Error("bad corpus header at " + p);
  const n = Number(hdr[1]), sp = hdr[2] === "1", text = buf.subarray(nl + 1, nl + 1 + n).toString("utf8");
  lines.push(kimiEncode(text, sp).join(" "));
  p = nl + 1 + n + 1;
}
process.stdout.write(lines.join("\n") + "\n");
