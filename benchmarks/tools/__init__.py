"""Tools built on the runner (layer 5; ``walk`` is layer 6, the command line). Each is a command,
``python -m benchmarks.tools.NAME``:

Measurements
    ``speed`` (GR4CIL's fast paths against the plain ones, and ``--train``: every strategy's training
    and evaluation speed against a bare open_clip reference, from ``train_speed``), ``reference``
    (that reference: plain open_clip and torch, no suite code; aten op counts), ``pipeline_speed``
    (the real runner's training and evaluation on fake data, against the reference beside it),
    ``loader_speed`` (data-loader throughput), ``shared_cores`` (the smoke suite's wall time by thread
    count, idle and beside a busy process), ``kill_rerun`` (kill -9 a run at random moments, rerun
    it: results identical to an uninterrupted run, no stray file), ``import_cost`` (a fresh process's
    imports with the garbage collector running and paused, beside the same packages without the
    suite's code). The outputs of the official code
    that the tests compare with are generated beside those tests (``tests/official/goldens/``).
    Their parts: ``measuring`` (interleaved timing, saved-tensor memory) and ``strategy_costs``
    (every strategy's evaluation forwards, MagMax's memory) for ``speed``; ``reference_pairing`` (a
    strategy's step described plainly for the reference) and ``speed_report`` (the machine, table
    cells, the printed and written results) for ``train_speed`` and ``pipeline_speed``.

Checking a GPU
    ``gpu_check``: in minutes on one GPU, before a long run, the CUDA tests, the speed table, the
    runner's pace and a fast dev run against the speed goals; one table and a verdict.

Data commands
    ``fake_data`` (fake files in every real dataset's format, and a random ViT-B/16), ``resized_cache``
    (images decoded and resized once). Downloads are ``benchmarks.prepare``'s alone.

The real-path walk
    ``walk``: every real suite with ``--fast-dev-run`` on fake data.
"""
