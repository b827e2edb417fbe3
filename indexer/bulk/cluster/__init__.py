"""Bulk indexing on a Ray cluster (`cnclip index --ray ADDRESS`): the driver plans and commits as a
local run does (indexer/bulk/pipeline.py); the nodes read, preprocess and embed. Ray is the
`cluster` extra and is imported only when a run asks for a cluster (indexer/bulk/cluster/ray_session.py)."""
