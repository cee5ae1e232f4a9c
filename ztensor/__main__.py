import sys

from ztensor.tools.cli import main

sys.exit(main())
