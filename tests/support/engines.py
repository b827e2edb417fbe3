"""The vector engines a test runs on, as one record; the `engine` fixtures in tests/conftest.py hand them out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest


@dataclass(frozen=True)
class EngineUnderTest:
    """A vector engine a test runs on: FAISS files, a Milvus Lite file, or the real Milvus server."""

    name: str  # faiss, milvus-lite, milvus-server
    milvus_uri: str | None = None  # the server's; None: Lite's default file under the data dir

    @property
    def vector_store(self) -> str:
        return "faiss" if self.name == "faiss" else "milvus"

    def overrides(self) -> dict[str, Any]:
        """Settings keyword arguments that select this engine."""
        return {"vector_store": self.vector_store, **({"milvus_uri": self.milvus_uri} if self.milvus_uri else {})}

    def env(self) -> dict[str, str]:
        """The same, as CNCLIP_* variables for a `cnclip` subprocess."""
        return {
            "CNCLIP_VECTOR_STORE": self.vector_store,
            **({"CNCLIP_MILVUS_URI": self.milvus_uri} if self.milvus_uri else {}),
        }


# The real server as a fixture parameter: marked, so that `-m "not milvus_server"` leaves it out.
MILVUS_SERVER = pytest.param("milvus-server", marks=pytest.mark.milvus_server)


def engine_under_test(request: pytest.FixtureRequest, name: str) -> EngineUnderTest:
    """The engine `name` for a parametrised fixture; the real server's URI from the `milvus_server_uri` fixture
    (asked for only then, so that FAISS and Lite runs never start a server), `module_milvus_server_uri`
    for a module-scoped one."""
    if name == "milvus-server":
        uri = "module_milvus_server_uri" if request.scope == "module" else "milvus_server_uri"
        return EngineUnderTest(name, request.getfixturevalue(uri))
    return EngineUnderTest(name)
