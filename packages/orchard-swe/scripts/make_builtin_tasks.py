#!/usr/bin/env python3
"""Build the built-in SWE task set: git bundles of small real projects + ``tasks.jsonl``.

For each project (pinned PyPI sdist, sha256-checked) this:

1. downloads the sdist (``pip download --no-binary :all: --no-deps NAME==VERSION``) into a
   cache directory, or takes it from ``--sdist-dir``, and checks its sha256;
2. keeps only the package source, its tests, the licence, packaging metadata and a README
   (upstream's when small, else a short one), every file mode 0644;
3. makes a git repository with a fixed identity and fixed dates: commit 1 on ``main`` is the
   snapshot; each task gets one commit on top of the snapshot that injects its bug, tagged
   ``task/<instance_id>`` (that commit is the task's ``base_commit``);
4. derives ``patch`` (the gold fix: base -> snapshot, source files only) and ``test_patch``
   (the new tests, test files only) with ``git diff``;
5. runs the test command with Debian's ``/usr/bin/python3`` (see verify_builtin_tasks.py) on
   the base, on base + test_patch and on base + test_patch + patch, and derives
   FAIL_TO_PASS / PASS_TO_PASS from the ``-rA`` summaries, checking that the declared
   FAIL_TO_PASS tests are exactly the ones that flip and that nothing else fails;
6. writes ``repos/<project>.bundle`` (``git bundle create --all``), ``tasks.jsonl`` and the
   README listing the tasks.

Re-running it reproduces the same commit hashes (and, with the same git, the same bundles).
The bug definitions are the data at the top of this file. Standard library only::

    python3 packages/orchard-swe/scripts/make_builtin_tasks.py [--sdist-dir DIR] [--check]

``--check`` builds into a temporary directory and compares with the committed output.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import verify_builtin_tasks as vbt

OUT_DIR = vbt.BUILTIN_DIR
DEFAULT_CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "orchard-swe" / "sdists"
)
IDENTITY = ("Orchard built-in tasks", "builtin-tasks@orchard.invalid")
TEST_CMD = "python3 -m pytest -rA -p no:cacheprovider"


@dataclass(frozen=True)
class Edit:
    """Replace the one occurrence of ``old`` in ``path`` by ``new``; ``old=""`` appends."""

    path: str
    old: str
    new: str


@dataclass(frozen=True)
class Project:
    name: str  # also the bundle's name and the instance id's prefix
    version: str
    sdist: str
    sha256: str
    repo: str  # upstream owner/name on GitHub
    license: str
    license_file: str
    snapshot_date: str  # the upstream release day (ISO, UTC)
    keep: tuple[str, ...]  # globs of kept paths, relative to the sdist's top directory
    readme: str  # the README's file name
    summary: str  # one line, for a replacement README
    pythonpath: str = ""  # "src" for a src/ layout


@dataclass(frozen=True)
class Task:
    project: str
    number: int
    test_files: tuple[str, ...]
    bug: tuple[Edit, ...]
    tests: tuple[Edit, ...]
    fail_to_pass: tuple[str, ...]
    summary: str  # what the bug is, for the README
    problem_statement: str

    @property
    def instance_id(self) -> str:
        return f"{self.project}__{self.project}-{self.number}"


README_LIMIT = 8 * 1024  # upstream READMEs larger than this are replaced by a short one

PROJECTS: dict[str, Project] = {
    p.name: p
    for p in (
        Project(
            name="inflection",
            version="0.5.1",
            sdist="inflection-0.5.1.tar.gz",
            sha256="1a29730d366e996aaacffb2f1f1cb9593dc38e2ddd30c91250c6dde09ea9b417",
            repo="jpvanhal/inflection",
            license="MIT",
            license_file="LICENSE",
            snapshot_date="2020-08-22T08:15:01Z",
            keep=(
                "LICENSE",
                "README.rst",
                "setup.py",
                "setup.cfg",
                "inflection/*",
                "test_inflection.py",
            ),
            readme="README.rst",
            summary="A port of Ruby on Rails' inflector to Python.",
        ),
        Project(
            name="isodate",
            version="0.7.2",
            sdist="isodate-0.7.2.tar.gz",
            sha256="4cd1aa0f43ca76f4a6c6c0292a85f40b35ec2e43e315b59f06e6d32171a953e6",
            repo="gweis/isodate",
            license="BSD-3-Clause",
            license_file="LICENSE",
            snapshot_date="2024-10-08T23:04:05Z",
            keep=("LICENSE", "README.rst", "pyproject.toml", "src/isodate/*", "tests/*"),
            readme="README.rst",
            summary="An ISO 8601 date/time/duration parser and formatter.",
            pythonpath="src",
        ),
        Project(
            name="tabulate",
            version="0.9.0",
            sdist="tabulate-0.9.0.tar.gz",
            sha256="0095b12bf5966de529c0feb1fa08671671b3368eec77d7ef7ab114be2c068b3c",
            repo="astanin/python-tabulate",
            license="MIT",
            license_file="LICENSE",
            snapshot_date="2022-10-06T16:17:37Z",
            keep=("LICENSE", "README.md", "pyproject.toml", "tabulate/*", "test/*"),
            readme="README.md",
            summary="Pretty-print tabular data in Python, a library and a command-line utility.",
        ),
        Project(
            name="toolz",
            version="1.0.0",
            sdist="toolz-1.0.0.tar.gz",
            sha256="2c86e3d9a04798ac556793bced838816296a2f085017664e4995cb40a1047a02",
            repo="pytoolz/toolz",
            license="BSD-3-Clause",
            license_file="LICENSE.txt",
            snapshot_date="2024-10-04T16:16:59Z",
            keep=(
                "LICENSE.txt",
                "README.rst",
                "setup.py",
                "setup.cfg",
                "versioneer.py",
                "toolz/*",
                "tlz/*",
            ),
            readme="README.rst",
            summary="A set of utility functions for iterators, functions, and dictionaries.",
        ),
        Project(
            name="more-itertools",
            version="10.5.0",
            sdist="more-itertools-10.5.0.tar.gz",
            sha256="5482bfef7849c25dc3c6dd53a6173ae4795da2a41a80faea6700d9f5846c5da6",
            repo="more-itertools/more-itertools",
            license="MIT",
            license_file="LICENSE",
            snapshot_date="2024-09-05T12:00:00Z",
            keep=(
                "LICENSE",
                "README.rst",
                "pyproject.toml",
                "setup.py",
                "more_itertools/*",
                "tests/*",
            ),
            readme="README.rst",
            summary="More routines for operating on iterables, beyond itertools.",
        ),
    )
}


TASKS: tuple[Task, ...] = (
    # ------------------------------------------------------------------ inflection
    Task(
        project="inflection",
        number=1,
        test_files=("test_inflection.py",),
        summary="`parameterize()` builds its clean-up regexes from the separator without "
        "escaping it, so separators such as `.` or `+` break it.",
        bug=(
            Edit(
                "inflection/__init__.py",
                "        re_sep = re.escape(separator)\n",
                "        re_sep = separator\n",
            ),
        ),
        tests=(
            Edit(
                "test_inflection.py",
                "",
                """

@pytest.mark.parametrize("separator", [".", "+", "*", "|"])
def test_parameterize_with_regex_metacharacter_separator(separator):
    assert inflection.parameterize("Donald E. Knuth", separator) == separator.join(
        ["donald", "e", "knuth"]
    )


def test_parameterize_with_dot_separator_strips_leading_and_trailing():
    assert inflection.parameterize("...Hello, World!...", ".") == "hello.world"
""",
            ),
        ),
        fail_to_pass=(
            "test_inflection.py::test_parameterize_with_regex_metacharacter_separator[.]",
            "test_inflection.py::test_parameterize_with_regex_metacharacter_separator[+]",
            "test_inflection.py::test_parameterize_with_regex_metacharacter_separator[*]",
            "test_inflection.py::test_parameterize_with_regex_metacharacter_separator[|]",
            "test_inflection.py::test_parameterize_with_dot_separator_strips_leading_and_trailing",
        ),
        problem_statement="""\
parameterize() fails with separators like "." or "+"

`parameterize()` works with the default separator, with `_` and even with longer
separators such as `__sep__`, but with a separator that happens to be a punctuation
character such as `.`, `+`, `*` or `|` it either returns garbage or raises:

```python
>>> import inflection
>>> inflection.parameterize("Donald E. Knuth")
'donald-e-knuth'
>>> inflection.parameterize("Donald E. Knuth", ".")
''
>>> inflection.parameterize("Donald E. Knuth", "+")
Traceback (most recent call last):
  ...
re.error: nothing to repeat at position 0
```

Expected `'donald.e.knuth'` and `'donald+e+knuth'`: whatever characters the separator is
made of, it should be treated as plain text, with runs of separators collapsed and leading
or trailing separators removed, exactly as for `-`.
""",
    ),
    Task(
        project="inflection",
        number=2,
        test_files=("test_inflection.py",),
        summary='`humanize()` (and so `titleize()`) removes "_id" anywhere in the string '
        "instead of only a trailing one.",
        bug=(
            Edit(
                "inflection/__init__.py",
                '    word = re.sub(r"_id$", "", word)\n',
                '    word = re.sub(r"_id", "", word)\n',
            ),
        ),
        tests=(
            Edit(
                "test_inflection.py",
                "",
                """

def test_humanize_keeps_id_inside_words():
    assert inflection.humanize("user_identifier") == "User identifier"
    assert inflection.humanize("valid_identity_card") == "Valid identity card"
    assert inflection.humanize("paid_ids") == "Paid ids"


def test_humanize_still_strips_trailing_id():
    assert inflection.humanize("author_id") == "Author"
    assert inflection.humanize("identity_id") == "Identity"


def test_titleize_keeps_id_inside_words():
    assert inflection.titleize("valid_identity") == "Valid Identity"
""",
            ),
        ),
        fail_to_pass=(
            "test_inflection.py::test_humanize_keeps_id_inside_words",
            "test_inflection.py::test_titleize_keeps_id_inside_words",
        ),
        problem_statement="""\
humanize() mangles words that contain "_id"

`humanize()` is documented to "turn underscores into spaces and strip a trailing `_id`",
and that works for `author_id`. But any `_id` in the middle of the string disappears too,
gluing words together:

```python
>>> import inflection
>>> inflection.humanize("author_id")
'Author'
>>> inflection.humanize("user_identifier")
'Userentifier'
>>> inflection.titleize("valid_identity")
'Validentity'
```

Expected `'User identifier'` and `'Valid Identity'`. Only a trailing `_id` should be
dropped.
""",
    ),
    # ------------------------------------------------------------------ isodate
    Task(
        project="isodate",
        number=1,
        test_files=("tests/test_duration.py",),
        summary="`parse_duration()` accepts a decimal comma in day/time components but "
        "crashes on one in years or months.",
        bug=(
            Edit(
                "src/isodate/isoduration.py",
                '                groups[key] = Decimal(groups[key][:-1].replace(",", "."))\n',
                "                groups[key] = Decimal(groups[key][:-1])\n",
            ),
        ),
        tests=(
            Edit(
                "tests/test_duration.py",
                "",
                '''

def test_parse_decimal_comma_in_years_and_months():
    """ISO 8601 allows a comma as decimal sign in every component."""
    assert parse_duration("P1,5Y") == Duration(years=Decimal("1.5"))
    assert parse_duration("P2Y0,5M") == Duration(years=2, months=Decimal("0.5"))
    assert parse_duration("-P1,5Y") == Duration(years=Decimal("-1.5"))


def test_parse_decimal_comma_in_time_components():
    assert parse_duration("PT1,5H") == timedelta(hours=1.5)
    assert parse_duration("P1,5D") == timedelta(days=1.5)
''',
            ),
            Edit(
                "tests/test_duration.py",
                "from datetime import date, datetime, timedelta\n",
                "from datetime import date, datetime, timedelta\nfrom decimal import Decimal\n",
            ),
        ),
        fail_to_pass=("tests/test_duration.py::test_parse_decimal_comma_in_years_and_months",),
        problem_statement="""\
parse_duration() crashes on a decimal comma in years or months

ISO 8601 allows both `.` and `,` as the decimal sign (the comma is even the preferred
one). `parse_duration` handles the comma for days, hours, minutes and seconds, but not
for years and months, where it crashes with an error from `decimal` instead of returning
a `Duration` (or raising `ISO8601Error`):

```python
>>> from isodate import parse_duration
>>> parse_duration("PT1,5H")
datetime.timedelta(seconds=5400)
>>> parse_duration("P1.5Y")
isodate.duration.Duration(0, 0, 0, years=1, months=0)
>>> parse_duration("P1,5Y")
Traceback (most recent call last):
  ...
decimal.InvalidOperation: [<class 'decimal.ConversionSyntax'>]
```

Expected `parse_duration("P1,5Y") == parse_duration("P1.5Y")`, and likewise for months.
""",
    ),
    Task(
        project="isodate",
        number=2,
        test_files=("tests/test_duration.py",),
        summary="`Duration.totimedelta(end=...)` subtracts in the wrong order and returns a "
        "negated timedelta.",
        bug=(
            Edit(
                "src/isodate/duration.py",
                "        return end - (end - self)\n",
                "        return (end - self) - end\n",
            ),
        ),
        tests=(
            Edit(
                "tests/test_duration.py",
                "",
                '''

def test_totimedelta_with_end():
    """Conversion to timedelta counted back from an end date."""
    dur = Duration(months=1)
    # February 2000 has 29 days, February 2001 has 28
    assert dur.totimedelta(end=datetime(2000, 3, 1)) == timedelta(29)
    assert dur.totimedelta(end=datetime(2001, 3, 1)) == timedelta(28)
    dur = Duration(years=1, days=1)
    assert dur.totimedelta(end=datetime(2001, 1, 1)) == timedelta(367)


def test_totimedelta_with_end_years():
    dur = Duration(years=1)
    # the year before 2000-03-01 contains 29 February 2000
    assert dur.totimedelta(end=datetime(2000, 3, 1)) == timedelta(366)
    assert dur.totimedelta(end=datetime(2001, 3, 1)) == timedelta(365)
''',
            ),
        ),
        fail_to_pass=(
            "tests/test_duration.py::test_totimedelta_with_end",
            "tests/test_duration.py::test_totimedelta_with_end_years",
        ),
        problem_statement="""\
Duration.totimedelta(end=...) returns a negative timedelta

`Duration.totimedelta()` takes either a `start` or an `end` date to anchor the years and
months of the duration. With `start` it works; with `end` the length comes out negated:

```python
>>> from datetime import datetime
>>> from isodate import Duration
>>> Duration(months=1).totimedelta(start=datetime(2000, 2, 1))
datetime.timedelta(days=29)
>>> Duration(months=1).totimedelta(end=datetime(2000, 3, 1))
datetime.timedelta(days=-29)
```

Expected `timedelta(days=29)` for the second call too: one month ending on 2000-03-01 is
February 2000, which has 29 days.
""",
    ),
    # ------------------------------------------------------------------ tabulate
    Task(
        project="tabulate",
        number=1,
        test_files=("test/test_output.py",),
        summary="When `intfmt` is a list shorter than the number of columns, the remaining "
        "columns get the float default format (`g`) instead of the integer one.",
        bug=(
            Edit(
                "tabulate/__init__.py",
                "            int_formats.extend((len(cols) - len(int_formats)) * [_DEFAULT_INTFMT])\n",
                "            int_formats.extend((len(cols) - len(int_formats)) * [_DEFAULT_FLOATFMT])\n",
            ),
        ),
        tests=(
            Edit(
                "test/test_output.py",
                """def test_empty_data_with_headers():
    "Output: table with empty data and headers as firstrow"
""",
                """def test_intfmt_multi():
    "Output: integer format different for each column"
    result = tabulate([[1234567, 7654321]], intfmt=(",", "_"), tablefmt="plain")
    expected = "1,234,567  7_654_321"
    assert_equal(expected, result)


def test_intfmt_multi_shorter_than_columns():
    "Output: columns without an integer format in the list use the default one"
    result = tabulate([[1234567, 7654321, 42]], intfmt=[","], tablefmt="plain")
    expected = "1,234,567  7654321  42"
    assert_equal(expected, result)


def test_empty_data_with_headers():
    "Output: table with empty data and headers as firstrow"
""",
            ),
        ),
        fail_to_pass=("test/test_output.py::test_intfmt_multi_shorter_than_columns",),
        problem_statement="""\
Per-column intfmt: columns past the end of the list are printed in scientific notation

`intfmt` can be a list with one format per column, like `floatfmt`. When the list is
shorter than the number of columns, the columns without a format of their own should be
formatted as if no `intfmt` had been given. Instead large integers in those columns come
out in exponent notation:

```python
>>> from tabulate import tabulate
>>> print(tabulate([[1234567, 7654321, 42]], intfmt=[","], tablefmt="plain"))
1,234,567  7.65432e+06  42
```

Expected:

```
1,234,567  7654321  42
```

`floatfmt` and `missingval` lists that are shorter than the row behave as expected.
""",
    ),
    Task(
        project="tabulate",
        number=2,
        test_files=("test/test_output.py",),
        summary='Number detection only accepts lower-case "nan"/"inf", so "NaN", "INF" or '
        '"-Inf" turn a numeric column into a text column.',
        bug=(
            Edit(
                "tabulate/__init__.py",
                '        return string.lower() in ["inf", "-inf", "nan"]\n',
                '        return string in ["inf", "-inf", "nan"]\n',
            ),
        ),
        tests=(
            Edit(
                "test/test_output.py",
                """def test_missingval():
    "Output: substitution of missing values"
""",
                """def test_float_special_values_in_any_case():
    "Output: NaN and infinity are numbers whatever their case"
    table = [["a", 1.5], ["b", "NaN"], ["c", "INF"], ["d", "-Inf"]]
    result = tabulate(table, tablefmt="plain")
    expected = "\\n".join(["a     1.5", "b   nan", "c   inf", "d  -inf"])
    assert_equal(expected, result)


def test_float_special_values_lower_case():
    "Output: lower-case nan and inf in a numeric column"
    result = tabulate([["a", 1.5], ["b", "nan"], ["c", "-inf"]], tablefmt="plain")
    expected = "\\n".join(["a     1.5", "b   nan", "c  -inf"])
    assert_equal(expected, result)


def test_missingval():
    "Output: substitution of missing values"
""",
            ),
        ),
        fail_to_pass=("test/test_output.py::test_float_special_values_in_any_case",),
        problem_statement="""\
Numeric column becomes a text column when it contains "NaN" or "INF"

A column with numbers and the string `"nan"` is treated as numeric (right/decimal
aligned, `nan` formatted as a float). The same column with `"NaN"` (as written by many
tools, e.g. pandas' `to_csv`) or `"INF"` / `"-Inf"` is treated as text, so it is
left-aligned and the other numbers lose their number formatting:

```python
>>> from tabulate import tabulate
>>> print(tabulate([["a", 1.5], ["b", "nan"]], tablefmt="plain"))
a    1.5
b  nan
>>> print(tabulate([["a", 1.5], ["b", "NaN"]], tablefmt="plain"))
a  1.5
b  NaN
```

Expected the second table to look like the first one. Python's `float()` accepts these
spellings case-insensitively, and tabulate should recognise them as numbers too.
""",
    ),
    # ------------------------------------------------------------------ toolz
    Task(
        project="toolz",
        number=1,
        test_files=("toolz/tests/test_dicttoolz.py",),
        summary="`get_in()` no longer treats a TypeError during the lookup as a missing "
        "key, so it raises instead of returning the default.",
        bug=(
            Edit(
                "toolz/dicttoolz.py",
                "    except (KeyError, IndexError, TypeError):\n",
                "    except (KeyError, IndexError):\n",
            ),
        ),
        tests=(
            Edit(
                "toolz/tests/test_dicttoolz.py",
                "                             itemfilter, assoc_in)\n",
                "                             itemfilter, assoc_in, get_in)\n",
            ),
            Edit(
                "toolz/tests/test_dicttoolz.py",
                "",
                """

def test_get_in():
    d = {'a': {'b': [10, 20]}, 'n': None, 'x': 5}
    assert get_in(['a', 'b', 1], d) == 20
    assert get_in(['a', 'c'], d) is None
    assert get_in(['a', 'b', 5], d, default=0) == 0
    assert raises(KeyError, lambda: get_in(['a', 'c'], d, no_default=True))


def test_get_in_returns_default_for_unsubscriptable_values():
    d = {'a': {'b': [10, 20]}, 'n': None, 'x': 5}
    # a list indexed by a string, None and an int indexed at all
    assert get_in(['a', 'b', 'first'], d) is None
    assert get_in(['n', 'anything'], d, default='missing') == 'missing'
    assert get_in(['x', 0], d, default=0) == 0
    assert raises(TypeError, lambda: get_in(['x', 0], d, no_default=True))
""",
            ),
        ),
        fail_to_pass=(
            "toolz/tests/test_dicttoolz.py::test_get_in_returns_default_for_unsubscriptable_values",
        ),
        problem_statement="""\
get_in raises TypeError instead of returning the default

`get_in` is documented to return `default` when `coll[i0][i1]...[iX]` cannot be found
(and to raise only when `no_default=True`). That works for missing keys and out-of-range
indices, but when the path runs into a value that cannot be indexed that way, the lookup
blows up:

```python
>>> from toolz import get_in
>>> transaction = {'name': 'Alice', 'purchase': {'items': ['Apple', 'Orange']}}
>>> get_in(['purchase', 'items', 10], transaction)    # None, fine
>>> get_in(['purchase', 'items', 'apple'], transaction)
Traceback (most recent call last):
  ...
TypeError: list indices must be integers or slices, not str
>>> get_in(['name', 'first'], {'name': None}, default='?')
Traceback (most recent call last):
  ...
TypeError: 'NoneType' object is not subscriptable
```

Expected `None` and `'?'`; the `get_in` docstring even shows
`get_in(['purchase', 'items', 'apple'], transaction)` returning `None`.
""",
    ),
    Task(
        project="toolz",
        number=2,
        test_files=("toolz/tests/test_itertoolz.py",),
        summary="`partition_all()` on an iterator (no `len`) finds the end of the last, "
        "short partition with an off-by-one binary search and truncates it.",
        bug=(
            Edit(
                "toolz/itertoolz.py",
                "                if prev[mid] is no_pad:\n                    hi = mid\n",
                "                if prev[mid] is no_pad:\n                    hi = mid - 1\n",
            ),
        ),
        tests=(
            Edit(
                "toolz/tests/test_itertoolz.py",
                "",
                """

def test_partition_all_iterator_last_partition():
    assert list(partition_all(5, iter(range(7)))) == [(0, 1, 2, 3, 4), (5, 6)]
    assert list(partition_all(3, iter(range(7)))) == [(0, 1, 2), (3, 4, 5), (6,)]


def test_partition_all_iterator_matches_sequence():
    for n in range(1, 9):
        for length in range(0, 25):
            expected = list(partition_all(n, list(range(length))))
            assert list(partition_all(n, iter(range(length)))) == expected, (n, length)
""",
            ),
        ),
        fail_to_pass=(
            "toolz/tests/test_itertoolz.py::test_partition_all_iterator_last_partition",
            "toolz/tests/test_itertoolz.py::test_partition_all_iterator_matches_sequence",
        ),
        problem_statement="""\
partition_all loses items of the last partition when given an iterator

`partition_all` gives different results for a list and for an iterator over the same
items. With an iterator (or any input without `len()`), the final, shorter partition is
often cut short or even empty:

```python
>>> from toolz import partition_all
>>> list(partition_all(5, range(7)))
[(0, 1, 2, 3, 4), (5, 6)]
>>> list(partition_all(5, iter(range(7))))
[(0, 1, 2, 3, 4), (5,)]
>>> list(partition_all(3, iter(range(7))))
[(0, 1, 2), (3, 4, 5), ()]
```

Expected `[(0, 1, 2, 3, 4), (5, 6)]` and `[(0, 1, 2), (3, 4, 5), (6,)]`: every element
should be in exactly one partition, whatever kind of iterable is passed in.
""",
    ),
    # ------------------------------------------------------------------ more-itertools
    Task(
        project="more-itertools",
        number=1,
        test_files=("tests/test_recipes.py",),
        summary="`nth_combination()` converts a negative index with an off-by-one, so -1 "
        "gives the second-to-last combination and -len raises IndexError.",
        bug=(
            Edit(
                "more_itertools/recipes.py",
                "    if index < 0:\n        index += c\n",
                "    if index < 0:\n        index += c - 1\n",
            ),
        ),
        tests=(
            Edit(
                "tests/test_recipes.py",
                """    def test_invalid_index(self):
        with self.assertRaises(IndexError):
            mi.nth_combination('abcdefg', 3, -36)
""",
                """    def test_invalid_index(self):
        with self.assertRaises(IndexError):
            mi.nth_combination('abcdefg', 3, -36)

    def test_negative_index(self):
        iterable = 'abcdefg'
        for r in range(len(iterable) + 1):
            expected = list(combinations(iterable, r))
            for index in range(-len(expected), 0):
                actual = mi.nth_combination(iterable, r, index)
                self.assertEqual(actual, expected[index], (r, index))

    def test_last(self):
        self.assertEqual(mi.nth_combination(range(5), 3, -1), (2, 3, 4))
""",
            ),
        ),
        fail_to_pass=(
            "tests/test_recipes.py::NthCombinationTests::test_negative_index",
            "tests/test_recipes.py::NthCombinationTests::test_last",
        ),
        problem_statement="""\
nth_combination() with a negative index returns the wrong combination

`nth_combination(iterable, r, index)` is documented as equivalent to
`list(combinations(iterable, r))[index]` and accepts negative indices, but they are off
by one:

```python
>>> from itertools import combinations
>>> import more_itertools as mi
>>> list(combinations(range(5), 3))[-1]
(2, 3, 4)
>>> mi.nth_combination(range(5), 3, -1)
(1, 3, 4)
>>> list(combinations(range(5), 3))[-10]
(0, 1, 2)
>>> mi.nth_combination(range(5), 3, -10)
Traceback (most recent call last):
  ...
IndexError
```

Non-negative indices work. Expected negative indices to count from the end, as list
indexing does.
""",
    ),
    Task(
        project="more-itertools",
        number=2,
        test_files=("tests/test_more.py",),
        summary="`difference()` checks `initial` for truthiness, so `initial=0` (or 0.0) "
        "is ignored and the first element is not dropped.",
        bug=(
            Edit(
                "more_itertools/more.py",
                "    if initial is not None:\n        first = []\n",
                "    if initial:\n        first = []\n",
            ),
        ),
        tests=(
            Edit(
                "tests/test_more.py",
                """    def test_initial(self):
        original = list(range(100))
        accumulated = accumulate(original, initial=100)
        actual = list(mi.difference(accumulated, initial=100))
        self.assertEqual(actual, original)
""",
                """    def test_initial(self):
        original = list(range(100))
        accumulated = accumulate(original, initial=100)
        actual = list(mi.difference(accumulated, initial=100))
        self.assertEqual(actual, original)

    def test_initial_zero(self):
        accumulated = [0, 1, 3, 6, 10]  # accumulate([1, 2, 3, 4], initial=0)
        actual = list(mi.difference(accumulated, initial=0))
        self.assertEqual(actual, [1, 2, 3, 4])

    def test_initial_roundtrip_any_value(self):
        original = [5, -2, 7, 0, 3]
        for initial in (0, 0.0, 10, -1):
            accumulated = accumulate(original, initial=initial)
            actual = list(mi.difference(accumulated, initial=initial))
            self.assertEqual(actual, original, initial)
""",
            ),
        ),
        fail_to_pass=(
            "tests/test_more.py::DifferenceTest::test_initial_zero",
            "tests/test_more.py::DifferenceTest::test_initial_roundtrip_any_value",
        ),
        problem_statement="""\
difference(..., initial=0) does not undo accumulate(..., initial=0)

`difference` is meant to be the inverse of `itertools.accumulate`, and its `initial`
argument mirrors `accumulate`'s: when the accumulated values started from an initial
value, passing the same `initial` drops it again. That works for `initial=100` but not
for `initial=0`, which is by far the most common starting value:

```python
>>> from itertools import accumulate
>>> import more_itertools as mi
>>> list(mi.difference(accumulate([1, 2, 3, 4], initial=100), initial=100))
[1, 2, 3, 4]
>>> list(mi.difference(accumulate([1, 2, 3, 4], initial=0), initial=0))
[0, 1, 2, 3, 4]
```

Expected `[1, 2, 3, 4]` in both cases.
""",
    ),
)


# ---------------------------------------------------------------------------- helpers


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            digest.update(chunk)
    return digest.hexdigest()


def fetch_sdist(project: Project, cache: Path, sdist_dir: Path | None) -> Path:
    """The pinned sdist, downloaded into ``cache`` unless it is there or in ``sdist_dir``."""
    for directory in (sdist_dir, cache):
        if directory is not None and (directory / project.sdist).is_file():
            path = directory / project.sdist
            if sha256_of(path) == project.sha256:
                return path
            print(f"  {path}: sha256 mismatch, downloading again", file=sys.stderr)
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        pip = _pip_command()
        cmd = [
            *pip,
            "download",
            "--no-binary",
            ":all:",
            "--no-deps",
            "-q",
            "-d",
            tmp,
            f"{project.name}=={project.version}",
        ]
        print(f"  {' '.join(cmd)}")
        subprocess.run(cmd, check=True)
        got = Path(tmp) / project.sdist
        if not got.is_file():
            raise SystemExit(f"pip did not download {project.sdist}: {os.listdir(tmp)}")
        if sha256_of(got) != project.sha256:
            raise SystemExit(f"{project.sdist}: sha256 {sha256_of(got)} != pinned {project.sha256}")
        shutil.move(str(got), cache / project.sdist)
    return cache / project.sdist


def _pip_command() -> list[str]:
    for python in (sys.executable, vbt.DEFAULT_PYTHON):
        if (
            python
            and subprocess.run([python, "-m", "pip", "--version"], capture_output=True).returncode
            == 0
        ):
            return [python, "-m", "pip"]
    if shutil.which("pip"):
        return ["pip"]
    raise SystemExit("no pip to download sdists with (or pass --sdist-dir)")


def _kept(rel: str, patterns: Sequence[str]) -> bool:
    if "__pycache__" in rel.split("/") or rel.endswith((".pyc", ".pyo")):
        return False
    return any(fnmatch.fnmatchcase(rel, pattern) for pattern in patterns)


def extract_snapshot(project: Project, sdist: Path, dest: Path) -> list[str]:
    """Write the kept files of the sdist into ``dest``; return their paths."""
    top = f"{project.name}-{project.version}/"
    written: list[str] = []
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.startswith(top):
                continue
            rel = member.name[len(top) :]
            if ".." in rel.split("/") or not _kept(rel, project.keep):
                continue
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            if rel == project.readme and len(data) > README_LIMIT:
                data = short_readme(project).encode()
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            target.chmod(0o644)
            written.append(rel)
    for required in (project.license_file, project.readme):
        if required not in written:
            raise SystemExit(f"{project.sdist}: {required} is missing from the snapshot")
    return sorted(written)


def short_readme(project: Project) -> str:
    title = project.name
    underline = "=" * len(title)
    head = f"# {title}\n" if project.readme.endswith(".md") else f"{title}\n{underline}\n"
    return (
        f"{head}\n{project.summary}\n\n"
        f"This is a trimmed snapshot of {project.name} {project.version} "
        f"(https://github.com/{project.repo}), taken from its PyPI sdist: the package "
        f"source, its tests, packaging metadata and the licence ({project.license}, see "
        f"{project.license_file}). The documentation is upstream.\n"
    )


def apply_edits(root: Path, edits: Sequence[Edit]) -> None:
    for edit in edits:
        path = root / edit.path
        text = path.read_text(encoding="utf-8")
        if edit.old == "":
            text = text + edit.new
        else:
            count = text.count(edit.old)
            if count != 1:
                raise SystemExit(
                    f"{edit.path}: the text to replace occurs {count} times:\n{edit.old}"
                )
            text = text.replace(edit.old, edit.new)
        path.write_text(text, encoding="utf-8")


def _iso(date: datetime) -> str:
    return date.strftime("%Y-%m-%dT%H:%M:%SZ")


class Repo:
    """A git repository written with a fixed identity and dates, ignoring user config."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.home = path.parent / "home"
        self.home.mkdir(exist_ok=True)

    def env(self, date: datetime | None = None) -> dict[str, str]:
        env = vbt._clean_env()
        env.update(
            {"HOME": str(self.home), "XDG_CONFIG_HOME": str(self.home / ".config"), "TZ": "UTC"}
        )
        env.update({"GIT_AUTHOR_NAME": IDENTITY[0], "GIT_AUTHOR_EMAIL": IDENTITY[1]})
        env.update({"GIT_COMMITTER_NAME": IDENTITY[0], "GIT_COMMITTER_EMAIL": IDENTITY[1]})
        if date is not None:
            stamp = f"{int(date.timestamp())} +0000"
            env.update({"GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp})
        return env

    def git(self, *args: str, date: datetime | None = None, input: str | None = None) -> str:
        config = [
            "-c",
            "core.autocrlf=false",
            "-c",
            "core.filemode=true",
            "-c",
            "commit.gpgsign=false",
            "-c",
            "tag.gpgsign=false",
            "-c",
            "init.defaultBranch=main",
            "-c",
            "pack.threads=1",
            "-c",
            "core.bigFileThreshold=512m",
            "-c",
            "advice.detachedHead=false",
            "-c",
            "diff.noprefix=false",
            "-c",
            "diff.mnemonicPrefix=false",
        ]
        done = subprocess.run(
            ["git", *config, *args],
            cwd=self.path,
            env=self.env(date),
            input=input,
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise SystemExit(f"git {' '.join(args)} failed:\n{done.stderr}")
        return done.stdout

    def commit_all(self, message: str, date: datetime) -> str:
        self.git("add", "-A", "-f")
        self.git("commit", "-q", "--no-verify", "-m", message, date=date)
        return self.git("rev-parse", "HEAD").strip()

    def diff(self, a: str, b: str | None = None, paths: Sequence[str] = ()) -> str:
        args = [
            "diff",
            "--no-color",
            "--no-ext-diff",
            "--no-renames",
            "--src-prefix=a/",
            "--dst-prefix=b/",
            a,
        ]
        if b is not None:
            args.append(b)
        return self.git(*args, "--", *paths)


@dataclass
class Built:
    rows: list[dict] = field(default_factory=list)
    bundles: dict[str, Path] = field(default_factory=dict)


def build_project(
    project: Project, tasks: Sequence[Task], sdist: Path, work: Path, python: str
) -> Built:
    """The repository, bundle and task rows of one project."""
    root = work / project.name
    root.mkdir(parents=True)
    repo_dir = root / "repo"
    repo_dir.mkdir()
    repo = Repo(repo_dir)
    extract_snapshot(project, sdist, repo_dir)
    day0 = datetime.fromisoformat(project.snapshot_date.replace("Z", "+00:00")).astimezone(UTC)
    repo.git("init", "-q", "-b", "main")
    snapshot = repo.commit_all(
        f"Import {project.name} {project.version}\n\n"
        f"Trimmed snapshot of the PyPI sdist {project.sdist}\n"
        f"(sha256 {project.sha256}) of https://github.com/{project.repo}.\n",
        day0,
    )
    built = Built()
    for task in tasks:
        date = day0 + timedelta(days=task.number)
        repo.git("checkout", "-q", "--detach", snapshot)
        apply_edits(repo_dir, task.bug)
        base = repo.commit_all(f"Task base for {task.instance_id}\n", date)
        repo.git("tag", f"task/{task.instance_id}", base)
        bug_files = sorted({e.path for e in task.bug})
        test_files = sorted({e.path for e in task.tests})
        patch = repo.diff(base, snapshot, bug_files)
        apply_edits(repo_dir, task.tests)
        test_patch = repo.diff("HEAD", None, test_files)
        repo.git("reset", "-q", "--hard")
        repo.git("checkout", "-q", "main")
        test_cmd = " ".join(
            part
            for part in (
                f"PYTHONPATH={project.pythonpath}" if project.pythonpath else "",
                TEST_CMD,
                *task.test_files,
            )
            if part
        )
        row = {
            "repo": project.repo,
            "instance_id": task.instance_id,
            "base_commit": base,
            "patch": patch,
            "test_patch": test_patch,
            "problem_statement": task.problem_statement,
            "hints_text": "",
            "created_at": _iso(date),
            "version": project.version,
            "FAIL_TO_PASS": "",
            "PASS_TO_PASS": "",
            "environment_setup_commit": base,
            "install_config": {"install": "", "test_cmd": test_cmd, "log_parser": "pytest"},
            "repo_url": f"builtin:{project.name}.bundle",
        }
        f2p, p2p = derive_test_lists(task, row, repo_dir, root, python)
        row["FAIL_TO_PASS"] = json.dumps(f2p)
        row["PASS_TO_PASS"] = json.dumps(p2p)
        built.rows.append(row)
    bundle = root / f"{project.name}.bundle"
    repo.git("bundle", "create", "-q", str(bundle), "--all")
    built.bundles[project.name] = bundle
    return built


def derive_test_lists(
    task: Task, row: dict, source: Path, root: Path, python: str
) -> tuple[list[str], list[str]]:
    """FAIL_TO_PASS and PASS_TO_PASS from real runs, checked against the declared F2P."""
    iid = task.instance_id
    test_cmd = row["install_config"]["test_cmd"]
    check = root / f"check-{task.number}"
    vbt.checkout(source, row["base_commit"], check)
    bare = vbt.run_tests(check, test_cmd, python)
    bad = {t: s for t, s in bare.statuses.items() if s in vbt.FAILING}
    if not bare.statuses or bad:
        raise SystemExit(
            f"{iid}: at the base commit the existing tests must all pass: {bad or bare.log[-2000:]}"
        )
    vbt.apply_patch(check, row["test_patch"])
    before = vbt.run_tests(check, test_cmd, python)
    vbt.apply_patch(check, row["patch"])
    after = vbt.run_tests(check, test_cmd, python)
    shutil.rmtree(check)
    failing_after = {t: s for t, s in after.statuses.items() if s in vbt.FAILING}
    if failing_after:
        raise SystemExit(
            f"{iid}: tests fail with the gold patch: {failing_after}\n{after.log[-3000:]}"
        )
    f2p = [
        t
        for t, s in after.statuses.items()
        if s == "PASSED" and before.statuses.get(t) in vbt.FAILING
    ]
    if sorted(f2p) != sorted(task.fail_to_pass):
        raise SystemExit(
            f"{iid}: the tests that flip are not the declared FAIL_TO_PASS:\n"
            f"  flipped:  {sorted(f2p)}\n  declared: {sorted(task.fail_to_pass)}\n{before.log[-3000:]}"
        )
    still_failing = {t: s for t, s in before.statuses.items() if s in vbt.FAILING and t not in f2p}
    if still_failing:
        raise SystemExit(
            f"{iid}: tests fail at base+test_patch that the gold patch does not fix: {still_failing}"
        )
    new = set(before.statuses) - set(bare.statuses)
    if not set(f2p) <= new:
        raise SystemExit(
            f"{iid}: FAIL_TO_PASS tests already exist at the base commit: {sorted(set(f2p) - new)}"
        )
    # ids with whitespace reach SWE-bench's parser cut off at the first space: leave them out
    truncated = vbt.truncated_ids(before.log) | vbt.truncated_ids(after.log)
    if set(f2p) & truncated:
        raise SystemExit(
            f"{iid}: FAIL_TO_PASS ids must not contain whitespace: {sorted(set(f2p) & truncated)}"
        )
    p2p = [
        t
        for t, s in after.statuses.items()
        if s == "PASSED" and before.statuses.get(t) == "PASSED" and t not in truncated
    ]
    left_out = [t for t, s in after.statuses.items() if s == "PASSED" and t in truncated]
    note = (
        f", {len(left_out)} passing test(s) with whitespace in their id left out"
        if left_out
        else ""
    )
    print(f"  {iid}: {len(f2p)} FAIL_TO_PASS, {len(p2p)} PASS_TO_PASS{note}")
    # FAIL_TO_PASS in the declared order; PASS_TO_PASS sorted, since pytest's order is not
    # stable for every project (inflection parametrizes over a set of strings)
    return list(task.fail_to_pass), sorted(p2p)


def build(out: Path, cache: Path, sdist_dir: Path | None, python: str) -> None:
    """Build every project into ``out`` (``repos/*.bundle``, ``tasks.jsonl``, ``README.md``)."""
    vbt.ensure_host_pytest(python)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="orchard-builtin-") as tmp:
        work = Path(tmp)
        bundles: dict[str, Path] = {}
        for project in PROJECTS.values():
            tasks = [t for t in TASKS if t.project == project.name]
            print(f"{project.name} {project.version}: {len(tasks)} task(s)")
            sdist = fetch_sdist(project, cache, sdist_dir)
            built = build_project(project, tasks, sdist, work, python)
            rows.extend(built.rows)
            bundles.update(built.bundles)
        repos = out / "repos"
        repos.mkdir(parents=True, exist_ok=True)
        for stale in repos.glob("*.bundle"):
            if stale.stem not in bundles:
                stale.unlink()
        for name, bundle in bundles.items():
            shutil.copyfile(bundle, repos / f"{name}.bundle")
    lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    (out / "tasks.jsonl").write_text(lines, encoding="utf-8")
    (out / "README.md").write_text(readme(rows), encoding="utf-8")
    print(f"wrote {len(rows)} tasks to {out / 'tasks.jsonl'} and {out / 'README.md'}")


README_HEAD = """\
# Built-in SWE tasks

A small SWE-bench-style task set that works offline: {tasks} tasks in {projects} small real
pure-Python projects, each with an injected (SWE-smith style) bug, a gold `patch`, a
`test_patch` and `FAIL_TO_PASS` / `PASS_TO_PASS`. Load it with
`orchard_swe.tasks.load_tasks("builtin")` (or `--tasks builtin` on the command line).

**Generated** by `packages/orchard-swe/scripts/make_builtin_tasks.py`, like `tasks.jsonl` and
`repos/*.bundle`: edit the data in that script, not these files.

## Layout

- `tasks.jsonl`: one instance a line with SWE-bench's fields (`instance_id`, `repo`,
  `base_commit`, `patch`, `test_patch`, `problem_statement`, `hints_text`, `created_at`,
  `version`, `FAIL_TO_PASS`, `PASS_TO_PASS` as JSON strings, `environment_setup_commit`)
  plus SWE-rebench's `install_config` (`install` empty, `test_cmd`, `log_parser: pytest`)
  and `repo_url: builtin:<project>.bundle`.
- `repos/<project>.bundle`: a git bundle (`git clone repos/toolz.bundle` works). `main` is
  the trimmed upstream snapshot (package source, tests, licence, packaging metadata, a
  README); each task's `base_commit` is one commit on top of it that injects the bug,
  tagged `task/<instance_id>`. Identity and dates are fixed, so the hashes are reproducible.
- Tests run from the repository root with nothing but `python3` and pytest (no install
  step; isodate's src/ layout gets `PYTHONPATH=src` in its `test_cmd`).

## Tasks

| instance_id | project | licence | test file | F2P | P2P | the bug |
| --- | --- | --- | --- | --- | --- | --- |
"""

README_TAIL = """
## Projects

| project | version | upstream | licence | sdist sha256 |
| --- | --- | --- | --- | --- |
{projects}

Each snapshot keeps the project's licence file; the licences (MIT, BSD-3-Clause) allow
redistribution with the notice.

## Regenerate and verify

```bash
# rebuild (downloads the pinned sdists with pip, checks their sha256, runs the tests
# with /usr/bin/python3 to derive FAIL_TO_PASS / PASS_TO_PASS)
python3 packages/orchard-swe/scripts/make_builtin_tasks.py [--sdist-dir DIR]
# rebuild elsewhere and compare with what is committed (commit hashes, tasks.jsonl, README)
python3 packages/orchard-swe/scripts/make_builtin_tasks.py --check
# check every task on the host: F2P fail / P2P pass at base + test_patch, all pass with the
# gold patch, an empty patch stays unresolved (needs `apt-get install -y python3-pytest`)
python3 packages/orchard-swe/scripts/verify_builtin_tasks.py [--install-pytest]
# the same as a test (marked integration)
uv run pytest packages/orchard-swe/tests/test_builtin_tasks.py
```

Verifying all tasks takes about 15 s on two cores (three test runs per task, two tasks at a
time); rebuilding about 30 s once the sdists are cached.

## Caveats

- Test ids that contain whitespace (some of inflection's parametrized tests, e.g.
  `test_titleize[ActiveRecord-Active Record]`) are left out of `PASS_TO_PASS`: SWE-bench's
  pytest log parser keeps only the first word of a summary line, so they could never match.
  They still run. Parametrized ids with brackets (`test_x[a-b]`) are listed as pytest
  prints them.
- The bundle holds the whole history: the clean snapshot (`main`), every task's base and
  their tags. An agent that can run git in a clone can see the injected bug with
  `git show HEAD` or `git diff main`; an environment that must hide it should give the
  agent the tree at `base_commit` without that history.
- Tests of unittest-style suites avoid `subTest`, whose failures pytest 9 reports apart from
  the test itself; the set was verified with pytest 7.2 (Debian 12), 7.4 and 9.2.
"""


def readme(rows: Sequence[dict]) -> str:
    """The README of the task set, from the data above and the built rows."""
    by_id = {t.instance_id: t for t in TASKS}
    lines = []
    for row in rows:
        task = by_id[row["instance_id"]]
        project = PROJECTS[task.project]
        tests = " ".join(f"`{f}`" for f in task.test_files)
        f2p, p2p = json.loads(row["FAIL_TO_PASS"]), json.loads(row["PASS_TO_PASS"])
        lines.append(
            f"| `{task.instance_id}` | {project.name} {project.version} | {project.license} "
            f"| {tests} | {len(f2p)} | {len(p2p)} | {task.summary} |"
        )
    projects = "\n".join(
        f"| {p.name} | {p.version} | [{p.repo}](https://github.com/{p.repo}) | {p.license} "
        f"(`{p.license_file}`) | `{p.sha256[:16]}…` |"
        for p in PROJECTS.values()
    )
    head = README_HEAD.format(tasks=len(rows), projects=len(PROJECTS))
    return head + "\n".join(lines) + "\n" + README_TAIL.format(projects=projects)


def refs_of(bundle: Path) -> dict[str, str]:
    """ref -> commit of a bundle."""
    listing = subprocess.run(
        ["git", "bundle", "list-heads", str(bundle)],
        capture_output=True,
        text=True,
        check=True,
        env=vbt._clean_env(),
    ).stdout
    return {
        ref: sha for sha, ref in (line.split() for line in listing.splitlines() if line.strip())
    }


def check_against(out: Path, committed: Path) -> int:
    """Compare a fresh build with the committed one: same rows, same refs in every bundle."""
    problems = []
    new_rows = (out / "tasks.jsonl").read_text(encoding="utf-8")
    old_rows = (committed / "tasks.jsonl").read_text(encoding="utf-8")
    if new_rows != old_rows:
        problems.append("tasks.jsonl differs")
    if (out / "README.md").read_text(encoding="utf-8") != (committed / "README.md").read_text(
        encoding="utf-8"
    ):
        problems.append("README.md differs")
    for bundle in sorted((out / "repos").glob("*.bundle")):
        old = committed / "repos" / bundle.name
        if not old.exists():
            problems.append(f"{bundle.name} is not committed")
            continue
        if refs_of(bundle) != refs_of(old):
            problems.append(f"{bundle.name}: refs differ")
        elif bundle.read_bytes() != old.read_bytes():
            print(f"note: {bundle.name} has the same refs but other bytes (another git version?)")
    for problem in problems:
        print(f"MISMATCH: {problem}")
    print(
        "reproducible: the commit hashes and tasks.jsonl match"
        if not problems
        else "NOT reproducible"
    )
    return 1 if problems else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="where repos/ and tasks.jsonl go")
    parser.add_argument(
        "--cache-dir", type=Path, default=DEFAULT_CACHE, help="sdist download cache"
    )
    parser.add_argument("--sdist-dir", type=Path, default=None, help="take the sdists from here")
    parser.add_argument(
        "--python", default=vbt.DEFAULT_PYTHON, help="interpreter that runs the tests"
    )
    parser.add_argument(
        "--check", action="store_true", help="build elsewhere and compare with --out"
    )
    args = parser.parse_args(argv)
    if args.check:
        with tempfile.TemporaryDirectory(prefix="orchard-builtin-check-") as tmp:
            build(Path(tmp), args.cache_dir, args.sdist_dir, args.python)
            return check_against(Path(tmp), args.out)
    build(args.out, args.cache_dir, args.sdist_dir, args.python)
    return 0


if __name__ == "__main__":
    sys.exit(main())
