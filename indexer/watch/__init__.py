"""Folder watchers, `cnclip index --watch` and `cnclip serve` with `CNCLIP_WATCH`: the watcher
(watcher.py), its passes (the bulk pipeline's own run over the files a hint names), where hints come
from (inotify or polling), debouncing, the per-folder lock, the watched root pinned by descriptor,
and the served watchers' health.

It may import bulk/, service/, domain/, fs/, `indexer/errors.py`, `indexer/config.py` and
`retrieval`; never storage/."""
