"""Data layer: loaders for each public source, the items/queries/qrels Dataset, GE validation.

Import from the submodules (``coevo.data.schema.Dataset``, ``coevo.data.loaders.load_source``,
``coevo.data.validation.ensure_valid``, ``coevo.data.summary.summarize``) so that importing
the package stays cheap.
"""
