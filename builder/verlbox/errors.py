"""User-facing errors: the CLI prints these as one message and exits non-zero, never a traceback."""


class VerlboxError(Exception):
    """A problem the user can fix; the message says what and where."""

    exit_code = 1


class RecipeError(VerlboxError):
    """A recipe file that cannot be used: names the file, the key path and what was expected."""

    exit_code = 2

    def __init__(self, path: object, key: str, problem: str) -> None:
        self.path = str(path)
        self.key = key
        self.problem = problem
        where = f"{self.path}: {key}" if key else self.path
        super().__init__(f"{where}: {problem}")


class BuildError(VerlboxError):
    """The image build failed; the message points at the kept log."""
