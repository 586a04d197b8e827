// Job: write o200k_base in the standard tiktoken.model format ("base64 rank" lines) from the ranks
// shipped inside npm tiktoken@1.0.22 (same logic as shared/tools/tokenizer-oracle/make_o200k_tiktoken.cjs).
// It is the stand-in vocabulary of the tokenizer parity test (the real Kimi tiktoken.model is not public).
// usage: node tests/tokenizer/make_o200k.cjs NODE_MODULES_PARENT > tiktoken.model
const fs = require("fs"), path = require("path"), { createRequire } = require("module");
const req = createRequire(path.join(path.resolve(process.argv[2] || "."), "noop.js"));
const j = JSON.parse(fs.readFileSync(req.resolve("tiktoken/encoders/o200k_base.json"), "utf8"));
const out = [];
for (const line of j.bpe_ranks.split("\n")) { if (!line) continue;
  const [, off, ...toks] = line.split(" "); toks.forEach((t, i) => out.push(`${t} ${Number(off) + i}`)); }
process.stdout.write(out.join("\n") + "\n");
