"""What the decode and encode command tests share: the bad-input rule."""

import re


def assert_bad_input(main, tmp_path, capsys, argv, message):
    """``main(argv)`` exits 2 with one ``error:`` line matching ``message`` and writes nothing."""
    before = sorted(tmp_path.rglob("*"))
    assert main([*argv, "--no-compile-cache"]) == 2
    err = capsys.readouterr().err
    # Progress bars of the stages that finished may come first; the error is
    # the last line, alone, with no traceback.
    last = err.rstrip("\n").split("\n")[-1]
    assert last.startswith("error: ") and "Traceback" not in err, err
    assert re.search(message, last), err
    assert sorted(tmp_path.rglob("*")) == before  # nothing written, no temp left
