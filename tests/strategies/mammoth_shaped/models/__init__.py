"""Like Mammoth's: importing the package moves the process into the checkout and onto sys.path."""

import os
import sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.append(root)
os.chdir(root)
