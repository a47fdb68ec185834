"""The registered data sources: one module each, registering one ``data.registry.DataSource``.

``data.registry`` imports every module here on first lookup, so a new module is a new source.
"""
