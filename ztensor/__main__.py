import sys

from ztensor.cli import main

sys.exit(main())
