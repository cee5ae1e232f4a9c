"""For tests that measure a child process's memory."""
import os


def measured_env():
    """The environment for a child whose memory is measured: under AddressSanitizer
    (the CI's sanitized run preloads it) freed memory is held in a 256 MB quarantine,
    which would count as the library's; no quarantine there, nothing changed elsewhere."""
    env = dict(os.environ)
    if "asan" in env.get("LD_PRELOAD", ""):
        extra = "quarantine_size_mb=0:thread_local_quarantine_size_kb=0"
        env["ASAN_OPTIONS"] = ":".join(filter(None, [env.get("ASAN_OPTIONS"), extra]))
    return env
