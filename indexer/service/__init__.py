"""The use cases: the collection service (collections.py), the one door every route, command, the
bulk pipeline, the watchers and the demo go through, and the feature services it is composed of
(searches and uploads, near-duplicates, model generations, thumbnails), coded against the ports
they need of storage (ports.py: narrow protocols, one per concern).

It may import domain/, fs/, `indexer/errors.py`, `indexer/config.py` and `retrieval`; never
storage/ (the catalog that implements the ports is handed in by the composition root,
indexer/runtime.py)."""
