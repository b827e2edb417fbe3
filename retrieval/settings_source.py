"""Where the settings read `CNCLIP_*`: pydantic-settings' environment source with one rule more.
A list or object setting (`CNCLIP_MODEL_DIRS`, `CNCLIP_BUCKETS`, …) is JSON, parsed as the hostile
text any JSON from outside is (retrieval/json_text.py): nested 50,000 `[` deep it is a bad value
(one line, exit status 2) instead of a `RecursionError` traceback, and an object that names a key
twice is refused instead of keeping the last without a word."""

from __future__ import annotations

from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import EnvSettingsSource, NoDecode

from retrieval.json_text import loads


class SafeEnvSource(EnvSettingsSource):
    """`EnvSettingsSource` whose JSON values go through `retrieval.json_text.loads`."""

    def decode_complex_value(self, field_name: str, field: FieldInfo, value: Any) -> Any:
        if field is not None and NoDecode in field.metadata:
            return value  # the field's own validator parses it (CNCLIP_WATCH)
        return loads(value, unique_keys=True)  # a JSONDecodeError is a ValueError: pydantic-settings' SettingsError
