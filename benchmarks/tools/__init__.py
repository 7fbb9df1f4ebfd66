"""Layer 5: measurement tools built on the runner: ``speed`` (GR4CIL's fast paths against the
plain ones) and ``loader_speed`` (data-loader throughput)."""
