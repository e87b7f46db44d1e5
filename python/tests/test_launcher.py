"""knob.Experiment / knob.load against the real `knob` (the wheel's, in CI: `.ci/run`'s wheel
step): real experiments, real trial processes, real stores in temporary folders."""

import gc
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path
from types import FrameType
from typing import IO, Any, Dict, Iterator, List, Optional

import pytest

import knob


def _knob_or_skip() -> str:
    try:
        return knob.knob_command()
    except knob.KnobError as error:
        if os.environ.get("KNOB_TEST_REQUIRE_ALL") == "1":
            raise
        pytest.skip(f"skipped: {error}")
        raise


@pytest.fixture
def home(tmp_path: Path) -> Iterator[str]:
    """A registry of our own and a `knob` to run (skips visibly without one)."""
    _knob_or_skip()
    yield str(tmp_path / "home")


BRANIN = """\
import math, knob_trial
p = knob_trial.get_parameters()
x1, x2 = p["x1"], p["x2"]
value = (x2 - 5.1 / (4 * math.pi ** 2) * x1 ** 2 + 5 / math.pi * x1 - 6) ** 2 + 10 * (1 - 1 / (8 * math.pi)) * math.cos(x1) + 10
for epoch in range(1, 4):
    knob_trial.report_intermediate(value * (1 + 1 / epoch))
knob_trial.report_final({"default": value, "epochs": 3})
"""


def branin_config(code: Path, trials: int) -> Dict[str, Any]:
    code.mkdir(parents=True, exist_ok=True)
    (code / "branin.py").write_text(BRANIN)
    return {
        "experimentName": "launcher-test",
        "searchSpace": {
            "x1": {"_type": "uniform", "_value": [-5, 10]},
            "x2": {"_type": "uniform", "_value": [0, 15]},
        },
        "trialCommand": f"{sys.executable} branin.py",
        "trialCodeDirectory": str(code),
        "trialConcurrency": 2,
        "maxTrialNumber": trials,
        "maxExperimentDuration": "5m",
        "experimentWorkingDirectory": str(code.parent / "experiments"),
        "tuner": {"name": "Random", "classArgs": {"optimize_mode": "minimize", "seed": 3}},
        "trainingService": {"platform": "local"},
    }


def test_the_installed_package_and_knob_are_used_when_testing_the_wheel() -> None:
    """CI's wheel step sets KNOB_TEST_INSTALLED=1: these tests must then exercise what pip
    installed, not the repository's python/ folder or a cargo build."""
    if os.environ.get("KNOB_TEST_INSTALLED") != "1":
        pytest.skip("skipped: KNOB_TEST_INSTALLED is not set (only CI's wheel step tests an install)")
    prefix = Path(sys.prefix).resolve()
    assert prefix in Path(knob.__file__).resolve().parents
    assert Path(knob.knob_command()).resolve() == prefix / "bin" / "knob"


def test_a_dict_config_runs_and_returns_its_trials(tmp_path: Path, home: str) -> None:
    config = branin_config(tmp_path / "code", trials=4)
    output = tmp_path / "progress.txt"
    with output.open("w") as out:
        trials = knob.Experiment(config, id="dict1", home=home, base_dir=tmp_path).run(output=out)
    assert len(trials) == 4
    for trial in trials:
        assert trial.status == "SUCCEEDED", trial
        assert set(trial.parameters) == {"x1", "x2"}
        assert trial.final is not None and trial.final > 0.39
        assert json.loads(trial.final_raw or "") == {"default": trial.final, "epochs": 3}
        assert [m.sequence for m in trial.intermediate] == [0, 1, 2]
        first = trial.intermediate[0].value
        assert first is not None and abs(first - 2 * trial.final) < 1e-9
    shown = output.read_text()
    assert "experiment dict1 DONE: 4 trials (4 succeeded, 0 failed)" in shown
    # knob's progress, as lines: the last one counts every trial.
    progress = [line for line in shown.splitlines() if line.startswith("progress: ")]
    assert progress and progress[-1].startswith("progress: 4/4 done 4 · running 0 · failed 0"), shown
    # The temporary config file is gone; the experiment reads back the same.
    assert not list(tmp_path.glob(".knob-config-*"))
    result = knob.load("dict1", home=home)
    assert result.status == "DONE"
    assert result.trials == trials


def test_a_retried_trials_intermediate_is_its_latest_attempts(tmp_path: Path, home: str) -> None:
    """A trial run twice: `intermediate` is the curve of the attempt its status and final
    describe, `all_intermediate` every attempt's (they ran together, a saw-tooth) (H3 F5)."""
    code = tmp_path / "code"
    code.mkdir()
    # The first attempt reports 2 steps and fails; the second (the marker file is there) 3 steps.
    (code / "retried.py").write_text(
        "import os, sys, knob_trial\n"
        "first = not os.path.exists('ran-once')\n"
        "open('ran-once', 'w').close()\n"
        "for step in range(2 if first else 3):\n"
        "    knob_trial.report_intermediate(float(step + (10 if first else 0)))\n"
        "if first:\n"
        "    sys.exit(1)\n"
        "knob_trial.report_final(9.0)\n"
    )
    config = {
        "searchSpace": {"x": {"_type": "choice", "_value": [1]}},
        "trialCommand": f"{sys.executable} retried.py",
        "trialCodeDirectory": str(code),
        "trialConcurrency": 1,
        "maxTrialNumber": 1,
        "maxTrialRetries": 1,
        "experimentWorkingDirectory": str(tmp_path / "experiments"),
        "tuner": {"name": "Random"},
        "trainingService": {"platform": "local"},
    }
    (trial,) = knob.Experiment(config, id="retried", home=home).run(progress=False)
    assert (trial.status, trial.final, trial.attempts) == ("SUCCEEDED", 9.0, 2), trial
    assert [(m.attempt, m.value) for m in trial.intermediate] == [(2, 0.0), (2, 1.0), (2, 2.0)]
    assert [(m.attempt, m.value) for m in trial.all_intermediate] == [
        (1, 10.0),
        (1, 11.0),
        (2, 0.0),
        (2, 1.0),
        (2, 2.0),
    ]


def test_a_config_file_runs_quietly(tmp_path: Path, home: str) -> None:
    config = tmp_path / "code" / "config.json"
    data = branin_config(tmp_path / "code", trials=2)
    del data["trialCodeDirectory"]  # the config file's folder, as in NNI
    config.write_text(json.dumps(data))
    experiment = knob.Experiment(config, home=home)
    trials = experiment.run(progress=False)
    assert experiment.id.startswith("py")
    assert [t.status for t in trials] == ["SUCCEEDED", "SUCCEEDED"]


def test_a_relative_config_path_is_the_file_of_the_folder_it_was_given_in(
    tmp_path: Path, home: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`Experiment("config.yml")` checked ./config.yml at construction but ran the config.yml of
    whatever folder run() was called from (a notebook that `os.chdir`s ran another experiment,
    silently) (H1 F4). So does a relative base_dir."""
    for name in ("a", "b"):
        config = branin_config(tmp_path / name / "code", trials=1)
        config["experimentName"] = f"from-{name}"
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    monkeypatch.chdir(tmp_path / "a")
    experiment = knob.Experiment("config.json", home=home)
    monkeypatch.chdir(tmp_path / "b")
    experiment.run(progress=False)
    assert knob.load(experiment.id, home=home).config["experimentName"] == "from-a"
    monkeypatch.chdir(tmp_path)
    config = branin_config(tmp_path / "a" / "code", trials=1)
    config["trialCodeDirectory"] = "code"
    experiment = knob.Experiment(config, home=home, base_dir="a")
    monkeypatch.chdir(tmp_path / "b")
    experiment.run(progress=False)
    assert knob.load(experiment.id, home=home).config["trialCodeDirectory"] == str(tmp_path / "a" / "code")


def test_a_bad_config_is_knobs_one_line_error(tmp_path: Path, home: str) -> None:
    config = branin_config(tmp_path / "code", trials=2)
    config["trialConcurrency"] = 0
    with pytest.raises(knob.KnobError) as raised:
        knob.Experiment(config, home=home, base_dir=tmp_path).run(progress=False)
    assert "trialConcurrency" in str(raised.value)
    assert "error" in str(raised.value)
    # Named by its place in the dict, not in the temporary file knob read it from (gone now).
    assert "error: config.trialConcurrency: " in str(raised.value), raised.value
    assert ".knob-config-" not in str(raised.value), raised.value


def test_a_misspelt_field_is_named_in_the_dict_at_the_top_level_and_below(tmp_path: Path, home: str) -> None:
    # knob names no field path for an unknown top-level field ("FILE:3:1: unknown field ..."):
    # that read "config.unknown field" (H3 F10).
    config = branin_config(tmp_path / "code", trials=2)
    config["maxTrialNumbr"] = config.pop("maxTrialNumber")
    with pytest.raises(knob.KnobError) as raised:
        knob.Experiment(config, home=home, base_dir=tmp_path).run(progress=False)
    assert 'error: config: unknown field "maxTrialNumbr" (did you mean "maxTrialNumber"?)' in str(raised.value), raised.value
    config = branin_config(tmp_path / "code", trials=2)
    config["tuner"]["clasArgs"] = config["tuner"].pop("classArgs")
    with pytest.raises(knob.KnobError) as raised:
        knob.Experiment(config, home=home, base_dir=tmp_path).run(progress=False)
    assert 'error: config.tuner: unknown field "clasArgs"' in str(raised.value), raised.value


def test_nan_and_infinity_are_refused_where_they_are_in_a_dict_config(tmp_path: Path) -> None:
    config = branin_config(tmp_path / "code", trials=1)
    config["searchSpace"]["x1"]["_value"] = [0, float("inf")]
    with pytest.raises(knob.KnobError) as raised:
        knob.Experiment(config, base_dir=tmp_path).run(progress=False)
    assert str(raised.value).startswith("config.searchSpace.x1._value[1]: inf cannot go into a config"), raised.value
    config["searchSpace"]["x1"]["_value"] = [0, 1]
    config["trialConcurrency"] = float("nan")
    with pytest.raises(knob.KnobError) as raised:
        knob.Experiment(config, base_dir=tmp_path).run(progress=False)
    assert str(raised.value).startswith("config.trialConcurrency: nan cannot go into a config"), raised.value


def test_loading_an_unknown_experiment_says_so(home: str) -> None:
    with pytest.raises(knob.KnobError) as raised:
        knob.load("nosuchexperiment", home=home)
    assert "nosuchexperiment" in str(raised.value)


def test_an_id_starting_with_a_dash_is_knobs_to_refuse_not_an_option(tmp_path: Path, home: str) -> None:
    """`knob.load("-h")` ran `knob experiment export -h`, knob's help, and blamed the install
    ("is not knob ... pip install the knob wheel again"); `Experiment(id="-h")` got clap's "a
    value is required for '--id'" (H1 F3). The id is passed as a value: knob answers for it."""
    for experiment_id in ("-h", "-V"):
        with pytest.raises(knob.KnobError) as raised:
            knob.load(experiment_id, home=home)
        assert f"error: no experiment {experiment_id} in the registry" in str(raised.value), raised.value
    with pytest.raises(knob.KnobError) as raised:
        knob.Experiment(branin_config(tmp_path / "code", trials=1), id="-h", home=home, base_dir=tmp_path).run()
    assert 'error: experiment id "-h" is not valid' in str(raised.value), raised.value


def test_keyboard_interrupt_stops_the_experiment_as_ctrl_c(tmp_path: Path, home: str) -> None:
    code = tmp_path / "code"
    config = branin_config(code, trials=4)
    started = tmp_path / "started"
    (code / "slow.py").write_text(
        "import pathlib, sys, time\n"
        f"pathlib.Path({str(started)!r}).touch()\n"
        "time.sleep(120)\n"
    )
    config["trialCommand"] = f"{sys.executable} slow.py"
    config["trialConcurrency"] = 1

    def interrupt_once_a_trial_runs() -> None:
        deadline = time.monotonic() + 120
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    # Python leaves SIGINT ignored when it started ignored (pytest run from a background job
    # of a non-interactive shell, or under nohup): Ctrl-C must then raise as in a terminal.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupter = threading.Thread(target=interrupt_once_a_trial_runs, daemon=True)
    interrupter.start()
    began = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            knob.Experiment(config, id="ctrlc", home=home, base_dir=tmp_path).run(progress=False)
        interrupter.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert started.exists(), "no trial started within 120 s"
    # Stopped, not waited out: the trial sleeps 120 s.
    assert time.monotonic() - began < 100
    result = knob.load("ctrlc", home=home)
    assert result.status == "STOPPED", result
    assert [t.status for t in result.trials] == ["USER_CANCELED"]


class _Scalar:
    """What numpy's scalars and arrays have that json does not take: `tolist`."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def tolist(self) -> Any:
        return self.value


def test_paths_and_numpy_values_in_a_dict_config_are_written_and_others_named(tmp_path: Path, home: str) -> None:
    config = branin_config(tmp_path / "code", trials=1)
    # A pathlib path and numpy-like bounds, as a notebook builds them.
    config["trialCodeDirectory"] = tmp_path / "code"
    config["searchSpace"]["x1"]["_value"] = _Scalar([-5.0, 10.0])
    config["maxTrialNumber"] = _Scalar(1)
    trials = knob.Experiment(config, id="plain1", home=home, base_dir=tmp_path).run(progress=False)
    assert [t.status for t in trials] == ["SUCCEEDED"]
    assert -5.0 <= trials[0].parameters["x1"] <= 10.0

    config["searchSpace"]["x2"]["_value"] = {0, 15}
    with pytest.raises(knob.KnobError) as raised:
        knob.Experiment(config, id="plain2", home=home, base_dir=tmp_path).run(progress=False)
    assert str(raised.value).startswith("config.searchSpace.x2._value: set "), raised.value
    # Neither run left its temporary config file behind.
    assert not list(tmp_path.glob(".knob-config-*"))


def test_every_config_error_knob_reports_is_in_the_knob_error(tmp_path: Path, home: str) -> None:
    """knob reports a config's problems together, the first on its `error:` line, the others
    on lines of their own: all of them are the KnobError's, named in the dict (H1 F3)."""
    config = branin_config(tmp_path / "code", trials=2)
    config["searchSpace"]["x1"]["_type"] = "unif"
    config["trialConcurrency"] = "two"
    with pytest.raises(knob.KnobError) as raised:
        knob.Experiment(config, home=home, base_dir=tmp_path).run(progress=False)
    message = str(raised.value)
    assert "error: config.searchSpace: " in message and '"unif"' in message, message
    assert "\nconfig.trialConcurrency: " in message and '"two"' in message, message
    assert ".knob-config-" not in message, message
    # A config file's: its own places.
    path = tmp_path / "code" / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(knob.KnobError) as raised:
        knob.Experiment(path, home=home).run(progress=False)
    assert str(raised.value).count("config.json:") == 2, raised.value


def test_a_bad_knob_bin_base_dir_or_config_is_a_knob_error_saying_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not a raw OSError or RecursionError that a notebook catching KnobError misses (H1 F5)."""
    missing = tmp_path / "nowhere" / "knob"
    monkeypatch.setenv("KNOB_BIN", str(missing))
    for attempt in (lambda: knob.load("x"), lambda: knob.Experiment({"trialCommand": "true"}, base_dir=tmp_path).run()):
        with pytest.raises(knob.KnobError) as raised:
            attempt()
        assert str(raised.value).startswith(f"KNOB_BIN={missing} does not exist; set KNOB_BIN to a knob binary"), raised.value
    not_executable = tmp_path / "knob.txt"
    not_executable.write_text("")
    monkeypatch.setenv("KNOB_BIN", str(not_executable))
    with pytest.raises(knob.KnobError, match="is not an executable file"):
        knob.load("x")
    # Executable, but not a program the system can start.
    not_a_program = tmp_path / "knob"
    not_a_program.write_bytes(b"\x7fELF-not-really")
    not_a_program.chmod(0o755)
    monkeypatch.setenv("KNOB_BIN", str(not_a_program))
    for attempt in (lambda: knob.load("x"), lambda: knob.Experiment({"trialCommand": "true"}, base_dir=tmp_path).run()):
        with pytest.raises(knob.KnobError) as raised:
            attempt()
        assert str(raised.value).startswith(f"cannot run {not_a_program}: "), raised.value
    monkeypatch.delenv("KNOB_BIN")

    # A folder is named as one, not as a file that does not exist (H1 F6).
    with pytest.raises(knob.KnobError) as raised:
        knob.Experiment(tmp_path)
    assert str(raised.value).startswith(f"config file {tmp_path} is a folder, not a config file; "), raised.value
    with pytest.raises(knob.KnobError) as raised:
        knob.Experiment(tmp_path / "nowhere.yml")
    assert str(raised.value) == f"config file {tmp_path / 'nowhere.yml'} does not exist", raised.value

    with pytest.raises(knob.KnobError) as raised:
        knob.Experiment({"trialCommand": "true"}, base_dir=tmp_path / "nowhere")
    assert str(raised.value).startswith(f"base_dir {tmp_path / 'nowhere'} is not a folder"), raised.value

    config: Dict[str, Any] = {"trialCommand": "true", "tuner": {"name": "Random", "classArgs": {}}}
    config["tuner"]["classArgs"]["again"] = config["tuner"]
    with pytest.raises(knob.KnobError) as raised:
        knob.Experiment(config, base_dir=tmp_path).run()
    assert str(raised.value).startswith(
        "config.tuner.classArgs.again: is config.tuner itself, which it is inside; a config cannot contain itself"
    ), raised.value
    # Held twice without holding itself: a DAG is two copies.
    shared = {"_type": "uniform", "_value": [0, 1]}
    config = {"searchSpace": {"a": shared, "b": shared}, "trialCommand": "true"}
    with pytest.raises(knob.KnobError) as raised:
        knob.Experiment(config, base_dir=tmp_path, home=str(tmp_path / "home")).run(progress=False)
    assert "contain itself" not in str(raised.value)


def test_a_knob_bin_that_is_not_knob_is_a_knob_error_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A program that exits 0 without knob's export (/bin/true, /bin/echo, a wrapper of another
    knob version) raised json's JSONDecodeError or a KeyError, which a notebook catching
    KnobError misses (H1 F6)."""
    echo = tmp_path / "echo-knob"
    echo.write_text('#!/bin/sh\necho "$@"\n')
    other_version = tmp_path / "other-knob"
    other_version.write_text('#!/bin/sh\necho \'{"experiment": {}}\'\n')
    silent = tmp_path / "silent-knob"
    silent.write_text("#!/bin/sh\n")
    for program in (echo, other_version, silent):
        program.chmod(0o755)
    cases = [
        (silent, "printed nothing"),
        (echo, "printed no JSON (it began 'experiment export --format json -- x')"),
        (other_version, "printed JSON that is not knob's export (KeyError: 'id')"),
    ]
    for program, said in cases:
        monkeypatch.setenv("KNOB_BIN", str(program))
        with pytest.raises(knob.KnobError) as raised:
            knob.load("x")
        assert str(raised.value) == (
            f"{program} experiment export --format json -- x {said}; KNOB_BIN={program} is not knob (or another "
            "version's); set KNOB_BIN to a knob binary, or unset it to use the knob installed with this package"
        ), raised.value
    monkeypatch.setenv("KNOB_BIN", str(silent))
    with pytest.raises(knob.KnobError) as raised:
        knob.Experiment({"trialCommand": "true"}, id="notknob", base_dir=tmp_path).run(progress=False)
    assert str(raised.value).startswith(f"{silent} experiment export --format json -- notknob printed nothing; "), raised.value


def test_run_closes_knobs_output_pipe(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run() left its pipe from knob open: a ResourceWarning on every run under -X dev or
    pytest, and a notebook kept one open file per run until garbage collection (H1 F5)."""
    failing = tmp_path / "failing-knob"
    failing.write_text("#!/bin/sh\necho 'error: no experiment today'\nexit 1\n")
    failing.chmod(0o755)
    monkeypatch.setenv("KNOB_BIN", str(failing))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(knob.KnobError, match="error: no experiment today"):
            knob.Experiment({"trialCommand": "true"}, base_dir=tmp_path).run(progress=False)
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


def test_a_v1_dict_configs_warning_names_the_dict_not_its_gone_file(tmp_path: Path, home: str) -> None:
    """knob's warning for an NNI v1 config named the launcher's temporary file, and told to run
    `knob config check --v2` on it, though it is gone once knob has read it; its errors were
    named in the dict, its warnings not (H1 F4)."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "trial.py").write_text("import knob_trial\nknob_trial.report_final(0.5)\n")
    (code / "space.json").write_text(json.dumps({"x": {"_type": "uniform", "_value": [0, 1]}}))
    config = {
        "authorName": "me",
        "experimentName": "v1",
        "trialConcurrency": 1,
        "maxTrialNum": 1,
        "trainingServicePlatform": "local",
        "searchSpacePath": "space.json",
        "tuner": {"builtinTunerName": "Random"},
        "trial": {"command": f"{sys.executable} trial.py", "codeDir": "."},
        "logDir": str(tmp_path / "experiments"),
    }
    output = io.StringIO()
    trials = knob.Experiment(config, id="v1dict", home=home, base_dir=code).run(output=output)
    assert [(t.status, t.final) for t in trials] == [("SUCCEEDED", 0.5)]
    shown = output.getvalue()
    assert (
        "warning: config: an NNI v1 config, converted to v2 as NNI 2.x and 3.0 do; the experiment's "
        "`config`, as `knob.load()` reads it back, is the v2 config\n"
    ) in shown, shown
    assert ".knob-config-" not in shown, shown
    # What the warning says: the config read back is the v2 one.
    assert knob.load("v1dict", home=home).config["maxTrialNumber"] == 1


def _kill_knob_of(experiment_id: str) -> None:
    """SIGKILL for the `knob create --id EXPERIMENT_ID` this test started, found by its command
    line: a hung run() holds it and no one else could end it."""
    for entry in Path("/proc").iterdir():
        try:
            words = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"create" in words and f"--id={experiment_id}".encode() in words:
            os.kill(int(entry.name), signal.SIGKILL)


def _crash(tmp_path: Path, home: str, experiment_id: str) -> knob.KnobError:
    """Runs experiment `experiment_id`, one trial that waits, and SIGKILLs its knob once the trial
    runs (as the OOM killer or a batch scheduler would): run()'s KnobError. The trial runs on
    without its manager: `_stop_crashed` ends it."""
    code = tmp_path / "code"
    config = branin_config(code, trials=1)
    started = tmp_path / "started"
    (code / "slow.py").write_text(f"import pathlib, time\npathlib.Path({str(started)!r}).touch()\ntime.sleep(120)\n")
    config["trialCommand"] = f"{sys.executable} slow.py"

    def kill_once_the_trial_runs() -> None:
        deadline = time.monotonic() + 120
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        _kill_knob_of(experiment_id)

    killer = threading.Thread(target=kill_once_the_trial_runs, daemon=True)
    killer.start()
    with pytest.raises(knob.KnobError) as raised:
        knob.Experiment(config, id=experiment_id, home=home, base_dir=tmp_path).run(progress=False)
    killer.join()
    assert started.exists(), "no trial started within 120 s"
    return raised.value


def _stop_crashed(experiment_id: str, home: str) -> None:
    """`knob stop` of a crashed experiment: it ends the trials the crashed run left running."""
    subprocess.run(
        [knob.knob_command(), "stop", experiment_id], env={**os.environ, "KNOB_HOME": home}, capture_output=True
    )


def test_a_crashed_experiment_loads_as_crashed(tmp_path: Path, home: str) -> None:
    """knob.load() said RUNNING for ever of an experiment whose knob was killed (as `knob
    experiment export` did), where `knob experiment list` and the API say crashed: a script
    polling its status until it was not RUNNING waited for ever (H1 F1). run()'s KnobError was
    knob's last progress lines, saying nothing of the kill (H1 F2)."""
    error = _crash(tmp_path, home, "crashed")
    try:
        # What happened and what to do, not knob's last progress lines alone (H1 F2).
        assert str(error).startswith(
            "knob create (experiment crashed) was killed by SIGKILL (signal 9); the experiment is left "
            "crashed: `knob resume crashed` continues it (`knob stop crashed` ends the trials it left running)\n"
            "knob's last lines:\n"
        ), error
        result = knob.load("crashed", home=home)
        assert result.status == "CRASHED", result
        assert result.message is not None and "`knob resume crashed` continues it" in result.message, result
    finally:
        _stop_crashed("crashed", home)
    # Stopped by `knob stop`, what it left running is ended, and it stays crashed until resumed.
    assert knob.load("crashed", home=home).status == "CRASHED"


class _RefusingOutput(io.StringIO):
    """An output that fails on every write, as a full disk or a closed file does."""

    def write(self, text: str) -> int:
        raise OSError(28, "No space left on device")


@pytest.mark.parametrize("kind", ["ascii", "refusing"])
def test_run_reads_knob_to_its_end_whatever_its_output_does(tmp_path: Path, home: str, kind: str) -> None:
    """An output that cannot take knob's lines (an ASCII one and knob's `·`, or one whose writes
    fail) cost run() its only reader of knob's pipe: once the pipe was full (64 KiB: a warning
    a trial here) knob blocked for good and run() never returned (H1 F7). Now an ASCII output
    gets `?` for what it cannot encode, and a failing one a warning and nothing more."""
    code = tmp_path / "code"
    code.mkdir()
    config = {
        "searchSpace": {"x": {"_type": "uniform", "_value": [0, 1]}},
        # A final without "default": one `warning:` line a trial, some 250 bytes.
        "trialCommand": "echo 'KNOB_FINAL {\"acc\": 1}'",
        "trialCodeDirectory": str(code),
        "trialConcurrency": 4,
        "maxTrialNumber": 600,
        "experimentWorkingDirectory": str(tmp_path / "experiments"),
        "tuner": {"name": "Random"},
        "trainingService": {"platform": "local"},
    }
    experiment_id = f"drain{kind}"
    # Turns a hang into a failure: a run takes seconds here, not minutes.
    finished = threading.Event()
    hung: List[bool] = []

    def watch() -> None:
        if not finished.wait(300):
            hung.append(True)
            _kill_knob_of(experiment_id)

    watchdog = threading.Thread(target=watch, daemon=True)
    watchdog.start()
    shown = tmp_path / "shown.txt"
    try:
        with shown.open("w", encoding="ascii") as ascii_out:
            output: IO[str] = ascii_out if kind == "ascii" else _RefusingOutput()
            with pytest.warns(RuntimeWarning) if kind == "refusing" else _no_warning() as warned:
                trials = knob.Experiment(config, id=experiment_id, home=home, base_dir=tmp_path).run(output=output)
    finally:
        finished.set()
    assert not hung, "run() did not return: knob blocked on its full pipe"
    assert len(trials) == 600
    if kind == "ascii":
        text = shown.read_text(encoding="ascii")
        assert "progress: 600/600 done 600 ? running 0 ? failed 0" in text, text[-2000:]
        assert f"experiment {experiment_id} DONE: 600 trials" in text, text[-2000:]
    else:
        assert warned is not None
        (warning,) = [str(w.message) for w in warned if "knob's output" in str(w.message)]
        assert "OSError: [Errno 28] No space left on device" in warning, warning
        assert "the rest of it is not shown, the experiment goes on" in warning, warning


class _no_warning:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *args: Any) -> None:
        return None


def test_a_second_interrupt_is_passed_on_and_kills_the_trials_at_once(tmp_path: Path, home: str) -> None:
    """knob's first stop line says "a second Ctrl-C kills them at once": under the
    launcher a second interrupt was ignored, and a trial slow to stop had its full grace
    period (H1 F4)."""
    code = tmp_path / "code"
    config = branin_config(code, trials=1)
    started = tmp_path / "started"
    (code / "stubborn.py").write_text(
        "import pathlib, signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        f"pathlib.Path({str(started)!r}).touch()\n"
        "time.sleep(300)\n"
    )
    config["trialCommand"] = f"{sys.executable} stubborn.py"
    shown = tmp_path / "shown.txt"

    def wait_for(condition: Any) -> None:
        deadline = time.monotonic() + 120
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.05)

    def interrupt_twice() -> None:
        wait_for(started.exists)
        os.kill(os.getpid(), signal.SIGINT)
        wait_for(lambda: "stopping (" in shown.read_text())
        os.kill(os.getpid(), signal.SIGINT)

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupter = threading.Thread(target=interrupt_twice, daemon=True)
    try:
        with shown.open("w") as out:
            interrupter.start()
            with pytest.raises(KeyboardInterrupt):
                knob.Experiment(config, id="twice", home=home, base_dir=tmp_path).run(output=out)
        interrupter.join()
    finally:
        signal.signal(signal.SIGINT, previous)
    text = shown.read_text()
    assert "stopping at once: killing the running trials without their grace period" in text, text
    # Then knob either exits once the trial is killed ("exiting: ...") or, its manager seeing the
    # killed trial end first, ends the run as after one signal (STOPPED): either is knob's.


@pytest.mark.parametrize("where", ["_execute_child", "start"])
def test_an_interrupt_while_knob_starts_stops_it(tmp_path: Path, home: str, where: str) -> None:
    """A KeyboardInterrupt inside Popen (knob forked, its pid not yet returned) or the reader
    thread's start left knob running on its own, in a session no Ctrl-C reaches (H1 F1). The
    interrupt is sent the moment Popen's child is started or the reader thread is started."""
    code = tmp_path / "code"
    config = branin_config(code, trials=2)
    (code / "slow.py").write_text("import time\ntime.sleep(300)\n")
    config["trialCommand"] = f"{sys.executable} slow.py"
    knobs: List["subprocess.Popen[str]"] = []

    def interrupt_there(frame: FrameType, event: str, arg: Any) -> None:
        name = frame.f_code.co_name
        if event == "return" and name == "_execute_child" == where:
            knobs.append(frame.f_locals["self"])
            os.kill(os.getpid(), signal.SIGINT)
        elif event == "call" and name == "start" == where and frame.f_code.co_filename == threading.__file__:
            os.kill(os.getpid(), signal.SIGINT)
        elif event == "return" and name == "__init__" and isinstance(frame.f_locals.get("self"), subprocess.Popen):
            if not knobs:
                knobs.append(frame.f_locals["self"])

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            sys.setprofile(interrupt_there)
            try:
                knob.Experiment(config, id="early", home=home, base_dir=tmp_path).run(progress=False)
            finally:
                sys.setprofile(None)
    finally:
        signal.signal(signal.SIGINT, previous)
        (process,) = knobs
        stopped = process.poll() is not None
        if not stopped:
            process.send_signal(signal.SIGINT)
            process.send_signal(signal.SIGINT)
            process.wait()
    assert stopped, "knob still runs after the KeyboardInterrupt"
    try:
        assert knob.load("early", home=home).status != "RUNNING"
    except knob.KnobError:
        pass  # stopped before it registered the experiment


def test_a_dict_configs_file_is_gone_once_knob_has_read_it(tmp_path: Path, home: str) -> None:
    """The file holds the whole config, passwords too: it went only when run() returned, so a
    Python killed meanwhile left it in base_dir, the trial code folder (H1's note). The trial
    waits for it to go."""
    code = tmp_path / "code"
    config = branin_config(code, trials=1)
    (code / "look.py").write_text(
        "import glob, time, knob_trial\n"
        "deadline = time.monotonic() + 60\n"
        "while glob.glob('.knob-config-*') and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "knob_trial.report_final(len(glob.glob('.knob-config-*')))\n"
    )
    config["trialCommand"] = f"{sys.executable} look.py"
    (trial,) = knob.Experiment(config, id="gone", home=home, base_dir=code).run(progress=False)
    assert (trial.status, trial.final) == ("SUCCEEDED", 0.0), trial
