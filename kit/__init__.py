"""kit: multi-node vLLM serving made boring."""

__version__ = "0.1.0"
