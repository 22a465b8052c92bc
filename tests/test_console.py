"""Every command's edge (traces.console.run_cli, behind `engine`, `sim`, `python -m traces` and `tui`):
errors become one line and exit 2, a Ctrl-C that reaches it one line and exit 130."""
import pytest

from traces.console import run_cli


def _fail(error: BaseException):
    def body() -> int:
        raise error
    return body


@pytest.mark.parametrize("error, rc, line", [
    (ValueError("--flag: must be >= 1\n  got 0"), 2, "prog: error: --flag: must be >= 1 got 0"),
    (FileNotFoundError(2, "No such file or directory", "/x.yaml"), 2, "prog: error: /x.yaml: No such file or directory"),
    (OSError(28, "No space left on device"), 2, "prog: error: No space left on device"),
    (KeyboardInterrupt(), 130, "prog: interrupted; a trace keeps what was written before"),
])
def test_an_error_reaching_the_edge_is_one_line_and_its_exit_status(capsys, error, rc, line):
    assert run_cli("prog", _fail(error)) == rc
    assert capsys.readouterr().err.strip() == line


def test_an_error_outside_the_expected_kinds_still_raises():
    with pytest.raises(RuntimeError):
        run_cli("prog", _fail(RuntimeError("a bug: the traceback is the report")))
