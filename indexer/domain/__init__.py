"""The domain: records and pure rules, with no storage, no file system and no service behind them —
the records the catalog hands out and the service passes around (records.py, generations.py,
duplicates.py, results.py), collection names, the index grammar, paging and cutoffs, exclusion,
photo dates, perceptual hashes, grouping, the rules of recognised text.

It may import the standard library, numpy and Pillow, `retrieval` and `indexer/errors.py`, and
nothing else of indexer/: every other layer imports it, so it imports none of them."""
