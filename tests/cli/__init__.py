"""The tests of cli/: each `cnclip` command as a user runs it (typer's runner or a subprocess), its output,
exit statuses and errors. It shares helpers only through tests/support/ and fixtures only through
conftest.py; no test module imports another."""
