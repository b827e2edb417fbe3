"""The file system, one rule each: opening a file under a folder without following a symlink out
of it (safe_open.py), file names that are not valid UTF-8 kept exactly (file_names.py), a full disk
as its own fault (disk_full.py), whether an indexed file is gone (presence.py).

It may import `indexer/errors.py` and `retrieval`; nothing else of indexer/ (storage, the service
and the pipeline all use it)."""
