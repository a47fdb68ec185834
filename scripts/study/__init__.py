"""The CPU studies' reports and checks: each reads the runs of a sweep (``scripts.sweep``) and
writes the tables and figures of docs/results.md, or measures what a study needs (µP's coordinate
check, the activation's regime at initialisation, a mixture's realised shares)."""
