"""kit's network leaf: the one bounded HTTP client (kit/net/http.py)."""
