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


# Source a child script starts with (``python -c CAP_ADDRESS_SPACE + body``), so an
# allocation a file merely declares fails there at once instead of swapping a shared
# machine.  The cap is relative to what the child already maps: under AddressSanitizer
# that includes its shadow reservation (terabytes), so a fixed cap would fail at import.
CAP_ADDRESS_SPACE = """
def cap_address_space(extra):
    import resource
    used = int(open("/proc/self/statm").read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (used + extra, used + extra))
"""
