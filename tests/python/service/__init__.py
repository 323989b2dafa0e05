"""The fill-job service tests (a package, so that its conftest does not shadow tests/python/conftest.py as the top-level module `conftest`)."""
