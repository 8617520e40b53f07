"""cudalab's version, in a module of its own: bench.results records it in every results
file, and cudalab/__init__.py imports cudalab.bench before it could define it."""

__version__ = "0.1.0"
