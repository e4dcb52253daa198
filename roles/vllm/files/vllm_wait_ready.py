"""Wait until a vLLM instance serves: GET /v1/models with the bearer key answers 200 and
lists the model. Exits non-zero as soon as the container stops running, or on timeout.
Run by the instance's systemd unit (ExecStartPost), so the next instance starts only after
this one is ready. Usage: python3 vllm_wait_ready.py CONTAINER URL MODEL TIMEOUT (key in VLLM_API_KEY).
"""

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

container, url, model, timeout = sys.argv[1], sys.argv[2].rstrip("/"), sys.argv[3], float(sys.argv[4])
request = urllib.request.Request(url + "/v1/models", headers={"Authorization": "Bearer " + os.environ["VLLM_API_KEY"]})
deadline = time.monotonic() + timeout
while time.monotonic() < deadline:
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            if model in [entry["id"] for entry in json.load(response).get("data", [])]:
                sys.exit(0)
    except (urllib.error.URLError, OSError, ValueError):
        pass
    state = subprocess.run(["docker", "inspect", "--format", "{{.State.Status}}", container], capture_output=True, text=True, check=False)
    if state.returncode == 0 and state.stdout.strip() not in ("created", "running"):
        sys.exit(f"{container} is {state.stdout.strip()}")
    time.sleep(2)
sys.exit(f"{container} did not serve {model} within {timeout:.0f} s")
