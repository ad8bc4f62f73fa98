"""Token ids -> text for one generation: EOS, stop strings, and pieces safe to show as they come.

TextStream takes each step's accepted tokens and returns the new text piece and whether the generation is
over. It holds back the tail that could still become a stop string and a character split across tokens
(a trailing U+FFFD), so a piece once given is never taken back. The solo decode loop and the batching
engine both use it; nothing here knows about models.
"""
from __future__ import annotations


class TextStream:
    def __init__(self, tokenizer, eos: set, stops: tuple, max_new_tokens: int, generation):
        self.tokenizer, self.eos, self.max_new = tokenizer, eos, max_new_tokens
        self.stops = tuple(s for s in stops if s)
        self.hold = max((len(s) for s in self.stops), default=1) - 1  # what could start a stop string
        self.g = generation
        self.g.token_ids, self.g.text, self.g.finish_reason = [], "", "length"
        self.sent = 0

    def push(self, new: list[int]) -> tuple[str, bool]:
        """Add one step's tokens -> (text piece to show now, finished)."""
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
            # keep the tokens up to the one that completed the stop string (a step may accept more, and how
            # many more depends on the draft): the shortest prefix whose text reaches past it
            first = max(len(g.token_ids) - len(new), 0) + 1
            j = next((j for j in range(first, len(g.token_ids) + 1)
                      if len(self._decode(g.token_ids[:j])) >= cut + n), len(g.token_ids))
            del g.token_ids[j:]
        g.text = text
        done = g.finish_reason != "length" or len(g.token_ids) >= self.max_new
        end = len(text) if done else len(text) - self.hold
        if text.endswith("\ufffd") and not done:  # a character split across tokens: wait for the rest
            end = min(end, len(text) - 1)
        piece = ""
        if end > self.sent:
            piece, self.sent = text[self.sent:end], end
        if done:
            g.stats.new_tokens = len(g.token_ids)  # delivered: a step may accept tokens past the EOS or stop
        return piece, done

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode([t for t in ids if t not in self.eos])
