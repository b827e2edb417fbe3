"""The model a migration moves to, in tests that need no model files: another fake encoder."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from retrieval.fake import FakeEncoder, _unit_vector


class NewModel(FakeEncoder):
    """Another model: other vectors for the same bytes (a salt), possibly another dimension."""

    def __init__(self, dim: int = 16, model_id: str = "fake-next", fail_after: int | None = None) -> None:
        super().__init__(dim=dim, model_id=model_id)
        self.fail_after = fail_after  # image batches before it raises (an interrupted run)

    def embed_images_sync(self, images: Sequence[bytes]) -> np.ndarray:
        if self.fail_after is not None:
            if self.fail_after == 0:
                raise KeyboardInterrupt("killed")
            self.fail_after -= 1
        return np.stack([_unit_vector(b"next" + data, self.dim) for data in images]).reshape(-1, self.dim)

    def embed_texts_sync(self, texts: Sequence[str]) -> np.ndarray:
        return np.stack([_unit_vector(b"next-t" + t.encode(), self.dim) for t in texts]).reshape(-1, self.dim)
