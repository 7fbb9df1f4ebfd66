"""Layer 4, above ``strategies``: suites, the results store and its run locks, executing one run,
the launchers (inline, local processes, SLURM) and the status of a results folder."""
