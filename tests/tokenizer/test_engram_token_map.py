"""Engram's compressed token map (spec §6.1) against a Python re-implementation that uses HF
tokenizers' own decode and normalizers, as DeepSeek's reference code does."""
import json

import pytest
from tokenizers import Regex, Tokenizer
from tokenizers import normalizers as N

from test_hf_parity import SMALL, TOKENIZERS, run, tokenizer_path

NORMALIZER = N.Sequence([N.NFKC(), N.NFD(), N.StripAccents(), N.Lowercase(), N.Replace(Regex(r"[ \t\r\n]+"), " "),
                         N.Replace(Regex(r"^ $"), "\uE000"), N.Strip(), N.Replace("\uE000", " ")])


def reference_map(path):
    tok = Tokenizer.from_file(path)
    classes, out = {}, []
    for i in range(tok.get_vocab_size(with_added_tokens=True)):
        text = tok.decode([i], skip_special_tokens=False)
        if "\ufffd" in text:
            key = tok.id_to_token(i)
        else:
            norm = NORMALIZER.normalize_str(text)
            key = norm if norm else text
        out.append(classes.setdefault(key, len(classes)))
    return out, len(classes)


@pytest.mark.parametrize("name", TOKENIZERS)
def test_engram_map_matches_reference(name):
    path = tokenizer_path(name)
    want, n = reference_map(path)
    got = json.loads(run(["engram-map", "--tokenizer", path, "--json"]))
    assert got == want
    summary = run(["engram-map", "--tokenizer", path]).decode()
    assert summary.startswith(f"{n} classes")
    if name == "real":
        assert n == 99092  # the count DeepSeek's Engram code asserts
