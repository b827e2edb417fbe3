"""HTTP layer: FastAPI app factory, routes, schemas, auth, metrics; serves the web UI."""
