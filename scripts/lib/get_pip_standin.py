"""Stand-in for ansible-test's get-pip bootstrap script.

ansible-test downloads get-pip.py from a host this lab cannot reach; it first looks in
~/.ansible/test/cache/, where scripts/lib/common.sh places this file. It bootstraps pip
from CPython's bundled wheel (ensurepip) and then installs what ansible-test asked for
from the package index.
"""

import subprocess
import sys

GET_PIP_ONLY_OPTIONS = {"--no-setuptools", "--no-wheel"}

subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade", "--default-pip"], stdout=subprocess.DEVNULL)
pip_args = [arg for arg in sys.argv[1:] if arg not in GET_PIP_ONLY_OPTIONS]
subprocess.check_call([sys.executable, "-m", "pip", "install", "--quiet", *pip_args])
