"""Property: whatever a mutation does to a valid matrix or hang-model file, `soakmatrix plan` ends in
a valid plan (exit 0) or a located usage error (exit 2, `file:line: ...`), never a traceback, an
internal error (exit 3) or a hang. Hypothesis mutates the corpus's valid files line by line, value by
value and byte by byte; each example runs in-process under an alarm.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import signal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from soakmatrix.matrix.cli import main
from tests.test_hostile_inputs import CORPUS

GENERATOR = CORPUS / "generate.py"
LOCATED = re.compile(r"^[^\n]+:\d+: ", re.M)
SECONDS = 20


def _valid_texts() -> tuple[str, str]:
    namespace: dict = {"__name__": "corpus", "__file__": str(GENERATOR)}
    exec(compile(GENERATOR.read_text(), str(GENERATOR), "exec"), namespace)   # the corpus's own valid files
    return namespace["VALID_MATRIX"], namespace["VALID_HANGS"]


VALID_MATRIX, VALID_HANGS = _valid_texts()
SCALARS = st.one_of(st.integers(-10**6, 10**6), st.floats(allow_nan=True, allow_infinity=True), st.booleans(),
                    st.none(), st.text(max_size=20), st.sampled_from(["[]", "{}", "*x", "&x", "!!str", "<<", ".nan",
                                                                      "-", "~", "'", '"', "[", "{", "|", ">"]))


@st.composite
def mutated(draw, text: str) -> str:
    lines = text.splitlines()
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        how = draw(st.sampled_from(["delete", "duplicate", "value", "indent", "bytes", "swap"]))
        if how == "delete":
            del lines[i]
        elif how == "duplicate":
            lines.insert(i, lines[i])
        elif how == "value" and ":" in lines[i]:
            key = lines[i].split(":", 1)[0]
            value = draw(SCALARS)
            lines[i] = f"{key}: {value if isinstance(value, str) else repr(value)}"
        elif how == "indent":
            lines[i] = " " * draw(st.integers(0, 6)) + lines[i].lstrip()
        elif how == "bytes":
            pos = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:pos] + draw(st.text(min_size=1, max_size=3)) + lines[i][pos:]
        elif how == "swap" and len(lines) > 1:
            j = draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
        if not lines:
            lines = [""]
    return "\n".join(lines) + "\n"


class _Timeout(Exception):
    pass


def plan_exit(matrix_file) -> tuple[object, str]:
    def alarm(*_):
        raise _Timeout()

    previous = signal.signal(signal.SIGALRM, alarm)
    err = io.StringIO()
    signal.alarm(SECONDS)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = main(["plan", str(matrix_file), "--no-validate"])
    except _Timeout:
        code = "timeout"
    except SystemExit as exc:
        code = exc.code
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return code, err.getvalue()


def check(code: object, err: str) -> None:
    assert code in (0, 2), f"exit {code}:\n{err[-2000:]}"
    assert "Traceback" not in err and "internal error" not in err, err[-2000:]
    if code == 2:
        assert LOCATED.search(err), f"no file:line in:\n{err[-2000:]}"


PROFILE = settings(max_examples=int(os.environ.get("SOAKMATRIX_HYPOTHESIS_EXAMPLES", "60")), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@PROFILE
@given(text=mutated(VALID_MATRIX))
def test_a_mutated_matrix_is_a_plan_or_a_located_error(tmp_path, text):
    path = tmp_path / "matrix.yaml"
    path.write_text(text.replace("hangs/valid.yaml", str(tmp_path / "hangs.yaml")), encoding="utf-8",
                    errors="surrogatepass")
    (tmp_path / "hangs.yaml").write_text(VALID_HANGS)
    check(*plan_exit(path))


@PROFILE
@given(text=mutated(VALID_HANGS))
def test_a_mutated_hang_model_is_a_plan_or_a_located_error(tmp_path, text):
    (tmp_path / "hangs.yaml").write_text(text, encoding="utf-8", errors="surrogatepass")
    path = tmp_path / "matrix.yaml"
    path.write_text(VALID_MATRIX.replace("hangs/valid.yaml", str(tmp_path / "hangs.yaml")))
    check(*plan_exit(path))


def test_the_unmutated_files_plan():
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "hangs.yaml").write_text(VALID_HANGS)
        path = Path(folder) / "matrix.yaml"
        path.write_text(VALID_MATRIX.replace("hangs/valid.yaml", str(Path(folder) / "hangs.yaml")))
        assert plan_exit(path)[0] == 0


pytestmark = pytest.mark.filterwarnings("ignore")
