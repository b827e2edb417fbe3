"""Collections of images and texts: the service every entry point calls and what it stands on.

Packages show the layers (docs/architecture.md): domain/ (records and pure rules), service/ (the use
cases and the ports they need), storage/ (the catalog: sql/, vectors/ with faiss/ and milvus/,
media/), bulk/ (the indexing pipeline), watch/ (folder watchers) and fs/ (the file system). At the
root: the composition root (runtime.py), the settings (config.py) and the errors (errors.py).
The command line lives in cli/, the HTTP API in api/."""
