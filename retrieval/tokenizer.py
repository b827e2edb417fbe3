"""CN-CLIP's text tokenizer without torch: BERT WordPiece over cn_clip's 21128-token vocabulary.

`tokenize` is token-for-token identical to `cn_clip.clip.tokenize`: `[CLS] + ids[:L-2] + [SEP]`,
zero-padded to `L` (52). The steps are the ones of cn_clip's `bert_tokenizer.FullTokenizer`
(drop control characters, whitespace → space, spaces around CJK ideographs, split on whitespace;
per word: lower-case, strip accents, split on punctuation, greedy longest-match WordPiece, `[UNK]`),
rearranged for speed: the per-character pass and the per-word pass are each memoised, which is
exact because both are pure functions of a character or a word respectively.
"""

from __future__ import annotations

import functools
import io
import threading
import unicodedata
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from retrieval.regular_file import read_regular_text

VOCAB_PATH = Path(__file__).resolve().parent / "vocab.txt"
MAX_VOCAB_BYTES = 64 << 20  # BERT vocabularies take ~0.1-2 MB
CONTEXT_LENGTH = 52
MAX_CHARS_PER_WORD = 200  # cn_clip's WordpieceTokenizer.max_input_chars_per_word
_CACHE_LIMIT = 200_000  # memoised words/characters before the caches are cleared


def _is_whitespace(char: str) -> bool:
    return char in " \t\n\r" or unicodedata.category(char) == "Zs"


def _is_control(char: str) -> bool:
    if char in "\t\n\r":
        return False
    return unicodedata.category(char) in ("Cc", "Cf")


def _is_punctuation(char: str) -> bool:
    cp = ord(char)
    # BERT treats every non-alphanumeric ASCII character as punctuation, then Unicode class P*.
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_cjk(cp: int) -> bool:
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


def load_vocab(path: Path = VOCAB_PATH) -> dict[str, int]:
    """Read a BERT vocabulary exactly as cn_clip does (stripped lines; a repeated token keeps its last id)."""
    vocab: dict[str, int] = {}
    text = read_regular_text(path, MAX_VOCAB_BYTES, "vocabulary")  # a regular file only (retrieval/regular_file.py)
    for index, line in enumerate(io.StringIO(text, newline=None)):  # the lines text-mode open() gives
        vocab[line.strip()] = index
    return vocab


class Tokenizer:
    """cn_clip's tokenizer over one vocabulary; thread-safe, memoising characters and words."""

    def __init__(self, vocab_path: Path = VOCAB_PATH) -> None:
        self.vocab = load_vocab(vocab_path)
        self.cls_id = self.vocab["[CLS]"]
        self.sep_id = self.vocab["[SEP]"]
        self.unk_id = self.vocab["[UNK]"]
        self._char_map: dict[str, str] = {}
        self._word_ids: dict[str, tuple[int, ...]] = {}
        self._lock = threading.Lock()  # only guards clearing the caches; lookups are GIL-atomic

    def _map_char(self, char: str) -> str:
        """The first pass of BasicTokenizer for one character: drop, → space, pad a CJK ideograph, or keep."""
        mapped = self._char_map.get(char)
        if mapped is None:
            cp = ord(char)
            if cp == 0 or cp == 0xFFFD or _is_control(char):
                mapped = ""
            elif _is_whitespace(char):
                mapped = " "
            elif _is_cjk(cp):
                mapped = f" {char} "
            else:
                mapped = char
            self._char_map[char] = mapped
        return mapped

    def _split_word(self, word: str) -> list[str]:
        """Lower-case, strip accents and split on punctuation, as BasicTokenizer does per word."""
        word = unicodedata.normalize("NFD", word.lower())
        word = "".join(c for c in word if unicodedata.category(c) != "Mn")
        pieces: list[str] = []
        current: list[str] = []
        for char in word:
            if _is_punctuation(char):
                if current:
                    pieces.append("".join(current))
                    current = []
                pieces.append(char)
            else:
                current.append(char)
        if current:
            pieces.append("".join(current))
        # BasicTokenizer re-splits on whitespace: NFD or lower() can produce separators str.split() knows.
        return [token for piece in pieces for token in piece.split()]

    def _wordpiece(self, token: str) -> list[int]:
        if len(token) > MAX_CHARS_PER_WORD:
            return [self.unk_id]
        ids: list[int] = []
        start = 0
        while start < len(token):
            end = len(token)
            found = None
            while start < end:
                piece = token[start:end] if start == 0 else "##" + token[start:end]
                found = self.vocab.get(piece)
                if found is not None:
                    break
                end -= 1
            if found is None:
                return [self.unk_id]
            ids.append(found)
            start = end
        return ids

    def _ids_of_word(self, word: str) -> tuple[int, ...]:
        ids = self._word_ids.get(word)
        if ids is None:
            ids = tuple(i for token in self._split_word(word) for i in self._wordpiece(token))
            if len(self._word_ids) > _CACHE_LIMIT:
                with self._lock:
                    self._word_ids.clear()
            self._word_ids[word] = ids
        return ids

    def encode(self, text: str, max_ids: int | None = None) -> list[int]:
        """Token ids of `text` without [CLS]/[SEP]; stops early once `max_ids` ids are known."""
        if len(self._char_map) > _CACHE_LIMIT:
            with self._lock:
                self._char_map.clear()
        mapped = "".join([self._map_char(c) for c in text])
        ids: list[int] = []
        for word in mapped.split():
            ids.extend(self._ids_of_word(word))
            if max_ids is not None and len(ids) >= max_ids:
                break
        return ids

    def tokenize(self, texts: str | Sequence[str], context_length: int = CONTEXT_LENGTH) -> np.ndarray:
        """`[CLS] + ids[:context_length-2] + [SEP]`, zero-padded; int64 of shape (n, context_length)."""
        if context_length < 2:
            raise ValueError("context_length must be at least 2 ([CLS] and [SEP])")
        if isinstance(texts, str):
            texts = [texts]
        out = np.zeros((len(texts), context_length), dtype=np.int64)
        keep = context_length - 2
        for row, text in enumerate(texts):
            if not isinstance(text, str):
                raise TypeError(f"tokenize expects str, got {type(text).__name__}")
            ids = self.encode(text, max_ids=keep)[:keep]
            out[row, 0] = self.cls_id
            out[row, 1 : len(ids) + 1] = ids
            out[row, len(ids) + 1] = self.sep_id
        return out


@functools.lru_cache(maxsize=1)
def default_tokenizer() -> Tokenizer:
    """The tokenizer over the bundled `vocab.txt`, loaded on first use."""
    return Tokenizer()


def tokenize(texts: str | Sequence[str], context_length: int = CONTEXT_LENGTH) -> np.ndarray:
    """Token ids of `texts`, identical to `cn_clip.clip.tokenize` (as int64 numpy, no torch)."""
    return default_tokenizer().tokenize(texts, context_length)
