"""The image side's commands: train, smoke-checks, prepare-data, fetch, patch-verl (dispatched by verlbox.cli).

fetch and prepare-data also run on the host; train and smoke-checks need the image's stack."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from verlbox.errors import UsageError, VerlboxError
from verlbox.files import write_atomically
from verlbox.runtime.training.spec import SPEC_VARIABLE, ImageSpec, baked_spec

if TYPE_CHECKING:  # smoke imports the training stack: only when its command runs
    from verlbox.runtime.checks.smoke import RealModel

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)


def _given_spec(args: argparse.Namespace) -> ImageSpec | None:
    """--recipe (turned into a spec by the dispatcher), else the spec baked into this image, else None."""
    return getattr(args, "spec", None) or baked_spec()


def _spec(args: argparse.Namespace) -> ImageSpec:
    spec = _given_spec(args)
    if spec is None:
        raise UsageError(f"no recipe given and no image spec here (${SPEC_VARIABLE}): outside an image, pass --recipe")
    return spec


def _missing(*modules: str) -> list[str]:
    """The modules that are not installed here (find_spec: nothing is imported)."""
    return [name for name in modules if importlib.util.find_spec(name) is None]


def train(args: argparse.Namespace) -> int:
    """`train`; as compose's train service (`--on-halt wait`) a run that cannot go on holds with its reason
    instead of exiting into Docker's restart of the same failure, and a crash loop is tried again on its own after
    a long pause (VERLBOX_HALT_RETRY_S). A one-off exits with its code at once: a dry run, or a command typed with
    overrides (`up` runs the file's fixed command)."""
    from verlbox.runtime.training import console

    code: int | None = None
    try:
        code = _train_or_hold(args)
        return code
    finally:
        # a console that still blocks (a stalled terminal) would hold Python's own flush at exit for good, and with
        # it the container past its stop grace: the code is given without another write to it
        if not console.settle():
            os._exit(code if code is not None else _exit_code(sys.exc_info()[1]))
        _let_go_of_a_dead_console()


def _train_or_hold(args: argparse.Namespace) -> int:
    from verlbox.errors import RunHalted
    from verlbox.runtime.training import supervisor
    from verlbox.runtime.training.console import ConsoleGuard
    from verlbox.runtime.training.run_record import AlreadyRunning

    # --on-halt is followed as given; the environment's wait (run folders from before the flag) is compose's
    # service only: a dry run or a command typed with overrides is a one-off and exits
    one_off = args.dry_run or (args.on_halt is None and bool(args.overrides))
    waits = supervisor.holds(os.environ, args.on_halt) and not one_off
    # a console gone (EIO, a full disk under `2> file`) must not turn a hold into exit 1 and Docker's restart
    say = ConsoleGuard().guarding(lambda text: err.print(text, markup=False))
    retrying = False  # a crash loop's halt has been tried again: whatever fails next (the outage may still be on,
    # a one-off may hold the experiment's lock meanwhile) waits for the next pause, not for a person
    while True:
        supervisor.clear_halt()
        try:
            return _train(args)
        except (OSError, VerlboxError) as exc:
            # a full disk while preparing GSM8K, an unreadable folder: one line naming the path
            failure = (
                exc
                if isinstance(exc, VerlboxError)
                else VerlboxError(f"{exc.filename or 'a file'}: {exc.strerror or exc}")
            )
            if not waits or (isinstance(exc, AlreadyRunning) and not retrying):
                if failure is exc:
                    raise
                raise failure from None
            say(f"verlbox: error: {failure}")
            retrying = retrying or isinstance(exc, RunHalted)  # the policy was read before a crash loop could be
            again = supervisor.RestartPolicy.from_environment(os.environ).halt_retry_s if retrying else 0.0
            # a record the full disk kept from being written (train.supervised_run) is tried again while it holds
            code = supervisor.hold(
                failure.exit_code,
                str(failure),
                say,
                retry=getattr(exc, "pending_write", None),
                run_again_after_s=again or None,
            )
            if code is not None:
                return code
            say("verlbox: the halt's pause is over: starting the run again")


def _exit_code(exc: BaseException | None) -> int:
    """The code cli.main would give for EXC, ending train."""
    from verlbox.errors import FAILED, INTERRUPTED

    if isinstance(exc, VerlboxError):
        return exc.exit_code
    return INTERRUPTED if isinstance(exc, KeyboardInterrupt) else FAILED


def _let_go_of_a_dead_console() -> None:
    """Python flushes stdout and stderr as it exits, and a flush that fails there turns every exit code into
    120 (143 for a stop, 3 for a halt, 0 for a finished run: Docker would restart that one). What a dead
    console still holds goes to /dev/null instead."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            with contextlib.suppress(OSError, ValueError):
                os.dup2(devnull, stream.fileno())
            os.close(devnull)


def _train(args: argparse.Namespace) -> int:
    from verlbox.runtime.training.memory_cap import gib_from_environment, parse_gib
    from verlbox.runtime.training.profile import chosen_profile
    from verlbox.runtime.training.train import check_settings

    # what was typed is checked first (the settings compose passed from .env, a recipe given, its profile, the
    # cap); then where train runs, before asking for a recipe nobody gave: on a host without the stack that would
    # only lead astray
    check_settings(os.environ)
    given = _given_spec(args)
    profile = chosen_profile(args.profile, os.environ, given) if given else None
    gib = (
        parse_gib(args.gpu_memory_gib, "--gpu-memory-gib") if args.gpu_memory_gib else gib_from_environment(os.environ)
    )
    missing = _missing("torch", "verl")
    if missing:
        here = f"; `verlbox overrides {args.recipe}` checks its overrides here" if args.recipe else ""
        raise UsageError(
            f"train runs inside the image ({' and '.join(missing)} not installed here): `docker compose up train` "
            f"in a run folder, or `verlbox shell -- verlbox train --dry-run` to see its command{here}"
        )
    spec = given or _spec(args)  # none given: _spec says so
    from verlbox.runtime.training.train import train as run_training

    return run_training(
        spec,
        args.overrides,
        dry_run=args.dry_run,
        gpu_memory_gib=gib,
        console=err,
        gpus_per_node=args.gpus_per_node,
        nodes=args.nodes,
        profile=profile,
    )


def prepare_data(args: argparse.Namespace) -> int:
    if _missing("pyarrow"):
        raise UsageError(
            "prepare-data needs pyarrow, which is not installed here: `pip install pyarrow`, or run it in the image "
            "(`verlbox shell --no-gpu -- verlbox prepare-data gsm8k --source /data/gsm8k-raw --out /data/gsm8k`: "
            "the run folder's data/ is /data there), or let `train` prepare it on first start"
        )
    from verlbox.runtime.training import prompt_lengths
    from verlbox.runtime.training.data import prepare_gsm8k

    if args.trust_remote_code and not args.model:
        raise UsageError("--trust-remote-code goes with --model (it says how to load the model's tokenizer)")
    if args.model:  # refused before anything is written
        _check_tokenizer_folder(Path(args.model))

    folder = Path(args.out)
    written = prepare_gsm8k(Path(args.source), folder, validation_size=args.validation_size)
    for name, (rows, changed) in written.items():
        out.print(f"{folder / name}.parquet: {rows} rows{'' if changed else ' (unchanged)'}")
    if args.model:
        # the files the profiles train and validate on, so train's first start finds them measured
        files = [folder / "train.parquet", folder / "validation.parquet"]

        def say(line: str) -> None:
            out.print(line, markup=False)

        lengths = prompt_lengths.measure(files, Path(args.model), "prompt", say, args.trust_remote_code)
        out.print(f"prompt lengths: {lengths.total} prompts, the longest {lengths.longest} tokens")
    return 0


def _check_tokenizer_folder(model: Path) -> None:
    from verlbox.runtime.training import prompt_lengths

    if not model.is_dir():
        raise UsageError(f"--model {model}: no such folder (the model's folder, for its tokenizer)")
    if prompt_lengths.tokenizer_digest(model) is None:
        raise UsageError(f"--model {model}: no tokenizer files in it ({', '.join(prompt_lengths.TOKENIZER_FILES)})")
    if _missing("transformers"):
        raise UsageError(
            "prepare-data --model needs transformers, which is not installed here: run it in the image "
            "(`verlbox shell`), or leave --model out and let `train` record the prompt lengths on first start"
        )


def fetch(args: argparse.Namespace) -> int:
    """The model or GSM8K into --out, as `train` fetches it on first start (or copied from --from DIR); a folder
    that already holds it is checked against its record instead."""
    from verlbox.run_folder import find_run_folder
    from verlbox.runtime.training import hub

    environ = dict(os.environ)
    in_image = bool(environ.get(SPEC_VARIABLE))
    if in_image and args.run:
        raise UsageError("--run names a run folder on the host; in the image its folders are mounted (/models, /data)")
    run = None if in_image else find_run_folder(args.run)
    if run and (run.settings or not args.out):  # it is read: its settings, as compose gives them to train
        environ = {key: value for key, value in run.settings.items() if value} | environ  # the shell's own win
        err.print(run.described, markup=False)
    source = hub.source_from_environment(args.what, environ, args.repo, args.revision)
    if args.out:
        target = Path(args.out)
    elif in_image:
        raise UsageError(f"fetch {args.what}: give --out DIR (train reads /models/NAME and /data/gsm8k-raw)")
    elif run is None:
        raise UsageError(
            f"fetch {args.what}: give --out DIR, or run it in a run folder (or with --run DIR) to fill that folder's "
            f"{'models/NAME' if args.what == 'model' else 'data/gsm8k-raw'}"
        )
    elif source.repo != (configured := hub.source_from_environment(args.what, environ).repo):
        # the run folder's folder is for the repository its .env names: train would refuse another one there
        key = f"VERLBOX_{args.what.upper()}_REPO"
        raise UsageError(
            f"--repo {args.repo}: the run folder's {args.what} folder holds {key} ({configured}); "
            f"give --out DIR, or set {key} in its .env"
        )
    else:
        target = run.fetch_target(args.what)
    if args.source_folder:  # no hub asked: a folder on this machine, copied and checked
        from verlbox.runtime.training.local_copy import copy_in

        done = copy_in(source, Path(args.source_folder), target, lambda text: err.print(text, markup=False))
        out.print(done, markup=False)
        return 0
    done = hub.ensure(
        source,
        target,
        hub.Hub.from_environment(environ),
        lambda text: err.print(text, markup=False),
        by_hand=False,
        suggest=False,
    )
    out.print(done, markup=False)
    return 0


def patch_verl(args: argparse.Namespace) -> int:
    from verlbox.runtime.training.patches import PatchState, apply

    patch_set, statuses = apply(Path(args.directory))
    pending = [s for s in statuses if s.state is PatchState.PENDING]
    if not pending:
        out.print(f"verl {patch_set.verl_version} in {args.directory}: all {len(statuses)} patches already applied")
    for status in pending:
        out.print(f"applied {status.patch.id} ({status.patch.file}, {status.patch.count}x)")
    return 0


def print_results(results: list, console: Console = out) -> None:
    """One row per check; a long detail wraps within its cell, never cut short (the whole of it is the point)."""
    table = Table("tier", "check", "result")
    table.add_column("detail", overflow="fold")
    colours = {"passed": "green", "failed": "red", "skipped": "yellow"}
    for result in results:
        table.add_row(result.tier, result.name, f"[{colours[result.status]}]{result.status}[/]", result.detail)
    console.print(table, soft_wrap=False)


def _real_model(args: argparse.Namespace) -> RealModel | None:
    """--model (and --data): the user's model and GSM8K folders, checked before any check runs."""
    from verlbox.runtime.checks.smoke import RealModel
    from verlbox.runtime.training.data import PREPARED

    if not args.model:
        if args.data:
            raise UsageError("--data goes with --model: it is the GSM8K folder for the run on your model")
        return None
    model = Path(args.model)
    data = Path(args.data or os.environ.get("VERLBOX_DATA_DIR") or "/data/gsm8k")
    if not (model / "config.json").is_file():
        raise UsageError(f"--model {model}: no config.json there (a Hugging Face model folder is expected)")
    if any(not (data / name).is_file() for name in PREPARED):
        data = _prepared_here(data)
    return RealModel(model, data)


def _prepared_here(source: Path) -> Path:
    """GSM8K as `verlbox fetch data` leaves it (the hub's files), prepared into verl's parquet here in the
    image, which has pyarrow: the host needs nothing for it."""
    import tempfile

    from verlbox.runtime.training.data import PREPARED, prepare_gsm8k

    if not source.is_dir():
        raise UsageError(f"--data {source}: no such folder")
    out = Path(tempfile.mkdtemp(prefix="verlbox-smoke-gsm8k-"))
    err.print(f"preparing GSM8K from {source} for the run on your model", markup=False)
    try:
        prepare_gsm8k(source, out)
    except (VerlboxError, OSError, ValueError) as exc:
        raise UsageError(
            f"--data {source}: neither verl's {' and '.join(PREPARED)} nor a GSM8K source to prepare them from ({exc})"
        ) from None
    return out


def smoke_checks(args: argparse.Namespace) -> int:
    from verlbox.runtime.checks.smoke import results_json, run_smoke

    spec = _spec(args)
    real = _real_model(args)
    learn_too = args.learn or real is not None
    if args.json == "-":
        # verl and transformers print to stdout; keep it clean for the JSON the host reads
        sys.stdout.flush()
        json_out = os.dup(1)
        os.dup2(2, 1)
        try:
            results = run_smoke(spec, gpu=args.gpu or learn_too, learn_too=learn_too, real=real)
        finally:
            sys.stdout.flush()
            os.dup2(json_out, 1)
        sys.stdout.write(results_json(results) + "\n")
    else:
        results = run_smoke(spec, gpu=args.gpu or learn_too, learn_too=learn_too, real=real)
        if args.json:
            write_atomically(Path(args.json), results_json(results) + "\n")
        print_results(results)
    return 1 if any(r.status == "failed" for r in results) else 0


def tensorboard(args: argparse.Namespace) -> int:
    """TensorBoard over the runs' event files, as compose's tensorboard service runs it: its own lines (a
    pkg_resources warning, "TensorFlow installation not found", an address on 0.0.0.0 that is not where the
    host reaches it) replaced by one line with the address the port is published at."""
    import signal
    import threading
    import warnings

    if _missing("tensorboard"):
        raise UsageError(
            "tensorboard runs in the image, where TensorBoard is installed: `docker compose up -d tensorboard` in "
            "the run folder serves every run's curves (README: Watching a run)"
        )
    warnings.simplefilter("ignore")  # tensorboard's own import warns about pkg_resources, its business
    from tensorboard import program

    board = program.TensorBoard()
    # every interface inside the container: compose publishes the port on the host's 127.0.0.1 only
    settings = ["--logdir", args.logdir, "--host", "0.0.0.0", "--port", "6006", "--reload_interval", "30"]
    board.configure(argv=[None, *settings])
    board.launch()
    port = os.environ.get("VERLBOX_TENSORBOARD_PORT") or "6006"
    err.print(
        f"TensorBoard: http://127.0.0.1:{port} (this host only; from another machine: ssh -L {port}:127.0.0.1:{port} "
        "HOST)",
        markup=False,
    )
    stopped = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopped.set())
    stopped.wait()
    return 0
