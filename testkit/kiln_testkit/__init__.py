"""kiln-testkit: helpers that kiln's tests and benchmarks share.

Installed by ``make setup`` (``pip install -e testkit``) and on pytest's
``pythonpath``, so that ``tests/`` and ``benchmarks/`` import one copy of each
helper without touching ``sys.path``. Never part of an image: the engine image
carries ``engine/`` only.

- ``tree``: the checkout (``REPO``), a throwaway kiln tree (``make_tree``), the
  real CLI in a subprocess (``run_kiln``);
- ``twinserve``, ``twinstats``: serving a built recipe image and comparing
  feature-on and feature-off answers (the e2e tests, ``bench_cpu``,
  ``spec_acceptance``, ``record_traces``);
- ``dt_batches``: random verify batches shaped as vLLM builds them;
- ``dt_cost``: the numpy side of draft_trunc's cost model (its fit, and the
  device policy's twin that the simulator replays);
- ``gpubench``: CUDA-graph timing and the result header of the GPU benchmarks;
- ``scripts``: load a benchmark script as a module, for the tests of it.
"""
