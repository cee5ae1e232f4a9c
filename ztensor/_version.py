# The one place the package version is kept (setup reads it).  Its meaning
# (docs/versions.md): major 1 is the API line of the reference ``ztensor`` 1.x, whose
# code keeps working, and the v1.2 container is what it writes; minors after 1.2 are
# this package's releases.  PyPI ``ztensor`` 2.x is another API and container.
__version__ = "1.3.0"
