"""The release of consensus-api (semantic versioning, see CHANGELOG.md): a module of its own, so that
the package's modules and the build read it without importing the package."""

__version__ = "0.2.0"
