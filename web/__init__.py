"""The search UI: static HTML/CSS/JS served by the API at `/`."""
