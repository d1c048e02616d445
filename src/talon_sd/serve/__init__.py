"""``talon serve``: an OpenAI-compatible HTTP server over :class:`~talon_sd.SpeculativeGenerator`.

    app.py        HTTP only: request -> scheduler submission -> OpenAI response or SSE stream
    schemas.py    the wire format: pydantic request bodies, error objects, response shapes
    scheduler.py  FIFO queue + one worker thread that owns the engine; submit / events / cancel
    engine.py     the engines: BatchedEngine (continuous batching on a BatchDecoder), BatchOneEngine (one request
                  at a time, one ``generator.stream(...)`` call each)
    metrics.py    Prometheus collectors on a per-app registry
    loadtest.py   ``talon bench-serve``: concurrent streaming clients against a local server
    cli.py        the ``serve`` and ``bench-serve`` subcommands

The engine (``talon_sd`` outside this package) never imports the server. See docs/SERVING.md.
"""
