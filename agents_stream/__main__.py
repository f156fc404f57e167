import sys

from agents_stream.cli.main import main

sys.exit(main())
