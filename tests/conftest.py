import os
import sys

# Tests see the repository's package even without an install (the README installs it editable anyway).
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
