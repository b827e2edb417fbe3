"""The tests of demo/: the demo dataset, training and evaluating the demo model, `cnclip demo`'s gallery. It
shares helpers only through tests/support/ and fixtures only through conftest.py; no test module imports
another."""
