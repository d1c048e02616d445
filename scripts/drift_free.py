"""A finished bench or sweep repriced at one set of costs: the methods' decisions without the host's drift (the code: :mod:`talon_sd.bench.drift_free`)."""

from talon_sd.bench.drift_free import main

if __name__ == "__main__":
    raise SystemExit(main())
