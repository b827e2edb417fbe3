"""The rule that makes recognised text searchable by any part of it (issue 32): one normal form and
its n-grams, used by the writer (indexer/storage/sql/text_rows.py) and the query side alike.

Chinese has no spaces between words and OCR puts spaces where it likes ("出口 B" for "出口B"), so the
normal form drops all whitespace; NFKC folds full-width letters and digits ("Ｂ", "９") into their
ASCII forms, and casefold makes Latin matches case-blind. Every substring of one, two and three
characters is a gram: a query of up to three characters is one gram lookup, a longer one the
intersection of its trigrams, verified by a substring match on the normal form.

The rank of a match is the share of the text the piece covers (`coverage`): a sign that says only 烤鸭
beats a menu that mentions it once among fifty characters. The writer stores each gram's rank with
its posting (`gram_ranks`), so a query of up to three characters is ranked from the postings alone;
a longer one is ranked in SQL by the same formula (indexer/storage/sql/text_search.py).
"""

from __future__ import annotations

import unicodedata

# Longer queries are answered by intersecting grams of this length and checking the substring.
MAX_GRAM = 3


def normalize_text(text: str) -> str:
    """The form text is indexed and queried in: NFKC, casefolded, without any whitespace."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return "".join(ch for ch in folded if not ch.isspace())


def grams(normalized: str) -> set[str]:
    """Every substring of `normalized` of length 1 to MAX_GRAM (pass the output of normalize_text)."""
    found: set[str] = set()
    for length in range(1, MAX_GRAM + 1):
        for start in range(len(normalized) - length + 1):
            found.add(normalized[start : start + length])
    return found


def coverage(occurrences: int, piece_length: int, text_length: int) -> float:
    """The share of a text of `text_length` characters that `occurrences` of a piece cover (0 to 1)."""
    return occurrences * piece_length / text_length if text_length else 0.0


def gram_ranks(normalized: str) -> dict[str, tuple[int, float]]:
    """Every gram of `normalized` -> (its occurrences, counted without overlap as SQL's `replace`
    counts them, and its `coverage` of the text)."""
    ranks: dict[str, tuple[int, float]] = {}
    for gram in grams(normalized):
        occurrences = normalized.count(gram)
        ranks[gram] = (occurrences, coverage(occurrences, len(gram), len(normalized)))
    return ranks
