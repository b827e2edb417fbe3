"""Cross-cutting: the web UI and the API docs pages in a real Chromium driven by Playwright (marker
`browser`), against a live server. It shares helpers only through tests/support/ and fixtures only through
conftest.py; no test module imports another."""
