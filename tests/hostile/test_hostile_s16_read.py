"""Session 16: a probe round on the read side.  Each test names the one function
that keeps its rule."""
import subprocess
import sys

import pytest

import ztensor
import ztensor.errors


# ------------------------------------------------------------------ object stores
# Rule: source._network_error says botocore's own exceptions (source._botocore_error):
# a read of s3:// without credentials was a bare NoCredentialsError, and the command
# printed a 75-line traceback.


def _no_credentials(monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_an_object_store_read_without_credentials_is_a_network_error(monkeypatch, tmp_path):
    pytest.importorskip("s3fs")
    _no_credentials(monkeypatch, tmp_path)
    # a fresh filesystem: fsspec caches one per set of options
    options = {"skip_instance_cache": True}
    for call in (lambda: ztensor.Reader("s3://bucket/x.zt", storage_options=options),
                 lambda: ztensor.open_sharded("s3://bucket/ck/model.zt.index.json",
                                              storage_options=options)):
        with pytest.raises(ztensor.errors.NetworkPermissionError, match="no credentials") as err:
            call()
        assert err.value.path.startswith("s3://bucket/")
    proc = subprocess.run([sys.executable, "-m", "ztensor", "ls", "s3://bucket/x.zt"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.count("\n") == 1 and "no credentials" in proc.stderr, proc.stderr


# ------------------------------------------------------------------ transformers
# Rule: transformers._without_code_maps drops every auto_map (custom_pipelines) of a
# config.json before transformers sees it: an Auto class asked of a model type it has
# no class for offered, on stdin, to import evil.py from the checkpoint's folder (or
# a Hub repository) and cached it; "y" ran it.

EVIL_CALLER = """
import sys, transformers, ztensor, ztensor.transformers as ztf
try:
    ztf.from_pretrained(transformers.AutoModelForCausalLM, sys.argv[1])
    print("loaded")
except ztensor.ZTensorError as exc:
    print("refused", type(exc).__name__)
"""


def _tiny_llama_folder(folder):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import ztensor.transformers as ztf
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, vocab_size=32)
    ztf.save_pretrained(transformers.LlamaForCausalLM(config), folder)
    return folder


def test_an_auto_map_in_config_json_runs_no_code_and_asks_nothing(tmp_path):
    import json
    folder = _tiny_llama_folder(tmp_path / "ck")
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = "vit"  # no AutoModelForCausalLM of its own
    config["auto_map"] = {"AutoModelForCausalLM": "evil.EvilModel"}
    config["text_config"] = {"auto_map": {"AutoModel": "evil.EvilModel"}}
    (folder / "config.json").write_text(json.dumps(config))
    marker = tmp_path / "RAN"
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    proc = subprocess.run([sys.executable, "-c", EVIL_CALLER, str(folder)], input="y\ny\n",
                          capture_output=True, text=True, timeout=120)
    assert "refused FormatError" in proc.stdout, proc.stdout + proc.stderr
    assert "custom code" not in proc.stdout + proc.stderr  # no prompt
    assert not marker.exists()


def test_an_auto_map_beside_a_class_of_transformers_own_is_ignored(tmp_path):
    import json
    transformers = pytest.importorskip("transformers")
    import ztensor.transformers as ztf
    folder = _tiny_llama_folder(tmp_path / "ck")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_llama.LlamaForCausalLM"}
    (folder / "config.json").write_text(json.dumps(config))
    model = ztf.from_pretrained(transformers.AutoModelForCausalLM, folder)
    assert type(model) is transformers.LlamaForCausalLM
    assert not hasattr(model.config, "auto_map")


# Rule: transformers._AllocationBound counts the tensors alive together while the
# model is built (weakref-released), within the checkpoint's elements and
# _ALWAYS_ALLOWED_LIVE more: each of 100 GPT-J layers built a buffer just under the
# per-tensor bound (embed_positions, n_positions x rotary_dim) and held 27 GB.


def _gptj_folder(folder, n_positions):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import json
    import ztensor.transformers as ztf
    torch.manual_seed(0)
    config = transformers.GPTJConfig(n_embd=64, n_layer=1, n_head=4, vocab_size=16,
                                     rotary_dim=16, n_positions=64, n_inner=16)
    ztf.save_pretrained(transformers.GPTJForCausalLM(config), folder)
    data = json.loads((folder / "config.json").read_text())
    data["n_positions"] = n_positions
    data["n_layer"] = 6
    (folder / "config.json").write_text(json.dumps(data))
    return folder


def test_buffers_alive_together_are_bounded_not_only_each(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    import ztensor.transformers as ztf
    monkeypatch.setattr(ztf, "_ALWAYS_ALLOWED_LIVE", 1 << 20)
    # each layer's buffer is 2**16 x 16 = 2**20 elements: one is allowed, not six
    folder = _gptj_folder(tmp_path / "big", 1 << 16)
    with pytest.raises(ztensor.LimitError, match="alive together") as err:
        ztf.from_pretrained(transformers.AutoModelForCausalLM, folder)
    assert err.value.path.endswith("config.json")
    # what is freed is no longer counted: six layers' buffers of 2**12 x 16 (and the
    # temporaries that compute them) build, and the missing layers are then named
    small = _gptj_folder(tmp_path / "small", 1 << 12)
    with pytest.raises(ztensor.ObjectNotFoundError):
        ztf.from_pretrained(transformers.AutoModelForCausalLM, small)


# Rule: transformers._parameters_on_meta skips transformers' initialisation of a
# module with nothing real in it (every parameter on meta, no buffer of its own):
# Marian's sinusoidal table was computed in numpy for max_position_embeddings=2**19
# (75 s, 0.8 GB) only to be replaced by the checkpoint's, or refused.


def test_nothing_is_computed_for_a_parameter_the_checkpoint_fills(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import json
    import ztensor.transformers as ztf
    from transformers.models.marian import modeling_marian
    torch.manual_seed(0)
    config = transformers.MarianConfig(
        d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=128,
        max_position_embeddings=64, pad_token_id=0, decoder_start_token_id=0, eos_token_id=1)
    model = transformers.MarianMTModel(config).eval()
    model.save_pretrained(tmp_path / "st")
    ztf.save_pretrained(model, tmp_path / "zt")
    reference = transformers.MarianMTModel.from_pretrained(tmp_path / "st").eval()
    calls = []
    real = modeling_marian.MarianSinusoidalPositionalEmbedding.create_weight

    def counted(self):
        calls.append(self.weight.shape)
        return real(self)

    monkeypatch.setattr(modeling_marian.MarianSinusoidalPositionalEmbedding, "create_weight",
                        counted)
    loaded = ztf.from_pretrained(transformers.MarianMTModel, tmp_path / "zt")
    assert calls == []
    inputs = dict(input_ids=torch.tensor([[1, 5, 9, 3]]), decoder_input_ids=torch.tensor([[0, 4]]))
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, reference(**inputs).logits)
    data = json.loads((tmp_path / "zt" / "config.json").read_text())
    data["max_position_embeddings"] = 1 << 19
    (tmp_path / "zt" / "config.json").write_text(json.dumps(data))
    with pytest.raises(ztensor.FormatError, match="524288"):
        ztf.from_pretrained(transformers.MarianMTModel, tmp_path / "zt")
    assert calls == []


# ------------------------------------------------------------------ remote
# Rule: source.Source closes the fsspec file it opened when the open fails: a
# server giving only a compressed Content-Encoding's length left aiohttp's
# connection open, and the command printed two lines of "Unclosed connection"
# after its one-line error.


def test_a_url_refused_at_open_leaves_no_connection_open(tmp_path):
    import http.server
    import threading
    import numpy as np
    import ztensor.numpy
    pytest.importorskip("aiohttp")
    ztensor.numpy.save_file({"a": np.ones(4, np.float32)}, str(tmp_path / "one.zt"))
    data = (tmp_path / "one.zt").read_bytes()

    class Encoded(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, body):
            self.send_response(200)
            self.send_header("ETag", '"v1"')
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Connection", "close")
            self.end_headers()
            if body:
                self.wfile.write(data)

        def do_HEAD(self):
            self.reply(False)

        def do_GET(self):
            self.reply(True)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Encoded)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/one.zt"
        proc = subprocess.run([sys.executable, "-m", "ztensor", "ls", url],
                              capture_output=True, text=True, timeout=60)
    finally:
        server.shutdown()
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "Content-Encoding" in proc.stderr


def test_a_quantization_config_is_refused_before_either_path(tmp_path):
    """Rule: transformers.from_pretrained refuses config.json's quantization_config:
    transformers' own loader (which a checkpoint with one renamed name steers to)
    built quantized layers from it and imported their packages."""
    import json
    transformers = pytest.importorskip("transformers")
    import ztensor.transformers as ztf
    folder = _tiny_llama_folder(tmp_path / "ck")
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [8, 8]}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ztensor.UnsupportedError, match="quantization_config") as err:
        ztf.from_pretrained(transformers.AutoModelForCausalLM, folder)
    assert err.value.path.endswith("config.json")


# ------------------------------------------------------------------ torch
# Rule: frameworks.torch_bridge.torch_bits_for maps elements numpy holds in an
# ml_dtypes type to torch's own dtype: bf16 storage under an unknown logical type
# ("bool", "acme.x"; read as its storage) was refused by read_torch ("numpy dtype
# bfloat16 has no torch dtype") while verify and read_numpy took it.


@pytest.mark.parametrize("logical", ["bool", "acme.x"])
def test_bf16_storage_under_an_unknown_type_reads_through_torch(tmp_path, logical):
    torch = pytest.importorskip("torch")
    ml_dtypes = pytest.importorskip("ml_dtypes")
    import numpy as np
    import ztensor.torch as zt
    values = np.array([1.5, -2, 3, 0.25], ml_dtypes.bfloat16)
    path = str(tmp_path / "u.zt")
    with ztensor.Writer(path) as w:
        w.write("x", ztensor.Tensor({"data": values}, types={"data": logical}))
    with ztensor.Reader(path) as r:
        assert r.metadata("x").type == logical
        got = r.read_torch("x")
        assert got.dtype == torch.bfloat16
        assert got.float().tolist() == values.astype(np.float32).tolist()
        assert r.read_numpy("x").dtype == values.dtype
    assert zt.load_file(path)["x"].dtype == torch.bfloat16
    with ztensor.safe_open(path, framework="pt") as f:
        assert f.get_tensor("x").dtype == torch.bfloat16
        assert f.get_slice("x")[1:3].dtype == torch.bfloat16


# ------------------------------------------------------------------ GGUF
# Rule: gguf_file reads a tensor of no element as no bytes whatever its ggml type: one
# of a type this version does not know (39, which gguf-py writes) was read as the
# bytes up to the next larger offset, so a zero-element tensor at the next tensor's
# own offset (what gguf-py writes) overlapped it, and the file was refused.  Found by
# the exports fuzz target (a GGUF exported back to GGUF), three times in 1M inputs.


def test_a_zero_element_tensor_of_an_unknown_type_holds_no_bytes(tmp_path):
    import warnings
    import numpy as np
    gguf = pytest.importorskip("gguf")
    try:
        unknown = gguf.GGMLQuantizationType(39)
    except ValueError:
        pytest.skip("this gguf package has no ggml type 39")
    path = str(tmp_path / "z.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_tensor("t0.w", np.zeros((4, 0), np.uint8), raw_shape=(4, 4, 0), raw_dtype=unknown)
    w.add_tensor("t1.w", np.array([7], np.int8))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with ztensor.Reader(path) as r:
            assert r.metadata("t0.w").components["blocks"].length == 0
            assert r.read_numpy("t1.w").tolist() == [7]
        out = str(tmp_path / "again.gguf")
        ztensor.convert(path, out)
        with ztensor.Reader(out) as r:
            assert r.read_numpy("t1.w").tolist() == [7]
            assert r.metadata("t0.w").shape == (4, 4, 0)


def test_an_object_store_write_without_credentials_says_where_to_give_them(monkeypatch,
                                                                          tmp_path):
    """Rule (session 17): upload._reason says botocore's errors as a read does
    (source.botocore_reason): an upload without credentials named only the class."""
    pytest.importorskip("s3fs")
    _no_credentials(monkeypatch, tmp_path)
    options = {"skip_instance_cache": True}
    with pytest.raises(ztensor.WriteError, match="give them in storage_options") as err:
        with ztensor.Writer("s3://bucket/x.zt", storage_options=options) as w:
            w.write_numpy("a", __import__("numpy").zeros(2))
    assert err.value.path.startswith("s3://bucket/")
