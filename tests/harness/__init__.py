"""Test harnesses shared by the tests and the benchmarks; not part of the installed package.

- :mod:`harness.cluster`: real processes on loopback (redis-server, stub backends, gateway
  replicas), each killable and restartable, for the scale and fault tests;
- :mod:`harness.loadtest`: open-loop load against a gateway, counting every request's outcome;
- :mod:`harness.vllm`: a real vLLM OpenAI server on a free port, yielding its URL.

Importable as ``harness`` where ``tests/`` is on ``sys.path``: under pytest (``pythonpath`` in
``pyproject.toml``), and in the benchmarks, which put it there before importing.
"""
