import sys

from trit.cli import main

sys.exit(main())
