"""The HTTP service `headrace serve` runs: the API, the moderator page and the metrics
(`create_api` in app.py)."""
