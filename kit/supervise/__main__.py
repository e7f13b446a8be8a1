"""The supervise bundle's entry (the zipapp's __main__.py, kit/supervise/bundle.py): `python3
kit-supervise.pyz COMMAND DIR` runs kit.supervise.main."""

import sys

from kit.supervise.main import main

sys.exit(main(sys.argv[1:]))
