"""Bulk indexing, `cnclip index` and `cnclip index-texts`: the pipeline (pipeline.py: read → embed →
commit, each stage overlapping the next), its sources (a folder or a manifest), the reader threads,
routing each file (new bytes, a move, a duplicate), moves by content, backfills, RAW companions,
texts, and the Ray cluster variant (cluster/).

It calls the service (service/) and may import domain/, fs/, `indexer/errors.py`,
`indexer/config.py` and `retrieval`; never storage/."""
