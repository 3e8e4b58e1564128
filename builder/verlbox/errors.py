"""User-facing errors: the CLI prints each as one line and exits with its code, never a traceback.

Exit codes (the README lists them): 2 bad input (a recipe, an argument, an environment value, an
output path), 3 a preflight check failed, 4 a training run halted (a crash loop), 1 anything else (a
failed build, a missing engine).
"""

BAD_INPUT = 2
PREFLIGHT_FAILED = 3
RUN_HALTED = 4


class VerlboxError(Exception):
    """A problem the user can fix; the message says what and where."""

    exit_code = 1


class UsageError(VerlboxError):
    """Bad input: an argument, an environment value or an output path that cannot be used."""

    exit_code = BAD_INPUT


class RecipeError(UsageError):
    """A recipe file that cannot be used: names the file, the key path and what was expected."""

    def __init__(self, path: object, key: str, problem: str) -> None:
        self.path = str(path)
        self.key = key
        self.problem = problem
        where = f"{self.path}: {key}" if key else self.path
        super().__init__(f"{where}: {problem}")


class PreflightFailed(VerlboxError):
    exit_code = PREFLIGHT_FAILED


class RunHalted(VerlboxError):
    """verl kept failing: restarting it would only repeat the failure."""

    exit_code = RUN_HALTED


class BuildError(VerlboxError):
    """The image build failed; the message points at the kept log."""
