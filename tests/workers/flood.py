# usage: flood.py MIB -- writes MIB MiB of numbered lines to stdout and then MIB MiB as one
# line without a newline to stderr, as fast as it can (support/flood.py: the same bytes).
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/
from support.flood import long_line, numbered_lines

mib = int(sys.argv[1])
for chunk in numbered_lines(mib):
    sys.stdout.buffer.write(chunk)
sys.stdout.buffer.flush()
for chunk in long_line(mib):
    sys.stderr.buffer.write(chunk)
sys.stderr.buffer.flush()
