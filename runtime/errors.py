"""The runtime's one error type for a package it cannot use (a leaf: every runtime module may raise it)."""


class PackageError(Exception):
    """The folder is not a valid edgekit package."""
