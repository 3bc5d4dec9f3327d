"""A pytest plugin for nbval: cells that declare a tolerance have their figures compared within it.

Loaded by the repository's ``conftest.py`` (``pytest_plugins``) or with ``pytest -p course_lib.nbval_tolerance``.
A cell whose source has a ``# tolerance: ±X (why)`` comment is compared by ``course_lib.tolerance.compare``:
each decimal figure within ±X, the text, whole numbers and the number of decimals exactly. A figure that
moved too far fails the cell, and the failure names it, its stored and new value and the declared tolerance.
Cells without the comment are compared exactly, as nbval does.
"""
from __future__ import annotations


def pytest_configure(config) -> None:
    install()


def install() -> None:
    """Make nbval compare the outputs of cells that declare a tolerance with `course_lib.tolerance.compare`."""
    try:
        from nbval.plugin import IPyNbCell
    except ImportError:  # nbval is not installed: nothing to hook
        return
    import copy

    from course_lib.tolerance import compare, declared_tolerance

    if getattr(IPyNbCell.compare_outputs, "within_declared_tolerance", False):
        return
    exact = IPyNbCell.compare_outputs

    def comparable(outputs: list, skip: tuple) -> dict:
        """Each output string as nbval pairs them (by stream name or MIME type, in order): key -> [(holder, field)]."""
        found: dict = {}
        for output in outputs:
            if output.get("output_type") == "stream":
                found.setdefault(output["name"], []).append((output, "text"))
                continue
            for key, value in output.items():
                if key == "data":
                    for mime in value:
                        if mime not in skip:
                            found.setdefault(mime, []).append((value, mime))
                elif key not in skip:
                    found.setdefault(key, []).append((output, key))
        return found

    def compare_outputs(self, test, ref, skip_compare=None):
        tolerance = declared_tolerance(self.cell.source)
        if tolerance is None:
            return exact(self, test, ref, skip_compare)
        skip = skip_compare or self.parent.skip_compare
        test = copy.deepcopy(test)
        explanations = []
        fresh = comparable(test, skip)
        for key, stored_values in comparable(ref, skip).items():
            for (ref_holder, ref_field), (test_holder, test_field) in zip(stored_values, fresh.get(key, [])):
                before, after = ref_holder[ref_field], test_holder[test_field]
                if not (isinstance(before, str) and isinstance(after, str)):
                    continue
                problems = compare(self.sanitize(before), self.sanitize(after), tolerance)
                if problems:
                    explanations += [f"{key}: {problem}" for problem in problems]
                else:
                    test_holder[test_field] = before  # equal within the declared tolerance
        if exact(self, test, ref, skip_compare):
            return True
        self.comparison_traceback += [f"The cell declares a tolerance of {tolerance} (course_lib.tolerance):"]
        self.comparison_traceback += [f"  {line}" for line in explanations]
        return False

    compare_outputs.within_declared_tolerance = True  # type: ignore[attr-defined]
    IPyNbCell.compare_outputs = compare_outputs

