"""Layer 0: what every other layer may use. Errors, numeric precision, the run's environment,
atomic file writes, dataclasses read from JSON, and the protocol's metrics and subspace distances
(pure functions)."""
