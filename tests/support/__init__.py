"""The tests' shared helpers, imported as ``support.NAME`` (tests/ is on the path: pytest
puts the folder of the root ``conftest.py`` there). The tiny models themselves live in
``specbound.models.tiny`` and the audit's bigram tables in ``specbound.audit.tables``, where the
benchmarks reach them too."""
