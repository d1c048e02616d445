"""Benchmarks and hardware-aware budgets: ``talon bench``, ``talon sweep``, ``talon tune``.

Modules, one job each:

* :mod:`.datasets`  the six packaged prompt sets and user JSONL files
* :mod:`.methods`   the compared methods (ar, hf, hf-assisted, chain, static, eagle, talon), timed alike
* :mod:`.runner`    the interleaved benchmark loop over prompts x variants (multi-turn aware)
* :mod:`.results`   aggregation and the ``results.json`` schema
* :mod:`.report`    terminal table and ``report.md``;  :mod:`.plots`  the PNG plots
* :mod:`.sweep`     the budget grid of ``talon sweep``
* :mod:`.tune`      the cost model, :func:`~.tune.choose_budget` and ``--budget auto``
* :mod:`.measure`   forward timings and calibration runs;  :mod:`.tuner`  ``talon tune`` end to end
* :mod:`.profiles`  per-machine profile files;  :mod:`.machine`  machine and version records
* :mod:`.cli`       the three subcommands

From Python, with a generator already built (e.g. tiny test models)::

    from talon_sd.bench.runner import run_bench
    from talon_sd.bench.methods import Decoding, bench_variants
    records = run_bench(generator, prompts, bench_variants(["talon", "eagle"]), Decoding(max_new_tokens=64))
"""
