"""The dataset units: one module per dataset, each registering a ``DatasetUnit`` subclass with
``@register_dataset("name")`` (``benchmarks.data.unit``). Every module here is imported on the first
lookup (a name starting with ``_`` is not), so a new dataset is one new file and no edit elsewhere:
``docs/adding-a-dataset.md``."""
