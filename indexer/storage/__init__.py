"""Storage: what implements the service's ports. The catalog (catalog.py, `SqlCatalog`, and the
stores beside it for duplicates, generations and texts) over SQL (sql/, the source of truth) and a
vector engine (vectors/, derived data), this process's vector stores (store_pool.py), keeping them
equal to SQL (sync.py) and their health (store_health.py); uploaded bytes under media/.

It may import domain/, fs/, `indexer/errors.py`, `indexer/config.py` and `retrieval`. Only the
composition root (indexer/runtime.py), migrations/ and benchmarks/ import it; api/, cli/, demo/
and the service, bulk and watch packages reach it through the service."""
