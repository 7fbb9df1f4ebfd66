"""Experience replay in Mammoth's shape (``mammoth:mammoth_er.model:ER``)."""
