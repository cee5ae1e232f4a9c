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
