"""`kit bench` and `kit tune`: load generation, metrics and layout ranking.

Pure pieces (dataset, schedule, metrics, results, tune planning) plus one I/O piece (runner:
threads + `requests` streaming). Metric definitions follow `vllm bench serve` (vLLM 0.32,
vllm/benchmarks/serve.py `calculate_metrics`, lib/endpoint_request_func.py) so the numbers agree.
"""
