"""Deterministic test strings for tokenizer parity: many scripts, emoji, digits, whitespace runs,
code, special-token strings, and random mixtures of them."""
import random

ENGLISH = [
    "Hello, world!", "The quick brown fox jumps over the lazy dog.", "It's 5 o'clock; we're late.",
    "I'll say: \"don't\" — they'd've known.", "e.g. U.S.A., Ph.D., a.m./p.m.", "CamelCaseIdentifiersAndSNAKE_CASE",
    "What hath God wrought?", "To be, or not to be: that is the question.", "ALL CAPS SHOUTING!!!",
    "mixedCASE and   multiple   spaces", "trailing space ", " leading space", "tab\tseparated\tvalues",
]
CODE = [
    "def f(x):\n    return x ** 2  # square\n", "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "#include <vector>\nint main() { std::vector<int> v{1,2,3}; }", "SELECT * FROM users WHERE id = 42;",
    '{"key": [1, 2.5, -3e10, true, null], "nested": {"a": "b"}}', "<div class=\"x\">&nbsp;&lt;tag&gt;</div>",
    "if x!=y&&z>=0||w<=1: pass", "$ ls -la ~/.config | grep -v '^d' > out.txt 2>&1", "fn main() -> Result<(), Box<dyn Error>> {}",
    "    \n\t\t// indented comment\r\n", "a+=b;c-=d;e*=f;g/=h;i%=j;", "@decorator\nclass A(B, metaclass=M): ...",
    "https://example.com/path?query=1&b=%20x#frag", "user@example.org", "C:\\Windows\\System32\\drivers",
    "x = [i**2 for i in range(10) if i % 2 == 0]", "```python\nprint('hi')\n```", "---\ntitle: test\n---",
]
CJK = [
    "你好，世界！", "我爱自然语言处理。", "深度求索（DeepSeek）发布了新模型", "中文English混合123测试",
    "こんにちは、世界。", "カタカナとひらがな", "東京都渋谷区", "한국어 텍스트입니다.", "漢字かなカナ交じり文",
    "鿥鿦〇", "ｆｕｌｌｗｉｄｔｈ　ＡＢＣ１２３", "「引用」『二重』【括弧】", "一二三四五六七八九十百千万亿",
]
EMOJI = [
    "😀😃😄", "👍🏽 thumbs", "👨‍👩‍👧‍👦 family", "🇫🇷🇯🇵 flags", "❤️ love", "🏳️‍🌈", "a😀b", "🤖:🚀🚀🚀",
    "1️⃣ keycap", "☃☀★☆", "𝔾𝕠𝕠𝕕 𝕞𝕠𝕣𝕟𝕚𝕟𝕘", "𓀀𓀁 hieroglyphs", "🧑🏿‍💻",
]
DIGITS = [
    "1234567890", "3.14159265358979", "1,000,000", "-42", "+1e-9", "0x1F2E3D", "2024-11-29T08:55:19Z",
    "٠١٢٣٤٥٦٧٨٩", "१२३४", "①②③", "x²+y³=z⁴", "ⅠⅡⅢⅣ", "１２３４５", "12a34b567c8901d", "v1.2.3-rc.4",
    "999999999999999999999", "1 2  3   4", "100%", "$19.99", "½ ¼ ¾",
]
WHITESPACE = [
    " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n ", "\t \t", "a  b", "a\n\nb", "a \n b",
    "\u00a0", "a\u00a0b", "\u3000", "\u2028", "\u2029", "\u0085", "x\u0085y", "\u200b", "\u2003\u2003",
    "\f\v", "end   ", "   start", " \t\n\r ", "word\n", "\n\n\n\n\n", "a" + " " * 17 + "b",
]
SCRIPTS = [
    "Привет, мир!", "Ελληνικά γράμματα", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก",
    "Tiếng Việt có dấu", "naïve café résumé", "Ångström Œuvre ß", "e\u0301 composed vs é", "ﬁ ligature ﬂ",
    "İstanbul ıi", "ǅ titlecase", "Zalgo: z̷̢̛a̸̡l̵g̶o̴", "ქართული", "Հայերեն", "ኢትዮጵያ", "ᏣᎳᎩ",
    "ㄅㄆㄇ", "ꦗꦮ", "𐌰𐌱𐌲 gothic", "Ω≈ç√∫˜µ≤≥÷", "¡¿«»‹›„“”‘’", "§¶†‡•…‰′″", "←↑→↓↔", "∀∃∅∈∉∑∏",
]
SPECIAL = [
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<think>", "</think>",
    "<|EOT|>", "<｜fim▁hole｜>", "｜DSML｜", "<dsml:", "</dsml:", "<｜tool▁calls▁begin｜>", "<｜▁pad▁｜>",
    "<｜place▁holder▁no▁1｜>", "<｜User｜", "<think", "<｜image｜>", "<｜latest_reminder｜>",
]
PUNCT = [
    "!!!", "???", "...", "---", "***", "___", "~~~", "''", '""', "(())", "[[]]", "{{}}", "<<>>", ";;", "::",
    "!?", "—", "–", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "’s", "#1", "@@", "&&", "||", "\\\\",
]
FRAGMENTS = ENGLISH + CODE + CJK + EMOJI + DIGITS + WHITESPACE + SCRIPTS + SPECIAL + PUNCT
SEPARATORS = ["", " ", "  ", "\n", "\t", ", ", "\r\n", "\u3000", "…"]


def corpus(n=2600, seed=1234):
    """The fixed fragments, then n random mixtures of them (same list every run)."""
    rng = random.Random(seed)
    out = list(FRAGMENTS)
    while len(out) < n:
        k = rng.randint(1, 6)
        parts = [rng.choice(FRAGMENTS) for _ in range(k)]
        s = ""
        for p in parts:
            s += p + rng.choice(SEPARATORS)
        if rng.random() < 0.2:
            s = s.upper() if rng.random() < 0.5 else s * rng.randint(2, 4)
        out.append(s)
    out.append("")
    out.append("a" * 3000)            # one long piece (heap merge path, uncached)
    out.append("你" * 500 + "好" * 500)  # a long CJK run
    out.append(" " * 1000 + "x")
    out.append("\n" * 300)
    out.append("1" * 100)
    return out


POOLS = [
    (0x20, 0x7E), (0x09, 0x0D), (0xA0, 0x17F), (0x300, 0x36F), (0x370, 0x3FF), (0x400, 0x4FF),
    (0x590, 0x6FF), (0x900, 0x97F), (0xE00, 0xE7F), (0x2000, 0x206F), (0x3000, 0x30FF), (0x4E00, 0x9FFF),
    (0xAC00, 0xD7A3), (0xFF00, 0xFFEF), (0x1F300, 0x1FAFF), (0x0, 0xD7FF), (0xE000, 0x10FFFF),
]


EDGES = [" ", "  ", "\n", "\r", "\r\n", "\t", "a", "Z", "1", "12345", "!", ".", "'s", "'LL", "中", "ー", "あ",
         "e\u0301", "\u0301", "😀", "\u00a0", "\u3000", "#", "-", "_", "(", "\\", "\u2028", "\x85", "١", "²", "ǅ",
         "İ", "ß", "ﬁ", "<", "｜", " <", "\u180e", "\u200d", "\U0001fa77"]


def random_string(rng, max_len=40):
    """A random string over weighted code point pools, sometimes with special-token strings and
    characters at regex class boundaries."""
    chars = []
    for _ in range(rng.randint(0, max_len)):
        r = rng.random()
        if r < 0.05:
            chars.append(rng.choice(SPECIAL))
            continue
        if r < 0.15:
            chars.append(rng.choice(EDGES))
            continue
        if r < 0.25:
            chars.append(rng.choice(" \t\n\r  \u00a0\u3000"))
            continue
        lo, hi = rng.choice(POOLS)
        cp = rng.randint(lo, hi)
        if 0xD800 <= cp <= 0xDFFF:
            cp = 0xFFFD
        chars.append(chr(cp))
    return "".join(chars)
