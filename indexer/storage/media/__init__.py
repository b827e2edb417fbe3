"""Uploaded image bytes under the data dir: the content-addressed copies (store.py), which bytes may
be served as an item's image (check.py), and the start-up sweep of the media folder (sweep.py).

It may import domain/, fs/ and `indexer/errors.py`; nothing else of storage/."""
