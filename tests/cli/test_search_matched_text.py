"""How `cnclip search` prints the text a photo holds (cli/catalog.py): the recognised line with the match in
【】, and nothing a terminal would obey (an image can say anything, escape sequences included)."""

from __future__ import annotations

from cli.catalog import matched_line, shown


def test_the_match_is_bracketed_in_its_line() -> None:
    match = {"text": "烤鸭", "start": 7, "end": 9, "line": "北京烤鸭店", "line_start": 5}
    assert matched_line(match) == "北京【烤鸭】店"


def test_a_match_across_a_line_break_is_cut_at_the_line_end() -> None:
    match = {"text": "鸭\n全", "start": 3, "end": 6, "line": "北京烤鸭", "line_start": 0}
    assert matched_line(match) == "北京烤【鸭】"


def test_control_characters_never_reach_the_terminal() -> None:
    hostile = "\x1b]0;owned\x07\x1b[2J出口\u202eB\r"
    assert shown(hostile) == "?]0;owned??[2J出口?B?"
    assert shown("两行\n文字") == "两行 / 文字"
