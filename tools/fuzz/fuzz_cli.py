"""Fuzz target 7: the ztensor command on an arbitrary file (ls, info, verify, diff, stats,
text and --json).  Every run returns an exit code of 0, 1 or 2 and writes valid
JSON where asked: never a traceback, never a bare builtin exception's line, never a
terminal escape from the file."""
import contextlib
import functools
import io
import json
import os
import re
import tempfile

from common import run, ztensor  # noqa: F401 - instruments ztensor first

from ztensor.tools import cli

DIR = tempfile.mkdtemp(prefix="fuzz-cli-")
# argparse builds the same parser for each of the seven commands: 80% of a run's time.
# One parser serves every run (parse_args keeps no state), so the runs test the files
cli.build_parser = functools.lru_cache(maxsize=1)(cli.build_parser)
BARE = re.compile(r"^ztensor: [A-Z][A-Za-z]*: ", re.M)


def test_one_input(data: bytes):
    path = os.path.join(DIR, "input.zt")
    with open(path, "wb") as f:
        f.write(data)
    for argv in (["ls", path], ["ls", "--json", path], ["info", path],
                 ["info", "--json", path], ["verify", "-q", path], ["diff", path, path],
                 ["stats", "--json", path]):
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err):
            code = cli.main(argv, out=out)
        assert code in (0, 1, 2), (argv, code)
        # a refusal is a ZTensorError naming the file; "ztensor: KeyError: ..." is the
        # command's last-resort line for an exception no check named: a finding
        assert not BARE.search(err.getvalue()), (argv, err.getvalue())
        text = out.getvalue()
        if "--json" in argv and code == 0:
            json.loads(text)
        if "--json" not in argv:
            assert "\x1b" not in text, argv


if __name__ == "__main__":
    run(test_one_input)
