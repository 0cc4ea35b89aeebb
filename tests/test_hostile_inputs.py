"""Hostile input (issue 19): every file of the corpus in tests/data/hostile/ ends as exit 2 with a
located `file:line: key: message` error naming the problem, in a process whose memory and time are
bounded: no traceback, no hang, nothing silently accepted. Files are made by
tests/data/hostile/generate.py, each with the fragment its error must contain (expected.yaml).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import resource
import signal
import subprocess
import sys

import yaml

from tests.conftest import REPO

CORPUS = REPO / "tests" / "data" / "hostile"
EXPECTED: dict[str, str] = yaml.safe_load((CORPUS / "expected.yaml").read_text())
MEMORY_LIMIT = 3 << 30
SECONDS_PER_FILE = 20
LOCATED = re.compile(r"^(?P<file>[^\n]+?\.yaml):(?P<line>\d+): ", re.M)


class _Timeout(Exception):
    pass


def _worker(paths: list[str]) -> None:
    """Runs `soakmatrix plan` in-process on each file under a memory cap and a per-file alarm."""
    from soakmatrix.matrix.cli import main

    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    def alarm(*_):
        raise _Timeout()

    signal.signal(signal.SIGALRM, alarm)
    out = {}
    for path in paths:
        stdout, stderr = io.StringIO(), io.StringIO()
        signal.alarm(SECONDS_PER_FILE)
        try:
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                code = main(["plan", path, "--no-validate"])
        except _Timeout:
            code = "timeout"
        except MemoryError:
            code = "memory"
        except SystemExit as exc:
            code = exc.code
        finally:
            signal.alarm(0)
        out[path] = {"code": code, "stderr": stderr.getvalue()[-4000:]}
    print(json.dumps(out))


def run_corpus(names: list[str]) -> dict[str, dict]:
    paths = [str(CORPUS / n) for n in names]
    proc = subprocess.run([sys.executable, "-c", "import sys, json; from tests.test_hostile_inputs import _worker; "
                           "_worker(json.loads(sys.argv[1]))", json.dumps(paths)],
                          capture_output=True, text=True, cwd=REPO, timeout=SECONDS_PER_FILE * len(paths) + 60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {k.rsplit("/", 1)[1]: v for k, v in json.loads(proc.stdout.splitlines()[-1]).items()}


def test_the_corpus_is_large_and_each_file_is_listed():
    on_disk = {p.name for p in CORPUS.glob("*.yaml") if p.name != "expected.yaml"}
    assert on_disk == set(EXPECTED)
    hang_models = [p for p in (CORPUS / "hangs").glob("*.yaml") if p.name != "valid.yaml"]
    assert len(on_disk) + len(hang_models) >= 100


def test_every_hostile_file_is_a_located_usage_error():
    results = run_corpus(sorted(EXPECTED))
    wrong = []
    for name, fragment in sorted(EXPECTED.items()):
        got = results[name]
        err = got["stderr"]
        if got["code"] != 2 or "Traceback" in err or not LOCATED.search(err) or fragment not in err:
            wrong.append(f"{name}: exit {got['code']}, wanted 2 naming {fragment!r}:\n    "
                         + err.strip().replace("\n", "\n    ")[:600])
    assert not wrong, f"{len(wrong)} of {len(EXPECTED)} hostile files:\n" + "\n".join(wrong)
