"""The command line: the `cnclip` program (cli/main.py) and one module per command group. The
outermost layer: it may import every package below it (demo, api, indexer, retrieval), and nothing
imports it. typer and rich live here only. Commands stay thin: they parse, open a runtime
(indexer/runtime.py), call the collection service or the toolchain, and print; errors become exit
statuses through one table (cli/errors.py)."""
