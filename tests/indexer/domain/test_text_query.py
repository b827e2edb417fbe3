"""The rules of a query meeting recognised text (indexer/domain/text_query.py): quoted parts, the fusion
and the spans shown to clients."""

from __future__ import annotations

from indexer.domain.text_query import MatchedSpan, fuse, locate, split_query


def test_quoted_parts_are_split_from_the_clip_words() -> None:
    split = split_query('"会议室"  白板 “出口B” 「9:00」 笔记')
    assert split.clip_text == "白板 笔记"
    assert split.quoted == ("会议室", "出口B", "9:00")
    assert split.required == ["会议室", "出口b", "9:00"]
    assert split.ranked == "白板笔记"


def test_an_unclosed_quote_runs_to_the_end_and_empty_quotes_are_dropped() -> None:
    assert split_query('海边 "日落 晚霞').quoted == ("日落 晚霞",)
    assert split_query('"" 海边 "  "') == split_query("海边")
    assert split_query('"出口 B" "出口B"').required == ["出口b"]  # one normal form, once


def test_fusion_keeps_a_single_ranking_and_favours_items_in_both() -> None:
    assert [i for i, _ in fuse([[5, 3, 9]])] == [5, 3, 9]
    assert [i for i, _ in fuse([[5, 3, 9], []])] == [5, 3, 9]
    fused = fuse([[1, 2, 3, 4], [4]], k=10)
    assert [i for i, _ in fused] == [4, 1, 2, 3]  # 1/14 + 1/11 beats 1/11
    assert fused[0][1] == 1 / 14 + 1 / 11


def test_fusion_ties_keep_the_first_lists_order() -> None:
    assert [i for i, _ in fuse([[1, 2], [3, 4]], k=10)] == [1, 3, 2, 4]


def test_spans_map_the_normal_form_back_to_the_text_as_read() -> None:
    assert locate("出口 B\nEXIT", "出口b") == MatchedSpan("出口 B", 0, 4, "出口 B", 0)
    assert locate("出口 B\nEXIT", "exit") == MatchedSpan("EXIT", 5, 9, "EXIT", 5)
    assert locate("北京烤鸭\n全聚德", "鸭全") == MatchedSpan("鸭\n全", 3, 6, "北京烤鸭", 0)
    assert locate("ＡＢＣ超市", "bc") == MatchedSpan("ＢＣ", 1, 3, "ＡＢＣ超市", 0)
    assert locate("北京烤鸭", "上海") is None
    assert locate("北京烤鸭", "") is None
