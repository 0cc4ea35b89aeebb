"""Every option of every subcommand, fed the hostile values of its kind: built from the real parsers.

Each argparse action is classified by its type function's `kind` (matrix/arguments.py, matrix/paths.py):
path-in, path-out, dir-in, dir-out, log, count, port, pid, seed, number, probability, duration, host,
url, text; a switch or a choice list by its action. An option that fits none fails the test, so one
added later is covered or flagged. Each hostile value goes through the CLI's own `main` (the dispatcher,
the subcommand's parser) with the subcommand's `main` replaced by a tripwire: a value that is
accepted fails the test instead of starting a run. It must end as exit 2 naming the option, no
traceback, within a second. A few cases run the real command in a process of its own, for time and
memory. `sim-engine` parses vLLM's argv itself and has its own table at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import stat
import subprocess
import sys
import time

import pytest
from soakmatrix.matrix import cli
from soakmatrix.matrix.arguments import pid_max

from tests.cli_in_process import run_cli
from tests.conftest import EXAMPLES, REPO

ARGPARSE_COMMANDS = [name for name in cli.COMMANDS if name != "sim-engine"]
NUMBER_KINDS = {"count", "port", "pid", "seed", "number", "probability", "duration"}
KINDS = NUMBER_KINDS | {"path-in", "path-out", "dir-in", "dir-out", "log", "host", "url", "text", "switch", "enum"}
SECONDS_PER_CASE = 1.0


class Accepted(BaseException):
    """The tripwire: the subcommand's main was reached, so the parser accepted the value."""


def parser_of(name: str) -> argparse.ArgumentParser:
    module = importlib.import_module(cli.COMMANDS[name][0])
    parser = argparse.ArgumentParser(prog=f"soakmatrix {name}", description=module.HELP)
    module.configure(parser)
    return parser


def kind_of(action: argparse.Action) -> str | None:
    if action.nargs == 0:
        return "switch"
    if action.choices is not None:
        return "enum"
    return getattr(action.type, "kind", None)


def options() -> list[tuple[str, argparse.Action]]:
    return [(name, a) for name in ARGPARSE_COMMANDS for a in parser_of(name)._actions
            if not isinstance(a, argparse._HelpAction)]


def label(action: argparse.Action) -> str:
    return action.option_strings[-1] if action.option_strings else action.dest


@pytest.fixture(scope="module")
def places(tmp_path_factory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("hostile-places")
    (tmp / "file").write_text("x\n")
    (tmp / "dir").mkdir()
    os.mkfifo(tmp / "fifo")
    with open(tmp / "huge", "wb") as f:
        f.truncate(3 << 30)   # sparse: above every cap, no disk used
    (tmp / "matrix.yaml").write_text((EXAMPLES / "demo.yaml").read_text().replace(
        "hangs/demo.yaml", str(EXAMPLES / "hangs" / "demo.yaml")))
    from soakmatrix.reports.history import HistoryStore
    with HistoryStore(tmp / "store.sqlite") as store:
        store.finish_run(store.start_run(matrix="demo", profile="demo"), "finished")
    (tmp / "junit.xml").write_text('<testsuites><testsuite name="s"><testcase name="n"/></testsuite></testsuites>')
    return {"file": str(tmp / "file"), "dir": str(tmp / "dir"), "fifo": str(tmp / "fifo"), "huge": str(tmp / "huge"),
            "under": str(tmp / "file" / "x"), "missing": str(tmp / "missing"), "char": "/dev/null",
            "proc": "/proc/self/status", "proc_out": "/proc/self/new", "tmp": str(tmp),
            "matrix": str(tmp / "matrix.yaml"), "store": str(tmp / "store.sqlite"), "junit": str(tmp / "junit.xml")}


def base_argv(command: str, p: dict[str, str]) -> list[str]:
    """A valid command line: the hostile value is then its only problem."""
    return {"plan": [p["matrix"]], "run": [p["matrix"]], "smoke": [p["matrix"]],
            "bisect": [p["matrix"], "--cell", "x"], "report": [p["store"]],
            "watch": ["http://127.0.0.1:8000"], "doctor": []}[command]


def hostile_values(kind: str, action: argparse.Action, p: dict[str, str]) -> list[str]:
    number = ["-1", "nan", "inf", "1e400", "abc", "", "9" * 5000, "1" * 70]
    values = {
        "path-in": [p["fifo"], p["char"], p["dir"], p["under"], p["proc"], p["missing"], ""],
        "log": [p["fifo"], p["char"], p["dir"], p["under"], p["proc"], p["tmp"] + "/no/such/dir/log"],
        "dir-in": [p["file"], p["fifo"], p["char"], p["missing"], p["under"], "/proc/self"],
        "path-out": [p["char"], p["fifo"], p["dir"], p["under"], p["proc_out"], p["proc"], p["dir"] + "/"],
        "dir-out": [p["file"], p["under"], p["char"], p["fifo"], p["proc_out"]],
        "count": number + ["0", str(10**13)],
        "port": number + ["0", "65536", "99999999"],
        "pid": number + ["0", str(pid_max() + 1), "4194305"],
        "seed": number,
        "number": number + ["0", "1e308"],
        "probability": number + ["1", "1.5"],
        "duration": ["-1s", "soon", "", "9" * 5000, "9" * 70 + "s", "1e400s", "99999999d"],
        "host": ["999.1.1.1", "not an address", "-", "a" * 300, "", "1.2.3"],
        "url": ["ftp://x", "http://", "http://h:99999", "http://h:0", "not-a-url", "h" * 5000],
        "text": ["x" * 5000],
        "enum": ["no-such-choice"],
        "switch": [],
    }[kind]
    if kind == "path-in" and getattr(action.type, "max_bytes", None):
        values.append(p["huge"])
    if kind == "duration" and not action.type.range_text.startswith("0 or"):
        values.append("0")
    return values


def run_main(argv: list[str], monkeypatch) -> tuple[object, str, float]:
    """`soakmatrix ARGV` in this process, up to the subcommand's main (the tripwire)."""
    module = importlib.import_module(cli.COMMANDS[argv[0]][0])

    def tripwire(args):
        raise Accepted(args)

    monkeypatch.setattr(module, "main", tripwire)
    err = io.StringIO()
    started = time.monotonic()
    umask = os.umask(0o077)   # the CLI sets its own; the test process keeps the one it had
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(argv)
    except SystemExit as exc:
        code = exc.code
    except Accepted:
        code = "accepted"
    finally:
        os.umask(umask)
    return code, err.getvalue(), time.monotonic() - started


def test_every_option_has_a_kind():
    unknown = [f"soakmatrix {name} {label(a)} (type {a.type!r})" for name, a in options() if kind_of(a) not in KINDS]
    assert not unknown, "options with no checked type (matrix/arguments.py, matrix/paths.py):\n" + "\n".join(unknown)


def test_every_number_option_states_its_range_in_help():
    missing = [f"soakmatrix {name} {label(a)}: help does not say {a.type.range_text!r}" for name, a in options()
               if kind_of(a) in NUMBER_KINDS - {"pid", "seed"} and a.type.range_text not in (a.help or "")]
    assert not missing, "\n".join(missing)


def test_the_base_command_lines_parse(places):
    for name in ARGPARSE_COMMANDS:
        parser_of(name).parse_args(base_argv(name, places))


def test_every_option_refuses_the_hostile_values_of_its_kind(places, monkeypatch):
    tried, wrong = 0, []
    for name, action in options():
        kind = kind_of(action)
        for value in hostile_values(kind, action, places):
            argv = base_argv(name, places)
            if action.option_strings:
                argv = argv + [action.option_strings[-1], value]
            else:   # a positional: the hostile value in its place
                position = [a.dest for a in parser_of(name)._actions if not a.option_strings].index(action.dest)
                argv = list(argv)
                argv[position] = value
            code, err, seconds = run_main([name, *argv], monkeypatch)
            tried += 1
            named = label(action) in err or (action.metavar or "") in err
            if code != 2 or "Traceback" in err or not named or seconds > SECONDS_PER_CASE:
                wrong.append(f"soakmatrix {name} {label(action)} {value[:40]!r} ({kind}): exit {code}, "
                             f"{seconds:.1f} s: {err.strip()[-300:]}")
    assert tried > 300
    assert not wrong, f"{len(wrong)} of {tried} hostile values:\n" + "\n".join(wrong)


def test_the_range_ends_themselves_are_accepted(places, monkeypatch):
    ends = {("watch", "--metrics-port"): ["1", "65535"], ("watch", "--pid"): ["1", str(pid_max())],
            ("watch", "--metrics-addr"): ["0.0.0.0", "::1", "localhost", "metrics.example.org"],
            ("bisect", "--seed"): ["0", str(2**63 - 1)], ("watch", "--canary"): ["0", "5s", "1d"],
            ("report", "--limit"): ["1", "100000"], ("watch", "--log"): ["-", places["missing"]],
            ("watch", "--store"): [places["missing"] + "/deeper/store.sqlite"]}
    for (name, option), values in ends.items():
        for value in values:
            code, err, _ = run_main([name, *base_argv(name, places), option, value], monkeypatch)
            assert code == "accepted", f"soakmatrix {name} {option} {value}: {err}"


def test_metrics_listen_on_loopback_unless_told():
    action = next(a for a in parser_of("watch")._actions if "--metrics-addr" in a.option_strings)
    assert action.default == "127.0.0.1" and "0.0.0.0" in action.help


# -- a few in a process of their own: time and memory of the real command ----------------------------

# Runs the command from a small interpreter and reports the command's own CPU time and peak memory:
# a child forked straight from the test's worker would count the worker's memory (hundreds of MB once
# torch is imported) as its own until its exec.
MEASURED = """
import json, os, resource, subprocess, sys
def limited():
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
try:
    code = subprocess.run(sys.argv[2:], stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, timeout=30,
                          preexec_fn=limited).returncode
except subprocess.TimeoutExpired:
    code = "timeout"
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
os.write(int(sys.argv[1]), json.dumps([code, usage.ru_utime + usage.ru_stime, usage.ru_maxrss]).encode())
"""


@pytest.mark.parametrize("argv", [
    ["plan", "{fifo}"],
    ["bisect", "{matrix}", "--cell", "x", "--virtual", "--builds", "{fifo}"],
    ["bisect", "{matrix}", "--cell", "x", "--virtual", "--hang-model", "{huge}"],
    ["watch", "http://127.0.0.1:1", "--log", "{fifo}"],
    ["watch", "http://127.0.0.1:1", "--duration", "9" * 5000],
    ["watch", "http://127.0.0.1:1", "--pid", "99999999"],
    ["report", "{store}", "--junit", "{char}"],
], ids=lambda argv: " ".join(a[:20] for a in argv[:1] + argv[-2:]))
def test_the_real_command_refuses_within_5_s_and_200_mb(places, argv, tmp_path):
    argv = [a.format(**places) for a in argv]
    read, write = os.pipe()
    with open(tmp_path / "err", "w+") as err:
        proc = subprocess.run([sys.executable, "-c", MEASURED, str(write), sys.executable, "-m", "soakmatrix.matrix.cli",
                               *argv], stderr=err, cwd=REPO, pass_fds=(write,), timeout=60)
        os.close(write)
        with os.fdopen(read) as answer:
            code, cpu_s, max_rss_kb = json.loads(answer.read())
        err.seek(0)
        text = err.read()
    assert proc.returncode == 0
    assert code == 2 and "Traceback" not in text, (code, text)
    # 5 s of its own work (a loaded CI machine may stretch the wall clock: the limit of 30 s is for a hang)
    assert cpu_s < 5, f"{cpu_s:.1f} s of CPU"
    assert max_rss_kb < 200 * 1024, f"{max_rss_kb // 1024} MB"


def test_a_device_output_is_never_replaced(tmp_path):
    """A write that renames over its target must not turn a device node into a file (as root it could)."""
    from soakmatrix.reports.files import write_atomic

    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(OSError, match="not a regular file"):
        write_atomic(tmp_path / "pipe", lambda fh: fh.write(b"x"))
    assert stat.S_ISFIFO(os.stat(tmp_path / "pipe").st_mode)


def test_a_write_that_fails_is_exit_3_naming_the_file_and_keeps_the_old_one(places, tmp_path, monkeypatch):
    import errno

    from soakmatrix.reports import files

    junit = tmp_path / "junit.xml"
    junit.write_text("previous")

    def full(fh):
        raise OSError(errno.ENOSPC, "No space left on device")

    real = files.write_atomic
    monkeypatch.setattr("soakmatrix.reports.junit.write_atomic", lambda path, write: real(path, full))
    err = io.StringIO()
    umask = os.umask(0o077)
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = cli.main(["report", places["store"], "--junit", str(junit)])
    finally:
        os.umask(umask)
    assert code == 3 and "--junit" in err.getvalue() and "No space left" in err.getvalue(), err.getvalue()
    assert junit.read_text() == "previous" and sorted(p.name for p in tmp_path.iterdir()) == ["junit.xml"]


@pytest.fixture
def full_tmpfs(tmp_path):
    """A 64 KiB tmpfs filled to the brim (root only: mounting needs it)."""
    mount = tmp_path / "full"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        with open(mount / "filler", "wb") as f:
            with contextlib.suppress(OSError):
                f.write(b"\0" * (1 << 20))
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_merge_onto_a_full_file_system_is_exit_3(places, full_tmpfs):
    proc = subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", "report", "--merge", places["junit"],
                           "-o", str(full_tmpfs / "merged.xml")], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    assert proc.returncode == 3 and "-o" in proc.stderr and "merged.xml" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (full_tmpfs / "merged.xml").exists()


def test_a_read_only_file_system_is_refused_up_front(places, tmp_path):
    mount = tmp_path / "ro"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a read-only tmpfs needs root")
    try:
        from soakmatrix.matrix.paths import output_dir, output_file
        for check in (output_file, output_dir):
            with pytest.raises(argparse.ArgumentTypeError, match="read-only file system"):
                check(str(mount / "x"))
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


# -- sim-engine: vLLM's argv, parsed by jobs/sim/args.py --------------------------------------------

@pytest.mark.parametrize("argv, fragment", [
    (["m", "--port", "65536"], "--port"),
    (["m", "--port", "-1"], "--port"),
    (["m", "--seed", "9" * 5000], "--seed"),
    (["m", "--hang-model", "{fifo}"], "FIFO"),
    (["m", "--hang-model", "{dir}"], "directory"),
    (["m", "--hang-model", "{char}"], "device"),
    (["m", "--hang-record", "{dir}"], "--hang-record"),
    (["m", "--hang-record", "{under}"], "--hang-record"),
    (["m", "--time-scale", "0"], "--time-scale"),
])
def test_sim_engine_refuses_its_hostile_values(places, argv, fragment, monkeypatch):
    from soakmatrix.jobs.sim import server
    from soakmatrix.jobs.sim.cli import run

    def tripwire(config):
        raise Accepted(config)

    monkeypatch.setattr(server, "serve", tripwire)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = run([a.format(**places) for a in argv])
    assert code == 2 and fragment in err.getvalue() and "Traceback" not in err.getvalue(), err.getvalue()
    assert len(err.getvalue()) < 2000


# -- values that are legal but would do nothing: refused, or at least warned about ---------------------

def run_in_process(argv: list[str]) -> tuple[object, str, str]:
    return run_cli(argv)


def test_report_refuses_an_empty_store(tmp_path):
    (tmp_path / "empty.sqlite").write_bytes(b"")
    code, _, err = run_in_process(["report", str(tmp_path / "empty.sqlite")])
    assert code == 2 and "argument store" in err and "an empty file" in err


def test_a_signature_the_hang_model_never_plants_is_refused_in_virtual_time(places):
    code, out, err = run_in_process(["bisect", places["matrix"], "--cell", "e9c7d9144023", "--virtual", "--quiet",
                                     "--signature", "no_such_hang"])
    assert code == 2 and out == "" and "--signature 'no_such_hang'" in err and "shm_broadcast_timeout" in err, err


def test_a_signature_no_detector_knows_is_a_warning_on_real_probes():
    from soakmatrix.api.flags import _check_signature

    warned: list[str] = []
    _check_signature("no_such_hang", virtual=False, hang_model=None, matrix=None, warn=warned.append)
    assert len(warned) == 1 and "warning: --signature 'no_such_hang'" in warned[0]
    _check_signature("shm_broadcast_timeout", virtual=False, hang_model=None, matrix=None, warn=warned.append)
    assert len(warned) == 1


def test_an_empty_store_where_a_new_one_starts_is_warned_about(places, tmp_path):
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    code, _, err = run_in_process(["run", places["matrix"], "--store", str(empty), "--out", str(tmp_path / "o"),
                                   "--ray-address", "127.0.0.1:1"])
    assert code == 3 and f"warning: --store {empty} is an empty file" in err, err


def test_watch_metrics_listen_on_loopback_and_a_taken_port_is_a_usage_error(tmp_path):
    import psutil

    from tests.conftest import free_port

    port = free_port()
    watch = subprocess.Popen([sys.executable, "-m", "soakmatrix.matrix.cli", "watch", "http://127.0.0.1:9",
                              "--duration", "30s", "--out", str(tmp_path / "w"), "--metrics-port", str(port)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert f"metrics on 127.0.0.1:{port}" in watch.stdout.readline()
        listening = {c.laddr.ip for c in psutil.Process(watch.pid).net_connections("inet")
                     if c.status == psutil.CONN_LISTEN and c.laddr.port == port}
        assert listening == {"127.0.0.1"}
        taken = subprocess.run([sys.executable, "-m", "soakmatrix.matrix.cli", "watch", "http://127.0.0.1:9",
                                "--duration", "5s", "--out", str(tmp_path / "w2"), "--metrics-port", str(port)],
                               capture_output=True, text=True, cwd=REPO, timeout=60)
        assert taken.returncode == 2 and f"--metrics-port {port}" in taken.stderr, taken.stderr
        assert "Traceback" not in taken.stderr
    finally:
        watch.terminate()
        watch.communicate(timeout=30)
