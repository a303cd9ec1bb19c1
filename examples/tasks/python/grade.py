"""Grades one workspace of the Python task set against its hidden tests.

    python3 grade.py WORKSPACE HIDDEN

Runs every test in HIDDEN/test_*.py with WORKSPACE first on sys.path and
prints one line of JSON: {"score": passed/total, "valid": true, "detail": {...}}.
Uses pytest when it is installed, plain assert-style test functions otherwise.
A workspace whose code fails to import scores 0 (a valid zero); a grader that
cannot find any test exits 2 (a crash: Gyre retries, never a zero).
"""

import importlib.util
import json
import os
import sys
import traceback


def with_pytest(workspace, hidden):
    import pytest

    class Count:
        def __init__(self):
            self.passed, self.failed = 0, 0

        def pytest_runtest_logreport(self, report):
            if report.when == "call":
                if report.passed:
                    self.passed += 1
                else:
                    self.failed += 1
            elif report.failed:
                self.failed += 1

        def pytest_collectreport(self, report):
            if report.failed:
                self.failed += 1

    count = Count()
    pytest.main(
        ["-q", "-p", "no:cacheprovider", "--rootdir", hidden, "-o", "console_output_style=classic", hidden],
        plugins=[count],
    )
    return count.passed, count.passed + count.failed, "pytest"


def with_asserts(workspace, hidden):
    passed, total = 0, 0
    for name in sorted(os.listdir(hidden)):
        if not (name.startswith("test_") and name.endswith(".py")):
            continue
        spec = importlib.util.spec_from_file_location(name[:-3], os.path.join(hidden, name))
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception:
            traceback.print_exc(file=sys.stderr)
            total += 1
            continue
        for attr in sorted(dir(module)):
            if attr.startswith("test_") and callable(getattr(module, attr)):
                total += 1
                try:
                    getattr(module, attr)()
                    passed += 1
                except Exception:
                    traceback.print_exc(file=sys.stderr)
    return passed, total, "asserts"


def main():
    if len(sys.argv) != 3:
        print("usage: grade.py WORKSPACE HIDDEN", file=sys.stderr)
        sys.exit(2)
    workspace, hidden = (os.path.abspath(a) for a in sys.argv[1:])
    sys.path.insert(0, workspace)
    sys.dont_write_bytecode = True
    try:
        import pytest  # noqa: F401

        runner = with_pytest
    except ImportError:
        runner = with_asserts
    # Keep the runner's own chatter off stdout: the verdict is the last line.
    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    passed, total, how = runner(workspace, hidden)
    sys.stdout = real_stdout
    if total == 0:
        print(f"no tests found in {hidden}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps({"score": passed / total, "valid": True,
                      "detail": {"passed": passed, "total": total, "runner": how}}))


if __name__ == "__main__":
    main()
