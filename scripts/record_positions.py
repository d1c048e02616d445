"""Record the real pair's draft trees at every position of recorded greedy answers: exact replay worlds (the code: :mod:`talon_sd.bench.record`)."""

from talon_sd.bench.record import main

if __name__ == "__main__":
    raise SystemExit(main())
