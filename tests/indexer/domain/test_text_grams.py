"""The search form of recognised text (indexer/domain/text_grams.py): whitespace-blind, width- and
case-folded, and every substring of 1 to 3 characters a gram."""

from __future__ import annotations

from indexer.domain.text_grams import MAX_GRAM, grams, normalize_text


def test_the_normal_form_drops_whitespace_and_folds_width_and_case() -> None:
    assert normalize_text("出口 B") == normalize_text("出口B") == "出口b"
    assert normalize_text("营业时间\n9:00-21:00") == "营业时间9:00-21:00"
    assert normalize_text("ＡＢＣ　１２３") == "abc123"  # full-width letters, digits and the ideographic space
    assert normalize_text(" \t\n") == ""


def test_grams_are_every_substring_of_one_to_three_characters() -> None:
    text = normalize_text("北京烤鸭")
    assert grams(text) == {"北", "京", "烤", "鸭", "北京", "京烤", "烤鸭", "北京烤", "京烤鸭"}
    assert grams("") == set()
    assert grams("ab") == {"a", "b", "ab"}
    long = normalize_text("安全出口B请勿堵塞")
    found = grams(long)
    assert max(len(g) for g in found) == MAX_GRAM
    assert len(found) == len({long[i : i + n] for n in (1, 2, 3) for i in range(len(long) - n + 1)})
