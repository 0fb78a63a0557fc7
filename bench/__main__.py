import sys

from bench.measures import main

sys.exit(main())
