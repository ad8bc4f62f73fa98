"""Token ids -> text for one generation: EOS, stop strings, and pieces safe to show as they come.

TextStream takes each step's accepted tokens and returns the new text piece and whether the generation is
over. It holds back the tail that could still become a stop string and text later tokens may still change
(a character split across tokens), so a piece once given is never taken back, and the pieces join to exactly
tokenizer.decode(token ids). Detokenizer decodes incrementally: a window of the last tokens per step rather
than the whole text. The solo decode loop and the batching engine both use TextStream; nothing here knows
about models.
"""
from __future__ import annotations

import re

BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")  # a byte-fallback piece (SentencePiece-style vocabularies)


class Detokenizer:
    """Incremental tokenizer.decode of a growing token list (the prefix-offset scheme of vLLM's detokenizer
    and transformers' TextStreamer): `text` is decode(ids[:r]) for a boundary r, and for the window start p
    (the boundary before), decode(ids) == text + decode(ids[p:])[len(decode(ids[p:r])):]. A decoder may treat
    the window's first token specially (Metaspace and Strip drop its leading space), which cancels out in that
    difference. r moves to the end of the ids when no later token can change the text before it:
    - the window's new text does not end in U+FFFD: no character is split across tokens there;
    - the last token decode keeps is not a byte-fallback piece <0xNN>: tokenizers' ByteFallback decodes a run
      of them (skipped special tokens between them included) as one, and a later invalid byte turns the whole
      run into U+FFFDs;
    and p moves to the old r only if decode(ids[r_old:r_new]) is not empty, so that what a decoder does to
    the window's first token always lands on text before r.
    tokenizers' DecodeStream is the same scheme, but it shows neither the unsettled tail (a stop string can
    complete in it) nor flushes it at the end, and it settles inside byte-fallback runs (on random ids of a
    byte-fallback vocabulary tokenizers 0.23 raised InvalidPrefix or gave other text than decode)."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.ids: list[int] = []
        self.text = ""  # settled: decode(ids[:r])
        self.p = self.r = 0
        self.prefix = ""  # decode(ids[p:r])
        self.special = {i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special}  # decode skips them

    def extend(self, new: list[int]) -> str:
        """Add tokens -> the unsettled tail: decode(ids) == text + tail. Settles nothing (see settle)."""
        self.ids.extend(new)
        return self.tok.decode(self.ids[self.p:])[len(self.prefix):]

    def settle(self, tail: str) -> None:
        """Move r to the end of the ids if no later token can change the text before it (class docstring)."""
        if not tail or tail.endswith("\ufffd") or self._in_byte_run():
            return
        self.text += tail
        last = self.tok.decode(self.ids[self.r:])
        if last:
            self.p, self.prefix = self.r, last
        else:
            self.prefix += tail
        self.r = len(self.ids)

    def _in_byte_run(self) -> bool:
        """Is the last token decode keeps a byte-fallback piece? (Skipped special tokens do not end a run.)"""
        last = next((t for t in reversed(self.ids) if t not in self.special), None)
        return last is not None and BYTE_TOKEN.fullmatch(self.tok.id_to_token(last) or "") is not None

    def length_at(self, j: int) -> int:
        """len(decode(ids[:j])): by the window for j >= r, else decoded whole (before r: rare, see TextStream)."""
        if j < self.r:
            return len(self.tok.decode(self.ids[:j]))
        return len(self.text) + len(self.tok.decode(self.ids[self.p:j])) - len(self.prefix)


class TextStream:
    def __init__(self, tokenizer, eos: set, stops: tuple, max_new_tokens: int, generation):
        self.eos, self.max_new = eos, max_new_tokens
        self.stops = tuple(s for s in stops if s)
        self.hold = max((len(s) for s in self.stops), default=1) - 1  # what could start a stop string
        self.g = generation
        self.g.token_ids, self.g.text, self.g.finish_reason = [], "", "length"
        self.detok = Detokenizer(tokenizer)  # the token ids but the EOS (only ever the last one)
        self.sent = 0

    def push(self, new: list[int]) -> tuple[str, bool]:
        """Add one step's tokens -> (text piece to show now, finished)."""
        g = self.g
        searched = max(len(self.detok.text) - self.hold, 0)  # a new stop string ends past the settled text
        fresh = []
        for t in new:
            if len(g.token_ids) >= self.max_new:
                break
            g.token_ids.append(t)
            if t in self.eos:
                g.finish_reason = "eos"
                break
            fresh.append(t)
        tail = self.detok.extend(fresh)
        text = self.detok.text + tail
        hits = [(i, len(s)) for i, s in ((text.find(s, searched), s) for s in self.stops) if i >= 0]
        if hits:
            cut, n = min(hits)
            text, g.finish_reason = text[:cut], "stop"
            # keep the tokens up to the one that completed the stop string (a step may accept more, and how
            # many more depends on the draft): the shortest prefix whose text reaches past it
            first = max(len(g.token_ids) - len(new), 0) + 1
            j = next((j for j in range(first, len(g.token_ids) + 1)
                      if self.detok.length_at(min(j, len(self.detok.ids))) >= cut + n), len(g.token_ids))
            del g.token_ids[j:]
        g.text = text
        done = g.finish_reason != "length" or len(g.token_ids) >= self.max_new
        if not done:
            self.detok.settle(tail)
        # settled text only (no later token changes it), less what could still start a stop string
        end = len(text) if done else len(self.detok.text) - self.hold
        piece = ""
        if end > self.sent:
            piece, self.sent = text[self.sent:end], end
        if done:
            g.stats.new_tokens = len(g.token_ids)  # delivered: a step may accept tokens past the EOS or stop
        return piece, done
