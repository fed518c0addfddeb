// A deterministic corpus of varied strings for tokenizer parity tests and benchmarks:
// multilingual prose, CJK, emoji (ZWJ sequences, skin tones, flags, keycaps), code, long
// whitespace runs, digits, special tokens embedded in text, very long words, combining marks
// (decomposed forms exercise NFC), control characters and random code points.
//
//   import { makeCorpus } from './lib/corpus.mjs';
//   const strings = makeCorpus({ seed: 1, count: 2400, specials: ['<|eot_id|>'] });

function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const PROSE = [
  "The quick brown fox jumps over the lazy dog. It's 5 o'clock somewhere, isn't it?",
  "I'M SURE they'LL come; we'VE waited, HE'D said so, and she's right.",
  "Der schnelle braune Fuchs springt über den faulen Hund. Größe, Maß, Straße.",
  "Le cœur a ses raisons que la raison ne connaît point. Où est l'hôtel ?",
  "¿Dónde está la biblioteca? ¡Qué día tan bonito! Mañana será otro día.",
  "Съешь же ещё этих мягких французских булок, да выпей чаю.",
  "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία. Αυτό είναι ελληνικό κείμενο.",
  "نص عربي للاختبار مع أرقام ١٢٣٤ وعلامات ترقيم، وكلمات طويلة.",
  "עברית היא שפה שמית. זה משפט לבדיקה עם ניקוד: שָׁלוֹם.",
  "हिन्दी एक भारतीय भाषा है। यह परीक्षण वाक्य है।",
  "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ ทดสอบการตัดคำ",
  "Tiếng Việt có nhiều dấu: người, được, những, thương.",
  "Pijamalı hasta yağız şoföre çabucak güvendi. İstanbul, ıIiİ.",
  "Zażółć gęślą jaźń. Pchnąć w tę łódź jeża lub ośm skrzyń fig.",
  "다람쥐 헌 쳇바퀴에 타고파. 한국어 문장을 시험합니다.",
  "いろはにほへと ちりぬるを。日本語の文章、カタカナとひらがな。",
  "我能吞下玻璃而不伤身体。这是一个中文句子，包含标点符号！",
  "這是繁體中文的句子，測試「引號」與『書名號』。",
  "Ｆｕｌｌｗｉｄｔｈ　ｔｅｘｔ　１２３，ｍｉｘｅｄ　ｗｉｔｈ　ascii.",
  "Smart “quotes” and ‘single’ ones — with dashes – and ellipses…",
  "Math: ∀x∈ℝ, x²≥0; ∑ᵢ aᵢ = ∫₀¹ f(t) dt ≈ 3.14159 ± 0.001.",
  "Currency: $1,234.56, €99, £5, ¥1000, ₹250, ₿0.001.",
  "Email me at someone@example.com or visit https://example.org/path?q=1&x=%20y#frag.",
  "Ελληνικά, Русский, 中文, العربية, हिन्दी in one line.",
];

const CJK = [
  "人工智能正在改变世界",
  "東京都渋谷区",
  "ソフトウェアエンジニアリング",
  "대한민국 서울특별시",
  "𠀀𠀁𠀂 extension-B characters 𪚥",
  "。，、；：？！（）【】《》",
];

const EMOJI = [
  "👍", "😀😃😄", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🇺🇸🇯🇵🇩🇪", "1️⃣2️⃣#️⃣", "❤️‍🔥",
  "🧑🏿‍🤝‍🧑🏻", "👁️‍🗨️", "✌🏾", "🤷‍♀️", "🐈‍⬛", "©️®️™️", "🫠🫡🫶",
];

const CODE = [
  "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
  "#include <vector>\nint main() {\n\tstd::vector<int> v{1, 2, 3};\n\treturn v.size() == 3 ? 0 : 1;\n}\n",
  "const x = await fetch(`/api/${id}`).then(r => r.json());\r\nconsole.log(x?.data ?? []);\r\n",
  '{"key": "value", "nested": {"list": [1, 2.5, -3e10, true, null]}}',
  "<div class=\"a\">\n  <p>Hello &amp; goodbye</p>\n</div>",
  "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%smith%';",
  "for (int i = 0; i < n; ++i) { a[i] += b[i] * c[i]; }  // axpy",
  "    \t  indented_with_mixed_whitespace = True\n\n\n",
  "fn main() -> Result<(), Box<dyn Error>> { println!(\"{:?}\", vec![1u8; 4]); Ok(()) }",
  "$ ls -la | grep '^d' | awk '{print $9}' > dirs.txt 2>&1",
];

const SPACES = [" ", "  ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u2009", "\u200b", "\u2028", "\v", "\f"];

const COMBINING = [
  "e\u0301", "a\u0308", "n\u0303", "A\u030a", "\u1100\u1161\u11a8", "o\u0302\u0323",
  "Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334\u0319\u0324\u031e\u0349\u035a\u032f\u031e\u0320\u034d",
  "\u0915\u094d\u0937", "\u1e9b\u0323",
];

function pick(rng, list) {
  return list[Math.floor(rng() * list.length)];
}

function randInt(rng, lo, hi) {
  return lo + Math.floor(rng() * (hi - lo + 1));
}

function randomCodepoint(rng) {
  const ranges = [
    [0x0, 0x7f], [0x80, 0x7ff], [0x800, 0xd7ff], [0xe000, 0xfffd], [0x10000, 0x1faff],
    [0x20000, 0x2fa1f], [0xf0000, 0xf00ff],
  ];
  const [lo, hi] = pick(rng, ranges);
  return String.fromCodePoint(randInt(rng, lo, hi));
}

function longWord(rng) {
  const kind = randInt(rng, 0, 5);
  const n = randInt(rng, 200, 4000);
  if (kind === 0) return "a".repeat(n);
  if (kind === 1) {
    let s = "";
    const letters = "abcdefghijklmnopqrstuvwxyz";
    while (s.length < n) s += letters[randInt(rng, 0, 25)];
    return s;
  }
  if (kind === 2) return "Supercalifragilisticexpialidocious".repeat(Math.ceil(n / 34));
  if (kind === 3) {
    let s = "";
    const b64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    while (s.length < n) s += b64[randInt(rng, 0, 63)];
    return s + "==";
  }
  if (kind === 4) return "長".repeat(Math.ceil(n / 3));
  return "ab".repeat(n / 2) + "é".repeat(10);
}

function digits(rng) {
  const kind = randInt(rng, 0, 4);
  if (kind === 0) return String(randInt(rng, 0, 1e9)) + String(randInt(rng, 0, 1e9));
  if (kind === 1) return `${randInt(rng, 0, 99999)}.${randInt(rng, 0, 99999)}`;
  if (kind === 2) return "1234567890".repeat(randInt(rng, 1, 30));
  if (kind === 3) return "٠١٢٣٤٥٦٧٨٩ ０１２３ ①②③ ½ ¾";
  return `${randInt(rng, 1, 12)}/${randInt(rng, 1, 31)}/${randInt(rng, 1900, 2100)} ${randInt(rng, 0, 23)}:${randInt(rng, 10, 59)}`;
}

function whitespaceRun(rng) {
  let s = "";
  const n = randInt(rng, 1, 80);
  for (let i = 0; i < n; i++) s += pick(rng, SPACES);
  if (rng() < 0.2) s += " ".repeat(randInt(rng, 100, 2000));
  return s;
}

function randomUnicode(rng) {
  let s = "";
  const n = randInt(rng, 1, 40);
  for (let i = 0; i < n; i++) s += randomCodepoint(rng);
  return s;
}

function piece(rng, specials) {
  const r = rng();
  if (r < 0.22) return pick(rng, PROSE);
  if (r < 0.30) return pick(rng, CJK);
  if (r < 0.38) return pick(rng, EMOJI);
  if (r < 0.48) return pick(rng, CODE);
  if (r < 0.55) return whitespaceRun(rng);
  if (r < 0.62) return digits(rng);
  if (r < 0.70 && specials.length) return pick(rng, specials);
  if (r < 0.74) return longWord(rng);
  if (r < 0.80) return pick(rng, COMBINING);
  if (r < 0.88) return randomUnicode(rng);
  return pick(rng, ["'s", "'T", "'re", "'VE", "'m", "'Ll", "'d", "’s", " ", "\n", "-", "..."]);
}

// Returns `count` strings; the first ones are the plain building blocks themselves.
export function makeCorpus({ seed = 1, count = 2400, specials = [] } = {}) {
  const rng = mulberry32(seed);
  const out = [...PROSE, ...CJK, ...EMOJI, ...CODE, ...COMBINING, ...specials, "", " ", "\n\n"];
  for (const s of specials) out.push(`text${s}more`, ` ${s} `, `${s}${s}`, s.slice(0, -2));
  while (out.length < count) {
    const parts = randInt(rng, 1, 8);
    let s = "";
    for (let i = 0; i < parts; i++) {
      s += piece(rng, specials);
      if (rng() < 0.5) s += pick(rng, [" ", "", "\n", ", ", " - "]);
    }
    out.push(s);
  }
  return out.slice(0, count);
}
