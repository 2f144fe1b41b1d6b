"""Print the length and sha256 of every ``PHALANX_TEST_BIG_*`` variable, and the parent pid."""

import hashlib
import json
import os

PREFIX = "PHALANX_TEST_BIG_"
digests = {
    name: [len(value), hashlib.sha256(value.encode()).hexdigest()]
    for name, value in os.environ.items()
    if name.startswith(PREFIX)
}
print(json.dumps({"ppid": os.getppid(), "big": digests}))
