import os
import sys

# The tests import their reference module from this folder.
sys.path.insert(0, os.path.dirname(__file__))
