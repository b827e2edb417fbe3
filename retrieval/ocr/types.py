"""What recognition reads in one image: plain records, imported by the indexer's domain too
(indexer/domain/item_texts.py). Imports nothing of the project."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Point = tuple[float, float]


@dataclass(frozen=True)
class TextLine:
    """One line as the engine read it: its text, its box in the decoded image's pixels (four corners,
    clockwise from top-left, in the orientation the image is shown in) and the engine's confidence."""

    text: str
    box: tuple[Point, Point, Point, Point]
    score: float

    def as_json(self) -> dict[str, Any]:
        return {"text": self.text, "box": [[x, y] for x, y in self.box], "score": self.score}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TextLine:
        corners = tuple((float(x), float(y)) for x, y in data["box"])
        return cls(text=str(data["text"]), box=corners, score=float(data["score"]))  # type: ignore[arg-type]


@dataclass(frozen=True)
class RecognisedText:
    """What recognition found in one image: possibly no lines (a photo without text, or one that
    could not be read); `engine` names the engine and its version."""

    lines: tuple[TextLine, ...] = ()
    engine: str = ""

    @property
    def text(self) -> str:
        """The lines in reading order, joined by newlines."""
        return "\n".join(line.text for line in self.lines)
