"""The one error type users see: a one-line message, exit code 2, no traceback."""


class EdgekitError(Exception):
    """Bad input or an unmet requirement. The CLI prints `error: <message>` and exits with `exit_code`."""

    exit_code = 2


class DataError(EdgekitError):
    """Bad data, located by file and (where it applies) 1-based line."""

    def __init__(self, path, line: int | None, message: str):
        self.path, self.line = str(path), line
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {message}")
