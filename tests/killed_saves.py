"""A checkpoint save killed part way, for the tests of checkpoint_moves' recovery: a
child process that dies (os._exit, so no cleanup runs) at its ``at``-th call of
os.replace matching ``rule`` (a Python expression over ``src`` and ``dst``)."""
import subprocess
import sys
import textwrap


def killed_save(folder, value, rule, at, max_shard_size=16):
    """The child's exit code: 9 when it was killed, 0 when the save completed first.
    It saves tensors a, b, c of four ``value``s into ``folder``, sharded."""
    code = textwrap.dedent(f"""
        import os, numpy as np, ztensor
        real, seen = os.replace, [0]
        def replace(src, dst):
            if {rule}:
                seen[0] += 1
                if seen[0] == {at}:
                    os._exit(9)
            real(src, dst)
        os.replace = replace
        ztensor.save_sharded({{k: np.full(4, {value}, "f4") for k in "abc"}},
                             {str(folder)!r}, max_shard_size={max_shard_size})
        os._exit(0)
    """)
    return subprocess.run([sys.executable, "-c", code], timeout=120).returncode
