"""Red team, round 12: the user-facing surfaces (the ``ztensor`` command, ``safe_open``'s
slices, the foreign readers behind every command) on hostile input.

Each test names the one function that keeps its rule (docs/threat-model.md)."""
from __future__ import annotations

import io
import random

import numpy as np
import pytest

import ztensor
from ztensor.tensor import Tensor
from ztensor.tools import cli

# an OSC title change, a bell, a screen clear, a C1 CSI, an RTL override, a line
# separator: each does something to a terminal when written raw
ESCAPES = "\x1b]0;PWNED\x07\x1b[2J\x9b31m\u202e\u2028"


def _run(argv, capsys):
    out = io.StringIO()
    code = cli.main(argv, out=out)
    return code, out.getvalue() + capsys.readouterr().err


def _only_printable(text):
    return all(c.isprintable() or c == "\n" for c in text)


@pytest.fixture()
def escaping_file(tmp_path):
    """A real .zt file whose every free-text field holds escape sequences: an object
    name, its format (an open set: a format this version does not know is kept and
    listed), a component type, object and file attribute keys and values."""
    path = tmp_path / "escapes.zt"
    with ztensor.Writer(path, attributes={"k" + ESCAPES: "v" + ESCAPES}) as w:
        w.write_numpy("plain" + ESCAPES, np.arange(4, dtype=np.float32))
        w.write(
            "odd" + ESCAPES,
            Tensor(
                {"data": np.arange(3.0)},
                format="dense" + ESCAPES,
                types={"data": "ty" + ESCAPES},
                attributes={"a" + ESCAPES: ESCAPES},
                shape=(3,),
            ),
        )
    return path


@pytest.mark.parametrize(
    "command", [["info"], ["ls"], ["verify"], ["stats", "--quiet"], ["diff"]]
)
def test_no_escape_from_any_field_reaches_the_terminal(escaping_file, command, capsys):
    """``ztensor info`` counted objects per format on its "objects:" line and printed
    each format's name raw: a file whose object has format ``dense\\x1b]0;...`` set
    the terminal's title and cleared the screen.  Every line ``info`` prints now
    passes ``cli._printable`` whole, as every table cell (``cli._write_table``) and
    summary line do; every command's output and error line hold printable text
    only."""
    argv = command + [str(escaping_file)]
    if command == ["diff"]:
        argv.append(str(escaping_file))
    code, text = _run(argv, capsys)
    assert code in (0, 1, 2)
    assert _only_printable(text), (command, text)
    if command == ["info"]:
        assert code == 0
        assert "dense\\x1b]0;PWNED\\x07" in text  # shown, as an escape


def test_a_damaged_hdf5_object_header_is_a_format_error(tmp_path, capsys):
    """A one-byte change in an HDF5 file's root object header made h5py's
    ``ObjectID.__hash__`` raise ``TypeError: Objects of class FileID cannot be
    hashed`` (its own RuntimeError chained under it) while ztensor walked the
    groups: ``ztensor ls`` printed ``ztensor: TypeError: ...`` and ``Reader`` raised a
    bare TypeError.  Kept by ``hdf5_file._entries``: whatever h5py raises walking a
    damaged file is a FormatError naming it.  Every single-byte change in the
    header region is either read or refused cleanly."""
    h5py = pytest.importorskip("h5py")
    good_path = tmp_path / "good.h5"
    with h5py.File(good_path, "w") as h:
        h["w"] = np.arange(64, dtype=np.float32).reshape(8, 8)
    good = good_path.read_bytes()
    path = tmp_path / "damaged.h5"
    for at in range(96, 160):
        for value in (0x00, 0x01, 0xD6, 0xFF):
            if good[at] == value:
                continue
            data = bytearray(good)
            data[at] = value
            path.write_bytes(bytes(data))
            try:
                with ztensor.Reader(path) as r:
                    for name in r.keys():
                        r.read_numpy(name)
            except ztensor.ZTensorError as exc:
                assert exc.path == str(path), (at, value, exc)
            code, text = _run(["ls", str(path)], capsys)
            assert code in (0, 2) and "TypeError" not in text, (at, value, text)


@pytest.mark.parametrize("framework", ["np", "pt"])
def test_get_slice_takes_numpy_integer_steps_as_safetensors_does(tmp_path, framework):
    """``get_slice(name)[0:3:np.int64(2)]`` was refused ("step np.int64(2) is not a
    positive integer") though the same slice's bounds may be numpy integers and
    safetensors takes the step; a bool step stays refused.  Kept by
    ``safe._selection``."""
    st = pytest.importorskip("safetensors")
    from safetensors.numpy import save_file

    if framework == "pt":
        pytest.importorskip("torch")
    a = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    path = str(tmp_path / "a.safetensors")
    save_file({"a": a}, path)
    indices = [
        slice(0, 3, np.int64(2)),
        (slice(None), slice(1, None, np.int32(2))),
        (np.int64(1), slice(None, None, np.uint8(3)), slice(0, 5, np.int16(4))),
    ]
    with st.safe_open(path, framework) as theirs, ztensor.safe_open(path, framework) as ours:
        for index in indices:
            want, got = theirs.get_slice("a")[index], ours.get_slice("a")[index]
            assert np.array_equal(np.asarray(got), np.asarray(want)), index
            assert np.array_equal(np.asarray(got), a[index]), index
        # True is the integer 1 for both frameworks, as in safetensors 0.8 (torch
        # indexing for pt; its numpy slices take a Python bool as an int too)
        want, got = theirs.get_slice("a")[0:3:True], ours.get_slice("a")[0:3:True]
        assert np.array_equal(np.asarray(got), np.asarray(want))


def _counting_keep(monkeypatch):
    calls = [0]
    keep = cli._keep

    def counted(*args):
        calls[0] += 1
        return keep(*args)

    monkeypatch.setattr(cli, "_keep", counted)
    return calls


def test_shortening_names_sharing_a_form_is_linear(monkeypatch):
    """``ztensor ls`` on a terminal narrower than the names shortens them to distinct
    forms (``cli.shorten_distinct``); names whose shortened forms collide get a
    counter, ``#2``, ``#3``..., and the counter was searched from 2 for each name:
    500 names of 200 random ``a``/``b`` characters took 9.6 s, 1,000 took 38 s (a file
    of 20,000 such names held the terminal for hours).  The search now starts after
    the last counter given to the same form: a bounded number of forms per name."""
    rnd = random.Random(12)
    texts = sorted({"".join(rnd.choice("ab") for _ in range(40)) for _ in range(400)})
    calls = _counting_keep(monkeypatch)
    out = cli.shorten_distinct(texts, 4)  # little room: most names share a form
    assert len(set(out)) == len(out) == len(texts)
    assert max(int(s.rsplit("#", 1)[1]) for s in out if "#" in s) > 100  # "#100"s
    assert calls[0] <= 4 * len(texts), calls[0]  # the search from 2: 40,601 forms


def test_shortened_names_keep_their_counters_past_nine():
    """The counter's mark grows a digit at ``#10``, which leaves the kept form less
    room; the forms are those the search from 2 gave (this list is its output), each
    the smallest counter free when its name's turn came."""
    rnd = random.Random(12)
    texts = sorted({"".join(rnd.choice("ab") for _ in range(40)) for _ in range(30)})
    assert len(texts) == 30
    assert cli.shorten_distinct(texts, 4) == [
        "…b#2", "…a#2", "…a#3", "…a#4", "…a#5", "…b#3", "…b#4", "…a#6", "…a#7", "…b#5",
        "…a#8", "…b#6", "…a#9", "…b#7", "…a#10", "…b#8", "…a#11", "…b#9", "…b#10",
        "…b#11", "…a#12", "…b#12", "…b#13", "…b#14", "…a#13", "…b#15", "…b#16", "…a#14",
        "…a#15", "…b#17",
    ]  # fmt: skip


def test_diff_of_a_file_with_nan_attributes_and_itself_is_identical(tmp_path, capsys):
    """``ztensor diff`` compared attributes with ``==``: a NaN attribute (a file's
    ``lr``, an object's ``scale``) differs from itself, so a file and its copy were
    reported as 2 differences, exit 1.  And ``==`` takes ``True`` for ``1`` and ``1``
    for ``1.0``, which a file stores as different values: those are differences.
    Kept by ``cli._same``."""
    nan = float("nan")
    one = tmp_path / "one.zt"
    with ztensor.Writer(one, attributes={"lr": nan, "nested": {"x": [nan, 1.0]}}) as w:
        w.write("t", Tensor({"data": np.arange(3.0)}, attributes={"scale": nan}))
    copy = tmp_path / "copy.zt"
    copy.write_bytes(one.read_bytes())
    code, text = _run(["diff", str(one), str(copy)], capsys)
    assert code == 0 and text.strip() == "identical", text

    other = tmp_path / "other.zt"
    with ztensor.Writer(other, attributes={"lr": nan, "nested": {"x": [nan, True]}}) as w:
        w.write("t", Tensor({"data": np.arange(3.0)}, attributes={"scale": -0.0}))
    code, text = _run(["diff", str(one), str(other)], capsys)
    assert code == 1, text
    assert "changed keys: nested" in text and "changed keys: scale" in text, text


@pytest.mark.parametrize("left, right", [(1, True), (1, 1.0), (0.0, -0.0)])
def test_diff_tells_attribute_values_a_file_stores_differently(tmp_path, capsys, left, right):
    """``1 == True == 1.0`` and ``0.0 == -0.0`` in Python, but a file stores each as a
    different value (CBOR's int, true, float; the float's sign bit); ``ztensor diff``
    called such files identical.  Kept by ``cli._same``."""
    paths = []
    for i, value in enumerate((left, right)):
        path = tmp_path / f"{i}.zt"
        with ztensor.Writer(path, attributes={"flag": value}) as w:
            w.write_numpy("t", np.arange(3.0))
        paths.append(str(path))
    code, text = _run(["diff", *paths], capsys)
    assert code == 1 and "changed keys: flag" in text, text


@pytest.mark.parametrize("model", [None, {}, "model.zt", np.zeros(3)], ids=repr)
def test_save_model_and_load_model_take_a_module(tmp_path, model):
    """``ztensor.torch.save_model`` / ``load_model`` given something other than a
    ``torch.nn.Module`` (a state dict, the arguments swapped) raised
    ``AttributeError: ... has no attribute 'state_dict'``; now a TypeError saying
    what they take, before anything is written.  Kept by ``torch._require_module``."""
    torch = pytest.importorskip("torch")
    import ztensor.torch as zt

    path = tmp_path / "m.zt"
    zt.save_model(torch.nn.Linear(3, 2), path)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        zt.load_model(model, path)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        zt.save_model(model, tmp_path / "out.zt")
    assert not (tmp_path / "out.zt").exists()


def test_save_pretrained_takes_a_transformers_model(tmp_path):
    """``ztensor.transformers.save_pretrained`` of a plain torch module made the
    output folder, then failed with ``AttributeError: 'Linear' object has no
    attribute 'config'``; now a TypeError before anything is written (kept in
    ``transformers.save_pretrained``)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import ztensor.transformers as ztf

    for model in (torch.nn.Linear(2, 2), {}, None):
        with pytest.raises(TypeError, match="PreTrainedModel"):
            ztf.save_pretrained(model, tmp_path / "out")
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("encoding", ["ascii", "cp1252", "latin-1"])
@pytest.mark.parametrize("command", [["stats"], ["ls"], ["info"], ["diff"]])
def test_output_fits_any_stream_encoding(tmp_path, capsys, encoding, command):
    """On a stream that cannot encode every character (``PYTHONIOENCODING=ascii``, a
    Windows redirect in cp1252) ``ztensor stats`` printed its header, then
    ``ztensor: UnicodeEncodeError: ... '\\u2588'`` (the histogram's block), exit 2;
    a name in another script failed ``ls`` the same way.  Kept by
    ``cli._Encodable``, which ``cli.main`` writes through: what the encoding cannot
    hold is written as its backslash escape."""
    path = tmp_path / "names.zt"
    with ztensor.Writer(path, attributes={"note": "\u4e2d\u6587 \u2713"}) as w:
        w.write_numpy("\u6743\u91cd.weight", np.linspace(-1, 1, 50, dtype=np.float32))
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding=encoding, newline="\n")
    argv = command + [str(path)] + ([str(path)] if command == ["diff"] else [])
    code = cli.main(argv, out=out)
    out.flush()
    assert code == 0, capsys.readouterr().err
    text = raw.getvalue().decode(encoding)
    if command in (["ls"], ["stats"]):
        assert "\\u6743\\u91cd.weight" in text, text  # the name, as its escape


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:1/model.safetensors", "s3://bucket/model.zt",
            # an index's folder was listed as a local one, its shards read from local
            # paths made from the URL (./http:/host/ck/...): refused the same (s14)
            "http://127.0.0.1:1/ck/model.zt.index.json"]
)
def test_convert_of_one_file_by_url_says_so(tmp_path, capsys, url):
    """``ztensor convert http://host/model.safetensors out.zt`` took the URL for a local
    path: ``No such file or directory``, whether the server refused the connection
    or held the file.  A single file is converted from a local path; the refusal
    says so and names the URL (``convert.convert``), nothing is written."""
    out = tmp_path / "out.zt"
    with pytest.raises(ztensor.UnsupportedError, match="local path") as info:
        ztensor.convert(url, out)
    assert info.value.path == url
    code, text = _run(["convert", url, str(out)], capsys)
    assert code == 2 and "No such file" not in text and "local path" in text, text
    assert not out.exists()
