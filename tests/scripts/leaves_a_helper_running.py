"""A script that starts a helper in a session of its own, with a cleaned environment (no variable of cloudtrain's
reaches it), writes the helper's pid and exits 0: the helper must not outlive the job's node."""

import os
import subprocess
import sys

helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                          env={"PATH": os.environ.get("PATH", "/usr/bin")}, stdin=subprocess.DEVNULL,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
with open(sys.argv[1], "w") as f:
    f.write(str(helper.pid))
print(f"started helper {helper.pid}", flush=True)
