"""TextStream's incremental decoding against decoding the whole token list, on real tokenizers of the kinds the
supported models use (byte-level BPE; SentencePiece-style BPE with byte fallback, Strip or Metaspace; the
tests' character tokenizer), with random token sequences, random step sizes, EOS, max_new_tokens and stop
strings. The reference is the stream as it was before it decoded incrementally: every step re-decoded the
whole text."""
from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

sys.path.insert(0, str(Path(__file__).parent))
from checkpoints import CHARS, char_tokenizer  # noqa: E402

from specexport.runtime.decoder import Stats  # noqa: E402
from specexport.runtime.text import TextStream  # noqa: E402

CORPUS = ["The quick brown fox jumps over the lazy dog.", "naïve café, déjà vu: señor Müller's façade",
          "日本語のテキストと中文字符混在", "emoji 🙂🚀 and ✓ marks ≠ ∑ ∞", "Zürich — Ελληνικά, русский текст",
          "def f(x):\n    return x ** 2  # code\n", "ａｂｃ full width, 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and 🏳️‍🌈 joiners"] * 4
SPECIALS = ["<unk>", "<s>", "</s>", "<|im_start|>"]
EOS = 2


class Generation:  # what TextStream fills (runtime.Generation's fields it touches)
    def __init__(self):
        self.token_ids, self.text, self.finish_reason, self.stats = [], "", "length", Stats()


def byte_level():
    """GPT-2 / Llama 3 / SmolLM2 / Qwen2 style: bytes mapped to characters, decoded with UTF-8 replacement."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def sentencepiece(decoder: str):
    """Llama 2 / Mistral / TinyLlama style: '▁' for spaces, <0xNN> pieces for characters out of the vocabulary;
    decoder "strip" (Replace, ByteFallback, Fuse, Strip one leading space) or "metaspace" (prepend_scheme first)."""
    trained = Tokenizer(models.BPE(unk_token="<unk>"))
    trained.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    trained.train_from_iterator(CORPUS[:3], trainers.BpeTrainer(vocab_size=150, special_tokens=SPECIALS, show_progress=False))
    import json

    model = json.loads(trained.to_str())["model"]
    vocab = dict(model["vocab"])
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    tok = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.add_special_tokens(SPECIALS)
    tok.normalizer = trained.normalizer
    tok.decoder = (decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                      decoders.Strip(" ", 1, 0)]) if decoder == "strip" else
                   decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace("▁", prepend_scheme="first")]))
    return tok


def char_level():
    return char_tokenizer(CHARS).backend_tokenizer


TOKENIZERS = {"byte-level": byte_level, "sentencepiece-strip": lambda: sentencepiece("strip"),
              "sentencepiece-metaspace": lambda: sentencepiece("metaspace"), "char": char_level}


class Reference:
    """TextStream as it was: the whole text re-decoded every step."""

    def __init__(self, tokenizer, eos, stops, max_new_tokens, g):
        self.tokenizer, self.eos, self.max_new = tokenizer, eos, max_new_tokens
        self.stops = tuple(s for s in stops if s)
        self.g = g
        self.g.token_ids, self.g.text, self.g.finish_reason = [], "", "length"

    def push(self, new):
        g = self.g
        for t in new:
            if len(g.token_ids) >= self.max_new:
                break
            g.token_ids.append(t)
            if t in self.eos:
                g.finish_reason = "eos"
                break
        text = self._decode(g.token_ids)
        hits = [(i, len(s)) for i, s in ((text.find(s), s) for s in self.stops) if i >= 0]
        if hits:
            cut, n = min(hits)
            text, g.finish_reason = text[:cut], "stop"
            first = max(len(g.token_ids) - len(new), 0) + 1
            j = next((j for j in range(first, len(g.token_ids) + 1)
                      if len(self._decode(g.token_ids[:j])) >= cut + n), len(g.token_ids))
            del g.token_ids[j:]
        g.text = text
        return g.finish_reason != "length" or len(g.token_ids) >= self.max_new

    def _decode(self, ids):
        return self.tokenizer.decode([t for t in ids if t not in self.eos])


def token_sequence(tok, rng: random.Random, n: int) -> list[int]:
    """Uniform random ids (split characters, lone and invalid bytes, special tokens), a real text's ids, or a
    mix; sometimes an EOS."""
    V = tok.get_vocab_size()
    kind = rng.random()
    if kind < 0.4:
        ids = [rng.randrange(V) for _ in range(n)]
    else:
        text = "".join(rng.choice(CORPUS)[rng.randrange(10):] for _ in range(3))
        ids = tok.encode(text, add_special_tokens=False).ids[:n]
        if kind > 0.7:  # real text with random tokens spliced in
            for _ in range(max(1, n // 8)):
                ids.insert(rng.randrange(len(ids) + 1), rng.randrange(V))
    if rng.random() < 0.2:
        ids.insert(rng.randrange(len(ids) + 1), EOS)
    return ids


def run(stream_cls, tok, ids, stops, max_new, steps):
    g = Generation()
    s = stream_cls(tok, {EOS}, stops, max_new, g)
    pieces, i = [], 0
    for size in steps:
        out = s.push(ids[i:i + size])
        i += size
        piece, done = out if isinstance(out, tuple) else ("", out)
        pieces.append(piece)
        if done:
            break
    return g, pieces


@pytest.mark.parametrize("name", TOKENIZERS)
def test_incremental_text_is_the_whole_decode(name):
    """The pieces join to the text decoding all tokens at once gives; with stop strings the generation ends at
    the same token with the same text as re-decoding every step did."""
    tok = TOKENIZERS[name]()
    rng = random.Random(13)
    checked = {"stops": 0, "multibyte": 0}
    for trial in range(300):
        ids = token_sequence(tok, rng, rng.randrange(1, 60))
        steps = [rng.randrange(1, 6) for _ in range(len(ids))]  # a verify step accepts 1..k+1 tokens
        whole = tok.decode(ids[:ids.index(EOS)] if EOS in ids else ids)
        stops = ()
        if trial % 2 and whole:  # stop strings cut from the text, so that they are hit; one that never is
            a = rng.randrange(len(whole))
            stops = (whole[a:a + rng.randrange(1, 5)], "\x00never")
        max_new = rng.choice([len(ids), max(1, len(ids) // 2)])  # the stream ends by the last token
        want, _ = run(Reference, tok, ids, stops, max_new, steps)
        got, pieces = run(TextStream, tok, ids, stops, max_new, steps)
        assert "".join(pieces) == got.text, (name, trial)
        assert (got.text, got.token_ids, got.finish_reason) == (want.text, want.token_ids, want.finish_reason), \
            (name, trial, ids, stops, steps)
        if got.finish_reason != "stop":
            assert got.text == tok.decode([t for t in got.token_ids if t != EOS])
        checked["stops"] += got.finish_reason == "stop"
        checked["multibyte"] += any(ord(c) > 127 for c in got.text)
    assert checked["stops"] > 50 and (checked["multibyte"] > 100 or name == "char"), checked  # the cases did occur


def test_each_step_decodes_a_window_not_the_whole_text():
    """Over a long generation pushed one token a step, the tokens decoded grow linearly with the tokens
    generated (re-decoding the whole text each step: n^2 / 2)."""
    tok = byte_level()

    class Counting:  # the real tokenizer, counting the ids it is asked to decode
        decoded = 0

        def decode(self, ids):
            Counting.decoded += len(ids)
            return tok.decode(ids)

        def id_to_token(self, i):
            return tok.id_to_token(i)

        def get_added_tokens_decoder(self):
            return tok.get_added_tokens_decoder()

    ids = tok.encode(" ".join(CORPUS * 6), add_special_tokens=False).ids
    n = len(ids)
    assert n > 1000
    g = Generation()
    s, pieces = TextStream(Counting(), {EOS}, ("\x00never",), n, g), []
    for t in ids:
        pieces.append(s.push([t])[0])
    assert "".join(pieces) == g.text == tok.decode(ids)
    assert Counting.decoded < 8 * n, (Counting.decoded, n)


def test_a_split_character_is_held_until_complete():
    """A character split over byte-fallback pieces appears only once all its bytes are in, and a stop string
    that is a prefix of the text is never shown in part."""
    tok = sentencepiece("strip")
    ids = tok.encode("café 🚀 done", add_special_tokens=False).ids
    pieces = [tok.id_to_token(i) for i in ids]
    assert "<0xF0>" in pieces  # the rocket is four byte pieces
    g = Generation()
    s = TextStream(tok, {EOS}, ("don",), len(ids), g)
    shown = []
    for t in ids:
        piece, done = s.push([t])
        shown.append(piece)
        assert "\ufffd" not in "".join(shown)
        if done:
            break
    assert "".join(shown) == g.text == "café 🚀 " and g.finish_reason == "stop"
