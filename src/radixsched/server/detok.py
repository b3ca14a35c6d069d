"""Incremental detokenization for streaming, with stop strings.

Tokens arrive a few at a time; their text is emitted as soon as it is final:

* a token can end in the middle of a UTF-8 character (byte-level vocabularies): text whose
  decoding ends in U+FFFD is held back until the next token completes it (or the request ends);
* text that could be the beginning of a stop string is held back until it is known not to be
  one; when a stop string appears, the text is cut before it and nothing more is emitted (of
  several stop strings completed by the same tokens, the one that starts first wins).

Only a sliding window of ids is decoded per token (from ``_prefix_offset``), so streaming a long
answer costs O(tokens), not O(tokens^2). Stop strings are matched by one Knuth-Morris-Pratt
automaton each, fed every new character once: O(characters) per stop string whatever its length.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str: ...


class StopMatcher:
    """Streaming search for stop strings. ``state[j]`` is the length of the longest prefix of
    stop ``j`` that is a suffix of the text fed so far (always shorter than the stop: a full
    match is reported, then the automaton falls back)."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._kmp_fail = [_kmp_failure(s) for s in self.stops]
        self.state = [0] * len(self.stops)
        self.steps = 0  # automaton transitions taken (at most two per character per stop)

    def feed(self, text: str, start: int) -> tuple[int, str] | None:
        """Advance over ``text``, which begins at offset ``start`` of the whole text; the
        earliest-starting stop completed inside it, as (offset, stop string)."""
        best: tuple[int, str] | None = None
        for j, stop in enumerate(self.stops):
            fail, q, n, steps = self._kmp_fail[j], self.state[j], len(stop), 0
            for i, ch in enumerate(text):
                while q and stop[q] != ch:
                    q = fail[q - 1]
                    steps += 1
                if stop[q] == ch:
                    q += 1
                steps += 1
                if q == n:
                    hit = (start + i + 1 - n, stop)
                    if best is None or hit < best:
                        best = hit
                    q = fail[q - 1]
            self.state[j] = q
            self.steps += steps
        return best

    def held(self) -> int:
        """Length of the longest suffix of the text that is a proper prefix of a stop."""
        return max(self.state, default=0)


def _kmp_failure(s: str) -> list[int]:
    """KMP failure function: ``f[i]`` = length of the longest proper border of ``s[: i + 1]``."""
    f = [0] * len(s)
    k = 0
    for i in range(1, len(s)):
        while k and s[i] != s[k]:
            k = f[k - 1]
        if s[i] == s[k]:
            k += 1
        f[i] = k
    return f


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Decoder, stop: Sequence[str] = ()) -> None:
        self._tok = tokenizer
        self._stop = StopMatcher(stop)
        self._ids: list[int] = []
        # ids[_prefix_offset:_read_offset] were decoded into text already; they are decoded
        # again as context so that the next tokens join them the way the tokenizer joins text.
        self._prefix_offset = 0
        self._read_offset = 0
        # Characters past the decoded prefix already taken from the current window (text
        # before an incomplete trailing character).
        self._window_emitted = 0
        self._text = ""  # final text so far (stop-string cut applied)
        self._emitted = 0  # characters of _text handed out
        self.matched_stop: str | None = None

    @property
    def text(self) -> str:
        """Everything decoded so far (including text still held back)."""
        return self._text

    @property
    def stopped(self) -> bool:
        return self.matched_stop is not None

    @property
    def stop_scan_steps(self) -> int:
        return self._stop.steps

    def push(self, ids: Sequence[int]) -> str:
        """Add tokens; return the newly final text (possibly empty)."""
        if self.stopped or not ids:
            return ""
        self._ids.extend(ids)
        prefix = self._tok.decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._tok.decode(self._ids[self._prefix_offset :])
        done = len(prefix) + self._window_emitted
        if not full.endswith(REPLACEMENT_CHAR):
            if len(full) > done:
                self._append(full[done:])
            if len(full) > len(prefix):
                self._prefix_offset = self._read_offset
                self._read_offset = len(self._ids)
                self._window_emitted = 0
        else:
            # An incomplete character at the end: what comes before it is final already.
            stable = full.rstrip(REPLACEMENT_CHAR)
            if len(stable) > done:
                self._append(stable[done:])
                self._window_emitted = len(stable) - len(prefix)
        return self._new_text(final=False)

    def finish(self) -> str:
        """The request ended: flush what was held back (an incomplete character decodes as
        U+FFFD, like a non-streaming decode of the same ids)."""
        if not self.stopped and self._read_offset < len(self._ids):
            prefix = self._tok.decode(self._ids[self._prefix_offset : self._read_offset])
            full = self._tok.decode(self._ids[self._prefix_offset :])
            done = len(prefix) + self._window_emitted
            if len(full) > done:
                self._append(full[done:])
            self._prefix_offset = self._read_offset = len(self._ids)
            self._window_emitted = 0
        return self._new_text(final=True)

    def _append(self, delta: str) -> None:
        start = len(self._text)
        self._text += delta
        if not self._stop.stops:
            return
        hit = self._stop.feed(delta, start)
        if hit is not None:
            pos, s = hit
            self._text = self._text[:pos]
            self.matched_stop = s

    def _new_text(self, *, final: bool) -> str:
        end = len(self._text)
        if not final and not self.stopped:
            end -= self._stop.held()
        end = max(end, self._emitted)
        out = self._text[self._emitted : end]
        self._emitted = end
        return out
