"""A nearest-class-mean learner in PyCIL's shape (``pycil:pycil_ncm.learner:NCM``)."""
