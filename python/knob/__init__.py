"""knob's launcher, for notebooks and scripts: run an experiment and get its trials back as plain
Python objects, through the `knob` command (the one this package was installed with).

    import knob
    trials = knob.Experiment("config.yml").run()           # or a dict: the config itself
    best = min((t for t in trials if t.final is not None), key=lambda t: t.final)
    trials = knob.load("a1b2c3d4").trials                  # a finished experiment, read back

`run()` starts `knob create`, shows its progress, and returns the trials once it ends. A
KeyboardInterrupt (Ctrl-C, or a notebook's interrupt) stops the experiment as Ctrl-C stops
`knob create` (running trials are killed and recorded USER_CANCELED; `knob resume` continues it),
waits for knob to finish stopping (a second interrupt meanwhile is passed on: knob kills the
trials at once), and is raised again. Nothing beyond the standard library.
"""

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

__all__ = ["Experiment", "ExperimentResult", "KnobError", "Metric", "Trial", "load", "knob_command"]

# How long a stopping knob gets after the first interrupt before a second one (knob then exits at
# once, as on a second Ctrl-C), and after that before it is killed.
STOP_GRACE_SECONDS = 120.0
EXIT_GRACE_SECONDS = 15.0


class KnobError(Exception):
    """`knob` failed: the message is what it said (its `error:` lines), or why it could not run."""


@dataclass(frozen=True)
class Metric:
    """One intermediate result: its place in the trial's sequence and its value (None when the
    trial sent NaN, Infinity or something unreadable; `raw` is the text it sent)."""

    sequence: int
    value: Optional[float]
    raw: Optional[str]
    attempt: int


@dataclass(frozen=True)
class Trial:
    """One trial as `knob experiment export` has it (its latest attempt's outcome)."""

    id: str
    sequence: int
    parameters: Dict[str, Any]
    status: str
    final: Optional[float]
    # The text the trial sent as its final result (None if it sent none).
    final_raw: Optional[str]
    # The latest attempt's intermediate results: the curve its status and final come from.
    intermediate: List[Metric]
    # Every attempt's, oldest attempt first, each with its `attempt` (a retried or resumed trial's
    # earlier attempts too).
    all_intermediate: List[Metric]
    attempts: int
    message: Optional[str]
    exit_code: Optional[int]
    # Everything the export holds for the trial (times, attempt history, …).
    export: Dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_export(cls, trial: Mapping[str, Any]) -> "Trial":
        every = [
            Metric(m["sequence"], m.get("value"), m.get("raw"), m.get("attempt", 1))
            for m in trial.get("intermediate", [])
        ]
        # Attempts are numbered 1, 2, …: the latest is the count.
        latest = trial.get("attempts", 0)
        return cls(
            id=trial["id"],
            sequence=trial["sequence"],
            parameters=trial["parameters"],
            status=trial["status"],
            final=trial.get("final"),
            final_raw=trial.get("final_raw"),
            intermediate=[m for m in every if m.attempt == latest],
            all_intermediate=every,
            attempts=trial.get("attempts", 0),
            message=trial.get("message"),
            exit_code=trial.get("exit_code"),
            export=dict(trial),
        )


@dataclass(frozen=True)
class ExperimentResult:
    """An experiment's status and trials, from `knob experiment export ID --format json`. `status`:
    as knob records it (RUNNING, NO_MORE_TRIAL, ... while knob runs it; DONE, STOPPED or ERROR once
    it ended), or CRASHED once its knob process is gone without recording its end (killed;
    `message` says to `knob resume` it; trials it left RUNNING may run on until `knob stop` or
    `knob resume` ends them)."""

    id: str
    status: str
    message: Optional[str]
    config: Dict[str, Any]
    trials: List[Trial]

    @classmethod
    def from_export(cls, export: Mapping[str, Any]) -> "ExperimentResult":
        experiment = export["experiment"]
        return cls(
            id=experiment["id"],
            status=experiment["status"],
            message=experiment.get("message"),
            config=experiment.get("config") or {},
            trials=[Trial.from_export(t) for t in export["trials"]],
        )


def knob_command() -> str:
    """The `knob` to run: `$KNOB_BIN`, else the one installed with this package (the scripts
    folder of this Python's environment), else `knob` on PATH."""
    explicit = os.environ.get("KNOB_BIN")
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            why = "is not an executable file" if os.path.exists(explicit) else "does not exist"
            raise KnobError(
                f"KNOB_BIN={explicit} {why}; set KNOB_BIN to a knob binary, or unset it to use the "
                "knob installed with this package"
            )
        return explicit
    installed = Path(sysconfig.get_path("scripts")) / "knob"
    if installed.is_file() and os.access(installed, os.X_OK):
        return str(installed)
    found = shutil.which("knob")
    if found is None:
        raise KnobError(
            f"no knob command: not in {installed.parent} (this Python's scripts folder) nor on "
            "PATH; pip install the knob wheel, or set KNOB_BIN to a knob binary"
        )
    return found


def _run_knob(args: Sequence[str], home: Optional[str]) -> str:
    """Runs `knob ARGS` to its end and returns its stdout; KnobError with its stderr otherwise."""
    env = _knob_env(home)
    command = knob_command()
    try:
        done = subprocess.run([command, *args], env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except OSError as error:
        raise KnobError(_cannot_run(command, error)) from None
    if done.returncode != 0:
        raise KnobError(f"knob {' '.join(args)}: {_error_text(done.stderr, done.returncode)}")
    return done.stdout


def _knob_env(home: Optional[str]) -> Dict[str, str]:
    env = dict(os.environ)
    if home is not None:
        env["KNOB_HOME"] = home
    return env


def _cannot_run(command: str, error: OSError) -> str:
    return (
        f"cannot run {command}: {error.strerror or error}; set KNOB_BIN to a knob binary, or pip "
        "install the knob wheel"
    )


def _error_text(output: str, code: int) -> str:
    """knob's error, from its output: its `error:` line and every line after it (knob ends on
    its error; a config's further problems follow the first on lines of their own), else its
    last lines."""
    lines = output.strip().splitlines()
    first = next((at for at, line in enumerate(lines) if line.startswith("error")), None)
    kept = lines[first:] if first is not None else lines[-5:]
    return "\n".join(kept) or _ended_by(code)


def _ended_by(code: int) -> str:
    """How a process that ended with return code `code` ended: its exit status, or the signal
    that killed it (subprocess's negative code)."""
    if code >= 0:
        return f"exit status {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = "a signal"
    return f"killed by {name} (signal {-code})"


def load(experiment_id: str, *, home: Optional[str] = None) -> ExperimentResult:
    """A known experiment (running, stopped or finished) as `knob experiment export` has it.
    `home`: knob's registry folder (`$KNOB_HOME`), when not the default."""
    # After `--`: an id starting with `-` ("-h") is knob's to refuse, not an option of its own.
    args = ["experiment", "export", "--format", "json", "--", experiment_id]
    text = _run_knob(args, home)
    try:
        return ExperimentResult.from_export(json.loads(text))
    except (ValueError, LookupError, TypeError, AttributeError) as error:
        # A KNOB_BIN that is another program (exit 0, no JSON), or a knob whose export is
        # another version's: the README promises KnobError, not json's or a KeyError.
        raise KnobError(_not_an_export(args, text, error)) from None


def _not_an_export(args: Sequence[str], text: str, error: Exception) -> str:
    command = knob_command()
    if isinstance(error, json.JSONDecodeError):
        said = f"printed no JSON (it began {text.strip()[:60]!r})" if text.strip() else "printed nothing"
    else:
        said = f"printed JSON that is not knob's export ({type(error).__name__}: {error})"
    if os.environ.get("KNOB_BIN"):
        fix = (
            f"KNOB_BIN={command} is not knob (or another version's); set KNOB_BIN to a knob binary, "
            "or unset it to use the knob installed with this package"
        )
    else:
        fix = f"{command} is not knob (or another version's); pip install the knob wheel again, or set KNOB_BIN to a knob binary"
    return f"{command} {' '.join(args)} {said}; {fix}"


ConfigSource = Union[str, "os.PathLike[str]", Mapping[str, Any]]


class Experiment:
    """An experiment to run: a config file's path, or the config itself as a dict (the same
    fields as the YAML file; relative paths in it are relative to `base_dir`, by default the
    current directory). A relative config path or base_dir is taken from the current directory
    when the Experiment is made, not when it runs."""

    def __init__(
        self,
        config: ConfigSource,
        *,
        id: Optional[str] = None,
        base_dir: Union[str, "os.PathLike[str]", None] = None,
        home: Optional[str] = None,
    ) -> None:
        if isinstance(config, Mapping):
            self._config_dict: Optional[Dict[str, Any]] = dict(config)
            self._config_path: Optional[Path] = None
        else:
            self._config_dict = None
            # Made absolute now, as base_dir is: the file checked here is the one run() runs,
            # whatever folder (a notebook's os.chdir) it is called from.
            self._config_path = Path(config).absolute()
            if self._config_path.is_dir():
                raise KnobError(
                    f"config file {self._config_path} is a folder, not a config file; give the config "
                    "file's path (YAML or JSON), or the config itself as a dict"
                )
            if not self._config_path.is_file():
                raise KnobError(f"config file {self._config_path} does not exist")
        # An id of our own, so that the result can be read back whatever knob prints.
        self.id = id or "py" + uuid.uuid4().hex[:10]
        self._base_dir = Path(base_dir).absolute() if base_dir is not None else Path.cwd()
        if self._config_dict is not None and not self._base_dir.is_dir():
            raise KnobError(
                f"base_dir {self._base_dir} is not a folder; give the folder the config's relative "
                "paths are relative to (default: the current one)"
            )
        self._home = home

    def run(self, *, progress: bool = True, output: Optional[IO[str]] = None) -> List[Trial]:
        """Runs the experiment to its end and returns its trials. knob's output (its progress and
        its table of best trials) is copied to `output` (default: sys.stdout) unless `progress`
        is false. Raises KnobError when knob fails (a bad config, an experiment that errors or
        whose every trial failed: knob's own non-zero exits), KeyboardInterrupt after stopping
        the experiment."""
        if self._config_dict is None:
            assert self._config_path is not None
            return self._run_file(self._config_path, progress, output, None)
        # In base_dir, since knob resolves relative paths against the config file's folder (and
        # leaves the file out of the trial code it copies to other hosts). It holds the whole
        # config, passwords too, so it is removed as soon as knob has read it, not when run()
        # returns: a Python killed meanwhile (by a batch scheduler, a kernel restart) cannot
        # remove it, and knob, in a session of its own, runs on.
        text = json.dumps(_plain(self._config_dict, "config", {}))
        try:
            handle, name = tempfile.mkstemp(prefix=".knob-config-", suffix=".json", dir=self._base_dir)
        except OSError as error:
            raise KnobError(
                f"cannot write the config into base_dir {self._base_dir} (knob reads a dict config "
                f"from a file there): {error.strerror or error}; give a base_dir you can write to"
            ) from None

        def remove() -> None:
            try:
                os.unlink(name)
            except FileNotFoundError:
                pass

        def in_dict(text: str) -> str:
            return _name_the_dict(text, name)

        try:
            with os.fdopen(handle, "w") as file:
                file.write(text)
            return self._run_file(Path(name), progress, output, remove, in_dict)
        except KnobError as error:
            raise KnobError(in_dict(str(error))) from None
        finally:
            remove()

    def _run_file(
        self,
        config: Path,
        progress: bool,
        output: Optional[IO[str]],
        read: Optional[Callable[[], None]],
        rewrite: Optional[Callable[[str], str]] = None,
    ) -> List[Trial]:
        """Runs `knob create` on `config`; `read` is called once knob has read it (it has created
        the experiment, the line naming its folder, and reads the file no more). `rewrite`:
        applied to each line of knob's output before it is shown or kept for an error."""
        out = output if output is not None else sys.stdout
        # `--id=ID`: an id starting with `-` is the value, for knob to refuse, not an option.
        command = [knob_command(), "create", f"--config={config}", f"--id={self.id}"]
        # Its own session: a terminal's Ctrl-C reaches only Python, which passes each one on
        # (`_stop`), as the terminal would have.
        env = _knob_env(self._home)
        # Plain progress lines: the bar knob draws on a terminal shows nothing through a pipe.
        env.setdefault("KNOB_PROGRESS", "lines")
        tail: List[str] = []
        made: List[bool] = []

        def on_created() -> None:
            made.append(True)
            if read is not None:
                read()

        created = (f"experiment {self.id}: ", on_created)
        process: "Optional[subprocess.Popen[str]]" = None
        reader: Optional[threading.Thread] = None
        try:
            # An interrupt while knob starts must stop it too: one raised inside Popen (knob
            # forked, its pid not yet kept) or in the reader's start would leave knob running
            # unwatched, in a session no Ctrl-C reaches. It is held until both are done.
            with _interrupts_held():
                try:
                    process = subprocess.Popen(
                        command,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT,
                        text=True,
                        errors="replace",
                        start_new_session=True,
                    )
                except OSError as error:
                    raise KnobError(_cannot_run(command[0], error)) from None
                assert process.stdout is not None
                reader = threading.Thread(
                    target=_copy_lines,
                    args=(process.stdout, out if progress else None, tail, created, rewrite),
                    daemon=True,
                )
                reader.start()
            # A bounded wait in a loop keeps the main thread in Python code, so a
            # KeyboardInterrupt is raised here promptly however knob's output flows.
            while True:
                try:
                    code = process.wait(timeout=0.2)
                    break
                except subprocess.TimeoutExpired:
                    continue
            reader.join(timeout=EXIT_GRACE_SECONDS)
        except KeyboardInterrupt:
            if process is not None:
                _stop(process)
            if reader is not None:
                reader.join(timeout=EXIT_GRACE_SECONDS)
            raise
        finally:
            # The pipe is ours to close (left open, every run() was a ResourceWarning under
            # -X dev or pytest, and a notebook kept one file per run until garbage
            # collection); not under a reader still in it (a process knob left behind holding
            # knob's stdout), where closing would wait on that read.
            if process is not None and process.stdout is not None and (reader is None or not reader.is_alive()):
                process.stdout.close()
        if code < 0:
            # Killed (the OOM killer, a batch scheduler, kill -9): knob said nothing of it, its
            # last lines are progress, and the experiment is left crashed.
            left = (
                f"the experiment is left crashed: `knob resume {self.id}` continues it (`knob stop "
                f"{self.id}` ends the trials it left running)"
                if made
                else "before it created the experiment"
            )
            last = "".join(tail[-5:]).rstrip("\n")
            raise KnobError(
                f"knob create (experiment {self.id}) was {_ended_by(code)}; {left}"
                + (f"\nknob's last lines:\n{last}" if last else "")
            )
        if code != 0:
            raise KnobError(f"knob create (experiment {self.id}): {_error_text(''.join(tail), code)}")
        return load(self.id, home=self._home).trials


def _name_the_dict(text: str, temporary: str) -> str:
    """knob's output about a dict config, naming the dict rather than `temporary`, the file knob
    read it from: the user never wrote that file, and it is gone once knob has read it. The
    field's path knob gives with a place in it names the place in the dict ("FILE:4:1: tuner:
    ..." is config.tuner); a problem of the whole mapping ("FILE:3:1: unknown field ...", an NNI
    v1 config's warning "FILE: an NNI v1 config ...") has no path: config. Errors and warnings
    alike, as shown and as raised."""
    if temporary not in text:
        return text
    # The NNI v1 warning's way to see the converted config ran `knob config check --v2` on the
    # file, which is gone: the experiment's config as read back is that v2 config.
    text = text.replace(
        f"`knob config check --v2 {temporary}` prints the v2 config",
        "the experiment's `config`, as `knob.load()` reads it back, is the v2 config",
    )

    def in_dict(place: "re.Match[str]") -> str:
        return f"config.{place.group(2)}: " if place.group(2) else "config: "

    text = re.sub(re.escape(temporary) + r"(:\d+)*: (?:([^\s:]+): )?", in_dict, text)
    return text.replace(temporary, "the config")


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """SIGINT, while the block runs, is held and raised again once it is done (through the
    handler it would have met: KeyboardInterrupt, usually). Only the main thread can set a
    handler; elsewhere, and where SIGINT is ignored or not Python's to handle, it is left alone."""
    previous = signal.getsignal(signal.SIGINT) if _main_thread() else None
    if previous is None or previous is signal.SIG_IGN:
        yield
        return
    held: List[int] = []

    def hold(signum: int, frame: Optional[FrameType]) -> None:
        held.append(signum)

    signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            signal.raise_signal(signal.SIGINT)


def _plain(value: Any, where: str, inside: Dict[int, str]) -> Any:
    """`value` as JSON can hold it: paths as their text, numpy arrays and scalars (anything
    with `tolist`) as lists and numbers. Anything else is a KnobError naming where it is in
    the config (json's own error named only its type); so is a dict or list inside itself
    (`inside`: the dicts and lists `value` is in, by id, and where they are)."""
    if isinstance(value, float) and not math.isfinite(value):
        # json.dumps would write NaN or Infinity, which knob reads as those strings.
        raise KnobError(f"{where}: {value} cannot go into a config (JSON has no NaN or infinity); give a finite number")
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (Mapping, list, tuple)):
        if id(value) in inside:
            raise KnobError(
                f"{where}: is {inside[id(value)]} itself, which it is inside; a config cannot contain "
                "itself (give a copy)"
            )
        inside = {**inside, id(value): where}
    if isinstance(value, Mapping):
        plain: Dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, (str, int)) or isinstance(key, bool):
                raise KnobError(f"{where}: the key {key!r} is not a string; a config's keys are strings")
            plain[str(key)] = _plain(item, f"{where}.{key}", inside)
        return plain
    if isinstance(value, (list, tuple)):
        return [_plain(item, f"{where}[{index}]", inside) for index, item in enumerate(value)]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return _plain(tolist(), where, inside)
    raise KnobError(
        f"{where}: {type(value).__name__} {value!r} cannot go into a config; give a string, a number, "
        "a bool, a list or a dict"
    )


def _copy_lines(
    stream: IO[str],
    out: Optional[IO[str]],
    tail: List[str],
    created: Optional[Tuple[str, Callable[[], None]]],
    rewrite: Optional[Callable[[str], str]] = None,
) -> None:
    """Reads knob's output to its end, copying it to `out`, whatever `out` does: this is the only
    reader of knob's pipe, which, once full, blocks knob for good. A line `out` cannot encode is
    written with `?` for what it cannot; an `out` that fails otherwise gets nothing more (a
    warning says so). `created`: a line's start, and what to call when a line starts so.
    `rewrite`: what each line becomes, shown and kept."""
    for line in stream:
        if rewrite is not None:
            line = rewrite(line)
        tail.append(line)
        # The last lines are kept for the error message; knob's own output is bounded by the
        # experiment's length, not this list, which keeps at most 200.
        del tail[:-200]
        if created is not None and line.startswith(created[0]):
            try:
                created[1]()
            except Exception:
                pass  # run() tries again when it returns, where its error can be raised
            created = None
        if out is not None:
            try:
                _write(out, line)
            except Exception as error:
                warnings.warn(
                    f"knob: cannot write knob's output to {out!r} ({type(error).__name__}: {error}); "
                    "the rest of it is not shown, the experiment goes on",
                    RuntimeWarning,
                )
                out = None


def _write(out: IO[str], line: str) -> None:
    try:
        out.write(line)
    except UnicodeEncodeError:
        # knob's lines hold `·` and trials' names and paths: an ASCII terminal or file (or
        # PYTHONIOENCODING=ascii) gets the rest of the line.
        encoding = getattr(out, "encoding", None) or "ascii"
        out.write(line.encode(encoding, errors="replace").decode(encoding))
    out.flush()


def _stop(process: "subprocess.Popen[str]") -> None:
    """Ctrl-C for knob: SIGINT, and each interrupt meanwhile passed on, as a terminal would have
    (knob's second kills the trials at once and exits, as it says on the first). Without one, a
    second SIGINT if knob has not stopped within STOP_GRACE_SECONDS of the first, and SIGKILL
    EXIT_GRACE_SECONDS after the second."""
    sent: List[float] = []

    def interrupt() -> None:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            sent.append(time.monotonic())

    def pass_on(signum: int, frame: Optional[FrameType]) -> None:
        interrupt()

    previous = signal.signal(signal.SIGINT, pass_on) if _main_thread() else None
    try:
        interrupt()
        while sent:
            try:
                process.wait(timeout=0.2)
                return
            except subprocess.TimeoutExpired:
                pass
            if len(sent) == 1 and time.monotonic() - sent[0] >= STOP_GRACE_SECONDS:
                interrupt()
            elif len(sent) >= 2 and time.monotonic() - sent[1] >= EXIT_GRACE_SECONDS:
                process.kill()
                process.wait()
                return
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()
