class SequentialPlain:
    N_TASKS = 3
