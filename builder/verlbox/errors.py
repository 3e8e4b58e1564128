"""User-facing errors: the CLI prints each as one line and exits with its code, never a traceback.

EXIT_CODES is the one table of what verlbox's exit codes mean: the README's table is tested to be this
one, and every error class below carries a code of it. The rule between 1 and 2: 2 when the command
refused what it was given before changing anything (fix the command line, a file or a setting and run
it again); 1 when it started and something failed, or the machinery under it did.
"""

SUCCESS = 0
FAILED = 1
BAD_INPUT = 2
PREFLIGHT_FAILED = 3
RUN_HALTED = 4
# a run stopped by a signal exits 128 + its number, as shells report it
SIGNALLED = 128
INTERRUPTED = SIGNALLED + 2  # SIGINT: Ctrl-C

# (code, meaning), in the order the README lists them
EXIT_CODES: tuple[tuple[str, str], ...] = (
    (str(SUCCESS), "success"),
    (
        str(FAILED),
        "the command ran and something failed: a build; a check that found a difference or a problem (`verify`, "
        "`smoke`, `doctor`, `render --check`, `build --check`, `images --verify`); the Docker engine or compose "
        "(none answering, an error of theirs)",
    ),
    (
        str(BAD_INPUT),
        "bad input, refused before anything changed: an argument, a recipe, an environment or `.env` value, a "
        "path, or something named that is not there (an image not on the engine, a recipe without a lock)",
    ),
    (
        str(PREFLIGHT_FAILED),
        "a preflight check failed (`train`: this GPU, driver, model or data cannot run the profile)",
    ),
    (str(RUN_HALTED), "a training run halted: verl kept failing the same way (a crash loop)"),
    (
        f"{SIGNALLED} + N",
        f"stopped by signal N: {INTERRUPTED} Ctrl-C, {SIGNALLED + 15} SIGTERM (`docker compose stop`; `build` "
        f"stops BuildKit first and exits {INTERRUPTED})",
    ),
)


class VerlboxError(Exception):
    """A problem the user can fix; the message says what and where."""

    exit_code = FAILED


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


class MissingImage(UsageError):
    """An image named (an argument, a .env's VERLBOX_IMAGE, a recipe's default tag) that the engine does not
    hold: bad input like any other name that cannot be used, as an image without verlbox's labels is."""


class PreflightFailed(VerlboxError):
    exit_code = PREFLIGHT_FAILED


class RunHalted(VerlboxError):
    """verl kept failing: restarting it would only repeat the failure."""

    exit_code = RUN_HALTED


class BuildError(VerlboxError):
    """The image build failed; the message points at the kept log."""
